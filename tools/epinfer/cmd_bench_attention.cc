// epinfer bench attention: the CUDA backend's attention op at real model shapes, decode over a paged KV
// cache and causal prefill, against the H200's speed of light (backend/cuda/attention_bench.h says what is
// timed and how bytes and FLOPs are counted).
//   epinfer bench attention                              # the ten cases below, 20 repeats each
//   epinfer bench attention --cases decode --repeats 10 --json attn.json   # for bench/attention_peers.py
//   epinfer bench attention --profile-out h200.json --base-profile h200_sxm  # for plan --hardware
//   epinfer bench attention --cases decode --decode-sizes 64x1024,256x512    # decode at other sizes
// Cases (issue 4), GQA shapes of tests/data/configs (num_attention_heads / num_key_value_heads × head_dim):
// Qwen3-30B-A3B 32 / 4 × 128 and GLM-4.5 96 / 8 × 128, each at
//   decode:  batch 64 × context 4096 and batch 8 × context 32768 (one query token per sequence), and a
//            serving batch of short contexts, 256 × 256 (the engine's decode steps at 256 requests of
//            128 + 128 tokens), or the sizes of --decode-sizes;
//   prefill: 4096 and 16384 tokens of one sequence (causal);
// and MLA's absorbed decode over the latent cache (cases "mla"; kv_lora_rank 512 + qk_rope_head_dim 64 per
// token, V its first 512): Kimi K2 64 heads and DeepSeek-V3 128 heads, at the two decode sizes.
// The KV cache is bf16 (--kv-dtype; the engine's on GPUs), in blocks of the engine's block size, shuffled.
// Per case: the kernel, the median time, the KV bytes read (at the cache's dtype) and their bf16
// equivalent, GB/s, SOL = bytes / 4.8 TB/s / time on either,
// the fraction of the read-only stream ceiling measured in the same run, and the FLOPs with SOL = FLOPs /
// 989 TFLOP/s / time. Issue 4's targets: decode SOL on bf16 bytes ≥ 0.7, prefill SOL on FLOPs ≥ 0.35.
// --profile-out writes the base profile with gpu.prefill_attention_matmul_efficiency (the GQA prefill cases)
// and gpu.latent_attention_matmul_efficiency (the mla cases): each the cases' median TFLOP/s over the
// base's gpu.bf16_tflops (planner/calibration.h); its other figures stay the base's, so a profile written
// by `bench moe --profile-out` can be the base.
// Without a GPU (or without -DEPINFER_CUDA=ON) it exits with one line.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "comma_list.h"
#include "commands.h"
#include "engine/engine.h"
#include "flag_values.h"
#include "profile_out.h"
#if EPINFER_WITH_CUDA
#include "backend/cuda/attention_bench.h"
#include "backend/cuda/moe_bench.h"
#include "bench_ceilings.h"
#endif

