// check_fits, the runtime's memory check, against a hand calculation on the small GQA model of
// planner_test_util.h (H 1024, 8 heads of 128, 8 KV heads, 4 MoE layers of 8 experts top-2 width 512,
// vocab 1000) with everything fp32, as the CPU engine holds it.
#include <gtest/gtest.h>

#include <string>

#include "planner/fit_check.h"
#include "planner/memory_model.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

// Weights, fp32 (4 B), one rank:
//   embedding and LM head   2 · 1000 · 1024 · 4                      =   8,192,000
//   attention               4 layers · (2·1024·1024 + 2·1024·8·128) · 4 =  67,108,864
//   routed experts          4 layers · 8 · 3·1024·512 · 4            = 201,326,592
//   routers and norms       (4 · 8·1024 + 4 · 2·1024 + 1024) · 4     =     167,936
//                                                                      276,795,392
// Activations (16 step tokens, 2 requests, fp32):
//   hidden buffers 16 · 8 · 1024 · 4 = 524,288; MoE rows 16 · 2 · 8/8 = 32 of (3·512 + 2·1024) · 4
//   = 458,752; logits 2 · 1000 · 4 = 8,000                            =     991,040
// Non-KV: 277,786,432. KV per token: 4 layers · 2·8·128 · 4 = 32,768; one request of 100 tokens 3,276,800.
constexpr int64_t kWeights = 276795392;
constexpr int64_t kActivations = 991040;
constexpr int64_t kNonKv = kWeights + kActivations;
constexpr int64_t kKvPerToken = 32768;

FitOptions engine_options(int64_t device_bytes, double fraction) {
    FitOptions o;
    o.device_bytes = device_bytes;
    o.usable_fraction = fraction;
    o.device = "test device";
    o.memory.weights = {WeightFormat::kFp32, WeightFormat::kFp32, WeightFormat::kFp32};
    o.memory.context_tokens = 100;
    o.memory.kv_bytes_per_element = 4;
    o.memory.activation_bytes_per_element = 4;
    o.memory.max_prefill_tokens = 16;
    o.memory.max_dispatch_tokens_per_rank = 16;
    o.memory.max_batch_requests_per_rank = 2;
    o.memory.cuda_graph_bytes = 0;
    return o;
}

const ParallelLayout kOneRank{1, 1, 1, 1, 1};

TEST(FitCheck, KvTokensThatFitByHand) {
    // usable 300,000,000 − 277,786,432 = 22,213,568 B of KV = 677 tokens of 32,768 B.
    Result<MemoryPlan> plan = check_fits(testing::tiny_gqa_config(), kOneRank, engine_options(400000000, 0.75));
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    const StageMemory& s = plan->stages.at(0);
    EXPECT_EQ(s.weights.total(), kWeights);
    EXPECT_EQ(s.weights.routed_experts, 201326592);
    EXPECT_EQ(s.activation_bytes, kActivations);
    EXPECT_EQ(s.ep_buffer_bytes + s.cuda_graph_bytes, 0);
    EXPECT_EQ(s.kv_bytes_per_token, kKvPerToken);
    EXPECT_EQ(plan->usable_bytes, 300000000);
    EXPECT_EQ(plan->kv_tokens_per_rank, 677);
}

TEST(FitCheck, ExactlyOneRequestFitsAndOneByteLessDoesNot) {
    const int64_t exact = kNonKv + 100 * kKvPerToken;  // 281,063,232
    Result<MemoryPlan> plan = check_fits(testing::tiny_gqa_config(), kOneRank, engine_options(exact, 1.0));
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    EXPECT_EQ(plan->kv_tokens_per_rank, 100);
    Result<MemoryPlan> over = check_fits(testing::tiny_gqa_config(), kOneRank, engine_options(exact - 1, 1.0));
    ASSERT_FALSE(over.is_ok());
    EXPECT_EQ(over.status().code(), StatusCode::kOutOfMemory);
}

