// Hardware profiles: the shipped ones load and carry a source for every figure; malformed ones give one
// line naming the file and the key.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "planner/hardware_profile.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

const std::string kProfilesDir = std::string(EPINFER_TEST_DATA_DIR) + "/../../profiles";

std::vector<const Figure*> figures_of(const HardwareProfile& p) {
    const GpuSpec& g = p.gpu;
    std::vector<const Figure*> figs = {&g.memory_bytes,
                                       &g.usable_memory_fraction,
                                       &g.memory_bandwidth_gbps,
                                       &g.bf16_tflops,
                                       &g.fp8_tflops,
                                       &g.fp4_tflops,
                                       &g.kernel_launch_us,
                                       &g.graph_kernel_us,
                                       &g.memory_efficiency,
                                       &g.matmul_efficiency};
    for (const LinkSpec* link : {&p.intra_node, p.inter_node ? &*p.inter_node : nullptr}) {
        if (!link) continue;
        for (const CollectiveSpec& c : link->collectives) {
            figs.push_back(&c.latency_us);
            figs.push_back(&c.bus_bandwidth_gbps);
        }
    }
    return figs;
}

TEST(HardwareProfile, ShippedProfilesLoadWithSources) {
    std::vector<std::string> names = list_profile_names(kProfilesDir);
    EXPECT_EQ(names,
              (std::vector<std::string>{"b200", "h100_sxm", "h200_sxm", "l40s", "rtx_4090", "rtx_pro_6000"}));
    for (const std::string& name : names) {
        auto p = load_hardware_profile_file(kProfilesDir + "/" + name + ".json");
        ASSERT_TRUE(p.is_ok()) << p.status().message();
        EXPECT_EQ(p->name, name);
        EXPECT_EQ(p->gpus_per_node, 8);
        ASSERT_TRUE(p->inter_node.has_value()) << name;
        for (const Figure* f : figures_of(*p)) {
            EXPECT_NE(f->provenance, Provenance::kUnspecified) << name;
            EXPECT_FALSE(f->source.empty()) << name;
        }
    }
}

TEST(HardwareProfile, ShippedFiguresFromFacts) {
    auto h200 = load_hardware_profile_file(kProfilesDir + "/h200_sxm.json");
    ASSERT_TRUE(h200.is_ok());
    EXPECT_DOUBLE_EQ(h200->gpu.memory_bytes.value, 143771.0 * 1024 * 1024);  // FACTS.md C.2 [M]
    EXPECT_EQ(h200->gpu.memory_bytes.provenance, Provenance::kMeasured);
    EXPECT_DOUBLE_EQ(h200->gpu.memory_bandwidth_gbps.value, 4800.0);
    EXPECT_EQ(h200->intra_node.kind, LinkKind::kNvlink);
    auto rtx = load_hardware_profile_file(kProfilesDir + "/rtx_pro_6000.json");
    ASSERT_TRUE(rtx.is_ok());
    EXPECT_EQ(rtx->intra_node.kind, LinkKind::kPcieP2p);
    EXPECT_DOUBLE_EQ(rtx->gpu.memory_bandwidth_gbps.value, 1792.0);  // FACTS.md C.1
    ASSERT_EQ(rtx->intra_node[Collective::kAllReduce].tables.size(), 1u);
    EXPECT_EQ(rtx->intra_node[Collective::kAllReduce].tables[0].ranks, 8);
    EXPECT_EQ(rtx->intra_node[Collective::kAllReduce].tables[0].points.size(), 3u);
    auto rtx4090 = load_hardware_profile_file(kProfilesDir + "/rtx_4090.json");
    ASSERT_TRUE(rtx4090.is_ok());
    EXPECT_EQ(rtx4090->intra_node.kind, LinkKind::kPcieNoP2p);
}

