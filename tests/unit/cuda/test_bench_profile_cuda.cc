// `epinfer bench attention --profile-out` on the GPU: the profile it writes parses and carries the two
// attention figures measured in the run (planner/calibration.h attention_matmul_efficiency). Skipped
// without a GPU.
#if EPINFER_WITH_CUDA
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_runner.h"
#include "cuda_test_util.h"
#include "planner/hardware_profile.h"

namespace epinfer::test {
namespace {

namespace fs = std::filesystem;

class BenchProfileCuda : public CudaTest {};

TEST_F(BenchProfileCuda, BenchAttentionWritesTheAttentionFigures) {
    const fs::path dir = epinfer::testing::cli_scratch_dir("epinfer_bench_profile_cuda");
    // A base whose bf16 peak is far above any GPU's, so the measured fractions stay inside (0, 1] on
    // whatever GPU runs this (h200_sxm's 989.4 TFLOP/s would refuse a faster one as another GPU's base).
    const std::string shipped = std::string(EPINFER_TEST_DATA_DIR) + "/../../profiles/h200_sxm.json";
    nlohmann::json base = nlohmann::json::parse(epinfer::testing::read_text_file(shipped));
    base["gpu"]["bf16_tflops"]["value"] = 1e5;
    const fs::path base_path = dir / "base.json";
    std::ofstream(base_path) << base.dump(2);
    const fs::path out = dir / "measured.json";
    fs::remove(out);

    const epinfer::testing::CliResult r =
        epinfer::testing::run_epinfer("bench attention --cases mla,prefill --repeats 1 --profile-out '" +
                                      out.string() + "' --base-profile '" + base_path.string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    auto profile = planner::load_hardware_profile_file(out.string());
    ASSERT_TRUE(profile.is_ok()) << profile.status().message();
    const planner::GpuSpec& g = profile->gpu;
    for (const planner::Figure* f :
         {&g.latent_attention_matmul_efficiency, &g.prefill_attention_matmul_efficiency}) {
        EXPECT_EQ(f->provenance, planner::Provenance::kMeasured);
        EXPECT_GT(f->value, 0.0);
        EXPECT_LT(f->value, 1.0);
        EXPECT_NE(f->source.find("bench attention"), std::string::npos) << f->source;
    }
    EXPECT_NE(g.latent_attention_matmul_efficiency.source.find("deepseek_v3 mla 8 x 32768"),
              std::string::npos)
        << g.latent_attention_matmul_efficiency.source;
    EXPECT_NE(g.prefill_attention_matmul_efficiency.source.find("qwen3_30b_a3b prefill 1 x 4096"),
              std::string::npos)
        << g.prefill_attention_matmul_efficiency.source;
    // The rest is the base's.
    EXPECT_EQ(g.memory_efficiency.value, base["gpu"]["memory_efficiency"]["value"].get<double>());
}

}  // namespace
}  // namespace epinfer::test
#endif