TEST(FitCheck, OutOfMemoryMessageIsTheBreakdown) {
    // usable 200,000,000 B = 190.7 MiB; 276,795,392 B = 264.0 MiB of weights, 991,040 B = 967.8 KiB of
    // activations, 3,276,800 B = 3.1 MiB of KV, 281,063,232 B = 268.0 MiB in all; routed experts 192.0 MiB.
    Result<MemoryPlan> plan = check_fits(testing::tiny_gqa_config(), kOneRank, engine_options(400000000, 0.5));
    ASSERT_FALSE(plan.is_ok());
    EXPECT_EQ(plan.status().code(), StatusCode::kOutOfMemory);
    EXPECT_EQ(plan.status().message(),
              "tp1 does not fit: per rank, weights 264.0 MiB + buffers 0 B + activations 967.8 KiB + KV of 100 "
              "tokens (one request) 3.1 MiB = 268.0 MiB > usable 190.7 MiB = 0.5 × 381.5 MiB (test device); "
              "largest term: routed experts 192.0 MiB");

    // 100,000 tokens of KV (3.1 GiB) outweigh every other term.
    FitOptions o = engine_options(400000000, 0.5);
    o.memory.context_tokens = 100000;
    o.kv_tokens_source = "--kv-cache-tokens";
    plan = check_fits(testing::tiny_gqa_config(), kOneRank, o);
    ASSERT_FALSE(plan.is_ok());
    EXPECT_NE(plan.status().message().find("KV of 100000 tokens (--kv-cache-tokens) 3.1 GiB"), std::string::npos)
        << plan.status().message();
    EXPECT_NE(plan.status().message().find("largest term: KV 3.1 GiB"), std::string::npos)
        << plan.status().message();
}

TEST(FitCheck, PerStageUnderPipelineParallel) {
    // pp2: stage 0 holds the embedding and layers 0-1, stage 1 layers 2-3, the LM head and the final norm;
    // each stage's KV is its 2 layers' (16,384 B per token).
    Result<MemoryPlan> plan =
        check_fits(testing::tiny_gqa_config(), ParallelLayout{2, 1, 1, 1, 1}, engine_options(400000000, 0.75));
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    ASSERT_EQ(plan->stages.size(), 2u);
    EXPECT_EQ(plan->stages[0].kv_bytes_per_token, kKvPerToken / 2);
    EXPECT_EQ(plan->stages[1].weights.router_and_norms, (2 * 8 * 1024 + 2 * 2 * 1024 + 1024) * 4);
    // Stage 1 holds 4,096 B more (the final norm): it has the least room.
    const int64_t stage1 = kWeights - 4096000 - 2 * 67108864 / 4 - 2 * 201326592 / 4 -
                           (2 * 8 * 1024 + 2 * 2 * 1024) * 4 + kActivations;
    EXPECT_EQ(plan->stages[1].non_kv_bytes(), stage1);
    EXPECT_EQ(plan->kv_tokens_per_rank, (300000000 - stage1) / (kKvPerToken / 2));
}

TEST(FitCheck, BadInputs) {
    FitOptions o = engine_options(0, 0.5);
    EXPECT_EQ(check_fits(testing::tiny_gqa_config(), kOneRank, o).status().code(), StatusCode::kInvalidArgument);
    o = engine_options(1000, 1.5);
    EXPECT_EQ(check_fits(testing::tiny_gqa_config(), kOneRank, o).status().code(), StatusCode::kInvalidArgument);
    o = engine_options(1000, 0.5);
    o.memory.context_tokens = 0;
    EXPECT_EQ(check_fits(testing::tiny_gqa_config(), kOneRank, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(FitCheck, FormatBytes) {
    EXPECT_EQ(format_bytes(0), "0 B");
    EXPECT_EQ(format_bytes(1023), "1023 B");
    EXPECT_EQ(format_bytes(1024), "1.0 KiB");
    EXPECT_EQ(format_bytes(2202009), "2.1 MiB");
    EXPECT_EQ(format_bytes(int64_t{3} << 30), "3.0 GiB");
    EXPECT_EQ(format_bytes(-(int64_t{5} << 40)), "-5.0 TiB");
}

}  // namespace
}  // namespace epinfer::planner