namespace epinfer::cli {
namespace {

constexpr int kMaxRepeats = 10000;
constexpr double kDecodeTargetSol = 0.7;    // on bf16 KV bytes
constexpr double kPrefillTargetSol = 0.35;  // on causal FLOPs
constexpr std::string_view kCaseNames[] = {"default", "decode", "prefill", "mla"};  // default: all three

struct BenchAttentionOptions {
    std::string device = "cuda";
    std::vector<std::string> cases = {"default"};  // --cases as given: each a comma-separated list of kCaseNames
    int repeats = 20;
    std::string kv_dtype = "bf16";  // bf16 or fp32
    std::string json_path;
    std::string profile_out;   // write a hardware profile with the attention figures here
    std::string base_profile;  // ... starting from this one (name or file), required with profile_out
    // --decode-sizes as given: comma-separated BATCHxCONTEXT items; empty: the default sizes.
    std::vector<std::string> decode_sizes;
};

// A decode case's size: sequences × cached tokens each.
struct DecodeSize {
    int64_t batch = 0, context = 0;
};
constexpr int64_t kMaxDecodeTokens = int64_t{1} << 21;  // batch × context: 8 GiB of GLM-4.5's bf16 K/V

// The sizes of --decode-sizes (each value a comma-separated list of BATCHxCONTEXT, e.g. 64x1024).
// Errors: kInvalidArgument naming the item: not two integers around an 'x', one below 1, or a product above
// kMaxDecodeTokens.
Result<std::vector<DecodeSize>> parse_decode_sizes(const std::vector<std::string>& given) {
    EPI_ASSIGN_OR_RETURN(const std::vector<std::string> items,
                         split_comma_lists(given, "bench attention", "--decode-sizes",
                                           "BATCHxCONTEXT items, e.g. 64x4096,256x1024"));
    std::vector<DecodeSize> sizes;
    for (const std::string& item : items) {
        const size_t x = item.find('x');
        const auto side = [](const std::string& text) {
            return parse_flag_int(text, "--decode-sizes", 1, INT64_MAX);
        };
        const Result<int64_t> batch = side(item.substr(0, x)),
                              context = side(x == std::string::npos ? "" : item.substr(x + 1));
        if (!batch.is_ok() || !context.is_ok()) {
            return invalid_argument(
                fmt::format("bench attention: --decode-sizes item '{}': expected BATCHxCONTEXT, two integers "
                            "≥ 1 (e.g. 64x4096)",
                            item));
        }
        const DecodeSize size{batch.value(), context.value()};
        if (size.batch > kMaxDecodeTokens / size.context) {
            return invalid_argument(fmt::format(
                "bench attention: --decode-sizes item '{}': {} × {} cached tokens exceed the bench's {}",
                item, size.batch, size.context, kMaxDecodeTokens));
        }
        sizes.push_back(size);
    }
    return sizes;
}

// The case names of every --cases value (each split at its commas), in order.
// Errors: kInvalidArgument naming the value as given and its empty item or unknown name (exact, lower case).
Result<std::vector<std::string>> parse_cases(const std::vector<std::string>& given) {
    const std::string expected = fmt::format("a comma-separated list of: {}", fmt::join(kCaseNames, ", "));
    std::vector<std::string> names;
    for (const std::string& text : given) {
        EPI_ASSIGN_OR_RETURN(const std::vector<std::string> items,
                             split_comma_lists({text}, "bench attention", "--cases", expected));
        for (const std::string& name : items) {
            if (std::find(std::begin(kCaseNames), std::end(kCaseNames), name) == std::end(kCaseNames)) {
                return invalid_argument(fmt::format("bench attention: --cases '{}': unknown case name '{}' (expected {})",
                                                    text, name, expected));
            }
            names.push_back(name);
        }
    }
    return names;
}

// Every flag, before any GPU work and in every build: one line naming the flag and its value. Returns the
// base profile of --profile-out (read here; empty without it).
Result<BaseProfile> check_options(const BenchAttentionOptions& opts) {
    if (opts.device != "cuda") {
        return invalid_argument(fmt::format(
            "bench attention: --device {}: only cuda (the benchmark times the CUDA backend's attention op)",
            opts.device));
    }
    EPI_ASSIGN_OR_RETURN(const std::vector<std::string> names, parse_cases(opts.cases));
    EPI_RETURN_IF_ERROR(parse_decode_sizes(opts.decode_sizes).status());
    if (!opts.json_path.empty()) EPI_RETURN_IF_ERROR(check_output_file("--json", opts.json_path));
    if (opts.kv_dtype != "bf16" && opts.kv_dtype != "fp32") {
        return invalid_argument(
            fmt::format("bench attention: --kv-dtype '{}': expected bf16 or fp32", opts.kv_dtype));
    }
    if (opts.repeats < 1 || opts.repeats > kMaxRepeats) {
        return invalid_argument(fmt::format("bench attention: --repeats {}: must be in [1, {}]", opts.repeats,
                                            kMaxRepeats));
    }
    if (opts.profile_out.empty()) {
        if (!opts.base_profile.empty())
            return invalid_argument(
                "bench attention: --base-profile is used only with --profile-out FILE.json");
        return BaseProfile{};
    }
    if (opts.kv_dtype != "bf16") {
        return invalid_argument(fmt::format(
            "bench attention: --profile-out needs --kv-dtype bf16, the engine's KV cache on GPUs (got {})",
            opts.kv_dtype));
    }
    if (std::find_if(names.begin(), names.end(), [](const std::string& n) { return n != "decode"; }) ==
        names.end()) {
        return invalid_argument(
            fmt::format("bench attention: --profile-out needs prefill or mla cases (GQA decode is priced by "
                        "gpu.memory_efficiency; got --cases {})",
                        fmt::join(opts.cases, " --cases ")));
    }
    return load_base_profile(opts.profile_out, opts.base_profile);
}

#if EPINFER_WITH_CUDA
using cuda::AttentionBenchCase;
using cuda::AttentionBenchPhase;
using cuda::AttentionBenchRow;

struct GqaShape {
    const char* name;  // the stem of tests/data/configs/<name>.json
    int64_t num_heads, num_kv_heads, head_dim;
};
constexpr GqaShape kShapes[] = {{"qwen3_30b_a3b", 32, 4, 128}, {"glm_4_5", 96, 8, 128}};
struct MlaShape {
    const char* name;  // the stem of tests/data/configs/<name>.json
    int64_t num_heads;
};
constexpr MlaShape kMlaShapes[] = {{"kimi_k2_instruct_0905", 64}, {"deepseek_v3", 128}};
constexpr int64_t kMlaLatent = 512, kMlaRope = 64;  // kv_lora_rank, qk_rope_head_dim of both
constexpr DecodeSize kDecodeSizes[] = {{64, 4096}, {8, 32768}};
constexpr DecodeSize kServingDecodeSize = {256, 256};  // GQA only
constexpr int64_t kPrefillTokens[] = {4096, 16384};

// Whether the case names (parse_cases) select `phase`.
bool wanted(const std::vector<std::string>& names, const char* phase) {
    for (const std::string& c : names)
        if (c == "default" || c == phase) return true;
    return false;
}

// The cases `names` select; decode ones at `decode_sizes`, or (empty) at kDecodeSizes and, for GQA,
// kServingDecodeSize.
std::vector<AttentionBenchCase> cases_of(const std::vector<std::string>& names,
                                         const std::vector<DecodeSize>& decode_sizes) {
    std::vector<AttentionBenchCase> cases;
    auto add = [&](const GqaShape& s, AttentionBenchPhase phase, int64_t batch, int64_t context) {
        cases.push_back({s.name, phase, s.num_heads, s.num_kv_heads, s.head_dim, s.head_dim, batch, context});
    };
    std::vector<DecodeSize> gqa_sizes = decode_sizes, mla_sizes = decode_sizes;
    if (decode_sizes.empty()) {
        mla_sizes.assign(std::begin(kDecodeSizes), std::end(kDecodeSizes));
        gqa_sizes = mla_sizes;
        gqa_sizes.push_back(kServingDecodeSize);
    }
    if (wanted(names, "decode")) {
        for (const GqaShape& s : kShapes)
            for (const DecodeSize& size : gqa_sizes)
                add(s, AttentionBenchPhase::kDecode, size.batch, size.context);
    }
    if (wanted(names, "prefill")) {
        for (const GqaShape& s : kShapes)
            for (int64_t t : kPrefillTokens) add(s, AttentionBenchPhase::kPrefill, 1, t);
    }
    if (wanted(names, "mla")) {
        for (const MlaShape& s : kMlaShapes) {
            for (const DecodeSize& size : mla_sizes) {
                cases.push_back({s.name, AttentionBenchPhase::kDecode, s.num_heads, 1, kMlaLatent + kMlaRope,
                                 kMlaLatent, size.batch, size.context, /*v_in_k=*/true});
            }
        }
    }
    return cases;
}

struct RowFigures {
    double gbps, sol_actual, sol_bf16, stream_fraction, tflops, sol_flops, sol, target;
};

RowFigures figures(const AttentionBenchRow& r, double stream_gbps) {
    const double s = r.time_us * 1e-6;
    RowFigures f{};
    f.gbps = r.counts.kv_bytes / s / 1e9;
    f.sol_actual = r.counts.kv_bytes / cuda::kH200PeakBytesPerS / s;
    f.sol_bf16 = r.counts.kv_bytes_bf16 / cuda::kH200PeakBytesPerS / s;
    f.stream_fraction = stream_gbps > 0 ? f.gbps / stream_gbps : 0.0;
    f.tflops = r.counts.flops / s / 1e12;
    f.sol_flops = r.counts.flops / cuda::kH200PeakBf16FlopsPerS / s;
    const bool decode = r.c.phase == AttentionBenchPhase::kDecode;
    f.sol = decode ? f.sol_bf16 : f.sol_flops;
    f.target = decode ? kDecodeTargetSol : kPrefillTargetSol;
    return f;
}

void print_row(const AttentionBenchRow& r, const RowFigures& f) {
    fmt::print("{:<22} {:<7} {:>3}/{:<2} {:>3} {:>5} {:>6} {:>11.1f} {:>8.3f} {:>8.3f} {:>7.0f} {:>6.2f} {:>6.2f} "
               "{:>6.2f} {:>9.1f} {:>7.1f} {:>6.3f}  {:.2f} {} {:.2f}  {}\n",
               r.c.shape, cuda::attention_bench_phase_name(r.c.phase), r.c.num_heads, r.c.num_kv_heads,
               r.c.head_dim_qk, r.c.batch, r.c.context, r.time_us, r.counts.kv_bytes / 1e9,
               r.counts.kv_bytes_bf16 / 1e9, f.gbps, f.sol_actual, f.sol_bf16, f.stream_fraction,
               r.counts.flops / 1e9, f.tflops, f.sol_flops, f.sol, f.sol >= f.target ? ">=" : "<", f.target,
               r.kernel);
    std::fflush(stdout);
}

nlohmann::json row_json(const AttentionBenchRow& r, const RowFigures& f, int64_t kv_block_size) {
    return {{"shape", r.c.shape},
            {"phase", cuda::attention_bench_phase_name(r.c.phase)},
            {"num_heads", r.c.num_heads},
            {"num_kv_heads", r.c.num_kv_heads},
            {"head_dim_qk", r.c.head_dim_qk},
            {"head_dim_v", r.c.head_dim_v},
            {"batch", r.c.batch},
            {"context", r.c.context},
            {"num_tokens", r.counts.num_tokens},
            {"kv_block_size", kv_block_size},
            {"kernel", r.kernel},
            {"num_splits", r.num_splits},
            {"device_bytes", r.device_bytes},
            {"time_us", r.time_us},
            {"kv_bytes", r.counts.kv_bytes},
            {"kv_bytes_bf16", r.counts.kv_bytes_bf16},
            {"gbps", f.gbps},
            {"sol_actual", f.sol_actual},
            {"sol_bf16", f.sol_bf16},
            {"stream_fraction", f.stream_fraction},
            {"flops", r.counts.flops},
            {"tflops", f.tflops},
            {"sol_flops", f.sol_flops},
            {"sol", f.sol},
            {"target_sol", f.target}};
}

// Writes --profile-out: the prefill and latent cases' TFLOP/s as the planner's attention figures.
Status write_profile(const BenchAttentionOptions& opts, const BaseProfile& base,
                     const cuda::MoeBenchCeilings& ceil, const std::vector<AttentionBenchRow>& rows) {
    planner::Calibration cal;
    cal.source =
        fmt::format("{}, GPU {}, driver {}", calibration_source(), ceil.gpu_name, ceil.driver_version);
    for (const AttentionBenchRow& r : rows) {
        const bool prompt = r.c.phase == AttentionBenchPhase::kPrefill;
        const bool latent = r.c.v_in_k;  // the "mla" cases: MLA's latent cache
        const char* kind = latent ? "mla" : cuda::attention_bench_phase_name(r.c.phase);
        cal.attention.push_back({fmt::format("{} {} {} x {}", r.c.shape, kind, r.c.batch, r.c.context),
                                 latent, prompt, r.counts.flops, r.time_us});
    }
    EPI_RETURN_IF_ERROR(write_calibrated_profile(opts.profile_out, base, cal));
    fmt::print(
        "--profile-out {}: gpu.prefill_attention_matmul_efficiency and "
        "gpu.latent_attention_matmul_efficiency from the cases above (those without cases kept from the "
        "base)\n",
        opts.profile_out);
    return Status::ok();
}

Status run_bench_attention(const BenchAttentionOptions& opts) {
    EPI_ASSIGN_OR_RETURN(const BaseProfile base, check_options(opts));
    cuda::AttentionBenchOptions bench;
    bench.repeats = opts.repeats;
    bench.kv_block_size = EngineOptions{}.block_size;
    bench.kv_dtype = opts.kv_dtype == "fp32" ? DType::kF32 : DType::kBF16;
    EPI_ASSIGN_OR_RETURN(const std::vector<std::string> names, parse_cases(opts.cases));
    EPI_ASSIGN_OR_RETURN(const std::vector<DecodeSize> decode_sizes, parse_decode_sizes(opts.decode_sizes));
    const std::vector<AttentionBenchCase> cases = cases_of(names, decode_sizes);
    auto ceilings = cuda::cuda_bench_ceilings();
    if (!ceilings.is_ok()) return ceilings.status().with_context("bench attention");
    const cuda::MoeBenchCeilings& ceil = ceilings.value();
    print_bench_ceilings(ceil);
    fmt::print("KV cache {} in blocks of {} tokens (shuffled); median of {} graph replays after a 512 MiB L2 "
               "flush; targets: decode SOL_bf16 >= {:.2f}, prefill SOL_flop >= {:.2f}\n",
               opts.kv_dtype, bench.kv_block_size, opts.repeats, kDecodeTargetSol, kPrefillTargetSol);
    fmt::print("{:<22} {:<7} {:>6} {:>3} {:>5} {:>6} {:>11} {:>8} {:>8} {:>7} {:>6} {:>6} {:>6} {:>9} {:>7} "
               "{:>6}  {}\n",
               "shape", "phase", "Nh/kv", "D", "B", "ctx", "time_us", "KV_GB", "bf16_GB", "GB/s", "SOL", "SOLbf",
               "stream", "GFLOP", "TFLOP/s", "SOLfl", "issue SOL vs target  kernel");
    nlohmann::json doc = bench_ceilings_json(ceil);
    doc["bench"] = "attention";
    doc["repeats"] = opts.repeats;
    doc["kv_dtype"] = opts.kv_dtype;
    doc["kv_block_size"] = bench.kv_block_size;
    doc["rows"] = nlohmann::json::array();
    std::vector<AttentionBenchRow> rows;
    EPI_RETURN_IF_ERROR(cuda::cuda_bench_attention(cases, bench, [&](const AttentionBenchRow& row) {
        const RowFigures f = figures(row, ceil.stream_read_gbps);
        print_row(row, f);
        doc["rows"].push_back(row_json(row, f, bench.kv_block_size));
        rows.push_back(row);
    }));
    if (!opts.json_path.empty()) {
        std::ofstream out(opts.json_path);
        out << doc.dump(2) << "\n";
        if (!out) return not_found(fmt::format("--json {}: cannot write the file", opts.json_path));
    }
    if (!opts.profile_out.empty()) EPI_RETURN_IF_ERROR(write_profile(opts, base, ceil, rows));
    return Status::ok();
}
#else
Status run_bench_attention(const BenchAttentionOptions& opts) {
    EPI_RETURN_IF_ERROR(check_options(opts).status());
    return not_supported(
        "bench attention: this epinfer was built without the CUDA backend (configure with -DEPINFER_CUDA=ON)");
}
#endif

}  // namespace

void add_bench_attention_command(CLI::App& bench) {
    auto opts = std::make_shared<BenchAttentionOptions>();
    CLI::App* attn =
        bench.add_subcommand("attention", "the CUDA attention op (decode, prefill) vs the H200's speed of light");
    attn->add_option("--device", opts->device, "cuda (the only one benchmarked)")->capture_default_str();
    // Split by parse_cases, not CLI11 (whose ',' delimiter dropped empty items): errors name the value as given.
    attn->add_option("--cases", opts->cases, "default (all), decode, prefill or mla (comma-separated)")
        ->capture_default_str();
    attn->add_option("--repeats", opts->repeats, "timed repeats per case (median reported)")->capture_default_str();
    attn->add_option("--kv-dtype", opts->kv_dtype, "the KV cache's dtype: bf16 (the engine's on GPUs) or fp32")
        ->capture_default_str();
    attn->add_option("--decode-sizes", opts->decode_sizes,
                     "decode cases (GQA and mla) at these BATCHxCONTEXT sizes, comma-separated (default "
                     "64x4096,8x32768 and, for GQA, 256x256)");
    attn->add_option("--json", opts->json_path, "also write the results to this JSON file");
    add_profile_out_options(*attn, opts->profile_out, opts->base_profile,
                            "with the prefill and mla cases' attention efficiencies");
    attn->callback([opts] { exit_on_error(run_bench_attention(*opts)); });
}

}  // namespace epinfer::cli
