// The engine's facts (engine_facts.h) pinned to hand counts, and what they make of one Qwen3-30B-A3B decode
// step on the measured H200 profile (profiles/measured/h200_epinfer_2026-11-29.json).
#include <gtest/gtest.h>

#include <string>

#include "core/dtype.h"
#include "planner/cost_model.h"
#include "planner/engine_facts.h"
#include "planner/hardware_profile.h"
#include "planner/memory_model.h"
#include "planner/model_costs.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

const std::string kDataDir = std::string(EPINFER_TEST_DATA_DIR);

ModelCosts qwen3_30b() {
    return testing::config_file_costs("qwen3_30b_a3b.json");
}

// Kernels of one rank's `rows` rows when the MoE step has as many tokens (no DP attention), attention TP 1.
EngineKernels kernels_of_rows(const ModelCosts& m, int64_t rows) {
    return engine_kernels(m, rows, rows, 1);
}

TEST(EngineFacts, KernelsPerLayerQwen3) {
    // Batch 1 (77f1e2f): input norm (with the last MLP's add), [q, k, v] in one launch,
    // qk_norm_rope_kv_store (per-head q/k norms, 2 rope, 2 kv store), flash attention, o_proj = 5 (7 in
    // fdefb56's engine: q, k, v three launches); post norm (with the attention's add), router, top-k,
    // gate_up, down (kGemv in pick mode: no permute, no split-K, x read as fp32), combine = 6.
    ModelCosts m = qwen3_30b();
    EngineKernels one = kernels_of_rows(m, 1);
    EXPECT_EQ(one.attention, 5);
    EXPECT_EQ(one.moe, 6);
    EXPECT_EQ(one.head, 4);
    EXPECT_EQ(one.stage_send, 1);  // a sending pipeline stage's last add, once per forward
    // 2 rows: the permute (one block) plans the rows: 7; up to 4 the gemv tile reads the fp32 x.
    EXPECT_EQ(kernels_of_rows(m, 2).moe, 7);
    EXPECT_EQ(kernels_of_rows(m, 4).moe, 7);
    // 8 rows: the narrow tile on a bf16 copy of x (its split-K memset at 5–10 rows is not counted).
    EXPECT_EQ(kernels_of_rows(m, 5).moe, 8);
    EXPECT_EQ(kernels_of_rows(m, 8).attention, 5);
    EXPECT_EQ(kernels_of_rows(m, 8).moe, 8);
    // Past 16 rows the stacked q, k and v are one cuBLAS GEMM, and each of it, o_proj, the router and the LM
    // head adds an f32→bf16 conversion of its input: 5 + 2 = 7.
    EXPECT_EQ(kernels_of_rows(m, 16).attention, 5);
    EngineKernels big = kernels_of_rows(m, 17);
    EXPECT_EQ(big.attention, 7);
    EXPECT_EQ(big.moe, 9);
    EXPECT_EQ(big.head, 5);
    EXPECT_EQ(kernels_of_rows(m, 64).moe, 9);
    EXPECT_EQ(kernels_of_rows(m, 80).moe, 9);  // 640 picks: still the one-block permute
    // 96 rows (768 picks) and 256 rows (2048): keys, CUB's one-tile sort, slots, finalize.
    EXPECT_EQ(kernels_of_rows(m, 96).moe, 7 + 1 + 4);
    EXPECT_EQ(kernels_of_rows(m, 256).attention, 7);
    EXPECT_EQ(kernels_of_rows(m, 256).moe, 7 + 1 + 4);
    // 1024 rows, 8192 picks: keys, 2 memsets, histogram, exclusive sum, memset + onesweep (keys 0..128 in
    // 8 bits: one pass), slots, finalize.
    EXPECT_EQ(kernels_of_rows(m, 1024).attention, 7);
    EXPECT_EQ(kernels_of_rows(m, 1024).moe, 7 + 1 + 9);
}

