// Decode and prefill breakdowns of whole layouts, pinned to hand calculations on a round-number model
// and profile (planner_test_util.h), and the collective counts of Kimi K2.
#include <gtest/gtest.h>

#include "planner/cost_model.h"
#include "planner/hardware_profile.h"
#include "planner/model_costs.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

class RoundModel : public testing::TinyModelCosts {
protected:
    void SetUp() override {
        auto profile = parse_hardware_profile(testing::round_profile_json(), "round.json");
        ASSERT_TRUE(profile.is_ok()) << profile.status().message();
        hw_ = *profile;
    }
};

TEST_F(RoundModel, Tp2DecodeOneRequest) {
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 2, 1, 2, 1}), 1, 1 << 30);
    const StepBreakdown& s = r.step;
    // Attention per layer on one rank: q,o 2·1024·1024/2 + k,v 4 of 8 heads · 2·1024·128 = 2,097,152 params
    // = 4,194,304 B at 1000 GB/s = 4.194304 µs; KV in the engine's bf16: 100 tokens · 4 heads · 2 · 128 · 2 B
    // = 204,800 B = 0.2048 µs. Four layers: 4 · 4.399104.
    EXPECT_NEAR(s.attention_us, 17.596416, 1e-9);
    // Experts: one token touches 2 of 8 experts; each rank reads half of each: 2 · 3·1024·512/2 · 2 B
    // = 3,145,728 B = 3.145728 µs per layer.
    EXPECT_NEAR(s.experts_us, 4 * 3.145728, 1e-9);
    EXPECT_NEAR(s.experts_touched_per_rank, 2.0, 1e-12);
    // Dense: routers 8·1024·2 B = 0.016384 µs per layer; LM head 500·1024·2 B = 1.024 µs.
    EXPECT_NEAR(s.dense_us, 4 * 0.016384 + 1.024, 1e-9);
    // Activations (engine_facts.h, fp32, one row): attention 4·(8·1024 + 6·512 + 7·512) = 59,392 B; MoE
    // 4·(7·1024 + 2·8) + 2·1024 = 30,784 B + 2 pairs · 2·(5·1024 + 2·512/2) = 22,528 B; per layer 112,704 B
    // = 0.112704 µs. Head: 4·(4·1024 + 2·1000/2) = 20,384 B = 0.020384 µs.
    EXPECT_NEAR(s.activations_us, 4 * 0.112704 + 0.020384, 1e-9);
    // Two all-reduces per layer of one token's fp32 hidden state, 4096 B: 10 + 4096 · 2·1/2 / 1e5 µs.
    const CollectiveTerm* attn = term(s, "attention all_reduce");
    const CollectiveTerm* moe = term(s, "MoE all_reduce");
    ASSERT_TRUE(attn && moe);
    EXPECT_EQ(attn->calls, 4);
    EXPECT_EQ(moe->calls, 4);
    EXPECT_NEAR(attn->us_per_call, 10.04096, 1e-9);
    EXPECT_EQ(s.collectives.size(), 2u);
    // Kernels: 4 · (GQA 5: q, k, v in one launch; MoE 6: one token, pick mode, no permute, the gemv reading
    // the fp32 x; the adds inside the norms) + head 4; the round profile prices them at 0. (A collective is
    // no longer counted as a kernel: its measured time includes its kernel; it was 4 · 2 more.)
    EXPECT_EQ(s.kernels, 48);
    EXPECT_DOUBLE_EQ(s.launch_us, 0.0);
    const double step = 17.596416 + 12.582912 + 1.089536 + (4 * 0.112704 + 0.020384) + 8 * 10.04096;
    EXPECT_NEAR(s.step_us, step, 1e-9);
    EXPECT_NEAR(r.tpot_ms, step / 1e3, 1e-12);
    EXPECT_NEAR(r.tokens_per_s, 1e6 / step, 1e-6);
}

