#include "planner/hardware_profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "checkpoint/file_kind.h"
#include "core/env.h"
#include "core/json_error.h"

namespace epinfer::planner {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSchema = "epinfer.hardware_profile/1";

// Reads one JSON object, remembering the key path for messages ("SOURCE: gpu.memory_bytes: ...").
// Every figure's upper bound (bytes, GB/s, TFLOP/s, µs): far above any GPU's, low enough that a step's
// sums of figures × counts stay finite.
constexpr double kMaxFigure = 1e15;
// Every positive figure's lower bound (an efficiency, a bandwidth, a rate; fp8/fp4 rates too, where 0
// means none): the plan divides by them, and 5e-324 passes "> 0" yet makes every time infinite.
constexpr double kMinPositiveFigure = 1e-6;

class ObjectReader {
public:
    ObjectReader(const json& object, std::string source, std::string path)
        : object_(object), source_(std::move(source)), path_(std::move(path)) {}

    Status error(const std::string& key, const std::string& problem) const {
        return invalid_argument(fmt::format("{}: {}: {}", source_, key_path(key), problem));
    }
    std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
    const std::string& source() const { return source_; }
    bool has(const std::string& key) const { return object_.contains(key); }
    const json& at(const std::string& key) const { return object_.at(key); }

    // Every key of the object must be one of `allowed` (keys starting with "note" or "$" are comments).
    Status check_keys(std::initializer_list<const char*> allowed) const {
        for (const auto& [key, value] : object_.items()) {
            if (key.rfind("note", 0) == 0 || key.rfind('$', 0) == 0) continue;
            bool known = std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; });
            if (!known) return error(key, "unknown key");
        }
        return Status::ok();
    }

    Result<std::string> string(const std::string& key, bool required = true) const {
        if (!has(key)) {
            if (required) return error(key, "missing");
            return std::string();
        }
        if (!at(key).is_string()) return error(key, "expected a string");
        return at(key).get<std::string>();
    }

    Result<ObjectReader> object(const std::string& key) const {
        if (!has(key)) return error(key, "missing");
        if (!at(key).is_object()) return error(key, "expected an object");
        return ObjectReader(at(key), source_, key_path(key));
    }

    // A figure is a number, or {"value": number, "provenance": "...", "source": "..."}.
    // `min_value`/`max_value` bound it; `min_exclusive` makes the lower bound strict.
    Result<Figure> figure(const std::string& key, double min_value, bool min_exclusive,
                          double max_value = INFINITY) const {
        if (!has(key)) return error(key, "missing");
        const json& node = at(key);
        Figure fig;
        if (node.is_number()) {
            fig.value = node.get<double>();
        } else if (node.is_object()) {
            ObjectReader sub(node, source_, key_path(key));
            EPI_RETURN_IF_ERROR(sub.check_keys({"value", "provenance", "source"}));
            if (!sub.has("value") || !sub.at("value").is_number())
                return sub.error("value", "expected a number");
            fig.value = sub.at("value").get<double>();
            EPI_ASSIGN_OR_RETURN(fig.provenance, sub.provenance());
            EPI_ASSIGN_OR_RETURN(fig.source, sub.string("source", false));
        } else {
            return error(key, "expected a number or {\"value\": ..., \"provenance\": ..., \"source\": ...}");
        }
        bool too_low = min_exclusive ? !(fig.value > min_value) : !(fig.value >= min_value);
        if (std::isfinite(fig.value) && !too_low && fig.value > kMaxFigure) {
            return error(key,
                         fmt::format("must be <= {:g}, a bound on every figure that keeps the plan's sums "
                                     "finite (got {:g})",
                                     kMaxFigure, fig.value));
        }
        // Also where 0 is allowed (fp8_tflops, fp4_tflops: 0 = no such tensor cores; a divisor when > 0).
        if (std::isfinite(fig.value) && !too_low && min_value == 0.0 && fig.value > 0.0 &&
            fig.value < kMinPositiveFigure) {
            return error(key, fmt::format("must be >= {:g} when positive, a bound on every figure that keeps "
                                          "the plan's quotients finite (got {:g})",
                                          kMinPositiveFigure, fig.value));
        }
        if (!std::isfinite(fig.value) || too_low || fig.value > max_value) {
            std::string range = fmt::format("{} {}", min_exclusive ? ">" : ">=", min_value);
            if (std::isfinite(max_value)) range += fmt::format(" and <= {}", max_value);
            return error(key, fmt::format("must be {} (got {})", range, fig.value));
        }
        return fig;
    }

    Result<Provenance> provenance() const {
        EPI_ASSIGN_OR_RETURN(std::string text, string("provenance", false));
        if (text.empty()) return Provenance::kUnspecified;
        for (Provenance p : {Provenance::kDatasheet, Provenance::kMeasured, Provenance::kEstimate}) {
            if (text == provenance_name(p)) return p;
        }
        return error("provenance", fmt::format("'{}' is not one of datasheet, measured, estimate", text));
    }

