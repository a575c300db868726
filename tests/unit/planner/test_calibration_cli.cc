// `epinfer bench comm --profile-out` end to end: two ranks through mpirun write a profile that `epinfer plan
// --hardware` reads, and the plan's collectives cost what the measured table says; bad options fail with one
// line. Skipped when mpirun is not on PATH (the bench relaunches itself through it).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/cli_runner.h"
#include "planner/cost_model.h"
#include "planner/hardware_profile.h"

namespace epinfer::planner {
namespace {

namespace fs = std::filesystem;

const std::string kProfilesDir = std::string(EPINFER_TEST_DATA_DIR) + "/../../profiles";
const std::string kModel = std::string(EPINFER_TEST_DATA_DIR) + "/configs/qwen3_30b_a3b.json";

using epinfer::testing::CliResult;
using epinfer::testing::expect_one_line_error;

fs::path scratch_dir() { return epinfer::testing::cli_scratch_dir("epinfer_calibration_cli"); }

// Runs `epinfer ARGS` in the scratch folder with the shipped profiles in EPINFER_PROFILES_DIR.
CliResult run_cli(const std::string& args) {
    epinfer::testing::CliOptions options;
    options.env = "EPINFER_PROFILES_DIR='" + kProfilesDir + "'";
    options.cwd = scratch_dir().string();
    return epinfer::testing::run_epinfer(args, options);
}

bool mpirun_on_path() {
    return std::system("command -v mpirun > /dev/null 2>&1") == 0;
}

TEST(CalibrationCli, BenchCommProfileDrivesPlan) {
    if (!mpirun_on_path()) GTEST_SKIP() << "mpirun not on PATH";
    const fs::path profile_path = scratch_dir() / "measured.json";
    fs::remove(profile_path);
    CliResult bench = run_cli(
        "bench comm --ranks 2 --max-bytes 64K --iters 3 --profile-out measured.json --base-profile h200_sxm");
    ASSERT_EQ(bench.exit_code, 0) << bench.err << bench.out;

    auto profile = load_hardware_profile_file(profile_path.string());
    ASSERT_TRUE(profile.is_ok()) << profile.status().message();
    EXPECT_EQ(profile.value().name, "h200_sxm_measured");
    for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kAllToAll}) {
        const CollectiveSpec& spec = profile.value().intra_node[c];
        ASSERT_EQ(spec.tables.size(), 1u) << collective_name(c);
        EXPECT_EQ(spec.tables[0].ranks, 2) << collective_name(c);
        EXPECT_EQ(spec.tables[0].points.size(), 4u) << collective_name(c);  // 1K, 4K, 16K, 64K
        EXPECT_EQ(spec.tables[0].provenance, Provenance::kMeasured);
        EXPECT_EQ(spec.latency_us.provenance, Provenance::kMeasured);
        EXPECT_EQ(spec.bus_bandwidth_gbps.provenance, Provenance::kMeasured);
        EXPECT_NE(spec.tables[0].source.find("epinfer bench comm --ranks 2"), std::string::npos)
            << spec.tables[0].source;
    }
    EXPECT_EQ(profile.value().intra_node[Collective::kAllToAll].tables[0].points.front().first, 1024.0);
    // send_recv is not measured: the datasheet/estimate figure stays.
    EXPECT_NE(profile.value().intra_node[Collective::kSendRecv].latency_us.provenance, Provenance::kMeasured);

    CliResult plan = run_cli("plan --hardware measured.json --model '" + kModel + "' --gpus 2 --json");
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    nlohmann::json doc = nlohmann::json::parse(plan.out);
    EXPECT_EQ(doc["hardware"]["name"], "h200_sxm_measured");
    int checked = 0;
    for (const auto& layout : doc["layouts"]) {
        for (const auto& coll : layout["decode"][0]["breakdown"]["collectives"]) {
            if (coll["kind"] == "send_recv") continue;
            const std::string kind = coll["kind"];
            Collective c = kind == "all_reduce" ? Collective::kAllReduce : Collective::kAllToAll;
            ASSERT_TRUE(kind == "all_reduce" || kind == "all_to_all") << kind;
            // The plan's cost is the measured table at 2 ranks and nothing more (the engine's NCCL calls
            // are queued on the stream, as the bench times them).
            EXPECT_FALSE(coll.contains("sync_us_per_call"));
            const double expected = collective_time_us(
                profile.value().intra_node[c], c, coll["size_bytes"].get<double>(), coll["ranks"].get<int>());
            EXPECT_NEAR(coll["us_per_call"].get<double>(), expected, 1e-9 * expected) << layout["spec"];
            ++checked;
        }
    }
    EXPECT_GE(checked, 4);  // tp2, ep2: all_reduce; dp2-ep2, dp2: all_to_all
}