TEST_F(RoundModel, DpAttentionDispatchCombine) {
    // dp2-ep2, two requests: one per rank, no attention all-reduce. A token's 2 experts land on
    // 2·(1 − C(4,2)/C(8,2)) = 44/28 EP ranks; half of them are the sender itself, so 22/28 fp32 rows of
    // 4096 B leave each rank: 3218.285714 B, at 20 µs + bytes / (50 GB/s).
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 2, 1 << 30);
    const StepBreakdown& s = r.step;
    EXPECT_EQ(term(s, "attention all_reduce"), nullptr);
    EXPECT_EQ(term(s, "MoE all_reduce"), nullptr);
    const CollectiveTerm* dispatch = term(s, "dispatch");
    const CollectiveTerm* combine = term(s, "combine");
    ASSERT_TRUE(dispatch && combine);
    EXPECT_EQ(dispatch->calls, 4);
    EXPECT_EQ(combine->calls, 4);
    const double remote = 22.0 / 28.0 * 4096.0;
    EXPECT_NEAR(dispatch->size_bytes, remote * 2, 1e-9);  // nccl-tests size: remote · n/(n−1)
    EXPECT_NEAR(dispatch->us_per_call, 20.0 + remote / 5e4, 1e-9);
    // Each rank attends over its own request only: the attention of the TP2 case without the split.
    EXPECT_EQ(s.tokens_per_attn_rank, 1);
}

TEST_F(RoundModel, DpAttentionWithFewerRequestsThanGroups) {
    // dp2-ep2: one request is on one DP group only; the other joins the all-to-all with no token, so the
    // MoE sees 1 token (2 with two requests, one per group).
    DecodeResult one = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 1, 1 << 30);
    DecodeResult two = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 2, 1 << 30);
    EXPECT_EQ(one.step.tokens, 1);
    EXPECT_EQ(two.step.tokens, 2);
    EXPECT_EQ(one.step.tokens_per_attn_rank, 1);
    EXPECT_LT(one.step.experts_us, two.step.experts_us);
}

TEST_F(RoundModel, DpAttentionHostRoundTrips) {
    // dp2-ep2, two requests (one per rank): each of the 4 MoE layers plans its dispatch on the host
    // (engine_facts.h): 2 routing copies to the host + 2 MPI exchanges + 1 upload = 5 round trips, and
    // 2·moe_ep = 4 gathers and adds. At 30 µs a round trip: 4 · 5 · 30 = 600 µs more per step.
    DecodeResult base = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 2, 1 << 30);
    EXPECT_EQ(base.step.host_round_trips, 20);
    EXPECT_DOUBLE_EQ(base.step.host_us, 0.0);  // the round profile has no host_round_trip_us
    // Kernels: 4 · (GQA 5 + MoE 7 + 4) + head 4 (each rank's experts receive both tokens: the permute; the
    // gemv reads the fp32 x).
    EXPECT_EQ(base.step.kernels, 68);
    hw_.gpu.host_round_trip_us.value = 30.0;
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 2, 1 << 30);
    EXPECT_EQ(r.step.host_round_trips, 20);
    EXPECT_NEAR(r.step.host_us, 600.0, 1e-9);
    EXPECT_NEAR(r.step.step_us - base.step.step_us, 600.0, 1e-9);
    EXPECT_NEAR(r.step.path_us - base.step.path_us, 600.0, 1e-9);
    // Each round trip 0.5 µs more per row the rank holds: one row each with two requests (20 · 0.5), two
    // with four.
    hw_.gpu.host_round_trip_us_per_row.value = 0.5;
    DecodeResult per_row = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 2, 1 << 30);
    EXPECT_EQ(per_row.step.tokens_per_attn_rank, 1);
    EXPECT_NEAR(per_row.step.host_us, 20 * (30.0 + 0.5), 1e-9);
    DecodeResult four = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 4, 1 << 30);
    EXPECT_EQ(four.step.tokens_per_attn_rank, 2);
    EXPECT_NEAR(four.step.host_us, 20 * (30.0 + 2 * 0.5), 1e-9);
    // Without DP attention the routing stays on the GPU: no round trip, the kernels of Tp2DecodeOneRequest.
    DecodeResult tp = decode_step(inputs(ParallelLayout{1, 2, 1, 2, 1}), 1, 1 << 30);
    EXPECT_EQ(tp.step.host_round_trips, 0);
    EXPECT_DOUBLE_EQ(tp.step.host_us, 0.0);
    EXPECT_EQ(tp.step.kernels, 48);
}