TEST(EngineFacts, QkNormsOfTheWholeProjectionRunAlone) {
    // Per-head q/k norms (Qwen3) run inside qk_norm_rope_kv_store: as many kernels as no q/k norm (Qwen2);
    // OLMoE's norms over the whole q and k projections are 2 rms_norm kernels before it.
    ModelCosts m = qwen3_30b();
    m.qk_norm_full_projection = true;
    EXPECT_EQ(kernels_of_rows(m, 1).attention, 5 + 2);
    EXPECT_EQ(kernels_of_rows(m, 64).attention, 7 + 2);
    // Under attention TP each rank projects every q and k head (project_full_then_slice): q, its norm, the
    // copy of the rank's heads, the same for k, then v, each alone (no group at any row count); + the
    // fused op, attention, o_proj and the input norm = 11; + 4 conversions past 16 rows.
    EXPECT_EQ(engine_kernels(m, 1, 1, 2).attention, 3 + 3 + 1 + 4);
    EXPECT_EQ(engine_kernels(m, 64, 64, 2).attention, 11 + 4);
    // Per-head norms split by heads like any projection: the group under TP too.
    EXPECT_EQ(engine_kernels(qwen3_30b(), 1, 1, 2).attention, 5);
    // Activation bytes: the two norms read and write q and k once more, 4·2·(4096 + 512).
    EXPECT_DOUBLE_EQ(
        engine_activation_bytes(m, 1, 1, 4, 4, 1).attention_per_token,
        engine_activation_bytes(qwen3_30b(), 1, 1, 4, 4, 1).attention_per_token + 4.0 * 2 * (4096 + 512));
}

TEST(EngineFacts, PickModeNeedsOneMoeToken) {
    // DP attention, one row on this rank and one on another DP group's: the experts receive both, the
    // permute plans them (7, the gemv tile); one MoE token over the group runs pick mode (6); 5 MoE tokens
    // the narrow tile, with the f32→bf16 copy of x (8).
    ModelCosts m = qwen3_30b();
    EXPECT_EQ(engine_kernels(m, 1, 2, 1).moe, 7);
    EXPECT_EQ(engine_kernels(m, 1, 1, 1).moe, 6);
    EXPECT_EQ(engine_kernels(m, 1, 5, 1).moe, 8);
}

TEST(EngineFacts, MoePermuteKernels) {
    EXPECT_EQ(engine_moe_permute_kernels(1, 128), 1);
    EXPECT_EQ(engine_moe_permute_kernels(640, 128), 1);
    EXPECT_EQ(engine_moe_permute_kernels(641, 128), 4);
    EXPECT_EQ(engine_moe_permute_kernels(1024, 128), 4);
    EXPECT_EQ(engine_moe_permute_kernels(4864, 128), 4);
    EXPECT_EQ(engine_moe_permute_kernels(4865, 128), 9);
    EXPECT_EQ(engine_moe_permute_kernels(8192, 255), 9);   // keys 0..255: 8 bits, one pass
    EXPECT_EQ(engine_moe_permute_kernels(8192, 256), 11);  // keys 0..256: 9 bits, two passes
}

TEST(EngineFacts, KvCacheIsBf16OnGpus) {
    // --kv-cache-dtype auto stores bf16 k/v pools on CUDA (fp32 on the CPU backend, the exact reference):
    // what plan prices, and the planner's defaults.
    EXPECT_EQ(kEngineKvBytesPerElement, static_cast<int>(dtype_size(DType::kBF16)));
    EXPECT_EQ(MemoryOptions{}.kv_bytes_per_element, 2);
    EXPECT_EQ(CostInputs{}.kv_bytes_per_element, 2);
}

TEST(EngineFacts, DpAttentionMoeOnTheHost) {
    // layers/moe/moe_dp_device.cc, ep_device.cc, ep_dispatch.cc per MoE layer on a rank with tokens:
    // copies to the host of the ids and weights, 2 MPI all_to_all_v, one upload of the send rows, the local
    // slots, their weights, row_of and the zero row: 5 round trips. Kernels: 1 gather to send, then moe_ep
    // gathers and moe_ep − 1 adds home.
    EXPECT_EQ(kEngineDpMoeHostRoundTrips, 2 + 2 + 1);
    EXPECT_EQ(engine_dp_moe_kernels(4), 1 + 4 + 3);
    EXPECT_EQ(engine_dp_moe_kernels(2), 1 + 2 + 1);
}