TEST(HardwareProfile, OptionalKernelFigures) {
    // Absent: no kernel latency, and the grouped expert GEMMs at matmul_efficiency.
    auto round = parse_hardware_profile(testing::round_profile_json(), "round.json");
    ASSERT_TRUE(round.is_ok()) << round.status().message();
    EXPECT_EQ(round->gpu.kernel_latency_us.value, 0.0);
    EXPECT_EQ(round->gpu.expert_matmul_efficiency.value, round->gpu.matmul_efficiency.value);
    EXPECT_EQ(round->gpu.host_round_trip_us_per_row.value, 0.0);
    EXPECT_EQ(round->gpu.prefill_attention_matmul_efficiency.value, round->gpu.matmul_efficiency.value);
    EXPECT_EQ(round->gpu.latent_attention_matmul_efficiency.value, round->gpu.matmul_efficiency.value);
    EXPECT_EQ(round->gpu.latent_attention_matmul_efficiency.source, "absent: matmul_efficiency");
    nlohmann::json doc = nlohmann::json::parse(testing::round_profile_json());
    doc["gpu"]["kernel_latency_us"] = 2.5;
    doc["gpu"]["expert_matmul_efficiency"] = 0.25;
    doc["gpu"]["host_round_trip_us_per_row"] = 0.125;
    doc["gpu"]["prefill_attention_matmul_efficiency"] = 0.375;
    doc["gpu"]["latent_attention_matmul_efficiency"] = {
        {"value", 0.5}, {"provenance", "measured"}, {"source", "bench attention"}};
    auto both = parse_hardware_profile(doc.dump(), "both.json");
    ASSERT_TRUE(both.is_ok()) << both.status().message();
    EXPECT_EQ(both->gpu.kernel_latency_us.value, 2.5);
    EXPECT_EQ(both->gpu.expert_matmul_efficiency.value, 0.25);
    EXPECT_EQ(both->gpu.host_round_trip_us_per_row.value, 0.125);
    EXPECT_EQ(both->gpu.prefill_attention_matmul_efficiency.value, 0.375);
    EXPECT_EQ(both->gpu.latent_attention_matmul_efficiency.value, 0.5);
    EXPECT_EQ(both->gpu.latent_attention_matmul_efficiency.provenance, Provenance::kMeasured);
    EXPECT_EQ(both->gpu.latent_attention_matmul_efficiency.source, "bench attention");
    // The expert efficiency by rows: absent, no points; present, its points, provenance and source.
    EXPECT_TRUE(round->gpu.expert_memory_efficiency_by_rows.points.empty());
    doc["gpu"]["expert_memory_efficiency_by_rows"] = {
        {"points",
         {{{"rows_per_expert", 1}, {"efficiency", 0.36}}, {{"rows_per_expert", 16}, {"efficiency", 0.75}}}},
        {"provenance", "measured"},
        {"source", "bench moe"}};
    auto table = parse_hardware_profile(doc.dump(), "table.json");
    ASSERT_TRUE(table.is_ok()) << table.status().message();
    const RowsEfficiencyTable& t = table->gpu.expert_memory_efficiency_by_rows;
    ASSERT_EQ(t.points.size(), 2u);
    EXPECT_EQ(t.points[1].rows_per_expert, 16.0);
    EXPECT_EQ(t.points[1].efficiency, 0.75);
    EXPECT_EQ(t.provenance, Provenance::kMeasured);
    EXPECT_EQ(t.source, "bench moe");
    // The shipped H200 carries the measured floor of a kernel that touches memory.
    auto h200 = load_hardware_profile_file(kProfilesDir + "/h200_sxm.json");
    ASSERT_TRUE(h200.is_ok());
    EXPECT_EQ(h200->gpu.kernel_latency_us.value, 2.3);
    EXPECT_EQ(h200->gpu.kernel_latency_us.provenance, Provenance::kMeasured);
}

// Applies `edit` to the round profile, parses it as "bad.json" and returns the error message.
template <typename Edit>
std::string error_after(Edit edit) {
    nlohmann::json doc = nlohmann::json::parse(testing::round_profile_json());
    edit(doc);
    auto p = parse_hardware_profile(doc.dump(), "bad.json");
    return p.is_ok() ? std::string("(parsed)") : p.status().message();
}