TEST(CalibrationCli, BaseProfileMayBeAFile) {
    // --base-profile FILE.json (here the one-GPU engine calibration): its GPU figures and its note stay, the
    // collectives are the measured ones, and a base already named *_measured keeps its name.
    if (!mpirun_on_path()) GTEST_SKIP() << "mpirun not on PATH";
    const std::string base = kProfilesDir + "/measured/h200_epinfer_2026-11-29.json";
    const fs::path profile_path = scratch_dir() / "measured_from_file.json";
    fs::remove(profile_path);
    CliResult bench = run_cli(
        "bench comm --ranks 2 --max-bytes 4K --iters 2 --profile-out measured_from_file.json "
        "--base-profile '" +
        base + "'");
    ASSERT_EQ(bench.exit_code, 0) << bench.err << bench.out;
    auto profile = load_hardware_profile_file(profile_path.string());
    auto engine = load_hardware_profile_file(base);
    ASSERT_TRUE(profile.is_ok()) << profile.status().message();
    ASSERT_TRUE(engine.is_ok()) << engine.status().message();
    EXPECT_EQ(profile->name, "h200_sxm_measured");
    EXPECT_EQ(profile->gpu.kernel_latency_us.value, engine->gpu.kernel_latency_us.value);
    EXPECT_EQ(profile->gpu.eager_kernel_us.value, engine->gpu.eager_kernel_us.value);
    EXPECT_EQ(profile->gpu.expert_matmul_efficiency.value, engine->gpu.expert_matmul_efficiency.value);
    ASSERT_NE(profile->intra_node[Collective::kAllReduce].table_for(2), nullptr);
    EXPECT_EQ(profile->intra_node[Collective::kAllReduce].table_for(2)->provenance, Provenance::kMeasured);
    nlohmann::json doc = nlohmann::json::parse(epinfer::testing::read_text_file(profile_path));
    EXPECT_NE(doc["note_calibration"].get<std::string>().find(base), std::string::npos);
    ASSERT_TRUE(doc.contains("note_calibration_base"));
    EXPECT_NE(doc["note_calibration_base"].get<std::string>().find("epinfer's kernels"), std::string::npos);
}

TEST(CalibrationCli, BadOptionsFailWithOneLine) {
    expect_one_line_error(run_cli("bench comm --ranks 2 --profile-out x.json"), "needs --base-profile");
    expect_one_line_error(run_cli("bench comm --ranks 2 --base-profile h200_sxm"), "only with --profile-out");
    expect_one_line_error(run_cli("bench comm --ranks 1 --profile-out x.json --base-profile h200_sxm"),
                          "--ranks 2 or more");
    expect_one_line_error(run_cli("bench comm --ranks 2 --profile-out x.json --base-profile nosuch"),
                          "unknown hardware profile 'nosuch'");
    // bench attention checks the same before any GPU work (so also in a build without CUDA).
    expect_one_line_error(run_cli("bench attention --profile-out x.json"), "needs --base-profile");
    expect_one_line_error(run_cli("bench attention --base-profile h200_sxm"), "only with --profile-out");
    expect_one_line_error(run_cli("bench attention --profile-out x.json --base-profile nosuch"),
                          "unknown hardware profile 'nosuch'");
    expect_one_line_error(
        run_cli("bench attention --profile-out x.json --base-profile h200_sxm --kv-dtype fp32"),
        "--profile-out needs --kv-dtype bf16, the engine's KV cache on GPUs (got fp32)");
    expect_one_line_error(
        run_cli("bench attention --profile-out x.json --base-profile h200_sxm --cases decode"),
        "--profile-out needs prefill or mla cases");
    // An empty value is refused while parsing, not taken as "not given".
    expect_one_line_error(run_cli("bench attention --profile-out '' --base-profile h200_sxm"),
                          "--profile-out: must not be empty");
    expect_one_line_error(run_cli("bench comm --ranks 2 --profile-out x.json --base-profile ''"),
                          "--base-profile: must not be empty");
    // The output path is checked before anything is measured.
    expect_one_line_error(
        run_cli("bench attention --profile-out /nonexistent/dir/x.json --base-profile h200_sxm"),
        "--profile-out /nonexistent/dir/x.json: cannot write into the folder /nonexistent/dir");
    expect_one_line_error(
        run_cli("bench comm --ranks 2 --profile-out /nonexistent/x.json --base-profile h200_sxm"),
        "cannot write into the folder /nonexistent");
    expect_one_line_error(run_cli("bench attention --profile-out / --base-profile h200_sxm"),
                          "--profile-out /: is a folder, not a file");
}

}  // namespace
}  // namespace epinfer::planner