TEST(EngineFacts, KernelsPerLayerKimiK2) {
    // MLA with q_lora: 11 + the absorbed form's 5 more (two packs, two batched GEMMs, the q_pe copy; the
    // attention op counted in the 11; the residual add runs in the post-attention norm); MoE 6 at one token
    // (pick mode: no permute; the gemv reads the fp32 x) + one shared expert's [gate, up] (one launch),
    // silu·mul, down and its add into the routed output; dense MLP 4: post norm, [gate, up], silu·mul, down.
    // At 64 rows: + 4 f32→bf16 conversions in attention, + the router's, + the permute (512 picks: one
    // block), gate and up apart (+ 1) and 2 conversions (gate and up share one) in the shared expert and in
    // the dense MLP.
    ModelCosts m = model_costs(testing::kimi_k2_config());
    EngineKernels one = kernels_of_rows(m, 1);
    EXPECT_EQ(one.attention, 16);
    EXPECT_EQ(one.moe, 6 + 4);
    EXPECT_EQ(one.dense_mlp, 4);
    EngineKernels big = kernels_of_rows(m, 64);
    EXPECT_EQ(big.attention, 20);
    EXPECT_EQ(big.moe, 7 + 1 + 1 + 7);
    EXPECT_EQ(big.dense_mlp, 7);
}

TEST(EngineFacts, ActivationBytesQwen3) {
    // H 2048, q_w 32·128 = 4096, kv_w 4·128 = 512, E 128, I 768, V 151936, fp32 (4 B), one rank.
    ModelCosts m = qwen3_30b();
    EngineActivationBytes one = engine_activation_bytes(m, 1, 1, 4, 4, 1);
    // Attention: input norm 2H, q/k/v read 3H (each projection its x, in one launch or three: 77f1e2f
    // changed no byte), o_proj write H, the add inside the post-attention norm 2H (residual read, sum
    // written) = 8H; q written, qk_norm_rope_kv_store r/w, attention read, output w/r = 6·q_w; k and v
    // written, read by the fused op, k and 2 cache rows written = 7·kv_w: 4·(8·2048 + 6·4096 + 7·512) =
    // 4·44,544 (before fdefb56: 4·56,320, the q/k norms, ropes and stores 4·q_w + 8·kv_w, the add 3H).
    EXPECT_DOUBLE_EQ(one.attention_per_token, 178176.0);
    // 4·(7·2048 + 2·128) + 2·2048 = 62,464 (the add inside the next norm: 2H); per pair
    // 2·(5·2048 + 2·768) = 23,552.
    EXPECT_DOUBLE_EQ(one.moe_per_token, 62464.0);
    EXPECT_DOUBLE_EQ(one.moe_per_pair, 23552.0);
    EXPECT_DOUBLE_EQ(one.dense_mlp_per_token, 0.0);
    // 4·(4·2048 + 2·151936) = 1,248,256.
    EXPECT_DOUBLE_EQ(one.head_per_row, 1248256.0);
    // A sending pipeline stage's last add alone: 3H, the H more than inside the norm.
    EXPECT_DOUBLE_EQ(one.stage_send_per_token, 4.0 * 2048);
    // Past 16 rows: + 4·(2048 + 4096) for the conversions of the q/k/v input and o_proj's; + 4·2048 for the
    // router and for the LM head.
    EngineActivationBytes big = engine_activation_bytes(m, 1, 1, 4, 4, 17);
    EXPECT_DOUBLE_EQ(big.attention_per_token, 178176.0 + 24576.0);
    EXPECT_DOUBLE_EQ(big.moe_per_token, 62464.0 + 8192.0);
    EXPECT_DOUBLE_EQ(big.head_per_row, 1248256.0 + 8192.0);
    // Attention TP 2 halves q_w and the vocab slice: 4·(8·2048 + 6·2048 + 7·256).
    EXPECT_DOUBLE_EQ(engine_activation_bytes(m, 2, 1, 2, 4, 1).attention_per_token,
                     4.0 * (16384 + 12288 + 1792));
}