TEST_F(RoundModel, PipelineKeepsAllRequestsInFlight) {
    // pp2, 8 requests: 2 micro-batches of 4, never 8 / pp requests in flight.
    DecodeResult r = decode_step(inputs(ParallelLayout{2, 1, 1, 1, 1}), 8, 1 << 30);
    EXPECT_EQ(r.step.micro_batches, 2);
    EXPECT_EQ(r.step.tokens, 4);
    EXPECT_NEAR(r.tokens_per_s, 8 / r.step.step_us * 1e6, 1e-6);
    const CollectiveTerm* send = term(r.step, "stage send");
    ASSERT_NE(send, nullptr);
    EXPECT_EQ(send->calls, 1);  // stage 0's hidden states of micro-batch 0
    EXPECT_NEAR(send->size_bytes, 4 * 1024 * 4, 1e-9);
    // Then the last stage broadcasts the step's 8 ids and 8 non-finite flags (int32) over MPI.
    const CollectiveTerm* broadcast = term(r.step, "output broadcast");
    ASSERT_NE(broadcast, nullptr);
    EXPECT_EQ(broadcast->calls, 2);
    EXPECT_NEAR(broadcast->size_bytes, 8 * 4, 1e-9);
    // One request: one micro-batch, each stage idles while the other works.
    DecodeResult one = decode_step(inputs(ParallelLayout{2, 1, 1, 1, 1}), 1, 1 << 30);
    EXPECT_EQ(one.step.micro_batches, 1);
    EXPECT_GT(one.step.bubble_us, 0.0);
    EXPECT_NEAR(one.step.step_us, one.step.path_us, 1e-9);
}

TEST_F(RoundModel, DecodeStepsHoldAtMostMaxStepTokensRequests) {
    // 8 requests, steps of 2 tokens: a step decodes 2 requests (the step of C = 2), each request waits 4
    // steps per token; the layout makes 2 tokens per step either way.
    CostInputs in = inputs(ParallelLayout{1, 1, 1, 1, 1});
    const DecodeResult two = decode_step(in, 2, 1 << 30);
    in.max_step_tokens = 2;
    const DecodeResult eight = decode_step(in, 8, 1 << 30);
    EXPECT_EQ(eight.step.tokens, 2);
    EXPECT_DOUBLE_EQ(eight.decode_step_ms, two.decode_step_ms);
    EXPECT_NEAR(eight.tpot_ms, 4 * two.decode_step_ms, 1e-12);
    EXPECT_NEAR(eight.tokens_per_s, two.tokens_per_s, 1e-9 * two.tokens_per_s);
    // With room for all 8, one step of 8 rows.
    in.max_step_tokens = 8;
    EXPECT_EQ(decode_step(in, 8, 1 << 30).step.tokens, 8);
}

TEST_F(RoundModel, KvCapacityBoundsConcurrency) {
    // dp2: ⌈5/2⌉ = 3 requests on the busiest rank · 100 tokens.
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 5, 299);
    EXPECT_EQ(r.kv_tokens_needed_per_rank, 300);
    EXPECT_FALSE(r.kv_fits);
    EXPECT_TRUE(decode_step(inputs(ParallelLayout{1, 1, 2, 1, 2}), 5, 300).kv_fits);
}

TEST_F(RoundModel, GroupsAcrossNodesUseTheInterNodeLink) {
    // 8 ranks over 2 nodes of 4: a TP8 all-reduce of 4096 B spans both nodes → 50 µs + 4096 · 1.75 / 1e4.
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 8, 1, 8, 1}, 2), 1, 1 << 30);
    const CollectiveTerm* attn = term(r.step, "attention all_reduce");
    ASSERT_NE(attn, nullptr);
    EXPECT_TRUE(attn->inter_node);
    EXPECT_NEAR(attn->us_per_call, 50.0 + 4096 * 1.75 / 1e4, 1e-9);
    // pp2 × tp4 over the same nodes: TP stays inside a node, the stage boundary crosses.
    DecodeResult pp = decode_step(inputs(ParallelLayout{2, 4, 1, 4, 1}, 2), 1, 1 << 30);
    EXPECT_FALSE(term(pp.step, "attention all_reduce")->inter_node);
    EXPECT_TRUE(term(pp.step, "stage send")->inter_node);
}

