// epinfer bench moe: one MoE layer on the GPU at real model shapes against the H200's speed of light
// (backend/cuda/moe_bench.h says what is timed and how bytes, FLOPs and SOL are counted).
//   epinfer bench moe                                   # the four shapes of tests/data/configs, every size
//   epinfer bench moe --model-config tests/data/configs/qwen3_30b_a3b.json --tokens 1,64 --routing zipf
//   epinfer bench moe --json moe.json                   # for bench/moe_peers.py --epinfer-json moe.json
// Prints the ceilings measured in the same run (read-only stream over 4 GiB, cuBLAS bf16 GEMM), then one
// row per (shape, routing, tokens). Without a GPU (or without -DEPINFER_CUDA=ON) it exits with one line.
// --profile-out writes the base profile with gpu.matmul_efficiency = GEMM TFLOP/s / bf16_tflops and, from
// the layers of one --model-config under uniform routing at ≥ 2 sizes ≤ 256 tokens and at 1024, the
// engine fit (planner/calibration.h fit_moe_engine): gpu.memory_efficiency, gpu.expert_matmul_efficiency,
// gpu.kernel_latency_us, gpu.expert_memory_efficiency_by_rows (at each size ≤ 256's rows per touched expert)
// and gpu.expert_matmul_efficiency_by_rows (at each size ≥ 1024's);
// without those rows gpu.memory_efficiency = stream GB/s / memory_bandwidth_gbps and one line says what was
// not fitted and why (profile_out.h, docs/planner.md).
// e.g. --model-config tests/data/configs/qwen3_30b_a3b.json --routing uniform --tokens 1,8,64,256,1024.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/hf_config.h"
#include "comma_list.h"
#include "commands.h"
#include "flag_values.h"
#include "planner/calibration.h"
#include "planner/hardware_profile.h"
#include "profile_out.h"
#if EPINFER_WITH_CUDA
#include "backend/cuda/moe_bench.h"
#include "bench_ceilings.h"
#endif

