// `epinfer plan` end to end: every config of tests/data/configs on every shipped profile prints one valid
// JSON document (or, for a config the checkpoint parser rejects, that parser's one-line error), and bad
// inputs fail with one line and exit status 1.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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

std::string read_all(const fs::path& path) { return epinfer::testing::read_text_file(path); }
fs::path scratch_dir() { return epinfer::testing::cli_scratch_dir("epinfer_plan_cli"); }

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
        // A config the checkpoint parser rejects (gpt-oss today) must fail with that parser's message.
        Result<ModelConfig> parsed = parse_hf_config(read_all(config), config);
        for (const std::string& profile : profiles) {
            SCOPED_TRACE(config + " on " + profile);
            CliResult r = run_plan("--model '" + config + "' --hardware " + profile + " --gpus 8 --json");
            if (r.seconds > slowest) {
                slowest = r.seconds;
                slowest_case = fs::path(config).filename().string() + " on " + profile;
            }
            // Generous bound (a loaded 2-core CI machine); typical runs take well under 0.1 s of CPU.
            EXPECT_LT(r.seconds, 10.0);
            if (!parsed.is_ok()) {
                expect_one_line_error(r, parsed.status().message());
                continue;
            }
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

TEST(PlanCli, BadInputsFailInOneLine) {
    const std::string kimi = "--model '" + kConfigsDir + "/kimi_k2_instruct_0905.json' ";
    expect_one_line_error(
        run_plan(kimi + "--hardware a100 --gpus 8"),
        "unknown hardware profile 'a100'; shipped profiles: b200, h100_sxm, h200_sxm, l40s, "
        "rtx_4090, rtx_pro_6000");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 0"), "--gpus 0: must be >= 1");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout tp3"), "layout tp3: ");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --layout zz8"), "layout 'zz8': ");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --nodes 3"), "--nodes 3");
    expect_one_line_error(run_plan(kimi + "--hardware h200_sxm --gpus 8 --weight-dtype int3"),
                          "--weight-dtype 'int3'");
    expect_one_line_error(run_plan("--hardware h200_sxm --gpus 8"), "--model is required");
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