TEST_F(RoundModel, ClosedLoopReplaysTheScheduler) {
    // Two requests of 3 prompt tokens and 3 output tokens, steps of 3 tokens, decode first:
    //   step 1: prompt 0 (3 tokens, context 1.5) → request 0's first token
    //   step 2: request 0 decodes (context 4) + prompt 1's first 2 tokens (context 1)
    //   step 3: request 0 decodes (context 5) → done; + prompt 1's last token (offset 2, context 2.5) →
    //           request 1's first token
    //   steps 4, 5: request 1 decodes (contexts 4, 5) → done
    const CostInputs in = closed_loop_inputs(3, 3, 3);
    const double t1 = mixed_step(in, 0, 3, 0.0, 1.5, 1).step_us;
    const double t2 = mixed_step(in, 1, 2, 4.0, 1.0, 2).step_us;
    const double t3 = mixed_step(in, 1, 1, 5.0, 2.5, 2).step_us;
    const double t4 = mixed_step(in, 1, 0, 4.0, 0.0, 1).step_us;
    const double t5 = mixed_step(in, 1, 0, 5.0, 0.0, 1).step_us;
    ClosedLoopResult r = closed_loop_run(in, 2);
    EXPECT_EQ(r.steps, 5);
    EXPECT_EQ(r.mixed_steps, 3);
    // TPOT (t2 + t3)/2 and (t4 + t5)/2, median of two = their mean; TTFT t1 and t1 + t2 + t3.
    const double total = t1 + t2 + t3 + t4 + t5;
    EXPECT_NEAR(r.tpot_ms * 1e3, (t2 + t3 + t4 + t5) / 4, 1e-9);
    EXPECT_NEAR(r.ttft_ms * 1e3, t1 + (t2 + t3) / 2, 1e-9);
    EXPECT_NEAR(r.duration_ms * 1e3, total, 1e-9);
    EXPECT_NEAR(r.tokens_per_s, 6 / total * 1e6, 1e-6);
    // decode_step reports the closed loop as its headline when output_len > 0.
    DecodeResult d = decode_step(in, 2, 1 << 30);
    EXPECT_TRUE(d.has_closed_loop);
    EXPECT_DOUBLE_EQ(d.tpot_ms, r.tpot_ms);
    EXPECT_NEAR(d.decode_step_ms, d.step.step_us / 1e3, 1e-12);
}

TEST_F(RoundModel, ClosedLoopPricesARunOfDecodeStepsAtItsMeanContext) {
    // Two requests of 3 prompt and 10 output tokens, steps of 100 tokens: step 1 prefills both (6 rows,
    // context 1.5) and gives each its first token; then both decode 9 steps, at contexts 4 + j (both alike),
    // j = 0 … 8: one run, priced once at context 8 and counted 9 times, must equal the 9 steps one by one
    // (a step's cost is affine in the contexts).
    const CostInputs in = closed_loop_inputs(3, 10, 100);
    const double t1 = mixed_step(in, 0, 6, 0.0, 1.5, 2).step_us;
    double decode_us = 0.0;
    for (int j = 0; j < 9; ++j) decode_us += mixed_step(in, 2, 0, 4.0 + j, 0.0, 2).step_us;
    ClosedLoopResult r = closed_loop_run(in, 2);
    EXPECT_EQ(r.steps, 10);
    EXPECT_EQ(r.mixed_steps, 1);
    EXPECT_NEAR(r.duration_ms * 1e3, t1 + decode_us, 1e-9 * (t1 + decode_us));
    EXPECT_NEAR(r.tpot_ms * 1e3, decode_us / 9, 1e-9 * decode_us);
    // The attention term grows with the context, so pricing every step at the run's first context would
    // differ: the check above can fail.
    EXPECT_GT(mixed_step(in, 2, 0, 12.0, 0.0, 2).step_us, mixed_step(in, 2, 0, 4.0, 0.0, 2).step_us);
}