private:
    const json& object_;
    std::string source_;
    std::string path_;
};

Result<SizeTable> parse_table(const ObjectReader& reader) {
    EPI_RETURN_IF_ERROR(reader.check_keys({"ranks", "points", "provenance", "source"}));
    SizeTable table;
    if (!reader.has("ranks") || !reader.at("ranks").is_number_integer() ||
        reader.at("ranks").get<int>() < 2) {
        return reader.error("ranks", "expected an integer >= 2");
    }
    table.ranks = reader.at("ranks").get<int>();
    EPI_ASSIGN_OR_RETURN(table.provenance, reader.provenance());
    EPI_ASSIGN_OR_RETURN(table.source, reader.string("source", false));
    if (!reader.has("points") || !reader.at("points").is_array() || reader.at("points").empty()) {
        return reader.error("points", "expected a non-empty array of [bytes, time_us]");
    }
    const json& points = reader.at("points");
    for (size_t i = 0; i < points.size(); ++i) {
        const json& p = points[i];
        std::string key = fmt::format("points[{}]", i);
        if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number()) {
            return reader.error(key, "expected [bytes, time_us]");
        }
        double bytes = p[0].get<double>(), time_us = p[1].get<double>();
        if (!(bytes > 0) || !(time_us > 0)) return reader.error(key, "bytes and time_us must be > 0");
        if (!table.points.empty() && bytes <= table.points.back().first) {
            return reader.error(key, "sizes must be strictly ascending");
        }
        table.points.emplace_back(bytes, time_us);
    }
    return table;
}

// "tables": a non-empty array of tables, group sizes strictly ascending.
Result<std::vector<SizeTable>> parse_tables(const ObjectReader& coll) {
    const json& array = coll.at("tables");
    if (!array.is_array() || array.empty()) {
        return coll.error("tables",
                          "expected a non-empty array of {\"ranks\", \"points\", ...} (omit the key for none)");
    }
    std::vector<SizeTable> tables;
    for (size_t i = 0; i < array.size(); ++i) {
        std::string key = fmt::format("tables[{}]", i);
        if (!array[i].is_object()) return coll.error(key, "expected an object");
        ObjectReader reader(array[i], coll.source(), coll.key_path(key));
        EPI_ASSIGN_OR_RETURN(SizeTable table, parse_table(reader));
        if (!tables.empty() && table.ranks == tables.back().ranks) {
            return reader.error("ranks", fmt::format("a second table at {} ranks (one table per group size)",
                                                     table.ranks));
        }
        if (!tables.empty() && table.ranks < tables.back().ranks) {
            return reader.error("ranks", fmt::format("group sizes must be strictly ascending ({} after {})",
                                                     table.ranks, tables.back().ranks));
        }
        tables.push_back(std::move(table));
    }
    return tables;
}

