// `epinfer inspect` end to end: the built CLI (EPINFER_CLI_PATH) on a fixture, on copies whose
// config.json asks for more or fewer layers than the safetensors file holds, on a copy that lacks one
// tensor, and on one without its model.safetensors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/dtype.h"
#include "test_safetensors_writer.h"

namespace {

namespace fs = std::filesystem;

const std::string kFixture = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/deepseek_v3_tiny";

struct CliRun {
    int exit_code = -1;
    std::string out, err;
};

std::string read_file(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

class InspectCli : public ::testing::Test {
protected:
    void SetUp() override {
        tmp_ = fs::temp_directory_path() / ("epinfer_inspect_" + std::to_string(::getpid()) + "_" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(tmp_);
    }
    void TearDown() override { fs::remove_all(tmp_); }

    CliRun run(const std::string& args) {
        const fs::path out = tmp_ / "stdout.txt", err = tmp_ / "stderr.txt";
        const std::string cmd = std::string("'") + EPINFER_CLI_PATH + "' inspect " + args + " >'" +
                                out.string() + "' 2>'" + err.string() + "'";
        const int status = std::system(cmd.c_str());
        CliRun r;
        r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        r.out = read_file(out);
        r.err = read_file(err);
        return r;
    }

    // A copy of the fixture whose config.json has the given keys changed.
    fs::path copy_with(const std::vector<std::pair<std::string, nlohmann::json>>& changes) {
        const fs::path dir = tmp_ / ("model" + std::to_string(num_copies_++));
        fs::create_directories(dir);
        fs::copy_file(fs::path(kFixture) / "model.safetensors", dir / "model.safetensors");
        nlohmann::json config = nlohmann::json::parse(read_file(fs::path(kFixture) / "config.json"));
        for (const auto& [key, value] : changes) config[key] = value;
        std::ofstream(dir / "config.json") << config.dump(2);
        return dir;
    }

    // A copy of the fixture whose model.safetensors lacks the tensor `dropped`.
    fs::path copy_without(const std::string& dropped) {
        const fs::path dir = tmp_ / ("model" + std::to_string(num_copies_++));
        fs::create_directories(dir);
        fs::copy_file(fs::path(kFixture) / "config.json", dir / "config.json");
        auto file = epinfer::SafetensorsFile::open(kFixture + "/model.safetensors");
        EXPECT_TRUE(file.is_ok()) << file.status().to_string();
        std::vector<epinfer::safetensors_test::TestTensor> kept;
        for (const epinfer::TensorInfo& t : (*file)->tensors()) {
            if (t.name == dropped) continue;
            const auto* data = static_cast<const uint8_t*>((*file)->data(t));
            kept.push_back({t.name, epinfer::dtype_name(t.dtype), t.shape, {data, data + t.num_bytes()}});
        }
        epinfer::safetensors_test::write_file(dir / "model.safetensors",
                                              epinfer::safetensors_test::safetensors_bytes(kept));
        return dir;
    }

    fs::path tmp_;
    int num_copies_ = 0;
};

TEST_F(InspectCli, FixtureText) {
    const CliRun r = run("--model '" + kFixture + "'");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    for (const char* line : {
             "architecture  DeepseekV3ForCausalLM (model_type deepseek_v3)\n",
             "layers        3 (1 dense, 2 MoE)\n",
             "experts       E=16 routed of width 32, K=4, 1 shared (width 32)\n",
             "router        sigmoid + correction bias, noaux_tc, n_group 4, topk_group 2, norm_topk_prob "
             "true, "
             "scale 2.5\n",
             "attention     MLA, 4 heads, q_lora_rank 48, kv_lora_rank 32, qk_nope 16 + qk_rope 8, v 16\n",
             "parameters    total 326,352 (0.00B), active 178,896 (0.00B)\n",
             "weights       BF16: 652,704 bytes in 139 tensors\n",  // 326,352 bf16 parameters
             "tensors       139 expected, all present\n",
         }) {
        EXPECT_NE(r.out.find(line), std::string::npos) << "missing line: " << line << "in:\n" << r.out;
    }
}

TEST_F(InspectCli, FixtureJson) {
    const CliRun r = run("--model '" + kFixture + "' --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["architecture"], "DeepseekV3ForCausalLM");
    EXPECT_EQ(j["layers"]["moe"], 2);
    EXPECT_EQ(j["layers"]["dense"], 1);
    EXPECT_EQ(j["experts"]["routed"], 16);
    EXPECT_EQ(j["experts"]["top_k"], 4);
    EXPECT_EQ(j["attention"]["kind"], "mla");
    EXPECT_EQ(j["parameters"]["total"], 326352);
    EXPECT_EQ(j["parameters"]["active"], 178896);
    EXPECT_EQ(j["weights"]["BF16"]["bytes"], 652704);
    EXPECT_EQ(j["tensors"]["expected"], 139);
    EXPECT_EQ(j["tensors"]["complete"], true);
}

TEST_F(InspectCli, MissingLayerExitsOne) {
    // Four layers asked for, three stored: every tensor of layer 3 is missing.
    const fs::path dir = copy_with({{"num_hidden_layers", 4}});
    const CliRun r = run("--model '" + dir.string() + "'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(
        r.out.find("tensors       201 expected: 62 missing, 0 unexpected, 0 wrong shape, 0 wrong dtype"),
        std::string::npos)
        << r.out;
    EXPECT_NE(
        r.out.find("  missing      model.layers.3.input_layernorm.weight: missing (expected shape [64])"),
        std::string::npos)
        << r.out;
    EXPECT_EQ(r.err, "epinfer: error: " + dir.string() +
                         ": the checkpoint's tensors do not match config.json (62 issues)\n");
}

TEST_F(InspectCli, OneMissingTensorIsOneIssue) {
    const fs::path dir = copy_without("model.norm.weight");
    const CliRun r = run("--model '" + dir.string() + "'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.out.find("  missing      model.norm.weight: missing (expected shape [64])"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.err, "epinfer: error: " + dir.string() +
                         ": the checkpoint's tensors do not match config.json (1 issue)\n");
}

// The fixture without its model.safetensors: golden.safetensors beside config.json is not read as weights
// (a tester saw "139 missing, 12 unexpected").
TEST_F(InspectCli, FolderWithoutWeightsIsOneLine) {
    const fs::path dir = tmp_ / "no_weights";
    fs::create_directories(dir);
    for (const char* f : {"config.json", "golden.safetensors"})
        fs::copy_file(fs::path(kFixture) / f, dir / f);
    const CliRun r = run("--model '" + dir.string() + "'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "epinfer: error: " + dir.string() +
                         ": no model weights: neither model.safetensors.index.json nor model*.safetensors\n");
}

TEST_F(InspectCli, ExtraLayerExitsOneAndJsonListsIt) {
    // Two layers and no MTP layer asked for: the stored layer 2 is unexpected.
    const fs::path dir = copy_with({{"num_hidden_layers", 2}, {"num_nextn_predict_layers", 0}});
    const CliRun r = run("--model '" + dir.string() + "' --json");
    EXPECT_EQ(r.exit_code, 1);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tensors"]["complete"], false);
    EXPECT_EQ(j["tensors"]["missing"].size(), 0u);
    EXPECT_EQ(j["tensors"]["unexpected"].size(), 62u);
    EXPECT_EQ(j["tensors"]["unexpected"][0]["name"], "model.layers.2.input_layernorm.weight");

    // With an MTP layer allowed (num_nextn_predict_layers 1, the fixture's), layer 2 is still unexpected: it
    // has no MTP projection model.layers.2.eh_proj.weight, so it is a decoder layer that config.json does not
    // count (a tester's generate ran on 2 of the 3 layers, exit 0).
    const fs::path mtp = copy_with({{"num_hidden_layers", 2}});
    const CliRun text = run("--model '" + mtp.string() + "'");
    EXPECT_EQ(text.exit_code, 1);
    EXPECT_NE(
        text.out.find("model.layers.2.input_layernorm.weight: unexpected tensor (shape [64], BF16) not in "
                      "the DeepseekV3ForCausalLM layout of config.json (layer 2 >= num_hidden_layers 2; "
                      "not an MTP layer: no model.layers.2.eh_proj.weight)"),
        std::string::npos)
        << text.out;
    EXPECT_EQ(text.err, "epinfer: error: " + mtp.string() +
                            ": the checkpoint's tensors do not match config.json (62 issues)\n");
}

TEST_F(InspectCli, ConfigFileAlone) {
    const CliRun r =
        run("--model '" + std::string(EPINFER_TEST_DATA_DIR) + "/configs/mixtral_8x7b.json' --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["architecture"], "MixtralForCausalLM");
    EXPECT_EQ(j["parameters"]["total"], 46702792704);
    EXPECT_TRUE(j["tensors"].is_null());
}

TEST_F(InspectCli, Errors) {
    CliRun r = run("--model '" + (tmp_ / "nowhere").string() + "'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, "epinfer: error: " + (tmp_ / "nowhere").string() + ": no such folder\n");
}

// A float of config.json outside its range is one line naming the file, the key and the value, exit 1
// (a tester's rms_norm_eps 1e300 loaded and generated 0,0,0,0).
TEST_F(InspectCli, FloatOutsideItsRangeIsOneLine) {
    const fs::path dir = copy_with({{"rms_norm_eps", 1e300}});
    const CliRun r = run("--model '" + dir.string() + "'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "epinfer: error: " + (dir / "config.json").string() +
                         ": key 'rms_norm_eps' 1e+300 is outside (0, 1]\n");
}

// gpt-oss parses (for the planner): its config alone is inspected like any other.
TEST_F(InspectCli, GptOssConfigAlone) {
    const CliRun r =
        run("--model '" + std::string(EPINFER_TEST_DATA_DIR) + "/configs/gpt_oss_120b.json' --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["architecture"], "GptOssForCausalLM");
    EXPECT_NEAR(j["parameters"]["total"].get<double>(), 117e9, 0.01 * 117e9);  // FACTS.md A.4 [S21]
    EXPECT_EQ(j["attention"]["sliding_window"], 128);
    EXPECT_EQ(j["attention"]["sinks"], true);
    const CliRun text = run("--model '" + std::string(EPINFER_TEST_DATA_DIR) + "/configs/gpt_oss_120b.json'");
    ASSERT_EQ(text.exit_code, 0) << text.err;
    EXPECT_NE(text.out.find("sliding window 128 on 18 of 36 layers, attention sinks"), std::string::npos)
        << text.out;
}

}  // namespace
