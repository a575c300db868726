// The memory model: terms pinned by hand, and Kimi K2 on 8× RTX PRO 6000 (bf16: nothing fits, the
// routed experts named; int4 experts: fits).
#include <gtest/gtest.h>

#include <string>

#include "planner/hardware_profile.h"
#include "planner/memory_model.h"
#include "planner/planner.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

const std::string kProfilesDir = std::string(EPINFER_TEST_DATA_DIR) + "/../../profiles";

HardwareProfile rtx_pro_6000() {
    auto p = load_hardware_profile_file(kProfilesDir + "/rtx_pro_6000.json");
    EXPECT_TRUE(p.is_ok()) << p.status().message();
    return p.is_ok() ? *p : HardwareProfile{};
}

TEST(MemoryPlan, KimiTp8TermsByHand) {
    HardwareProfile hw = rtx_pro_6000();
    MemoryOptions o;
    o.weights = {WeightFormat::kBf16, WeightFormat::kBf16};
    MemoryPlan plan = plan_memory(testing::kimi_k2_config(), ParallelLayout{1, 8, 1, 8, 1}, hw.gpu, o);
    ASSERT_EQ(plan.stages.size(), 1u);
    const StageMemory& s = plan.stages[0];
    // 60 MoE layers · 384 experts · 44,040,192/8 parameters · 2 B = 253,671,505,920 B (236.25 GiB).
    EXPECT_EQ(s.weights.routed_experts, 253671505920LL);
    // Embedding and LM head: 163840/8 rows · 7168 · 2 B each.
    EXPECT_EQ(s.weights.embedding, 20480LL * 7168 * 2);
    EXPECT_EQ(s.weights.lm_head, 20480LL * 7168 * 2);
    // MLA latent is not split by heads: 61 · 576 · 2 B (the engine's bf16 cache on GPUs) per token on every
    // rank.
    EXPECT_EQ(s.kv_bytes_per_token, 70272);
    // No all-to-all under TP attention: no EP buffers.
    EXPECT_EQ(s.ep_buffer_bytes, 0);
    EXPECT_FALSE(plan.fits);
    EXPECT_EQ(plan.largest_term, "routed experts");
    EXPECT_EQ(plan.margin_bytes, plan.usable_bytes - s.non_kv_bytes() - 4096 * 70272);
}

TEST(MemoryPlan, EpBuffersUnderDpAttention) {
    HardwareProfile hw = rtx_pro_6000();
    MemoryOptions o;
    MemoryPlan plan = plan_memory(testing::kimi_k2_config(), ParallelLayout{1, 1, 8, 1, 8}, hw.gpu, o);
    // Dispatch + combine: 2 · 2048 tokens (the engine's step) · K 8 · H 7168 · 4 B (the engine's fp32 rows).
    EXPECT_EQ(plan.stages[0].ep_buffer_bytes, 2LL * 2048 * 8 * 7168 * 4);
    // 384 / 8 = 48 whole bf16 experts per rank; every rank holds all of the attention (DP attention).
    EXPECT_EQ(plan.stages[0].weights.routed_experts, 60LL * 48 * 44040192 * 2);
    EXPECT_EQ(plan.stages[0].weights.attention, 61LL * 101124096 * 2);
}

TEST(MemoryPlan, KimiBf16DoesNotFitOnRtxPro6000) {
    HardwareProfile hw = rtx_pro_6000();
    PlanRequest request;
    request.model_label = "kimi_k2";
    request.gpus = 8;
    request.memory.weights = {WeightFormat::kBf16, WeightFormat::kBf16};
    auto plan = make_plan(testing::kimi_k2_config(), hw, request);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    EXPECT_FALSE(plan->any_fits);
    for (const LayoutPlan& lp : plan->layouts) {
        EXPECT_FALSE(lp.memory.fits) << lp.spec;
        EXPECT_EQ(lp.memory.largest_term, "routed experts") << lp.spec;
    }
    EXPECT_NE(plan->memory_verdict.find("nothing fits"), std::string::npos);
    EXPECT_NE(plan->memory_verdict.find("routed experts"), std::string::npos) << plan->memory_verdict;
    for (const Recommendation& r : plan->recommendations) EXPECT_EQ(r.layout, -1);
}

TEST(MemoryPlan, KimiInt4ExpertsFitOnRtxPro6000) {
    HardwareProfile hw = rtx_pro_6000();
    PlanRequest request;
    request.model_label = "kimi_k2";
    request.gpus = 8;
    request.memory.weights = {WeightFormat::kInt4Group32, WeightFormat::kBf16};
    auto plan = make_plan(testing::kimi_k2_config(), hw, request);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    EXPECT_TRUE(plan->any_fits);
    const LayoutPlan& tp8 = plan->layouts[0];
    ASSERT_EQ(tp8.spec, "tp8");
    EXPECT_TRUE(tp8.memory.fits);
    // 60 · 384 · ⌈5,505,024 · 0.5625⌉ B of int4 experts per GPU.
    EXPECT_EQ(tp8.memory.stages[0].weights.routed_experts, 60LL * 384 * 3096576);
    EXPECT_GT(tp8.memory.max_requests, 0);
    ASSERT_GE(plan->recommendations.size(), 1u);
    EXPECT_GE(plan->recommendations[0].layout, 0);  // something runs one request
}

}  // namespace
}  // namespace epinfer::planner