// gpu.expert_memory_efficiency_by_rows: {"points": [{"rows_per_expert", "efficiency"}, ...], "provenance",
// "source"}, rows strictly ascending.
Result<RowsEfficiencyTable> parse_rows_efficiency(const ObjectReader& reader) {
    EPI_RETURN_IF_ERROR(reader.check_keys({"points", "provenance", "source"}));
    RowsEfficiencyTable table;
    EPI_ASSIGN_OR_RETURN(table.provenance, reader.provenance());
    EPI_ASSIGN_OR_RETURN(table.source, reader.string("source", false));
    const char* point_form = "{\"rows_per_expert\": r, \"efficiency\": e}";
    if (!reader.has("points") || !reader.at("points").is_array() || reader.at("points").empty()) {
        return reader.error("points", fmt::format("expected a non-empty array of {}", point_form));
    }
    const json& points = reader.at("points");
    for (size_t i = 0; i < points.size(); ++i) {
        std::string key = fmt::format("points[{}]", i);
        if (!points[i].is_object()) return reader.error(key, fmt::format("expected {}", point_form));
        ObjectReader point(points[i], reader.source(), reader.key_path(key));
        EPI_RETURN_IF_ERROR(point.check_keys({"rows_per_expert", "efficiency"}));
        EPI_ASSIGN_OR_RETURN(Figure rows, point.figure("rows_per_expert", 0.0, true));
        EPI_ASSIGN_OR_RETURN(Figure efficiency, point.figure("efficiency", 0.0, true, 1.0));
        if (!table.points.empty() && rows.value <= table.points.back().rows_per_expert) {
            return point.error("rows_per_expert", "must be strictly ascending");
        }
        table.points.push_back({rows.value, efficiency.value});
    }
    return table;
}

Result<LinkSpec> parse_link(const ObjectReader& reader, std::initializer_list<LinkKind> allowed_kinds) {
    EPI_RETURN_IF_ERROR(reader.check_keys({"kind", "all_reduce", "all_gather", "all_to_all", "send_recv"}));
    LinkSpec link;
    EPI_ASSIGN_OR_RETURN(std::string kind, reader.string("kind"));
    bool found = false;
    std::string names;
    for (LinkKind k : allowed_kinds) {
        names += (names.empty() ? "" : ", ") + std::string(link_kind_name(k));
        if (kind == link_kind_name(k)) {
            link.kind = k;
            found = true;
        }
    }
    if (!found) return reader.error("kind", fmt::format("'{}' is not one of {}", kind, names));
    for (int c = 0; c < kNumCollectives; ++c) {
        const char* name = collective_name(static_cast<Collective>(c));
        EPI_ASSIGN_OR_RETURN(ObjectReader coll, reader.object(name));
        if (coll.has("table")) {
            return coll.error("table", "replaced by \"tables\": [{\"ranks\": n, \"points\": ...}, ...], one "
                                       "table per group size; put the object in a one-element array");
        }
        EPI_RETURN_IF_ERROR(coll.check_keys({"latency_us", "bus_bandwidth_gbps", "tables"}));
        CollectiveSpec& spec = link.collectives[c];
        EPI_ASSIGN_OR_RETURN(spec.latency_us, coll.figure("latency_us", 0.0, false));
        EPI_ASSIGN_OR_RETURN(spec.bus_bandwidth_gbps, coll.figure("bus_bandwidth_gbps", 0.0, true));
        if (coll.has("tables")) {
            EPI_ASSIGN_OR_RETURN(spec.tables, parse_tables(coll));
        }
    }
    return link;
}