TEST_F(RoundModel, ExpertBytesAtTheEfficiencyOfTheirRows) {
    // tp1, two requests: 2 tokens touch 8 · (1 − (6/8)²) = 3.5 experts with 4 pairs, 4 / 3.5 = 8/7 rows per
    // touched expert. Table (1, 0.5), ((8/7)², 1.0): half way in log(rows), 0.75 of 1000 GB/s. Bytes per
    // layer 3.5 · 3·1024·512 · 2 B = 11,010,048 B at 750 GB/s = 14.680064 µs; 4 layers. (Compute: 4 pairs ·
    // 2 · 1,572,864 FLOP at 100 TFLOP/s = 0.13 µs, below.)
    const ParallelLayout tp1{1, 1, 1, 1, 1};
    const DecodeResult flat = decode_step(inputs(tp1), 2, 1 << 30);
    EXPECT_NEAR(flat.step.tokens_per_touched_expert, 8.0 / 7.0, 1e-12);
    EXPECT_DOUBLE_EQ(flat.step.experts_memory_efficiency, 1.0);  // no table: memory_efficiency
    EXPECT_NEAR(flat.step.experts_us, 4 * 11.010048, 1e-9);
    hw_.gpu.expert_memory_efficiency_by_rows.points = {{1.0, 0.5}, {64.0 / 49.0, 1.0}};
    const DecodeResult r = decode_step(inputs(tp1), 2, 1 << 30);
    EXPECT_NEAR(r.step.experts_memory_efficiency, 0.75, 1e-12);
    EXPECT_NEAR(r.step.experts_us, 4 * 14.680064, 1e-9);
    EXPECT_TRUE(r.step.experts_memory_bound);
    // Only the experts' bytes: attention and the rest are priced at memory_efficiency as before.
    EXPECT_NEAR(r.step.step_us - flat.step.step_us, 4 * (14.680064 - 11.010048), 1e-9);
    // One request: 2 experts of 1 row each, the first point (0.5): 2 · 3,145,728 B at 500 GB/s per layer.
    const DecodeResult one = decode_step(inputs(tp1), 1, 1 << 30);
    EXPECT_NEAR(one.step.experts_us, 4 * 12.582912, 1e-9);
    // Prefill of 1000 tokens, 250 rows per expert: above the last point (1.0), so compute-bound as before.
    EXPECT_FALSE(prefill_step(inputs(tp1), 1000).step.experts_memory_bound);
}

TEST_F(RoundModel, MixedStepSumsDecodeAndPromptRows) {
    // A pure decode mixed step is decode_step's step; prompt rows add their work on top.
    CostInputs in = inputs(ParallelLayout{1, 2, 1, 2, 1});
    const StepBreakdown decode = mixed_step(in, 4, 0, 0.0, 0.0, 0);
    EXPECT_NEAR(decode.step_us, decode_step(in, 4, 1 << 30).step.step_us, 1e-9);
    const StepBreakdown mixed = mixed_step(in, 4, 60, 0.0, 30.0, 5);
    EXPECT_EQ(mixed.tokens, 64);
    EXPECT_GT(mixed.step_us, decode.step_us);
    EXPECT_GT(mixed.experts_touched_per_rank, decode.experts_touched_per_rank);
}

TEST_F(RoundModel, PrefillIsComputeBound) {
    PrefillResult p = prefill_step(inputs(ParallelLayout{1, 2, 1, 2, 1}), 1000);
    // 1000 tokens touch every expert: 8 · (1 − 0.75^1000) = 8.
    EXPECT_NEAR(p.step.experts_touched_per_rank, 8.0, 1e-9);
    EXPECT_FALSE(p.step.experts_memory_bound);
    EXPECT_NEAR(p.tokens_per_s, 1000 / p.step.step_us * 1e6, 1e-6);
    EXPECT_NEAR(p.ttft_ms, p.step.step_us / 1e3, 1e-12);
}