TEST(HardwareProfile, ErrorsNameFileAndKey) {
    using nlohmann::json;
    EXPECT_EQ(error_after([](json& d) { d["gpu"].erase("memory_bandwidth_gbps"); }),
              "bad.json: gpu.memory_bandwidth_gbps: missing");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["memory_bytes"] = -1; }),
              "bad.json: gpu.memory_bytes: must be > 0 (got -1)");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["usable_memory_fraction"] = 1.5; }),
              "bad.json: gpu.usable_memory_fraction: must be > 0 and <= 1 (got 1.5)");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["hbm_bandwith_gbps"] = 1; }),
              "bad.json: gpu.hbm_bandwith_gbps: unknown key");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["kernel_latency_us"] = -1; }),
              "bad.json: gpu.kernel_latency_us: must be >= 0 (got -1)");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["host_round_trip_us_per_row"] = -0.5; }),
              "bad.json: gpu.host_round_trip_us_per_row: must be >= 0 (got -0.5)");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["expert_matmul_efficiency"] = 0; }),
              "bad.json: gpu.expert_matmul_efficiency: must be > 0 and <= 1 (got 0)");
    // 5e-324 passes "> 0" but would make every time infinite: positive figures are at least 1e-6.
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["latent_attention_matmul_efficiency"] = 5e-324; }),
              "bad.json: gpu.latent_attention_matmul_efficiency: must be >= 1e-06 when positive, a bound on "
              "every figure that keeps the plan's quotients finite (got 4.94066e-324)");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["memory_bandwidth_gbps"] = 1e-9; }),
              "bad.json: gpu.memory_bandwidth_gbps: must be >= 1e-06 when positive, a bound on every figure "
              "that keeps the plan's quotients finite (got 1e-09)");
    // Where 0 is allowed (no fp8 tensor cores) a positive rate is a divisor all the same.
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["fp8_tflops"] = 5e-324; }),
              "bad.json: gpu.fp8_tflops: must be >= 1e-06 when positive, a bound on every figure that keeps "
              "the plan's quotients finite (got 4.94066e-324)");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["prefill_attention_matmul_efficiency"] = 1.5; }),
              "bad.json: gpu.prefill_attention_matmul_efficiency: must be > 0 and <= 1 (got 1.5)");
    EXPECT_EQ(
        error_after([](json& d) { d["gpu"]["latent_attention_matmul_efficiency"] = "fast"; }),
        R"(bad.json: gpu.latent_attention_matmul_efficiency: expected a number or {"value": ..., "provenance": ..., "source": ...})");
    // Any figure past 1e15 (a value of 1e308 made the plan's cells inf).
    EXPECT_EQ(
        error_after([](json& d) { d["gpu"]["host_round_trip_us"] = 1e308; }),
        "bad.json: gpu.host_round_trip_us: must be <= 1e+15, a bound on every figure that keeps the plan's "
        "sums finite (got 1e+308)");
    EXPECT_EQ(
        error_after([](json& d) { d["intra_node"]["all_reduce"]["latency_us"] = 2e15; }),
        "bad.json: intra_node.all_reduce.latency_us: must be <= 1e+15, a bound on every figure that keeps "
        "the plan's sums finite (got 2e+15)");
    // gpu.expert_memory_efficiency_by_rows of two points (r1, e1), (r2, e2).
    auto rows = [](double r1, double e1, double r2, double e2) {
        return [=](json& d) {
            d["gpu"]["expert_memory_efficiency_by_rows"] =
                json{{"points",
                      {{{"rows_per_expert", r1}, {"efficiency", e1}},
                       {{"rows_per_expert", r2}, {"efficiency", e2}}}}};
        };
    };
    EXPECT_EQ(error_after(rows(4, 0.7, 1, 0.4)),
              "bad.json: gpu.expert_memory_efficiency_by_rows.points[1].rows_per_expert: must be strictly "
              "ascending");
    EXPECT_EQ(error_after(rows(1, 0.4, 4, 1.2)),
              "bad.json: gpu.expert_memory_efficiency_by_rows.points[1].efficiency: must be > 0 and <= 1 "
              "(got 1.2)");
    EXPECT_EQ(error_after(rows(0, 0.4, 4, 0.7)),
              "bad.json: gpu.expert_memory_efficiency_by_rows.points[0].rows_per_expert: must be > 0 "
              "(got 0)");
    EXPECT_EQ(error_after(rows(1, 0.4, 4, 0.7)), "(parsed)");
    EXPECT_EQ(error_after([](json& d) {
                  d["gpu"]["expert_memory_efficiency_by_rows"] = json{{"points", json::array()}};
              }),
              "bad.json: gpu.expert_memory_efficiency_by_rows.points: expected a non-empty array of "
              "{\"rows_per_expert\": r, \"efficiency\": e}");
    EXPECT_EQ(error_after([](json& d) {
                  d["gpu"]["expert_memory_efficiency_by_rows"] =
                      json{{"points", {{{"rows", 1}, {"efficiency", 0.4}}}}};
              }),
              "bad.json: gpu.expert_memory_efficiency_by_rows.points[0].rows: unknown key");
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["expert_memory_efficiency_by_rows"] = 0.5; }),
              "bad.json: gpu.expert_memory_efficiency_by_rows: expected an object");
    EXPECT_EQ(error_after([](json& d) { d["intra_node"]["kind"] = "infiniband"; }),
              "bad.json: intra_node.kind: 'infiniband' is not one of nvlink, pcie_p2p, pcie_no_p2p");
    EXPECT_EQ(error_after([](json& d) { d["intra_node"]["all_to_all"]["latency_us"] = "fast"; }),
              "bad.json: intra_node.all_to_all.latency_us: expected a number or {\"value\": ..., "
              "\"provenance\": ..., "
              "\"source\": ...}");
    EXPECT_EQ(error_after([](json& d) {
                  d["gpu"]["bf16_tflops"] = json{{"value", 100}, {"provenance", "guess"}};
              }),
              "bad.json: gpu.bf16_tflops.provenance: 'guess' is not one of datasheet, measured, estimate");
    EXPECT_EQ(error_after([](json& d) {
                  d["intra_node"]["all_reduce"]["tables"] =
                      json::array({json{{"ranks", 8}, {"points", {{1024, 5.0}, {512, 6.0}}}}});
              }),
              "bad.json: intra_node.all_reduce.tables[0].points[1]: sizes must be strictly ascending");
    // Several tables, one per group size, in ascending order.
    const json t2 = {{"ranks", 2}, {"points", {{1024, 50.0}, {4096, 52.0}}}};
    const json t4 = {{"ranks", 4}, {"points", {{1024, 260.0}, {4096, 150.0}}}};
    EXPECT_EQ(error_after([&](json& d) { d["intra_node"]["all_gather"]["tables"] = json::array({t2, t4}); }),
              "(parsed)");
    EXPECT_EQ(error_after([&](json& d) { d["intra_node"]["all_gather"]["tables"] = json::array({t2, t2}); }),
              "bad.json: intra_node.all_gather.tables[1].ranks: a second table at 2 ranks (one table per "
              "group size)");
    EXPECT_EQ(error_after([&](json& d) { d["intra_node"]["all_gather"]["tables"] = json::array({t4, t2}); }),
              "bad.json: intra_node.all_gather.tables[1].ranks: group sizes must be strictly ascending (2 "
              "after 4)");
    EXPECT_EQ(error_after([](json& d) { d["intra_node"]["all_gather"]["tables"] = json::array(); }),
              "bad.json: intra_node.all_gather.tables: expected a non-empty array of {\"ranks\", "
              "\"points\", ...} (omit the key for none)");
    EXPECT_EQ(error_after([](json& d) {
                  d["intra_node"]["all_gather"]["tables"] = json::array({json{{"ranks", 1}}});
              }),
              "bad.json: intra_node.all_gather.tables[0].ranks: expected an integer >= 2");
    // The single "table" of earlier profiles: refused, saying what replaces it.
    EXPECT_EQ(error_after([&](json& d) { d["intra_node"]["all_gather"]["table"] = t2; }),
              "bad.json: intra_node.all_gather.table: replaced by \"tables\": [{\"ranks\": n, \"points\": "
              "...}, ...], one table per group size; put the object in a one-element array");
    EXPECT_EQ(error_after([](json& d) { d["schema"] = "epinfer.hardware_profile/2"; }),
              "bad.json: schema: 'epinfer.hardware_profile/2' is not 'epinfer.hardware_profile/1'");
    EXPECT_EQ(error_after([](json& d) { d.erase("inter_node"); }), "(parsed)");  // optional
    EXPECT_EQ(error_after([](json& d) { d["gpu"]["note_datasheet"] = "a comment"; }), "(parsed)");

    auto malformed = parse_hardware_profile("{\"schema\": ", "broken.json");
    ASSERT_FALSE(malformed.is_ok());
    EXPECT_EQ(malformed.status().message().rfind("broken.json: malformed JSON: ", 0), 0u);
    // The parser's position, without nlohmann::json's "[json.exception...]" tag (as for config.json).
    EXPECT_EQ(malformed.status().message().find("[json.exception"), std::string::npos)
        << malformed.status().message();
    EXPECT_EQ(malformed.status().message().find('\n'), std::string::npos);
}