class Qwen3OnMeasuredH200 : public ::testing::Test {
protected:
    void SetUp() override {
        auto profile =
            load_hardware_profile_file(kDataDir + "/../../profiles/measured/h200_epinfer_2026-11-29.json");
        ASSERT_TRUE(profile.is_ok()) << profile.status().message();
        hw_ = *profile;
        model_ = qwen3_30b();
        in_.model = &model_;
        in_.hardware = &hw_;
        in_.layout = ParallelLayout{1, 1, 1, 1, 1};
        in_.context_tokens = 256;
    }
    HardwareProfile hw_;
    ModelCosts model_;
    CostInputs in_;
};

TEST_F(Qwen3OnMeasuredH200, KernelsAtTheMeasuredLatency) {
    // 48 layers · 11 (pick mode: no permute, the gemv reading the fp32 x; fdefb56's fused norms and q/k
    // preparation, 77f1e2f's one launch for q, k, v) + head 4 = 532 kernels, each graph_kernel_us 0.5 +
    // kernel_latency_us 7.42 (that profile's engine, 6c868cd, launched 1060: 22 per layer with the permute).
    DecodeResult one = decode_step(in_, 1, 1 << 30);
    EXPECT_EQ(one.step.kernels, 532);
    EXPECT_NEAR(one.step.launch_us, 532 * 7.92, 1e-6);
    // 1024 rows: 48 · (7 + 17) + 5 = 1157 kernels (1349 before q, k and v were stacked and a group's x
    // converted once).
    DecodeResult big = decode_step(in_, 1024, 1 << 30);
    EXPECT_EQ(big.step.kernels, 1157);
}

TEST_F(Qwen3OnMeasuredH200, ExpertsAtTheGroupedGemmRate) {
    // 1024 tokens touch 128·(1 − (120/128)^1024) ≈ 128 experts: 1.208 GB at 4800 · 0.7947 GB/s = 316.7 µs;
    // 2·1024·8·4,718,592 = 77.31 GFLOP at 989.4 · 0.1717 TFLOP/s = 455.1 µs: compute-bound, per layer.
    DecodeResult r = decode_step(in_, 1024, 1 << 30);
    const double flops = 2.0 * 1024 * 8 * 4718592;
    EXPECT_FALSE(r.step.experts_memory_bound);
    EXPECT_NEAR(r.step.experts_us, 48 * flops / (989.4 * 0.1717 * 1e6), 1e-6);
    // The dense projections stay at cuBLAS's rate: 2·18,874,368·1024 FLOP at 989.4 · 0.8055 vs 37.7 MB.
    EXPECT_NEAR(effective_tflops(hw_.gpu, MathRate::kBf16), 989.4 * 0.8055, 1e-9);
    EXPECT_NEAR(effective_expert_tflops(hw_.gpu, MathRate::kBf16, 64.0), 989.4 * 0.1717, 1e-9);  // no table
}

TEST_F(Qwen3OnMeasuredH200, ClosedLoopAddsPromptChunksToDecode) {
    // 256 requests of 128 prompt tokens: 32,768 prompt tokens in steps of ≤ 2048, decode first. The median
    // request's window holds prompt chunks, so its TPOT exceeds a pure decode step over the same contexts.
    in_.input_len = 128;
    in_.output_len = 128;
    ClosedLoopResult r = closed_loop_run(in_, 256);
    EXPECT_EQ(r.requests_per_group, 256);
    EXPECT_GE(r.mixed_steps, 16);  // ≥ 32,768 / 2048
    EXPECT_EQ(r.steps, r.mixed_steps + 127);
    StepBreakdown decode = mixed_step(in_, 256, 0, 128 + 64, 0.0, 0);
    EXPECT_GT(r.tpot_ms, decode.step_us / 1e3);
    EXPECT_NEAR(r.tokens_per_s, 256.0 * 128 / (r.duration_ms / 1e3), 1e-6);
}

}  // namespace
}  // namespace epinfer::planner