TEST_F(RoundModel, PrefillRunsInChunksOfMaxStepTokens) {
    // 5000 tokens in steps of 2048: chunks of 2048, 2048 and 904 rows over 1024, 3072 and 4548 keys on
    // average (2048·1024 + 2048·3072 + 904·4548 = 5000·2500: the causal FLOPs of one 5000-token step).
    CostInputs in = closed_loop_inputs(5000, 2, 2048);
    const PrefillResult p = prefill_step(in, 5000);
    EXPECT_EQ(p.chunks, 3);
    const StepBreakdown a = mixed_step(in, 0, 2048, 0.0, 1024.0, 1);
    const StepBreakdown b = mixed_step(in, 0, 2048, 0.0, 3072.0, 1);
    const StepBreakdown c = mixed_step(in, 0, 904, 0.0, 4548.0, 1);
    EXPECT_NEAR(p.step.step_us, a.step_us + b.step_us + c.step_us, 1e-9);
    EXPECT_NEAR(p.step.attention_us, a.attention_us + b.attention_us + c.attention_us, 1e-9);
    EXPECT_EQ(p.step.kernels, a.kernels + b.kernels + c.kernels);
    EXPECT_EQ(p.step.tokens, 2048);  // the first chunk's
    EXPECT_NEAR(p.ttft_ms, p.step.step_us / 1e3, 1e-12);
    // The same prompt alone in the closed loop: its first token comes after the same three steps.
    EXPECT_NEAR(closed_loop_run(in, 1).ttft_ms, p.ttft_ms, 1e-9);
    // One step when the prompt fits in one.
    in.max_step_tokens = 8192;
    EXPECT_EQ(prefill_step(in, 5000).chunks, 1);
    EXPECT_NEAR(prefill_step(in, 5000).step.step_us, mixed_step(in, 0, 5000, 0.0, 2500.0, 1).step_us, 1e-9);
}

TEST_F(RoundModel, PrefillChunksSumCollectivesAndPipelineTimes) {
    // pp 2 × tp 2: every chunk has all-reduces, a stage send, the output broadcast and a bubble; the
    // breakdown sums them over the chunks (add_step), not only the first chunk's.
    CostInputs in = inputs(ParallelLayout{2, 2, 1, 2, 1});
    in.max_step_tokens = 2048;
    const PrefillResult p = prefill_step(in, 5000);
    ASSERT_EQ(p.chunks, 3);
    const StepBreakdown a = mixed_step(in, 0, 2048, 0.0, 1024.0, 1);
    const StepBreakdown b = mixed_step(in, 0, 2048, 0.0, 3072.0, 1);
    const StepBreakdown c = mixed_step(in, 0, 904, 0.0, 4548.0, 1);
    ASSERT_GT(a.collectives_us(), 0.0);
    ASSERT_GT(a.bubble_us, 0.0);
    EXPECT_NEAR(p.step.collectives_us(), a.collectives_us() + b.collectives_us() + c.collectives_us(), 1e-9);
    EXPECT_NEAR(p.step.bubble_us, a.bubble_us + b.bubble_us + c.bubble_us, 1e-9);
    EXPECT_NEAR(p.step.path_us, a.path_us + b.path_us + c.path_us, 1e-9);
    EXPECT_NEAR(p.step.pipeline_wait_us, p.step.step_us - p.step.path_us, 1e-9);
    const CollectiveTerm* broadcast = term(p.step, "output broadcast");
    ASSERT_NE(broadcast, nullptr);
    EXPECT_EQ(broadcast->calls, 3 * term(a, "output broadcast")->calls);
}

