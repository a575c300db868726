// How the engine launches and synchronises a step, as the cost model prices it (cost_model.h,
// engine_facts.h): the pipeline schedule with sends that run when both stages reach them (stages one after
// another for one micro-batch), eager kernels when no decode CUDA graph runs (any layout of more than one
// rank), and NCCL calls queued on the stream that cost their link time alone; each pinned to a hand
// calculation on the round-number model (planner_test_util.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "planner/cost_model.h"
#include "planner/engine_facts.h"
#include "planner/hardware_profile.h"
#include "planner/model_costs.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

// The round profile with kernels of 1 µs latency, 0.5 µs inside a graph and 2 µs launched directly.
HardwareProfile engine_profile() {
    nlohmann::json doc = nlohmann::json::parse(testing::round_profile_json());
    doc["gpu"]["kernel_latency_us"] = 1.0;
    doc["gpu"]["graph_kernel_us"] = 0.5;
    doc["gpu"]["eager_kernel_us"] = 2.0;
    auto hw = parse_hardware_profile(doc.dump(), "engine.json");
    EXPECT_TRUE(hw.is_ok()) << hw.status().message();
    return hw.is_ok() ? *hw : HardwareProfile{};
}

class EngineSync : public testing::TinyModelCosts {
protected:
    void SetUp() override { hw_ = engine_profile(); }
};

// One request on one GPU of the tiny model (tp1), everything but the kernels, per layer: attention weights
// 4 · 1024 · 1024 params = 8,388,608 B = 8.388608 µs at 1000 GB/s; KV (the engine's bf16) 100 · 8 heads · 2 ·
// 128 · 2 B = 409,600 B = 0.4096 µs; 2 experts · 3 · 1024 · 512 · 2 B = 6.291456 µs; router 8 · 1024 · 2 B =
// 0.016384 µs; activations (engine_facts.h) 4 · (8 + 6 + 7) · 1024 = 86,016 B + 4 · (7 · 1024 + 16) +
// 2 · 1024 = 30,784 B + 2 pairs · 2 · (5 · 1024 + 2 · 512) = 24,576 B: 0.141376 µs. Sum 15.247424 µs per
// layer.
constexpr double kLayerUs = 8.388608 + 0.4096 + 6.291456 + 0.016384 + 0.141376;
// LM head 1000 · 1024 · 2 B = 2.048 µs, its activations 4 · (4 · 1024 + 2 · 1000) = 24,384 B = 0.024384 µs.
constexpr double kHeadUs = 2.048 + 0.024384;
// 11 kernels per layer at one row (GQA 5: q, k, v in one launch; MoE 6: pick mode, no permute, the gemv
// reading the fp32 x; the residual adds inside the norms), 4 for the head. A pipeline stage that sends runs
// its last add alone: 1 kernel, 4 · 1024 B more per row (0.004096 µs at one row).
constexpr int kLayerKernels = 11, kHeadKernels = 4, kSendAddKernels = 1;
constexpr double kSendAddUs = 0.004096;

TEST(EngineFacts, DecodeGraphsOnlyOnOneRank) {
    // models/model_decode_graph.cc decode_graph_fits: one rank, decode only, 1..256 rows (MLA too: its
    // decode rows take the absorbed form).
    ModelCosts gqa = model_costs(testing::tiny_gqa_config());
    EXPECT_TRUE(engine_uses_decode_graph(gqa, 1, 1, 0));
    EXPECT_TRUE(engine_uses_decode_graph(gqa, 1, 256, 0));
    EXPECT_FALSE(engine_uses_decode_graph(gqa, 1, 257, 0));
    EXPECT_FALSE(engine_uses_decode_graph(gqa, 1, 8, 100));  // prompt chunks in the step
    EXPECT_FALSE(engine_uses_decode_graph(gqa, 2, 1, 0));    // any layout of two ranks or more
    EXPECT_TRUE(engine_uses_decode_graph(model_costs(testing::kimi_k2_config()), 1, 1, 0));  // MLA
}

TEST(EngineFacts, EagerKernelCostDefaultsToTheLaunchCost) {
    // Absent eager_kernel_us reads as kernel_launch_us.
    nlohmann::json doc = nlohmann::json::parse(testing::round_profile_json());
    doc["gpu"]["kernel_launch_us"] = 4.5;
    auto hw = parse_hardware_profile(doc.dump(), "launch.json");
    ASSERT_TRUE(hw.is_ok()) << hw.status().message();
    EXPECT_DOUBLE_EQ(hw->gpu.eager_kernel_us.value, 4.5);
    doc["gpu"]["eager_kernel_us"] = -1.0;
    auto bad = parse_hardware_profile(doc.dump(), "bad.json");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().message(), "bad.json: gpu.eager_kernel_us: must be >= 0 (got -1)");
}