Result<GpuSpec> parse_gpu(const ObjectReader& r) {
    // The synchronous engine's per-NCCL-call gap (profiles of 2026-11-29 before the asynchronous change).
    if (r.has("collective_sync_us")) {
        return r.error("collective_sync_us",
                       "no longer used: the engine's NCCL calls are asynchronous, a collective costs its "
                       "measured time alone; remove the key");
    }
    EPI_RETURN_IF_ERROR(r.check_keys({"name",
                                      "memory_bytes",
                                      "usable_memory_fraction",
                                      "memory_bandwidth_gbps",
                                      "bf16_tflops",
                                      "fp8_tflops",
                                      "fp4_tflops",
                                      "kernel_launch_us",
                                      "graph_kernel_us",
                                      "kernel_latency_us",
                                      "eager_kernel_us",
                                      "host_round_trip_us",
                                      "host_round_trip_us_per_row",
                                      "memory_efficiency",
                                      "matmul_efficiency",
                                      "expert_matmul_efficiency",
                                      "prefill_attention_matmul_efficiency",
                                      "latent_attention_matmul_efficiency",
                                      "expert_memory_efficiency_by_rows",
                                      "expert_matmul_efficiency_by_rows"}));
    GpuSpec gpu;
    EPI_ASSIGN_OR_RETURN(gpu.name, r.string("name"));
    EPI_ASSIGN_OR_RETURN(gpu.memory_bytes, r.figure("memory_bytes", 0.0, true));
    EPI_ASSIGN_OR_RETURN(gpu.usable_memory_fraction, r.figure("usable_memory_fraction", 0.0, true, 1.0));
    EPI_ASSIGN_OR_RETURN(gpu.memory_bandwidth_gbps, r.figure("memory_bandwidth_gbps", 0.0, true));
    EPI_ASSIGN_OR_RETURN(gpu.bf16_tflops, r.figure("bf16_tflops", 0.0, true));
    EPI_ASSIGN_OR_RETURN(gpu.fp8_tflops, r.figure("fp8_tflops", 0.0, false));
    EPI_ASSIGN_OR_RETURN(gpu.fp4_tflops, r.figure("fp4_tflops", 0.0, false));
    EPI_ASSIGN_OR_RETURN(gpu.kernel_launch_us, r.figure("kernel_launch_us", 0.0, false));
    EPI_ASSIGN_OR_RETURN(gpu.graph_kernel_us, r.figure("graph_kernel_us", 0.0, false));
    EPI_ASSIGN_OR_RETURN(gpu.memory_efficiency, r.figure("memory_efficiency", 0.0, true, 1.0));
    EPI_ASSIGN_OR_RETURN(gpu.matmul_efficiency, r.figure("matmul_efficiency", 0.0, true, 1.0));
    if (r.has("kernel_latency_us")) {
        EPI_ASSIGN_OR_RETURN(gpu.kernel_latency_us, r.figure("kernel_latency_us", 0.0, false));
    } else {
        gpu.kernel_latency_us = Figure{0.0, Provenance::kUnspecified, "absent: 0"};
    }
    if (r.has("eager_kernel_us")) {
        EPI_ASSIGN_OR_RETURN(gpu.eager_kernel_us, r.figure("eager_kernel_us", 0.0, false));
    } else {
        gpu.eager_kernel_us =
            Figure{gpu.kernel_launch_us.value, Provenance::kUnspecified, "absent: kernel_launch_us"};
    }
    if (r.has("host_round_trip_us")) {
        EPI_ASSIGN_OR_RETURN(gpu.host_round_trip_us, r.figure("host_round_trip_us", 0.0, false));
    } else {
        gpu.host_round_trip_us = Figure{0.0, Provenance::kUnspecified, "absent: 0"};
    }
    if (r.has("host_round_trip_us_per_row")) {
        EPI_ASSIGN_OR_RETURN(gpu.host_round_trip_us_per_row,
                             r.figure("host_round_trip_us_per_row", 0.0, false));
    } else {
        gpu.host_round_trip_us_per_row = Figure{0.0, Provenance::kUnspecified, "absent: 0"};
    }
    if (r.has("expert_matmul_efficiency")) {
        EPI_ASSIGN_OR_RETURN(gpu.expert_matmul_efficiency,
                             r.figure("expert_matmul_efficiency", 0.0, true, 1.0));
    } else {
        gpu.expert_matmul_efficiency = gpu.matmul_efficiency;
    }
    for (auto [key, figure] :
         {std::pair{"prefill_attention_matmul_efficiency", &gpu.prefill_attention_matmul_efficiency},
          std::pair{"latent_attention_matmul_efficiency", &gpu.latent_attention_matmul_efficiency}}) {
        if (r.has(key)) {
            EPI_ASSIGN_OR_RETURN(*figure, r.figure(key, 0.0, true, 1.0));
        } else {
            *figure =
                Figure{gpu.matmul_efficiency.value, Provenance::kUnspecified, "absent: matmul_efficiency"};
        }
    }
    for (auto [key, table] :
         {std::pair{"expert_memory_efficiency_by_rows", &gpu.expert_memory_efficiency_by_rows},
          std::pair{"expert_matmul_efficiency_by_rows", &gpu.expert_matmul_efficiency_by_rows}}) {
        if (!r.has(key)) continue;
        EPI_ASSIGN_OR_RETURN(ObjectReader reader, r.object(key));
        EPI_ASSIGN_OR_RETURN(*table, parse_rows_efficiency(reader));
    }
    return gpu;
}

}  // namespace

