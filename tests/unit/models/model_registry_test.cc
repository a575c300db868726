// The two tables of families agree: supported_model_types() (checkpoint/hf_config.h, the list that error
// messages print) holds exactly the model_types whose FamilySpec::runs (models/model_registry.h).
#include "models/model_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"

namespace epinfer {
namespace {

namespace fs = std::filesystem;

// Every real config (tests/data/configs/*.json, gpt_oss among them) and every fixture's config.json.
std::vector<fs::path> config_files() {
    const std::string data = EPINFER_TEST_DATA_DIR;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(data + "/configs"))
        if (e.path().extension() == ".json") files.push_back(e.path());
    for (const auto& e : fs::directory_iterator(data + "/fixtures"))
        if (fs::exists(e.path() / "config.json")) files.push_back(e.path() / "config.json");
    return files;
}

Result<ModelConfig> parse_file(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return parse_hf_config(text.str(), path.string());
}

TEST(ModelRegistry, SupportedModelTypesAreThoseTheRuntimeRuns) {
    const std::vector<std::string>& types = supported_model_types();
    size_t refused = 0;
    for (const fs::path& path : config_files()) {
        SCOPED_TRACE(path.string());
        const Result<ModelConfig> config = parse_file(path);
        ASSERT_TRUE(config.is_ok()) << config.status().to_string();
        const bool listed = std::find(types.begin(), types.end(), config->model_type) != types.end();
        EXPECT_EQ(check_runtime_support(*config).is_ok(), listed) << config->model_type;
        refused += !listed;
    }
    EXPECT_EQ(refused, 1u);  // gpt_oss_120b
}

}  // namespace
}  // namespace epinfer