TEST_F(RoundModel, ManyChunksCostTheSumOfTheirSteps) {
    // 12000 prompt tokens in steps of 120 (100 chunks) on pp 2 × tp 2. A chunk's attention is the larger of
    // its score FLOPs (120 · context · 4096 per layer, context = offset + 60) and its KV bytes (the
    // offset + 120 keys it reads · 4096 B): bytes for the first chunks, FLOPs from a context of 300 on.
    // prefill_step prices the chunks in affine stretches (cost_model.cc add_affine_stretches); the result
    // must be the chunks priced one by one.
    CostInputs in = inputs(ParallelLayout{2, 2, 1, 2, 1});
    in.max_step_tokens = 120;
    in.input_len = 12000;
    in.output_len = 3;
    StepBreakdown sum;
    int64_t chunks = 0;
    for (int64_t done = 0; done < 12000; done += 120, ++chunks) {
        const StepBreakdown c = mixed_step(in, 0, 120, 0.0, static_cast<double>(done) + 60.0, 1);
        sum.step_us += c.step_us;
        sum.attention_us += c.attention_us;
        sum.bubble_us += c.bubble_us;
        sum.kernels += c.kernels;
    }
    const PrefillResult p = prefill_step(in, 12000);
    EXPECT_EQ(p.chunks, chunks);
    EXPECT_NEAR(p.step.step_us, sum.step_us, 1e-9 * sum.step_us);
    EXPECT_NEAR(p.step.attention_us, sum.attention_us, 1e-9 * sum.attention_us);
    EXPECT_NEAR(p.step.bubble_us, sum.bubble_us, 1e-9 * sum.bubble_us);
    EXPECT_EQ(p.step.kernels, sum.kernels);
    // The chunks bend where FLOPs overtake bytes: chunks 1 … 99 priced at their middle one would differ.
    const double first = mixed_step(in, 0, 120, 0.0, 120 + 60.0, 1).step_us;
    const double middle = mixed_step(in, 0, 120, 0.0, 50 * 120 + 60.0, 1).step_us;
    const double last = mixed_step(in, 0, 120, 0.0, 99 * 120 + 60.0, 1).step_us;
    EXPECT_GT(std::abs(middle - (first + last) / 2), 1e-6 * middle);
    // The same prompt alone in the closed loop: the same steps, then two decode steps over 12001 and 12002
    // tokens (the prompt and the tokens so far).
    const ClosedLoopResult r = closed_loop_run(in, 1);
    EXPECT_EQ(r.steps, chunks + 2);
    EXPECT_NEAR(r.ttft_ms * 1e3, sum.step_us, 1e-9 * sum.step_us);
    const double decode =
        mixed_step(in, 1, 0, 12001.0, 0.0, 1).step_us + mixed_step(in, 1, 0, 12002.0, 0.0, 1).step_us;
    EXPECT_NEAR(r.tpot_ms * 1e3, decode / 2, 1e-9 * decode);
}

TEST_F(RoundModel, ClosedLoopPromptsAfterDecodersTakeTheBudget) {
    // Two requests of 5 prompt and 2 output tokens, steps of 1 token: request 0's prompt in 5 steps alone,
    // its one decode step (the budget: request 1 waits), then request 1's prompt the same way (the same
    // prompt-only run again: cost_model.cc reuses its price) and its decode step.
    CostInputs in = inputs(ParallelLayout{1, 1, 1, 1, 1});
    in.max_step_tokens = 1;
    in.input_len = 5;
    in.output_len = 2;
    double prompt_us = 0.0;
    for (int k = 0; k < 5; ++k) prompt_us += mixed_step(in, 0, 1, 0.0, k + 0.5, 1).step_us;
    const double decode_us = mixed_step(in, 1, 0, 6.0, 0.0, 1).step_us;
    const ClosedLoopResult r = closed_loop_run(in, 2);
    EXPECT_EQ(r.steps, 12);
    EXPECT_EQ(r.mixed_steps, 10);
    EXPECT_NEAR(r.duration_ms * 1e3, 2 * (prompt_us + decode_us), 1e-9);
    EXPECT_NEAR(r.ttft_ms * 1e3, (prompt_us + (2 * prompt_us + decode_us)) / 2, 1e-9);
    EXPECT_NEAR(r.tpot_ms * 1e3, decode_us, 1e-9);
}