const char* provenance_name(Provenance provenance) {
    switch (provenance) {
        case Provenance::kDatasheet:
            return "datasheet";
        case Provenance::kMeasured:
            return "measured";
        case Provenance::kEstimate:
            return "estimate";
        case Provenance::kUnspecified:
            return "unspecified";
    }
    return "?";
}

const char* link_kind_name(LinkKind kind) {
    switch (kind) {
        case LinkKind::kNvlink:
            return "nvlink";
        case LinkKind::kPcieP2p:
            return "pcie_p2p";
        case LinkKind::kPcieNoP2p:
            return "pcie_no_p2p";
        case LinkKind::kInfiniband:
            return "infiniband";
        case LinkKind::kEthernet:
            return "ethernet";
    }
    return "?";
}

const char* collective_name(Collective collective) {
    switch (collective) {
        case Collective::kAllReduce:
            return "all_reduce";
        case Collective::kAllGather:
            return "all_gather";
        case Collective::kAllToAll:
            return "all_to_all";
        case Collective::kSendRecv:
            return "send_recv";
    }
    return "?";
}

const SizeTable* CollectiveSpec::table_for(int ranks) const {
    for (const SizeTable& table : tables) {
        if (table.ranks == ranks && !table.points.empty()) return &table;
    }
    return nullptr;
}

int64_t GpuSpec::usable_bytes() const {
    return static_cast<int64_t>(memory_bytes.value * usable_memory_fraction.value);
}

Result<HardwareProfile> parse_hardware_profile(const std::string& json_text, const std::string& source) {
    json root;
    try {
        root = json::parse(json_text);
    } catch (const json::exception& e) {
        return invalid_argument(fmt::format("{}: malformed JSON: {}", source, json_error_text(e)));
    }
    if (!root.is_object()) return invalid_argument(fmt::format("{}: expected a JSON object", source));
    ObjectReader r(root, source, "");
    EPI_RETURN_IF_ERROR(
        r.check_keys({"schema", "name", "description", "gpus_per_node", "gpu", "intra_node", "inter_node"}));
    EPI_ASSIGN_OR_RETURN(std::string schema, r.string("schema"));
    if (schema != kSchema) return r.error("schema", fmt::format("'{}' is not '{}'", schema, kSchema));
    HardwareProfile profile;
    EPI_ASSIGN_OR_RETURN(profile.name, r.string("name"));
    EPI_ASSIGN_OR_RETURN(profile.description, r.string("description", false));
    if (!r.has("gpus_per_node") || !r.at("gpus_per_node").is_number_integer() ||
        r.at("gpus_per_node").get<int>() < 1) {
        return r.error("gpus_per_node", "expected an integer >= 1");
    }
    profile.gpus_per_node = r.at("gpus_per_node").get<int>();
    EPI_ASSIGN_OR_RETURN(ObjectReader gpu, r.object("gpu"));
    EPI_ASSIGN_OR_RETURN(profile.gpu, parse_gpu(gpu));
    EPI_ASSIGN_OR_RETURN(ObjectReader intra, r.object("intra_node"));
    EPI_ASSIGN_OR_RETURN(profile.intra_node,
                         parse_link(intra, {LinkKind::kNvlink, LinkKind::kPcieP2p, LinkKind::kPcieNoP2p}));
    if (r.has("inter_node")) {
        EPI_ASSIGN_OR_RETURN(ObjectReader inter, r.object("inter_node"));
        EPI_ASSIGN_OR_RETURN(LinkSpec link, parse_link(inter, {LinkKind::kInfiniband, LinkKind::kEthernet}));
        profile.inter_node = std::move(link);
    }
    return profile;
}

