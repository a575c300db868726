// Decode and prefill breakdowns of whole layouts, pinned to hand calculations on a round-number model
// and profile (planner_test_util.h), and the collective counts of Kimi K2.
#include <gtest/gtest.h>

#include "planner/cost_model.h"
#include "planner/hardware_profile.h"
#include "planner/model_costs.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

class RoundModel : public ::testing::Test {
protected:
    void SetUp() override {
        auto profile = parse_hardware_profile(testing::round_profile_json(), "round.json");
        ASSERT_TRUE(profile.is_ok()) << profile.status().message();
        hw_ = *profile;
        model_ = model_costs(testing::tiny_gqa_config());
    }
    CostInputs inputs(ParallelLayout layout, int nodes = 1) const {
        CostInputs in;
        in.model = &model_;
        in.hardware = &hw_;
        in.layout = layout;
        in.nodes = nodes;
        in.context_tokens = 100;
        return in;
    }
    const CollectiveTerm* term(const StepBreakdown& s, const std::string& what) const {
        for (const CollectiveTerm& t : s.collectives) {
            if (t.what == what) return &t;
        }
        return nullptr;
    }
    HardwareProfile hw_;
    ModelCosts model_;
};

TEST_F(RoundModel, Tp2DecodeOneRequest) {
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 2, 1, 2, 1}), 1, 1 << 30);
    const StepBreakdown& s = r.step;
    // Attention per layer on one rank: q,o 2·1024·1024/2 + k,v 4 of 8 heads · 2·1024·128 = 2,097,152 params
    // = 4,194,304 B at 1000 GB/s = 4.194304 µs; KV 100 tokens · 4 heads · 2 · 128 · 2 B = 204,800 B
    // = 0.2048 µs. Four layers: 4 · 4.399104.
    EXPECT_NEAR(s.attention_us, 17.596416, 1e-9);
    // Experts: one token touches 2 of 8 experts; each rank reads half of each: 2 · 3·1024·512/2 · 2 B
    // = 3,145,728 B = 3.145728 µs per layer.
    EXPECT_NEAR(s.experts_us, 4 * 3.145728, 1e-9);
    EXPECT_NEAR(s.experts_touched_per_rank, 2.0, 1e-12);
    // Dense: routers 8·1024·2 B = 0.016384 µs per layer; LM head 500·1024·2 B = 1.024 µs.
    EXPECT_NEAR(s.dense_us, 4 * 0.016384 + 1.024, 1e-9);
    // Two all-reduces per layer of one token's hidden state, 2048 B: 10 + 2048 · 2·1/2 / 1e5 µs.
    const CollectiveTerm* attn = term(s, "attention all_reduce");
    const CollectiveTerm* moe = term(s, "MoE all_reduce");
    ASSERT_TRUE(attn && moe);
    EXPECT_EQ(attn->calls, 4);
    EXPECT_EQ(moe->calls, 4);
    EXPECT_NEAR(attn->us_per_call, 10.02048, 1e-9);
    EXPECT_EQ(s.collectives.size(), 2u);
    EXPECT_DOUBLE_EQ(s.launch_us, 0.0);
    const double step = 17.596416 + 12.582912 + 1.089536 + 8 * 10.02048;
    EXPECT_NEAR(s.step_us, step, 1e-9);
    EXPECT_NEAR(r.tpot_ms, step / 1e3, 1e-12);
    EXPECT_NEAR(r.tokens_per_s, 1e6 / step, 1e-6);
}

TEST_F(RoundModel, DpAttentionDispatchCombine) {
    // dp2-ep2, two requests: one per rank, no attention all-reduce. A token's 2 experts land on
    // 2·(1 − C(4,2)/C(8,2)) = 44/28 EP ranks; half of them are the sender itself, so 22/28 rows of
    // 2048 B leave each rank: 1609.142857 B, at 20 µs + bytes / (50 GB/s).
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 2, 1 << 30);
    const StepBreakdown& s = r.step;
    EXPECT_EQ(term(s, "attention all_reduce"), nullptr);
    EXPECT_EQ(term(s, "MoE all_reduce"), nullptr);
    const CollectiveTerm* dispatch = term(s, "dispatch");
    const CollectiveTerm* combine = term(s, "combine");
    ASSERT_TRUE(dispatch && combine);
    EXPECT_EQ(dispatch->calls, 4);
    EXPECT_EQ(combine->calls, 4);
    const double remote = 22.0 / 28.0 * 2048.0;
    EXPECT_NEAR(dispatch->size_bytes, remote * 2, 1e-9);  // nccl-tests size: remote · n/(n−1)
    EXPECT_NEAR(dispatch->us_per_call, 20.0 + remote / 5e4, 1e-9);
    // Each rank attends over its own request only: the attention of the TP2 case without the split.
    EXPECT_EQ(s.tokens_per_attn_rank, 1);
}

