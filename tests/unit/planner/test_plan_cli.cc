// `epinfer plan` end to end: every config of tests/data/configs (gpt-oss included) on every shipped profile
// prints one valid JSON document, and bad inputs fail with one line and exit status 1.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "common/cli_runner.h"
#include "planner/hardware_profile.h"

namespace epinfer::planner {
namespace {

namespace fs = std::filesystem;

const std::string kConfigsDir = std::string(EPINFER_TEST_DATA_DIR) + "/configs";
const std::string kProfilesDir = std::string(EPINFER_TEST_DATA_DIR) + "/../../profiles";

using epinfer::testing::CliResult;
using epinfer::testing::expect_one_line_error;

std::string read_all(const fs::path& path) {
    return epinfer::testing::read_text_file(path);
}
fs::path scratch_dir() {
    return epinfer::testing::cli_scratch_dir("epinfer_plan_cli");
}

// Runs `epinfer plan ARGS` with the shipped profiles folder in EPINFER_PROFILES_DIR.
CliResult run_plan(const std::string& args) {
    epinfer::testing::CliOptions options;
    options.env = "EPINFER_PROFILES_DIR='" + kProfilesDir + "'";
    return epinfer::testing::run_epinfer("plan " + args, options);
}

TEST(PlanCli, EveryConfigOnEveryProfile) {
    std::vector<std::string> configs;
    for (const auto& e : fs::directory_iterator(kConfigsDir)) {
        if (e.path().extension() == ".json") configs.push_back(e.path().string());
    }
    std::sort(configs.begin(), configs.end());
    std::vector<std::string> profiles = list_profile_names(kProfilesDir);
    ASSERT_GE(configs.size(), 10u);
    ASSERT_EQ(profiles.size(), 6u);
    double slowest = 0.0;
    std::string slowest_case;
    for (const std::string& config : configs) {
        Result<ModelConfig> parsed = parse_hf_config(read_all(config), config);
        ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
        for (const std::string& profile : profiles) {
            SCOPED_TRACE(config + " on " + profile);
            CliResult r = run_plan("--model '" + config + "' --hardware " + profile + " --gpus 8 --json");
            if (r.seconds > slowest) {
                slowest = r.seconds;
                slowest_case = fs::path(config).filename().string() + " on " + profile;
            }
            // Generous bound (a loaded 2-core CI machine); typical runs take well under 0.1 s of CPU.
            EXPECT_LT(r.seconds, 10.0);
            ASSERT_EQ(r.exit_code, 0) << r.err;
            nlohmann::json doc;
            ASSERT_NO_THROW(doc = nlohmann::json::parse(r.out));
            EXPECT_EQ(doc["schema"], "epinfer.plan/1");
            ASSERT_FALSE(doc["layouts"].empty());
            EXPECT_EQ(doc["recommendations"].size(), 6u);
            for (const auto& layout : doc["layouts"]) {
                ASSERT_EQ(layout["decode"].size(), 6u);
                for (const auto& d : layout["decode"]) EXPECT_TRUE(d["tokens_per_s"].is_number());
            }
        }
    }
    std::cout << "slowest epinfer plan: " << slowest << " s (" << slowest_case << ")\n";
}

// gpt-oss-120b: MXFP4 routed experts and BF16 for everything else by default (its quantization_config;
// FACTS.md A.4 [S21]): 0.53125 bytes per expert parameter (4 bits + one 8-bit scale per 32), 2 per other
// parameter; 117B parameters in all (A.4 [S21]), 24.88M per expert and 114.7B in the experts (A.6).
TEST(PlanCli, GptOss120bBytesPerParameter) {
    CliResult r =
        run_plan("--model '" + kConfigsDir + "/gpt_oss_120b.json' --hardware h100_sxm --gpus 1 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json doc = nlohmann::json::parse(r.out);
    const nlohmann::json& model = doc["model"];
    EXPECT_EQ(model["model_type"], "gpt_oss");
    EXPECT_EQ(model["weights"]["routed_experts"], "mxfp4");
    EXPECT_EQ(model["weights"]["dense"], "bf16");
    const double total_params = model["total_params"].get<double>();
    EXPECT_NEAR(total_params, 117e9, 0.01 * 117e9);
    ASSERT_EQ(doc["layouts"].size(), 1u);  // one GPU: tp1
    const nlohmann::json& layout = doc["layouts"][0];
    const nlohmann::json& w = layout["memory"]["stages"][0]["weights_bytes"];
    const double expert_params = 36.0 * 128 * 3 * 2880 * 2880;
    EXPECT_NEAR(expert_params / 128 / 36, 24.88e6, 0.01e6);
    EXPECT_NEAR(expert_params, 114.7e9, 0.05e9);
    EXPECT_DOUBLE_EQ(w["routed_experts"].get<double>() / expert_params, 0.53125);
    const double other_params = total_params - expert_params;
    const double other_bytes = w["total"].get<double>() - w["routed_experts"].get<double>();
    EXPECT_DOUBLE_EQ(other_bytes / other_params, 2.0);
    // The whole checkpoint at these formats: about 0.56 bytes per parameter, 61 GiB: one 80 GB GPU holds it.
    EXPECT_NEAR(w["total"].get<double>() / total_params, 0.558, 0.005);
    EXPECT_TRUE(layout["memory"]["fits"].get<bool>());
}

TEST(PlanCli, KimiTextTable) {
    CliResult r = run_plan("--model '" + kConfigsDir +
                           "/kimi_k2_instruct_0905.json' --hardware rtx_pro_6000 --gpus 8 "
                           "--weight-dtype experts=int4,dense=bf16 --concurrency 1,64");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("rtx_pro_6000: 8× NVIDIA RTX PRO 6000 Blackwell"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("experts int4, dense bf16"), std::string::npos);
    EXPECT_NE(r.out.find("C=64"), std::string::npos);
    EXPECT_NE(r.out.find("recommended"), std::string::npos);

    CliResult bf16 = run_plan("--model '" + kConfigsDir +
                              "/kimi_k2_instruct_0905.json' --hardware rtx_pro_6000 "
                              "--gpus 8 --weight-dtype bf16");
    ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
    EXPECT_NE(bf16.out.find("nothing fits"), std::string::npos) << bf16.out;
    EXPECT_NE(bf16.out.find("routed experts"), std::string::npos) << bf16.out;
}

TEST(PlanCli, ModelFolder) {
    fs::path dir = scratch_dir() / "kimi_k2";
    fs::create_directories(dir);
    fs::copy_file(kConfigsDir + "/kimi_k2_instruct_0905.json", dir / "config.json",
                  fs::copy_options::overwrite_existing);
    CliResult r = run_plan("--model '" + dir.string() + "' --hardware h200_sxm --gpus 8 --json --layout tp8");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json doc = nlohmann::json::parse(r.out);
    EXPECT_EQ(doc["model"]["label"], "kimi_k2");
    EXPECT_EQ(doc["layouts"].size(), 1u);
}

TEST(PlanCli, ClosedLoopOnTheMeasuredProfile) {
    // The issue-6 comparison (docs/benchmarks/planner.md): a profile path, the fp32 KV the engine ran then
    // (--kv-cache-dtype fp32; the default is the engine's bf16 on GPUs), and with --output-len each cell is
    // the closed loop's median TPOT.
    const std::string qwen3 = "--model '" + kConfigsDir + "/qwen3_30b_a3b.json' --hardware '" + kProfilesDir +
                              "/measured/h200_epinfer_2026-11-29.json' --gpus 1 --concurrency 1,256 "
                              "--context 256 --input-len 128 --output-len 128 --json";
    CliResult r = run_plan(qwen3 + " --kv-cache-dtype fp32");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json doc = nlohmann::json::parse(r.out);
    EXPECT_EQ(doc["hardware"]["name"], "h200_sxm_measured");
    EXPECT_EQ(doc["options"]["kv_bytes_per_element"], 4);
    const CliResult bf16 = run_plan(qwen3);
    ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
    EXPECT_EQ(nlohmann::json::parse(bf16.out)["options"]["kv_bytes_per_element"], 2);
    // auto, the default of generate, serve and bench, is their cache on GPUs: bf16 (it was refused).
    const CliResult automatic = run_plan(qwen3 + " --kv-cache-dtype auto");
    ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
    EXPECT_EQ(automatic.out, bf16.out);
    const CliResult help = run_plan("--help");
    ASSERT_EQ(help.exit_code, 0) << help.err;
    EXPECT_NE(help.out.find("auto or bf16 (the engine's cache on GPUs: its auto is bf16 there)"),
              std::string::npos)
        << help.out;
    EXPECT_EQ(doc["options"]["output_len"], 128);
    EXPECT_EQ(doc["options"]["max_step_tokens"], 2048);
    const auto& decode = doc["layouts"][0]["decode"];
    ASSERT_EQ(decode.size(), 2u);
    for (const auto& d : decode) {
        ASSERT_TRUE(d.contains("closed_loop"));
        EXPECT_DOUBLE_EQ(d["tpot_ms"].get<double>(), d["closed_loop"]["tpot_ms"].get<double>());
    }
    // C = 256: 32,768 prompt tokens need at least 16 steps of 2048, then 127 decode steps.
    EXPECT_GE(decode[1]["closed_loop"]["mixed_steps"].get<int>(), 16);
    expect_one_line_error(run_plan("--model '" + kConfigsDir +
                                   "/qwen3_30b_a3b.json' --hardware h200_sxm --gpus 1 --output-len 1"),
                          "--output-len 1: must be 0 (no closed loop) or >= 2");
    expect_one_line_error(run_plan("--model '" + kConfigsDir +
                                   "/qwen3_30b_a3b.json' --hardware h200_sxm --gpus 1 --kv-cache-dtype fp16"),
                          "--kv-cache-dtype 'fp16': expected auto, bf16, fp32 or fp8");
}

TEST(PlanCli, ClosedLoopContextFollowsTheRequests) {
    // With --output-len and no --context, a request holds --input-len + --output-len tokens of KV: 1024
    // requests of 128 + 128 fit on 2× H200 (the bench's runs); --context 4096 says otherwise.
    const std::string args = "--model '" + kConfigsDir + "/qwen3_30b_a3b.json' --hardware '" + kProfilesDir +
                             "/measured/h200x2_nvlink_epinfer_2026-11-29.json' --gpus 2 --layout tp2,pp2 "
                             "--concurrency 1,1024 --input-len 128 --output-len 128 --json";
    CliResult r = run_plan(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json doc = nlohmann::json::parse(r.out);
    EXPECT_EQ(doc["options"]["context_tokens"], 256);
    for (const auto& layout : doc["layouts"]) {
        EXPECT_TRUE(layout["decode"][1]["kv_fits"].get<bool>()) << layout["spec"];
        // Two ranks: no decode graphs.
        EXPECT_FALSE(layout["decode"][0]["breakdown"]["decode_graph"].get<bool>());
    }
    // tp2 at one request: each all-reduce of one fp32 row (2048 · 4 = 8192 B) costs the measured 2-rank
    // table (queued_us) between 4096 B (52.9126 µs) and 16384 B (55.2279 µs), no more (the NCCL calls are
    // queued): 52.9126 + 4096 / 12288 · 2.3153 = 53.684366667 µs.
    EXPECT_EQ(doc["layouts"][0]["spec"], "tp2");
    int all_reduces = 0;
    for (const auto& c : doc["layouts"][0]["decode"][0]["breakdown"]["collectives"]) {
        EXPECT_FALSE(c.contains("sync_us_per_call"));
        if (c["kind"] != "all_reduce") continue;
        EXPECT_EQ(c["size_bytes"].get<double>(), 8192.0) << c["what"];
        EXPECT_NEAR(c["us_per_call"].get<double>(), 52.9126 + 4096.0 / 12288.0 * 2.3153, 1e-9) << c["what"];
        all_reduces += c["calls"].get<int>();
    }
    EXPECT_EQ(all_reduces, 2 * 48);  // attention and MoE, 48 layers
    // pp2 at one request: one micro-batch.
    EXPECT_EQ(doc["layouts"][1]["spec"], "pp2");
    EXPECT_EQ(doc["layouts"][1]["decode"][0]["breakdown"]["micro_batches"], 1);
    CliResult wide = run_plan(args + " --context 4096");
    ASSERT_EQ(wide.exit_code, 0) << wide.err;
    nlohmann::json wide_doc = nlohmann::json::parse(wide.out);
    EXPECT_EQ(wide_doc["options"]["context_tokens"], 4096);
    EXPECT_FALSE(wide_doc["layouts"][0]["decode"][1]["kv_fits"].get<bool>());
    expect_one_line_error(run_plan(args + " --context 0"), "--context 0: must be >= 1");
}

TEST(PlanCli, TwoRankGroupsOfAFourGpuProfileUseItsTwoRankTable) {
    // h200x4_nvlink_epinfer_2026-11-29.json carries all_reduce tables at 2 ranks (2-GPU run) and 4 ranks
    // (4-GPU run). Qwen3-235B-A22B's fp32 row is 4096 · 4 = 16384 B, a measured size of both: tp2-pp2
    // prices its all-reduces at the 2-rank 55.2279 µs, tp4 at the 4-rank 352.38735 µs.
    const std::string args = "--model '" + kConfigsDir + "/qwen3_235b_a22b.json' --hardware '" +
                             kProfilesDir +
                             "/measured/h200x4_nvlink_epinfer_2026-11-29.json' --gpus 4 --layout tp4,pp2-tp2 "
                             "--concurrency 1 --input-len 128 --output-len 128 --json";
    CliResult r = run_plan(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json doc = nlohmann::json::parse(r.out);
    std::map<std::string, double> us_per_call;
    for (const auto& layout : doc["layouts"]) {
        for (const auto& c : layout["decode"][0]["breakdown"]["collectives"]) {
            if (c["kind"] != "all_reduce") continue;
            EXPECT_EQ(c["size_bytes"].get<double>(), 16384.0) << layout["spec"] << c["what"];
            us_per_call[layout["spec"].get<std::string>()] = c["us_per_call"].get<double>();
        }
    }
    ASSERT_EQ(us_per_call.size(), 2u) << r.out.substr(0, 300);
    EXPECT_NEAR(us_per_call["tp4"], 352.38735, 1e-6);
    EXPECT_NEAR(us_per_call["pp2-tp2"], 55.2279, 1e-6);
}

TEST(PlanCli, DpAttentionPaysTheHostRoundTrips) {
    // Qwen3-235B-A22B dp4-ep4 on the 4× H200 NVLink profile: 94 MoE layers × 5 host round trips per step at
    // the profile's fitted host_round_trip_us; ep4 (no DP attention) has none. The explanation names them.
    // The fp32 KV cache the engine had when the figure was fitted (--kv-cache-dtype fp32).
    const std::string profile = kProfilesDir + "/measured/h200x4_nvlink_epinfer_2026-11-29.json";
    const std::string args = "--model '" + kConfigsDir + "/qwen3_235b_a22b.json' --gpus 4 --layout ep4,dp4-ep4 "
                             "--concurrency 1,8,64,256 --input-len 128 --output-len 128 --kv-cache-dtype fp32";
    CliResult r = run_plan(args + " --hardware '" + profile + "' --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json doc = nlohmann::json::parse(r.out);
    nlohmann::json fitted = nlohmann::json::parse(read_all(profile))["gpu"]["host_round_trip_us"];
    const double round_trip_us = fitted["value"].get<double>();
    ASSERT_GT(round_trip_us, 0.0);
    ASSERT_EQ(doc["layouts"][1]["spec"], "dp4-ep4");
    for (const auto& d : doc["layouts"][1]["decode"]) {
        EXPECT_EQ(d["breakdown"]["host_round_trips"], 94 * 5);
        EXPECT_NEAR(d["breakdown"]["host_us"].get<double>(), 94 * 5 * round_trip_us, 1e-6);
    }
    EXPECT_EQ(doc["layouts"][0]["decode"][0]["breakdown"]["host_round_trips"], 0);
    // Where they decide it, the explanation names them: at 200 µs a round trip dp4-ep4 loses at C = 1.
    fs::path slow = scratch_dir() / "h200x4_nvlink_slow_host.json";
    nlohmann::json slow_doc = nlohmann::json::parse(read_all(profile));
    slow_doc["gpu"]["host_round_trip_us"]["value"] = 200.0;
    std::ofstream(slow) << slow_doc.dump(2);
    CliResult text = run_plan(args + " --hardware '" + slow.string() + "'");
    ASSERT_EQ(text.exit_code, 0) << text.err;
    EXPECT_NE(text.out.find("loses at C=1: 470 host round trips"), std::string::npos) << text.out;

    // This planner's TPOT with the figure at 0, and the figure adds 0.470 ms of TPOT per µs (94 · 5 round
    // trips; 0.846 with the engine's nine before 2026-11-30's single upload). (The fit of
    // profiles/measured/make_h200xn_epinfer_profiles.py took 62.858, 68.203, 85.164, 96.403 ms from the
    // planner of its day, which counted the split-K counters' memset in every MoE layer; engine_facts.h
    // no longer does: the kGemv tile (≤ 4 rows) and most narrow grids launch none.)
    fs::path zero = scratch_dir() / "h200x4_nvlink_no_host_round_trip.json";
    nlohmann::json without = nlohmann::json::parse(read_all(profile));
    without["gpu"].erase("host_round_trip_us");
    std::ofstream(zero) << without.dump(2);
    CliResult at0 = run_plan(args + " --hardware '" + zero.string() + "' --json");
    ASSERT_EQ(at0.exit_code, 0) << at0.err;
    nlohmann::json doc0 = nlohmann::json::parse(at0.out);
    // At C = 1 one DP group of the four has the request: the MoE sees 1 token, not 4 (61.973 when the planner
    // gave every group the busiest one's rows), and its experts run in pick mode: no permute (56.1014 when
    // the planner counted it: 94 kernels at 2.0 + 7.42 µs). The engine of fdefb56 launches 7 kernels fewer
    // per layer (the residual adds inside the norms, one qk_norm_rope_kv_store for six ops): 94 · 7 at
    // 9.42 µs = 6.198 ms less than the 55.2160, 67.3175, 84.278, 95.594 ms counted before, with its bytes.
    // 77f1e2f's q, k, v in one launch saves 2 more per layer at ≤ 16 rows per rank (C = 1, 8, 64: 1, 2, 16
    // rows), 94 · 2 at 9.42 µs = 1.771 ms less than 49.0150, 61.1140, 78.0385; 64 rows at C = 256 as before.
    // At C = 1 the gemv reads the fp32 x (≤ 4 MoE tokens): 94 f32→bf16 kernels less than 47.2441, 0.8855 ms.
    // At C = 256 some steps carry prompt chunks beside decode rows: their scores are priced as two rooflines
    // (decode rows bound by KV bytes, prompt rows by FLOPs), 2.5 µs of TPOT more than one roofline of the
    // sums (89.1902). There (64 rows per rank) the stacked q, k and v are one f32→bf16 conversion and one
    // GEMM where they were three of each: 94 · 4 kernels at 9.42 µs and 4·2·H bytes a row of conversion
    // less, 3.607 ms less than 89.1927.
    const double predicted_at_0[] = {46.3586, 59.3430, 76.2676, 85.5862};
    for (size_t i = 0; i < 4; ++i) {
        const double tpot0 = doc0["layouts"][1]["decode"][i]["tpot_ms"].get<double>();
        EXPECT_NEAR(tpot0, predicted_at_0[i], 5e-4) << i;
        EXPECT_NEAR(doc["layouts"][1]["decode"][i]["tpot_ms"].get<double>() - tpot0, 0.470 * round_trip_us,
                    1e-6)
            << i;
    }
}

TEST(PlanCli, TableShowsHowEachStageSplitsAttentionAndExperts) {
    // The layout names keep serve's flags (tp8-dp2-ep4: 8 GPUs per stage, requests over 2, experts over 4);
    // the table also says what each GPU group holds: attention tp4 × dp2, experts tp2 × ep4.
    CliResult r = run_plan("--model '" + kConfigsDir + "/deepseek_v3.json' --hardware h200_sxm --gpus 8 "
                           "--layout tp8-dp2-ep4,ep8,dp8 --concurrency 1 --weight-dtype experts=int4");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("attn / MoE"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("tp8-dp2-ep4  tp4·dp2 / tp2·ep4"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("tp8 / ep8"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("dp8 / tp8"), std::string::npos) << r.out;
}

TEST(PlanCli, MemoryCellsStayInTheirColumnsForAnAbsurdKvPool) {
    // A pool of 10^11 tokens per rank misses by ~2 PiB per GPU: the free/GPU cell switches to T (or P) so
    // that it stays apart from weights/GPU (it printed "7.2G-2288696.8G").
    CliResult r = run_plan("--model '" + kConfigsDir +
                           "/qwen3_30b_a3b.json' --hardware h200_sxm --gpus 8 "
                           "--layout tp8 --concurrency 1 --kv-cache-tokens 99999999999");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    bool found = false;
    while (std::getline(lines, line)) {
        if (line.rfind("tp8 ", 0) != 0) continue;
        found = true;
        EXPECT_TRUE(std::regex_search(line, std::regex("[0-9]G +-[0-9]{1,4}\\.[0-9][TP] "))) << line;
    }
    EXPECT_TRUE(found) << r.out;
}

TEST(PlanCli, NotesCollectivesPricedPastTheProfilesTables) {
    // The 2-GPU measured profile has 2-rank tables only: planned for 4 GPUs, its 4-rank collectives come
    // from the fit, and the report says so (text and JSON); planned for 2 GPUs, nothing to note.
    const std::string profile = kProfilesDir + "/measured/h200x2_nvlink_epinfer_2026-11-30e.json";
    const std::string args = "--model '" + kConfigsDir + "/qwen3_30b_a3b.json' --hardware '" + profile +
                             "' --layout tp4 --concurrency 1";
    CliResult four = run_plan(args + " --gpus 4");
    ASSERT_EQ(four.exit_code, 0) << four.err;
    EXPECT_NE(
        four.out.find("note: intra_node.all_reduce at 4 ranks: the profile measured 2 ranks only; priced "
                      "from its fit (16.4 µs + bytes at 304 GB/s bus bandwidth)"),
        std::string::npos)
        << four.out;
    CliResult json = run_plan(args + " --gpus 4 --json");
    ASSERT_EQ(json.exit_code, 0) << json.err;
    EXPECT_FALSE(nlohmann::json::parse(json.out)["notes"].empty());
    CliResult two = run_plan("--model '" + kConfigsDir + "/qwen3_30b_a3b.json' --hardware '" + profile +
                             "' --layout tp2 --concurrency 1 --gpus 2 --json");
    ASSERT_EQ(two.exit_code, 0) << two.err;
    EXPECT_TRUE(nlohmann::json::parse(two.out)["notes"].empty()) << two.out;
}

TEST(PlanCli, KvCacheTokensAndMemoryFractionDecideTheFitAsTheEngine) {
    // Qwen3-235B-A22B dp4-ep4 on 4 H200 (docs/benchmarks/multi_gpu.md): at serve's defaults
    // (--memory-fraction 0.9 --kv-cache-tokens 0) the engine refused it with "dp4-ep4 does not fit: per rank,
    // weights 120.6 GiB + ... + KV of 40960 tokens (one request of max_position_embeddings) 14.7 GiB =
    // 137.4 GiB > usable 123.6 GiB" (0.9 of its free memory); with --memory-fraction 0.95
    // --kv-cache-tokens 16384 it ran. The plan runs the same check on the profile's memory, with the fp32 KV
    // cache the engine had then (--kv-cache-dtype fp32).
    const std::string args = "--model '" + kConfigsDir + "/qwen3_235b_a22b.json' --hardware '" + kProfilesDir +
                             "/measured/h200x4_nvlink_epinfer_2026-11-29.json' --gpus 4 --layout dp4-ep4 "
                             "--concurrency 1,256 --input-len 128 --output-len 128 --kv-cache-dtype fp32 "
                             "--json";
    CliResult refused = run_plan(args + " --memory-fraction 0.9 --kv-cache-tokens 0");
    ASSERT_EQ(refused.exit_code, 0) << refused.err;
    nlohmann::json doc = nlohmann::json::parse(refused.out);
    const nlohmann::json& no = doc["layouts"][0];
    EXPECT_FALSE(no["fits"].get<bool>());
    EXPECT_FALSE(doc["any_fits"].get<bool>());
    const std::string refusal = no["refusal"].get<std::string>();
    EXPECT_EQ(refusal.rfind("dp4-ep4 does not fit: per rank, weights 120.6 GiB + ", 0), 0u) << refusal;
    EXPECT_NE(refusal.find("KV of 40960 tokens (one request of max_position_embeddings) 14.7 GiB = 137.4 GiB > "
                           "usable 126.4 GiB = 0.9 × 140.4 GiB"),
              std::string::npos)
        << refusal;
    EXPECT_EQ(doc["memory_verdict"], "nothing fits: " + refusal);
    // A refused layout holds no KV and no request, and the recommendation names the refusal (not the weights).
    EXPECT_EQ(no["memory"]["kv_tokens_per_rank"], 0);
    EXPECT_EQ(no["memory"]["max_requests"], 0);
    for (const nlohmann::json& d : no["decode"]) EXPECT_FALSE(d["kv_fits"].get<bool>());
    for (const nlohmann::json& r : doc["recommendations"]) EXPECT_EQ(r["reason"], doc["memory_verdict"]);

    CliResult runs = run_plan(args + " --memory-fraction 0.95 --kv-cache-tokens 16384");
    ASSERT_EQ(runs.exit_code, 0) << runs.err;
    doc = nlohmann::json::parse(runs.out);
    const nlohmann::json& yes = doc["layouts"][0];
    EXPECT_TRUE(yes["fits"].get<bool>());
    EXPECT_EQ(yes["refusal"], "");
    EXPECT_EQ(doc["options"]["memory_fraction"], 0.95);
    EXPECT_EQ(doc["options"]["kv_cache_tokens"], 16384);
    EXPECT_EQ(doc["hardware"]["usable_memory_fraction"]["value"], 0.95);
    // The engine's pool: 16,384 tokens per rank hold C = 256's 64 requests of 256 tokens; each stage reports
    // that pool (not the room left).
    EXPECT_EQ(yes["memory"]["kv_tokens_per_rank"], 16384);
    for (const nlohmann::json& st : yes["memory"]["stages"]) {
        EXPECT_EQ(st["kv_tokens"], 16384);
        EXPECT_EQ(st["kv_cache_bytes"], 16384 * st["kv_bytes_per_token"].get<int64_t>());
    }
    EXPECT_EQ(yes["memory"]["max_requests"], 4 * 16384 / 256);
    EXPECT_TRUE(yes["decode"][1]["kv_fits"].get<bool>());

    // A pool no GPU holds: refused, and the pool is the largest term in the JSON as in the refusal.
    CliResult huge = run_plan(args + " --kv-cache-tokens 99999999999");
    ASSERT_EQ(huge.exit_code, 0) << huge.err;
    doc = nlohmann::json::parse(huge.out);
    const nlohmann::json& over = doc["layouts"][0];
    EXPECT_FALSE(over["fits"].get<bool>());
    EXPECT_EQ(over["memory"]["largest_term"], "KV cache");
    EXPECT_NE(over["refusal"].get<std::string>().find("; largest term: KV "), std::string::npos)
        << over["refusal"];

    // Without the flags the plan's own rule: one request of --context (256) fits; the pool is what is left
    // at the profile's 92 %, too little for C = 256 (15,093 tokens per rank).
    CliResult own = run_plan(args);
    ASSERT_EQ(own.exit_code, 0) << own.err;
    doc = nlohmann::json::parse(own.out);
    EXPECT_TRUE(doc["layouts"][0]["fits"].get<bool>());
    EXPECT_TRUE(doc["options"]["kv_cache_tokens"].is_null());
    EXPECT_FALSE(doc["layouts"][0]["decode"][1]["kv_fits"].get<bool>());

    // The same parser as serve's: the same one-line errors as `generate` (which parses them for serve and
    // bench), before anything is read.
    const std::string generate = "generate --model '" + std::string(EPINFER_TEST_DATA_DIR) +
                                 "/fixtures/deepseek_v3_tiny' --prompt-ids 1 ";
    for (const std::string& flag :
         {std::string("--memory-fraction 1.5"), std::string("--memory-fraction 0"),
          std::string("--memory-fraction abc"), std::string("--kv-cache-tokens -1"),
          std::string("--kv-cache-tokens 1.5")}) {
        CliResult plan = run_plan(args + " " + flag);
        CliResult engine = epinfer::testing::run_epinfer(generate + flag);
        expect_one_line_error(plan, flag.substr(0, flag.find(' ')));
        EXPECT_EQ(plan.err, engine.err) << flag;
    }
}

TEST(PlanCli, BadInputsFailInOneLine) {
    const std::string kimi = "--model '" + kConfigsDir + "/kimi_k2_instruct_0905.json' ";
    expect_one_line_error(
        run_plan(kimi + "--hardware a100 --gpus 8"),
        "unknown hardware profile 'a100'; shipped profiles: b200, h100_sxm, h200_sxm, l40s, "
        "rtx_4090, rtx_pro_6000");
    // EPINFER_PROFILES_DIR naming no folder is refused (it fell back to the shipped profiles in silence).
    epinfer::testing::CliOptions missing_dir;
    missing_dir.env = "EPINFER_PROFILES_DIR=/nonexistent-profiles";
    expect_one_line_error(
        epinfer::testing::run_epinfer("plan " + kimi + "--hardware h100_sxm --gpus 2", missing_dir),
        "EPINFER_PROFILES_DIR=/nonexistent-profiles: not a folder (hardware profile 'h100_sxm')");
    // A FIFO given as the config is refused unopened (reading it blocked until a writer came).
    const fs::path fifo = scratch_dir() / "fifo_config.json";
    fs::remove(fifo);
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    expect_one_line_error(run_plan("--model '" + fifo.string() + "' --hardware h200_sxm --gpus 8"),
                          "--model: " + fifo.string() + ": is a FIFO, not a regular file");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 0"), "--gpus 0: must be >= 1");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout tp3"), "layout tp3: ");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout zz8"), "layout 'zz8': ");
    // The layout as written ("pp1" is tp1 in the planner's own names).
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout pp1"), "layout pp1: ");
    // A malformed layout names the whole value and its fault ("tp-1" was "bad token 'tp'"); an empty item of
    // the list is refused, not dropped.
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout dp8-ep8,tp-1"),
                          "--layout 'tp-1': degree of 'tp' must be a positive integer (at most 999999) right "
                          "after it, got '-1'");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout tp8,"),
                          "plan: --layout 'tp8,' has an empty item");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout tp8-"),
                          "--layout 'tp8-': an empty token");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --nodes 3"), "--nodes 3");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --weight-dtype int3"),
                          "--weight-dtype 'int3'");
    expect_one_line_error(run_plan("--hardware h200_sxm --gpus 8"), "--model is required");
    // Requests the engine refuses: past the model's positions (Kimi K2: 262144), a KV pool under one block.
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --context 300000"),
                          "--context 300000: more than the model's max_position_embeddings 262144");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --input-len 262144 --output-len 8"),
                          "--input-len + --output-len 262152: more than the model's max_position_embeddings");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --kv-cache-tokens 15"),
                          "--kv-cache-tokens 15: holds no KV block of the engine's 16 tokens");
    // A prompt past the positions also without a closed loop; a context shorter than the closed loop's
    // requests; a step larger than the plan takes; a layout named twice.
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --input-len 300000"),
                          "--input-len 300000: more than the model's max_position_embeddings 262144");
    expect_one_line_error(
        run_plan(kimi + "--hardware h200_sxm --gpus 8 --input-len 100 --output-len 100 --context 50"),
        "--context 50: shorter than --input-len + --output-len = 200");
    // Without a closed loop too: a request holds its prompt (the default context grows to it instead).
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --context 1"),
                          "--context 1: shorter than --input-len 2048");
    EXPECT_EQ(run_plan(kimi + "--hardware h200_sxm --gpus 8 --input-len 8192").exit_code, 0);
    // The default prompt of 2048 tokens becomes half the positions of a model of a shorter context (the
    // bundled tiny checkpoint: 512); given, it is refused as above.
    const std::string tiny =
        "--model '" + std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/deepseek_v3_tiny' ";
    const CliResult short_context = run_plan(tiny + "--hardware h200_sxm --gpus 2 --json");
    ASSERT_EQ(short_context.exit_code, 0) << short_context.err;
    const nlohmann::json tiny_doc = nlohmann::json::parse(short_context.out);
    EXPECT_EQ(tiny_doc["options"]["input_len"], 256);
    EXPECT_EQ(tiny_doc["options"]["context_tokens"], 512);
    expect_one_line_error(run_plan(tiny + "--hardware h200_sxm --gpus 2 --input-len 2048"),
                          "--input-len 2048: more than the model's max_position_embeddings 512");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --max-step-tokens 99999999999"),
                          "--max-step-tokens 99999999999: must be in [1, 1048576]");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout tp8,dp8-ep8,tp8"),
                          "--layout: tp8 is named twice");
    // Given empty: refused, not taken as absent.
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout ''"),
                          "--layout '': name at least");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --weight-dtype ''"),
                          "--weight-dtype '':");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --concurrency 1,,8"),
                          "--concurrency '1,,8': '' is not an integer");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --concurrency 99999999999999"),
                          "--concurrency '99999999999999': 99999999999999 is outside [1, 65536]");
    expect_one_line_error(run_plan("--model /nonexistent/config.json --hardware h200_sxm --gpus 8"),
                          "/nonexistent/config.json");

    // A malformed profile file: the message names the file and the key.
    fs::path bad = scratch_dir() / "bad_profile.json";
    nlohmann::json doc = nlohmann::json::parse(read_all(kProfilesDir + "/h200_sxm.json"));
    doc["intra_node"]["all_reduce"]["bus_bandwidth_gbps"]["value"] = 0;
    std::ofstream(bad) << doc.dump(2);
    expect_one_line_error(run_plan(kimi + "--hardware '" + bad.string() + "' --gpus 8"),
                          bad.string() + ": intra_node.all_reduce.bus_bandwidth_gbps: must be > 0 (got 0)");
    std::ofstream(bad) << "{\"schema\": \"epinfer.hardware_profile/1\",";
    expect_one_line_error(run_plan(kimi + "--hardware '" + bad.string() + "' --gpus 8"),
                          bad.string() + ": malformed JSON: ");
}

}  // namespace
}  // namespace epinfer::planner