TEST(EngineFacts, HostRoundTripIsOptionalAndNonNegative) {
    // gpu.host_round_trip_us: absent reads as 0; negative is refused.
    nlohmann::json doc = nlohmann::json::parse(testing::round_profile_json());
    auto absent = parse_hardware_profile(doc.dump(), "absent.json");
    ASSERT_TRUE(absent.is_ok()) << absent.status().message();
    EXPECT_DOUBLE_EQ(absent->gpu.host_round_trip_us.value, 0.0);
    doc["gpu"]["host_round_trip_us"] = {{"value", 41.5}, {"provenance", "estimate"}, {"source", "fitted"}};
    auto given = parse_hardware_profile(doc.dump(), "given.json");
    ASSERT_TRUE(given.is_ok()) << given.status().message();
    EXPECT_DOUBLE_EQ(given->gpu.host_round_trip_us.value, 41.5);
    EXPECT_EQ(given->gpu.host_round_trip_us.provenance, Provenance::kEstimate);
    doc["gpu"]["host_round_trip_us"] = -1.0;
    auto bad = parse_hardware_profile(doc.dump(), "bad.json");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().message(), "bad.json: gpu.host_round_trip_us: must be >= 0 (got -1)");
}

TEST(EngineFacts, TheSynchronousEnginesCollectiveGapIsRefused) {
    // gpu.collective_sync_us priced the host-polled NCCL calls of the engine before they became asynchronous;
    // a profile that still carries it is refused with a one-line reason rather than read differently.
    nlohmann::json doc = nlohmann::json::parse(testing::round_profile_json());
    doc["gpu"]["collective_sync_us"] = 22.0;
    auto old = parse_hardware_profile(doc.dump(), "old.json");
    ASSERT_FALSE(old.is_ok());
    EXPECT_EQ(old.status().message(),
              "old.json: gpu.collective_sync_us: no longer used: the engine's NCCL calls are asynchronous, a "
              "collective costs its measured time alone; remove the key");
}

TEST_F(EngineSync, KernelCostWithAndWithoutGraphs) {
    EXPECT_DOUBLE_EQ(kernel_fixed_us(hw_.gpu, true), 1.5);
    EXPECT_DOUBLE_EQ(kernel_fixed_us(hw_.gpu, false), 3.0);
    // tp1, one request: a decode graph, 4 · 11 (pick mode: no permute, the gemv reads the fp32 x) + 4 = 48
    // kernels at 1.5 µs.
    DecodeResult one = decode_step(inputs(ParallelLayout{1, 1, 1, 1, 1}), 1, 1 << 30);
    EXPECT_TRUE(one.step.decode_graph);
    EXPECT_EQ(one.step.kernels, 48);
    EXPECT_NEAR(one.step.launch_us, 48 * 1.5, 1e-9);
    EXPECT_NEAR(one.step.step_us, 4 * kLayerUs + kHeadUs + 48 * 1.5, 1e-9);
    // 257 rows: past the largest graph; launched one by one.
    DecodeResult big = decode_step(inputs(ParallelLayout{1, 1, 1, 1, 1}), 257, 1 << 30);
    EXPECT_FALSE(big.step.decode_graph);
    EXPECT_NEAR(big.step.launch_us, big.step.kernels * 3.0, 1e-9);
}

TEST_F(EngineSync, TwoRanksLaunchEagerlyAndQueueTheirCollectives) {
    // tp2, one request (test_cost_model.cc Tp2DecodeOneRequest with these kernel figures): no graph, so 48
    // kernels at 2 + 1 µs; each of the 8 all-reduces is queued on the stream and costs its link time alone:
    // 10 + 4096 · 1 / 1e5 = 10.04096 µs.
    DecodeResult r = decode_step(inputs(ParallelLayout{1, 2, 1, 2, 1}), 1, 1 << 30);
    const StepBreakdown& s = r.step;
    EXPECT_FALSE(s.decode_graph);
    EXPECT_EQ(s.kernels, 48);
    EXPECT_NEAR(s.launch_us, 48 * 3.0, 1e-9);
    const CollectiveTerm* attn = term(s, "attention all_reduce");
    ASSERT_NE(attn, nullptr);
    EXPECT_NEAR(attn->us_per_call, 10.04096, 1e-9);
    EXPECT_NEAR(s.collectives_us(), 8 * 10.04096, 1e-9);
    const double parts = 17.596416 + 4 * 3.145728 + (4 * 0.016384 + 1.024) + (4 * 0.112704 + 0.020384);
    EXPECT_NEAR(s.step_us, parts + 48 * 3.0 + 8 * 10.04096, 1e-9);
}