namespace epinfer::cli {
namespace {

struct BenchMoeOptions {
    std::vector<std::string> model_configs = {
        "tests/data/configs/kimi_k2_instruct_0905.json", "tests/data/configs/deepseek_v3.json",
        "tests/data/configs/qwen3_30b_a3b.json", "tests/data/configs/mixtral_8x7b.json"};
    // --tokens and --routing as given (comma-separated lists, split by check_options).
    std::vector<std::string> tokens = {"1,8,64,256,1024,4096,16384"};
    std::vector<std::string> routings = {"uniform,zipf"};
    int repeats = 20;
    uint64_t seed = 1;
    int64_t narrow_max_rows = -1;  // -1: the layer's default
    std::string json_path;
    std::string profile_out;   // write a hardware profile with the measured ceilings here
    std::string base_profile;  // ... starting from this one (name or file), required with profile_out
};

// The flags, checked and parsed.
struct CheckedOptions {
    std::vector<int64_t> tokens;
    std::vector<std::string> routings;  // each "uniform" or "zipf"
    BaseProfile base;                   // of --profile-out
};

// The flags every build checks before any GPU work: routings, token counts, repeats, the --json file, and
// the base profile of --profile-out (read here). Errors: kInvalidArgument naming the flag;
// load_base_profile's.
Result<CheckedOptions> check_options(const BenchMoeOptions& opts) {
    CheckedOptions c;
    EPI_ASSIGN_OR_RETURN(c.routings, split_comma_lists(opts.routings, "bench moe", "--routing",
                                                       "uniform, zipf, or both, comma-separated"));
    for (const std::string& r : c.routings) {
        if (r != "uniform" && r != "zipf") return invalid_argument(fmt::format("--routing {}: expected uniform or zipf", r));
    }
    EPI_ASSIGN_OR_RETURN(c.tokens, parse_comma_ints(opts.tokens, "bench moe", "--tokens"));
    for (int64_t t : c.tokens) {
        if (t < 1) return invalid_argument(fmt::format("--tokens {}: must be at least 1", t));
    }
    if (opts.repeats < 1) return invalid_argument(fmt::format("--repeats {}: must be at least 1", opts.repeats));
    if (!opts.json_path.empty()) EPI_RETURN_IF_ERROR(check_output_file("--json", opts.json_path));
    if (!opts.profile_out.empty()) {
        EPI_ASSIGN_OR_RETURN(c.base, load_base_profile(opts.profile_out, opts.base_profile));
    } else if (!opts.base_profile.empty()) {
        return invalid_argument("--base-profile is used only with --profile-out FILE.json");
    }
    return c;
}

#if EPINFER_WITH_CUDA
using cuda::MoeBenchRow;

Result<ModelConfig> read_config(const std::string& path) {
    std::ifstream in(path);
    if (!in) return not_found(fmt::format("--model-config {}: cannot open the file", path));
    std::stringstream text;
    text << in.rdbuf();
    return parse_hf_config(text.str(), path);
}

Result<cuda::MoeBenchShape> shape_of(const std::string& path) {
    EPI_ASSIGN_OR_RETURN(ModelConfig mc, read_config(path));
    if (mc.n_routed_experts <= 0) return invalid_argument(fmt::format("--model-config {}: not an MoE model", path));
    if (mc.shared_expert_intermediate_size > 0) {
        return not_supported(fmt::format("--model-config {}: the sigmoid-gated shared expert (Qwen2-MoE) is not "
                                         "in the CUDA MoE layer yet", path));
    }
    cuda::MoeBenchShape shape;
    shape.name = std::filesystem::path(path).stem().string();
    cuda::CudaMoeLayerConfig& c = shape.layer;
    c.hidden = mc.hidden_size;
    c.intermediate = mc.moe_intermediate_size;
    c.num_experts = mc.n_routed_experts;
    c.top_k = mc.router.num_experts_per_tok;
    c.shared_intermediate = mc.n_shared_experts * mc.moe_intermediate_size;
    c.scoring_func = mc.router.scoring_func;
    c.topk_method = mc.router.topk_method;
    c.n_group = mc.router.n_group;
    c.topk_group = mc.router.topk_group;
    c.norm_topk_prob = mc.router.norm_topk_prob;
    c.routed_scaling_factor = static_cast<float>(mc.router.routed_scaling_factor);
    return shape;
}

double sol(double bytes, double flops, double time_us) {
    const double floor_s = std::max(bytes / cuda::kH200PeakBytesPerS, flops / cuda::kH200PeakBf16FlopsPerS);
    return time_us > 0 ? floor_s / (time_us * 1e-6) : 0.0;
}

void print_row(const MoeBenchRow& r) {
    const double gbps = r.weight_bytes / (r.time_us * 1e-6) / 1e9;
    const double tflops = r.flops / (r.time_us * 1e-6) / 1e12;
    fmt::print("{:<24} {:<7} {:>6} {:>5} {:>9.3f} {:>10.1f} {:>10.1f} {:>7.0f} {:>7.1f} {:>5.2f} {:>10.1f} {:>5.2f}  {}{}\n",
               r.shape, cuda::moe_bench_routing_name(r.routing), r.tokens, r.experts_touched, r.weight_bytes / 1e9,
               r.flops / 1e9, r.time_us, gbps, tflops, sol(r.weight_bytes, r.flops, r.time_us), r.routed_time_us,
               sol(r.routed_weight_bytes, r.routed_flops, r.routed_time_us), r.tiling,
               r.routing_exact ? "" : "  ROUTING MISMATCH: " + r.routing_note);
    std::fflush(stdout);
}

nlohmann::json row_json(const MoeBenchRow& r, const cuda::CudaMoeLayerConfig& c) {
    return {{"shape", r.shape},
            {"routing", cuda::moe_bench_routing_name(r.routing)},
            {"tokens", r.tokens},
            {"hidden", c.hidden},
            {"intermediate", c.intermediate},
            {"num_experts", c.num_experts},
            {"top_k", c.top_k},
            {"n_group", c.n_group},
            {"topk_group", c.topk_group},
            {"grouped_routing", c.topk_method != TopkMethod::kGreedy && c.topk_group < c.n_group},
            {"shared_intermediate", c.shared_intermediate},
            {"experts_touched", r.experts_touched},
            {"weight_bytes", r.weight_bytes},
            {"flops", r.flops},
            {"time_us", r.time_us},
            {"graph_nodes", r.graph_nodes},
            {"sol", sol(r.weight_bytes, r.flops, r.time_us)},
            {"routed_weight_bytes", r.routed_weight_bytes},
            {"routed_flops", r.routed_flops},
            {"routed_time_us", r.routed_time_us},
            {"routed_sol", sol(r.routed_weight_bytes, r.routed_flops, r.routed_time_us)},
            {"routing_exact", r.routing_exact},
            {"routing_note", r.routing_note},
            {"tiling", r.tiling}};
}

// The layers the engine fit takes: those of the one shape under uniform routing, tokens ascending.
// Errors: kInvalidArgument naming what the run lacks (several shapes, no uniform routing).
Result<planner::MeasuredMoeEngine> engine_layers(const std::vector<cuda::MoeBenchShape>& shapes,
                                                 const std::vector<MoeBenchRow>& rows) {
    if (shapes.size() != 1) {
        return invalid_argument(fmt::format("{} --model-config shapes, the fit takes one", shapes.size()));
    }
    planner::MeasuredMoeEngine engine{shapes[0].name, {}};
    for (const MoeBenchRow& r : rows) {
        if (r.routing != cuda::MoeBenchRouting::kUniform) continue;
        const double pairs = static_cast<double>(r.tokens * shapes[0].layer.top_k);
        const double rows_per_expert = r.experts_touched > 0 ? pairs / static_cast<double>(r.experts_touched) : 0;
        engine.layers.push_back({r.tokens, r.weight_bytes, r.flops, r.time_us, r.graph_nodes, rows_per_expert});
    }
    if (engine.layers.empty()) return invalid_argument("no uniform routing (--routing uniform)");
    std::sort(engine.layers.begin(), engine.layers.end(),
              [](const auto& a, const auto& b) { return a.tokens < b.tokens; });
    return engine;
}

// Writes --profile-out: the ceilings, and the engine fit when the run has what it needs (else one line
// saying which figures were not fitted and why).
Status write_profile(const BenchMoeOptions& opts, const BaseProfile& base, const cuda::MoeBenchCeilings& ceil,
                     const std::vector<cuda::MoeBenchShape>& shapes, const std::vector<MoeBenchRow>& rows) {
    planner::Calibration cal;
    cal.source =
        fmt::format("{}, GPU {}, driver {}", calibration_source(), ceil.gpu_name, ceil.driver_version);
    cal.gpu_ceilings.push_back({ceil.stream_read_gbps, ceil.gemm_tflops});
    EPI_ASSIGN_OR_RETURN(planner::HardwareProfile profile,
                         planner::parse_hardware_profile(base.text, base.path));
    Result<planner::MeasuredMoeEngine> engine = engine_layers(shapes, rows);
    Result<planner::MoeEngineFit> fit = engine.status();
    if (engine.is_ok()) fit = planner::fit_moe_engine(engine->layers, profile.gpu.graph_kernel_us.value);
    if (fit.is_ok()) {
        cal.moe_engine.push_back(*engine);
        fmt::print(
            "--profile-out {}: engine fit over {}: {:.1f} GB/s, latency {:.2f} us over {} graph nodes at "
            "T {} ({:.2f} us per kernel beyond gpu.graph_kernel_us), {:.1f} TFLOP/s at T {}\n",
            opts.profile_out, engine->shape, fit->layers.bandwidth_gbps, fit->layers.latency_us, fit->kernels,
            fit->tokens, fit->kernel_latency_us, fit->layers.expert_tflops,
            planner::kMoeFitComputeBoundTokens);
    } else {
        fmt::print(
            "--profile-out {}: gpu.expert_matmul_efficiency, gpu.kernel_latency_us and the tables by rows "
            "not fitted (kept from the base), gpu.memory_efficiency from the read-only stream: {} (the engine "
            "fit needs one --model-config, uniform routing, >= 2 sizes <= {} tokens and {})\n",
            opts.profile_out, fit.status().message(), planner::kMoeFitMaxMemoryBoundTokens,
            planner::kMoeFitComputeBoundTokens);
    }
    return write_calibrated_profile(opts.profile_out, base, cal);
}

Status run_bench_moe(const BenchMoeOptions& opts) {
    EPI_ASSIGN_OR_RETURN(const CheckedOptions checked, check_options(opts));
    const BaseProfile& base = checked.base;
    cuda::MoeBenchOptions bench;
    bench.tokens = checked.tokens;
    bench.repeats = opts.repeats;
    bench.seed = opts.seed;
    bench.routings.clear();
    for (const std::string& r : checked.routings) {
        bench.routings.push_back(r == "uniform" ? cuda::MoeBenchRouting::kUniform : cuda::MoeBenchRouting::kZipf);
    }
    std::vector<cuda::MoeBenchShape> shapes;
    for (const std::string& path : opts.model_configs) {
        EPI_ASSIGN_OR_RETURN(cuda::MoeBenchShape shape, shape_of(path));
        if (opts.narrow_max_rows >= 0) shape.layer.narrow_max_rows_per_expert = opts.narrow_max_rows;
        shapes.push_back(shape);
    }
    EPI_ASSIGN_OR_RETURN(cuda::MoeBenchCeilings ceil, cuda::cuda_bench_ceilings());
    print_bench_ceilings(ceil);
    fmt::print("{:<24} {:<7} {:>6} {:>5} {:>9} {:>10} {:>10} {:>7} {:>7} {:>5} {:>10} {:>5}  {}\n", "shape", "routing",
               "T", "exp", "GB", "GFLOP", "time_us", "GB/s", "TFLOP/s", "SOL", "routed_us", "rSOL", "tiling");
    nlohmann::json doc = bench_ceilings_json(ceil);
    doc["repeats"] = opts.repeats;
    doc["seed"] = opts.seed;
    doc["rows"] = nlohmann::json::array();
    std::vector<MoeBenchRow> rows;
    for (const cuda::MoeBenchShape& shape : shapes) {
        auto result = cuda::cuda_bench_moe(shape, bench);
        if (!result.is_ok()) return result.status().with_context(fmt::format("bench moe {}", shape.name));
        for (const MoeBenchRow& row : result.value()) {
            print_row(row);
            doc["rows"].push_back(row_json(row, shape.layer));
            rows.push_back(row);
        }
    }
    if (!opts.profile_out.empty()) EPI_RETURN_IF_ERROR(write_profile(opts, base, ceil, shapes, rows));
    if (!opts.json_path.empty()) {
        std::ofstream out(opts.json_path);
        out << doc.dump(2) << "\n";
        if (!out) return not_found(fmt::format("--json {}: cannot write the file", opts.json_path));
    }
    return Status::ok();
}
#else
Status run_bench_moe(const BenchMoeOptions& opts) {
    EPI_RETURN_IF_ERROR(check_options(opts).status());
    return not_supported("bench moe: this epinfer was built without the CUDA backend (configure with -DEPINFER_CUDA=ON)");
}
#endif

}  // namespace

void add_bench_moe_command(CLI::App& bench) {
    auto opts = std::make_shared<BenchMoeOptions>();
    CLI::App* moe = bench.add_subcommand("moe", "one MoE layer on the GPU vs the H200's speed of light");
    moe->add_option("--model-config", opts->model_configs, "config.json of a model (repeatable)")
        ->capture_default_str();
    // Split by check_options, not CLI11 (whose ',' delimiter drops empty items: `--tokens 8,` ran as 8).
    moe->add_option("--tokens", opts->tokens, "token counts, comma-separated")->capture_default_str();
    moe->add_option("--routing", opts->routings, "uniform, zipf, or both (comma-separated)")->capture_default_str();
    moe->add_option("--repeats", opts->repeats, "timed repeats per size (median reported)")->capture_default_str();
    moe->add_option("--seed", opts->seed, "routing seed (bench/moe_peers.py uses the same)")
        ->check(CLI::Validator(  // before CLI11's strtoull, which takes "-1" as 2^64 - 1
            [](std::string& value) -> std::string {
                return value.rfind('-', 0) == 0 ? "'" + value + "' is negative; need 0 to 2^64 - 1" : "";
            },
            ""))
        ->capture_default_str();
    moe->add_option("--narrow-max-rows", opts->narrow_max_rows,
                    "tuning: decode-size tiles up to this many rows per expert (T·K/E); default: the layer's");
    moe->add_option("--json", opts->json_path, "also write the results to this JSON file");
    add_profile_out_options(
        *moe, opts->profile_out, opts->base_profile,
        "with cuBLAS's matmul efficiency and, for one --model-config with uniform routing at "
        ">= 2 sizes <= 256 tokens and at 1024, the engine's memory and expert-GEMM "
        "efficiencies, tables by rows and kernel latency (else the stream's memory efficiency)");
    moe->callback([opts] { exit_on_error(run_bench_moe(*opts)); });
}

}  // namespace epinfer::cli