TEST_F(RoundModel, PipelineKeepsAllRequestsInFlight) {
    // pp2, 8 requests: 2 micro-batches of 4, never 8 / pp requests in flight; step = max(path, 2 · stage).
    DecodeResult r = decode_step(inputs(ParallelLayout{2, 1, 1, 1, 1}), 8, 1 << 30);
    EXPECT_EQ(r.step.micro_batches, 2);
    EXPECT_EQ(r.step.tokens, 4);
    EXPECT_NEAR(r.tokens_per_s, 8 / r.step.step_us * 1e6, 1e-6);
    const CollectiveTerm* send = term(r.step, "stage send");
    ASSERT_NE(send, nullptr);
    EXPECT_EQ(send->calls, 1);  // the two stages send different sizes: hidden states and token ids
    // One request: one micro-batch, each stage idles while the other works.
    DecodeResult one = decode_step(inputs(ParallelLayout{2, 1, 1, 1, 1}), 1, 1 << 30);
    EXPECT_EQ(one.step.micro_batches, 1);
    EXPECT_GT(one.step.bubble_us, 0.0);
    EXPECT_NEAR(one.step.step_us, one.step.path_us, 1e-9);
}

TEST_F(RoundModel, KvCapacityBoundsConcurrency) {
    // dp2: ⌈5/2⌉ = 3 requests on the busiest rank · 100 tokens.
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 5, 299);
    EXPECT_EQ(r.kv_tokens_needed_per_rank, 300);
    EXPECT_FALSE(r.kv_fits);
    EXPECT_TRUE(decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 5, 300).kv_fits);
}

TEST_F(RoundModel, GroupsAcrossNodesUseTheInterNodeLink) {
    // 8 ranks over 2 nodes of 4: a TP8 all-reduce spans both nodes → 50 µs + 2048 · 1.75 / 1e4.
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 8, 1, 8, 1}, 2), 1, 1 << 30);
    const CollectiveTerm* attn = term(r.step, "attention all_reduce");
    ASSERT_NE(attn, nullptr);
    EXPECT_TRUE(attn->inter_node);
    EXPECT_NEAR(attn->us_per_call, 50.0 + 2048 * 1.75 / 1e4, 1e-9);
    // pp2 × tp4 over the same nodes: TP stays inside a node, the stage boundary crosses.
    DecodeResult pp = decode_step(inputs(ParallelLayout{2, 4, 1, 4, 1}, 2), 1, 1 << 30);
    EXPECT_FALSE(term(pp.step, "attention all_reduce")->inter_node);
    EXPECT_TRUE(term(pp.step, "stage send")->inter_node);
}

TEST_F(RoundModel, PrefillIsComputeBound) {
    PrefillResult p = prefill_step(inputs(ParallelLayout{1, 2, 1, 2, 1}), 1000);
    // 1000 tokens touch every expert: 8 · (1 − 0.75^1000) = 8.
    EXPECT_NEAR(p.step.experts_touched_per_rank, 8.0, 1e-9);
    EXPECT_FALSE(p.step.experts_memory_bound);
    EXPECT_NEAR(p.tokens_per_s, 1000 / p.step.step_us * 1e6, 1e-6);
    EXPECT_NEAR(p.ttft_ms, p.step.step_us / 1e3, 1e-12);
}

TEST(KimiCollectives, Tp8HasTwoAllReducesPerLayer) {
    // Kimi K2 on 8 GPUs under TP: 61 attention + 60 MoE + 1 dense-MLP all-reduces = 122 per step.
    auto profile = parse_hardware_profile(testing::round_profile_json(), "round.json");
    ASSERT_TRUE(profile.is_ok());
    ModelCosts kimi = model_costs(testing::kimi_k2_config());
    CostInputs in;
    in.model = &kimi;
    in.hardware = &*profile;
    in.layout = ParallelLayout{1, 8, 1, 8, 1};
    in.nodes = 2;  // 4 GPUs per node in this profile
    DecodeResult r = decode_step(in, 1, 1 << 30);
    int64_t all_reduces = 0;
    for (const CollectiveTerm& t : r.step.collectives) {
        if (t.kind == Collective::kAllReduce) all_reduces += t.calls;
    }
    EXPECT_EQ(all_reduces, 122);
    // EP with DP attention: a dispatch and a combine per MoE layer, nothing else.
    in.layout = ParallelLayout{1, 1, 8, 1, 8};
    DecodeResult ep = decode_step(in, 8, 1 << 30);
    int64_t a2a = 0, others = 0;
    for (const CollectiveTerm& t : ep.step.collectives)
        (t.kind == Collective::kAllToAll ? a2a : others) += t.calls;
    EXPECT_EQ(a2a, 120);
    EXPECT_EQ(others, 0);
}

}  // namespace
}  // namespace epinfer::planner