TEST_F(EngineSync, PipelineOfOneMicroBatchRunsTheStagesInTurn) {
    // pp2, one request: one micro-batch, so stage 1 waits for all of stage 0: the whole model's time, not
    // half. Stage 0: layers 0–1 and the add before its send, 23 kernels at 3 µs (no graph on two ranks);
    // stage 1: layers 2–3 and the head, 26 kernels. Send of one fp32 row (4096 B): 5 + 4096 / 2e5 µs; then
    // the broadcast of the id and the non-finite flag (MPI on the host): 2 · (5 + 4 / 2e5) µs.
    DecodeResult r = decode_step(inputs(ParallelLayout{2, 1, 1, 1, 1}), 1, 1 << 30);
    const StepBreakdown& s = r.step;
    EXPECT_EQ(s.micro_batches, 1);
    EXPECT_FALSE(s.decode_graph);
    const double stage0 = 2 * kLayerUs + kSendAddUs + (2 * kLayerKernels + kSendAddKernels) * 3.0;
    const double stage1 = 2 * kLayerUs + kHeadUs + (2 * kLayerKernels + kHeadKernels) * 3.0;
    const double send = 5.0 + 4096 / 2e5;
    const double broadcast = 2 * (5.0 + 4 / 2e5);
    ASSERT_NE(term(s, "stage send"), nullptr);
    EXPECT_NEAR(term(s, "stage send")->us_per_call, send, 1e-9);
    ASSERT_NE(term(s, "output broadcast"), nullptr);
    EXPECT_NEAR(term(s, "output broadcast")->total_us(), broadcast, 1e-9);
    EXPECT_NEAR(s.step_us, stage0 + send + stage1 + broadcast, 1e-9);
    EXPECT_NEAR(s.path_us, s.step_us, 1e-9);
    EXPECT_NEAR(s.bubble_us, stage0 + send, 1e-9);  // stage 1, the busier, idles through stage 0 and the send
}

TEST_F(EngineSync, PipelineOfTwoMicroBatchesWithSendsThatWaitForTheReceiver) {
    // pp2, two requests: two micro-batches of one. Stage 1 finishes micro-batch 0 at t0 + c + t1; stage 0's
    // second send waits for it (stage 1's stream reaches the receive only then), so micro-batch 1 ends at
    // max(2·t0 + c, t0 + c + t1) + c + t1 = t0 + 2c + 2·t1 here (t1 > t0), then the broadcast of 2 + 2
    // values.
    DecodeResult r = decode_step(inputs(ParallelLayout{2, 1, 1, 1, 1}), 2, 1 << 30);
    const double t0 = 2 * kLayerUs + kSendAddUs + (2 * kLayerKernels + kSendAddKernels) * 3.0;
    const double t1 = 2 * kLayerUs + kHeadUs + (2 * kLayerKernels + kHeadKernels) * 3.0;
    const double c = 5.0 + 4096 / 2e5;
    const double broadcast = 2 * (5.0 + 8 / 2e5);
    EXPECT_EQ(r.step.micro_batches, 2);
    EXPECT_NEAR(r.step.step_us, t0 + 2 * c + 2 * t1 + broadcast, 1e-9);
    EXPECT_NEAR(r.tokens_per_s, 2 / r.step.step_us * 1e6, 1e-6);
    // The general schedule: two equal stages of t with sends c: 3t + 2c; three stages: a middle stage
    // receives, computes and sends in turn, (1 + 2)·t + 2·c for micro-batch 0, then 1 + 2·0.5 per further
    // one.
    EXPECT_DOUBLE_EQ(pipeline_timing({1.0, 1.0}, 2, 0.5).step_us, 4.0);
    EXPECT_DOUBLE_EQ(pipeline_timing({1.0, 1.0, 1.0}, 2, 0.5).step_us, 6.0);
    EXPECT_DOUBLE_EQ(pipeline_timing({1.0, 1.0, 1.0}, 3, 0.5).step_us, 8.0);
}

TEST_F(EngineSync, MicroBatchesSplitTheStepsSequencesInOrder) {
    // A mixed step on pp2: 2 decode rows, then 2 prompt chunks of 30 rows. The engine splits by sequences:
    // micro-batch 0 = the 2 decode rows, micro-batch 1 = the 60 prompt rows (not 1 + 30 each).
    CostInputs in = inputs(ParallelLayout{2, 1, 1, 1, 1});
    StepBreakdown s = mixed_step(in, 2, 60, 0.0, 15.0, 4);
    EXPECT_EQ(s.micro_batches, 2);
    EXPECT_EQ(s.tokens_per_attn_rank, 2);
    EXPECT_FALSE(s.decode_graph);
    // The step is longer than micro-batch 0's path by at least the prompt micro-batch's last stage.
    EXPECT_GT(s.pipeline_wait_us, 0.0);
    // A prompt on one GPU: no graph either (prompt rows), every kernel at 3 µs.
    StepBreakdown prompt = mixed_step(inputs(ParallelLayout{1, 1, 1, 1, 1}), 0, 60, 0.0, 30.0, 1);
    EXPECT_FALSE(prompt.decode_graph);
    EXPECT_NEAR(prompt.launch_us, prompt.kernels * 3.0, 1e-9);
}

}  // namespace
}  // namespace epinfer::planner