Result<HardwareProfile> load_hardware_profile_file(const std::string& path) {
    // A folder, FIFO or device named as the file is said so: reading /dev/zero or a FIFO would not end.
    if (const Status kind = check_regular_file(path); !kind.is_ok())
        return Status(kind.code(), kind.message() + " (a hardware profile is a JSON file)");
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found(fmt::format("{}: cannot read hardware profile", path));
    std::stringstream text;
    text << in.rdbuf();
    EPI_ASSIGN_OR_RETURN(HardwareProfile profile, parse_hardware_profile(text.str(), path));
    profile.path = path;
    return profile;
}

std::vector<std::string> profile_search_dirs(const std::string& exe_path) {
    std::vector<std::string> dirs;
    std::string env_dir = env_profiles_dir();
    if (!env_dir.empty()) dirs.push_back(env_dir);
    if (!exe_path.empty()) {
        std::error_code ec;
        fs::path exe = fs::weakly_canonical(fs::path(exe_path), ec);
        if (ec) exe = fs::path(exe_path);
        fs::path bin = exe.parent_path();
        dirs.push_back((bin / ".." / "share" / "epinfer" / "profiles").lexically_normal().string());
        dirs.push_back((bin / ".." / ".." / ".." / "profiles").lexically_normal().string());
    }
    return dirs;
}

std::vector<std::string> list_profile_names(const std::string& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        if (entry.is_regular_file() && entry.path().extension() == ".json") {
            names.push_back(entry.path().stem().string());
        }
    }
    std::sort(names.begin(), names.end());
    return names;
}

Result<HardwareProfile> resolve_hardware_profile(const std::string& name_or_file,
                                                 const std::string& exe_path) {
    bool is_file = name_or_file.find('/') != std::string::npos ||
                   (name_or_file.size() > 5 && name_or_file.ends_with(".json"));
    if (is_file) return load_hardware_profile_file(name_or_file);
    // A folder the user named must exist (falling back to the shipped profiles would hide the typo).
    const std::string env_dir = env_profiles_dir();
    std::error_code env_ec;
    if (!env_dir.empty() && !fs::is_directory(env_dir, env_ec)) {
        return not_found(fmt::format("EPINFER_PROFILES_DIR={}: not a folder (hardware profile '{}')", env_dir,
                                     name_or_file));
    }
    std::vector<std::string> dirs = profile_search_dirs(exe_path);
    for (const std::string& dir : dirs) {
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) continue;
        fs::path file = fs::path(dir) / (name_or_file + ".json");
        if (fs::exists(file, ec)) return load_hardware_profile_file(file.string());
        std::vector<std::string> names = list_profile_names(dir);
        return not_found(
            fmt::format("unknown hardware profile '{}'; shipped profiles: {} (in {}); or pass a "
                        "FILE.json",
                        name_or_file, fmt::join(names, ", "), dir));
    }
    return not_found(
        fmt::format("hardware profile '{}': no profiles folder found (searched {}; set "
                    "EPINFER_PROFILES_DIR)",
                    name_or_file, fmt::join(dirs, ", ")));
}

}  // namespace epinfer::planner
