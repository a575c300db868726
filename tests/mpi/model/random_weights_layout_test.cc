// Model::create_random under one parallel layout (EPINFER_TEST_LAYOUT, as layout_test.cc): each rank binds
// its slices of the same random tensors (models/random_weights.h: a slice holds the same values as that
// part of the whole tensor), so the prefill logits equal those of the random model on one rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint/hf_config.h"
#include "common/compare.h"
#include "engine/kv_block_pool.h"
#include "layers/parallel_context.h"
#include "models/model.h"
#include "model_layout_util.h"
#include "mpi_test_world.h"

namespace epinfer {
namespace {

class RandomWeightsLayoutTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomWeightsLayoutTest, SameLogitsAsOneRank) {
    Communicator& world = mpi_test::world();
    auto layout = layout_from_flags(layout_flags_from_env());
    ASSERT_TRUE(layout.is_ok()) << layout.status().to_string();
    auto config = load_hf_config(std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + GetParam());
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    const LayoutModelDims dims = layout_model_dims(*config);
    const Status valid = validate_layout(*layout, dims, world.size());
    if (!valid.is_ok()) GTEST_SKIP() << GetParam() << ": " << valid.message();
    auto ctx = create_parallel_context(world, *layout, dims);
    ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
    std::unique_ptr<Backend> backend = make_cpu_backend(1);
    RandomWeightsOptions opts;
    opts.seed = 17;
    auto ref = Model::create_random(*config, *backend, opts);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    auto par = Model::create_random(*config, *backend, opts, ctx->get());
    ASSERT_TRUE(par.is_ok()) << par.status().to_string();
    if (world.size() > 1) {
        EXPECT_LT((*par)->weight_bytes(), (*ref)->weight_bytes());
    }

    const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5, 9}, {2, 7, 1, 8, 2}};
    std::vector<std::vector<int32_t>> own;
    for (size_t i = 0; i < prompts.size(); ++i)
        if (static_cast<int>(i) % layout->attn_dp == (*ctx)->coords.attn_dp_rank) own.push_back(prompts[i]);
    auto got = prefill_logits(**par, own);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    if (own.empty()) return;
    auto want = prefill_logits(**ref, own);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    const test::Diff diff = test::compare(std::span<const float>(*got), std::span<const float>(*want));
    EXPECT_TRUE(test::within(diff, test::tolerance("logits_multi_rank", DType::kBF16)))
        << GetParam() << ": nmse " << diff.nmse << " max_rel " << diff.max_rel;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RandomWeightsLayoutTest,
                         ::testing::Values("deepseek_v3_tiny", "qwen3_moe_tiny", "olmoe_tiny",
                                           "qwen2_moe_tiny", "mixtral_3l_tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace epinfer