TEST(HardwareProfile, ResolvesNamesAndFiles) {
    auto by_file = resolve_hardware_profile(kProfilesDir + "/b200.json", "");
    ASSERT_TRUE(by_file.is_ok()) << by_file.status().message();
    EXPECT_EQ(by_file->name, "b200");
    // A name, through the folder next to a (pretend) executable build-x/tools/epinfer/epinfer.
    auto by_name = resolve_hardware_profile("l40s", kProfilesDir + "/../build-x/tools/epinfer/epinfer");
    ASSERT_TRUE(by_name.is_ok()) << by_name.status().message();
    EXPECT_EQ(by_name->name, "l40s");
    auto unknown = resolve_hardware_profile("a100", kProfilesDir + "/../build-x/tools/epinfer/epinfer");
    ASSERT_FALSE(unknown.is_ok());
    EXPECT_NE(
        unknown.status().message().find("unknown hardware profile 'a100'; shipped profiles: b200, h100_sxm, "
                                        "h200_sxm, l40s, rtx_4090, rtx_pro_6000"),
        std::string::npos)
        << unknown.status().message();
    EXPECT_EQ(resolve_hardware_profile("/nonexistent/x.json", "").status().code(), StatusCode::kNotFound);
    // A folder, a device or a FIFO given as the file: said so, not "malformed JSON", and never read (reading
    // /dev/zero or a FIFO would not end).
    const std::string folder = ::testing::TempDir();
    const std::string fifo = folder + "/epinfer_profile_fifo.json";
    std::filesystem::remove(fifo);
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    for (const auto& [path, what] :
         {std::pair{folder, ": is a directory, not a file (a hardware profile is a JSON file)"},
          std::pair{std::string("/dev/zero"), ": is a character device, not a regular file"},
          std::pair{fifo, ": is a FIFO, not a regular file"}}) {
        auto loaded = load_hardware_profile_file(path);
        ASSERT_FALSE(loaded.is_ok()) << path;
        EXPECT_NE(loaded.status().message().find(path + what), std::string::npos)
            << loaded.status().message();
        EXPECT_FALSE(resolve_hardware_profile(path, "").is_ok()) << path;
    }
    std::filesystem::remove(fifo);
}

}  // namespace
}  // namespace epinfer::planner
