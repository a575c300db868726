// GPU router top-k (backend/cuda/kernels/moe_router.cuh) against the CPU reference (cpu_moe_router_topk) on
// the same fp32 logits: ids and their order exactly; weights within tolerances.h "moe_router_weights"
// (exp differs between glibc's expf and the GPU; everything else runs in the CPU's order).
#if EPINFER_WITH_CUDA
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/moe_router.h"
#include "backend/cuda/kernels/moe_router.cuh"
#include "common/compare.h"
#include "cuda_test_util.h"

namespace epinfer::test {
namespace {

struct RouterCase {
    std::string name;
    int64_t tokens, experts, top_k;
    ScoringFunc scoring;
    TopkMethod method;
    int64_t n_group, topk_group;
    bool norm;
    float scale;
    bool bias;
    int special;  // 0: uniform logits; 1: NaN/±inf sprinkled; 2: logits on a coarse grid (many ties)
};

std::vector<float> case_logits(const RouterCase& c, uint32_t seed) {
    std::vector<float> logits = random_floats(static_cast<size_t>(c.tokens * c.experts), seed, -3.0f, 3.0f);
    if (c.special == 1) {
        const float inf = std::numeric_limits<float>::infinity();
        for (size_t i = 0; i < logits.size(); i += 7) logits[i] = std::numeric_limits<float>::quiet_NaN();
        for (size_t i = 3; i < logits.size(); i += 29) logits[i] = inf;
        for (size_t i = 5; i < logits.size(); i += 31) logits[i] = -inf;
        // One row entirely NaN: no expert is choosable (ids −1).
        for (int64_t e = 0; e < c.experts; ++e) logits[e] = std::numeric_limits<float>::quiet_NaN();
    } else if (c.special == 2) {
        for (float& v : logits) v = std::round(v * 2.0f) / 2.0f;
    }
    return logits;
}

void PrintTo(const RouterCase& c, std::ostream* os) { *os << c.name; }

class MoeRouterCudaTest : public CudaTest, public ::testing::WithParamInterface<RouterCase> {};

TEST_P(MoeRouterCudaTest, MatchesCpuReference) {
    const RouterCase& c = GetParam();
    for (uint32_t seed : {1u, 2u}) {  // fresh random logits each time
        const std::vector<float> logits = case_logits(c, seed * 977 + static_cast<uint32_t>(c.experts));
        const std::vector<float> bias = random_floats(static_cast<size_t>(c.experts), seed + 5, -0.1f, 0.1f);
        const size_t picks = static_cast<size_t>(c.tokens * c.top_k);

        MoeRouterTopkArgs args;
        args.num_tokens = c.tokens;
        args.num_experts = c.experts;
        args.top_k = c.top_k;
        args.scoring_func = c.scoring;
        args.topk_method = c.method;
        args.n_group = c.n_group;
        args.topk_group = c.topk_group;
        args.norm_topk_prob = c.norm;
        args.routed_scaling_factor = c.scale;

        std::vector<int32_t> want_ids(picks);
        std::vector<float> want_weights(picks);
        MoeRouterTopkArgs cpu = args;
        cpu.router_logits = logits.data();
        cpu.e_score_correction_bias = c.bias ? bias.data() : nullptr;
        cpu.topk_ids = want_ids.data();
        cpu.topk_weights = want_weights.data();
        const Status checked = cpu_moe_router_topk(cpu);  // validates the case too
        ASSERT_TRUE(checked.is_ok()) << checked.message();

        cuda::CudaBuffer d_logits = upload(logits);
        cuda::CudaBuffer d_bias = upload(bias);
        cuda::CudaBuffer d_ids = poisoned<int32_t>(picks);
        cuda::CudaBuffer d_weights = poisoned<float>(picks);
        MoeRouterTopkArgs gpu = args;
        gpu.router_logits = d_logits.as<float>();
        gpu.e_score_correction_bias = c.bias ? d_bias.as<float>() : nullptr;
        gpu.topk_ids = d_ids.as<int32_t>();
        gpu.topk_weights = d_weights.as<float>();
        ASSERT_EQ(cuda::launch_moe_router_topk(gpu, nullptr), cudaSuccess);
        const std::vector<int32_t> got_ids = download<int32_t>(d_ids.data(), picks);
        const std::vector<float> got_weights = download<float>(d_weights.data(), picks);

        EXPECT_EQ(got_ids, want_ids) << c.name << " seed " << seed;
        const Diff d = compare<float>(got_weights, want_weights);
        EXPECT_TRUE(within(d, tolerance("moe_router_weights", DType::kF32))) << c.name << " seed " << seed;
        int64_t bit_exact = 0;
        for (size_t i = 0; i < picks; ++i) bit_exact += std::memcmp(&got_weights[i], &want_weights[i], 4) == 0;
        RecordProperty("weights_bit_exact_" + std::to_string(seed), std::to_string(bit_exact) + "/" + std::to_string(picks));
    }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, MoeRouterCudaTest,
    ::testing::Values(
        RouterCase{"softmax_greedy", 53, 37, 5, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, false, 1.0f, false, 0},
        RouterCase{"softmax_norm", 41, 60, 8, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, true, 1.0f, false, 0},
        RouterCase{"mixtral", 29, 8, 2, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, true, 1.0f, false, 0},
        RouterCase{"group_limited_v2", 31, 60, 4, ScoringFunc::kSoftmax, TopkMethod::kGroupLimitedGreedy, 6, 2, false,
                   16.0f, false, 0},
        RouterCase{"noaux_tc_v3", 33, 64, 6, ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 3, true, 2.5f, true, 0},
        RouterCase{"deepseek_v3_shape", 19, 256, 8, ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 4, true, 2.5f,
                   true, 0},
        RouterCase{"kimi_k2_shape", 17, 384, 8, ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 1, 1, true, 2.827f, true,
                   0},
        RouterCase{"sigmoid_greedy_no_norm", 23, 45, 3, ScoringFunc::kSigmoid, TopkMethod::kGreedy, 1, 1, false, 1.0f,
                   true, 0},
        RouterCase{"k_equals_e", 13, 9, 9, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, true, 1.0f, false, 0},
        RouterCase{"k_equals_e_grouped", 11, 12, 12, ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 4, 4, true, 1.0f,
                   true, 0},
        RouterCase{"nan_inf", 37, 24, 4, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, true, 1.0f, false, 1},
        RouterCase{"nan_inf_sigmoid_grouped", 37, 24, 5, ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 4, 2, true,
                   1.0f, true, 1},
        RouterCase{"ties", 45, 32, 6, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, true, 1.0f, false, 2},
        RouterCase{"ties_grouped", 45, 32, 6, ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 3, false, 1.0f, false, 2},
        RouterCase{"large_e", 9, 1000, 16, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, true, 1.0f, false, 0}),
    [](const ::testing::TestParamInfo<RouterCase>& info) { return info.param.name; });

TEST_F(CudaTest, RouterNoTokensLaunchesNothing) {
    MoeRouterTopkArgs args;
    args.num_tokens = 0;
    args.num_experts = 8;
    args.top_k = 2;
    EXPECT_EQ(cuda::launch_moe_router_topk(args, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