TEST_F(RoundModel, APromptChunkReadsTheKeysBeforeIt) {
    // A chunk of 10 rows after 990 tokens reads the KV of all 1000 keys it attends to, 1000 · 4096 B per
    // layer (8 KV heads · 2 · 128 · 2 B per token), 4.096 µs at 1000 GB/s, above its scores' 10 · 995 · 4096
    // FLOPs = 0.4 µs at 100 TFLOP/s; the same chunk at offset 0 reads 10 keys. Four layers: 4 · 990 · 4096 B
    // more, 16.22016 µs; the rest of the two steps is the same.
    const CostInputs in = inputs(ParallelLayout{1, 1, 1, 1, 1});
    const StepBreakdown first = mixed_step(in, 0, 10, 0.0, 5.0, 1);
    const StepBreakdown later = mixed_step(in, 0, 10, 0.0, 995.0, 1);
    EXPECT_NEAR(later.attention_us - first.attention_us, 16.22016, 1e-9);
    EXPECT_NEAR(later.step_us - first.step_us, 16.22016, 1e-9);
}

TEST_F(RoundModel, PromptScoresAtThePrefillAttentionEfficiency) {
    // A prompt of 1000 tokens, each over 500 keys on average: per layer 1000 · 500 · 4096 = 2.048e9 score
    // FLOPs, 20.48 µs at 100 TFLOP/s, against its chunk's KV read once, 1000 · 8 · 2 · 128 · 2 B = 4.096 µs:
    // compute-bound. At prefill_attention_matmul_efficiency 0.25 they take 81.92 µs, 4 · 61.44 µs more.
    const CostInputs in = inputs(ParallelLayout{1, 1, 1, 1, 1});
    const PrefillResult base = prefill_step(in, 1000);
    const DecodeResult base_decode = decode_step(in, 4, 1 << 30);
    hw_.gpu.prefill_attention_matmul_efficiency.value = 0.25;
    EXPECT_NEAR(prefill_step(in, 1000).step.attention_us - base.step.attention_us, 4 * 61.44, 1e-9);
    // Decode rows of GQA are bound by their KV bytes: the figure does not price them.
    EXPECT_EQ(decode_step(in, 4, 1 << 30).step.attention_us, base_decode.step.attention_us);
    // A mixed step: its prompt rows at the figure, its decode rows as before (two rooflines).
    hw_.gpu.prefill_attention_matmul_efficiency.value = 1.0;
    const StepBreakdown mixed = mixed_step(in, 4, 1000, 100.0, 500.0, 5);
    hw_.gpu.prefill_attention_matmul_efficiency.value = 0.25;
    EXPECT_NEAR(mixed_step(in, 4, 1000, 100.0, 500.0, 5).attention_us - mixed.attention_us, 4 * 61.44, 1e-9);
}

TEST(LatentAttention, DecodeAndPromptScoresAtTheLatentEfficiency) {
    // Kimi K2 on one round GPU: 139,264 score FLOPs and 1152 B of latent per context token per layer.
    auto profile = parse_hardware_profile(testing::round_profile_json(), "round.json");
    ASSERT_TRUE(profile.is_ok());
    HardwareProfile hw = *profile;
    ModelCosts kimi = model_costs(testing::kimi_k2_config());
    CostInputs in;
    in.model = &kimi;
    in.hardware = &hw;
    in.layout = ParallelLayout{1, 1, 1, 1, 1};
    in.context_tokens = 100;
    const double decode = decode_step(in, 1, 1 << 30).step.attention_us;
    const double prompt = prefill_step(in, 1000).step.attention_us;
    hw.gpu.latent_attention_matmul_efficiency.value = 0.25;
    hw.gpu.prefill_attention_matmul_efficiency.value = 0.125;  // GQA's figure: not MLA's
    // One decode row over 100 tokens: 13,926,400 FLOPs, 0.139264 µs at 100 TFLOP/s (above the latent's
    // 115,200 B = 0.1152 µs), 0.557056 µs at 0.25: 61 layers · 0.417792 µs more.
    EXPECT_NEAR(decode_step(in, 1, 1 << 30).step.attention_us - decode, 61 * 0.417792, 1e-9);
    // A prompt of 1000 tokens over 500 keys on average: 6.9632e10 FLOPs, 696.32 µs → 2785.28 µs per layer.
    EXPECT_NEAR(prefill_step(in, 1000).step.attention_us - prompt, 61 * 2088.96, 1e-6);
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
