// Each cost-model formula against a hand calculation (the arithmetic is in the comments).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "planner/cost_model.h"
#include "planner/layouts.h"
#include "planner/model_costs.h"
#include "planner/weight_format.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

TEST(WeightFormat, BytesPerElementIncludeScales) {
    EXPECT_DOUBLE_EQ(weight_bytes_per_element(WeightFormat::kBf16), 2.0);
    EXPECT_DOUBLE_EQ(weight_bytes_per_element(WeightFormat::kFp8Block128),
                     1.000244140625);                                                // 1 + 4/(128·128)
    EXPECT_DOUBLE_EQ(weight_bytes_per_element(WeightFormat::kInt4Group32), 0.5625);  // 0.5 + 2/32
    EXPECT_DOUBLE_EQ(weight_bytes_per_element(WeightFormat::kNvfp4), 0.5625);        // 0.5 + 1/16
    EXPECT_DOUBLE_EQ(weight_bytes_per_element(WeightFormat::kMxfp4), 0.53125);       // 0.5 + 1/32
}

TEST(WeightFormat, BytesPerKimiExpert) {
    // One Kimi K2 routed expert: 3 · 7168 · 2048 = 44,040,192 parameters (FACTS.md A.6: 44.04 M).
    ModelCosts m = model_costs(testing::kimi_k2_config());
    ASSERT_EQ(m.expert_params, 44040192);
    const double p = static_cast<double>(m.expert_params);
    EXPECT_DOUBLE_EQ(p * weight_bytes_per_element(WeightFormat::kBf16), 88080384.0);
    EXPECT_DOUBLE_EQ(p * weight_bytes_per_element(WeightFormat::kFp8Block128),
                     44050944.0);  // + 2688 blocks · 4 B
    EXPECT_DOUBLE_EQ(p * weight_bytes_per_element(WeightFormat::kInt4Group32), 24772608.0);
    EXPECT_DOUBLE_EQ(p * weight_bytes_per_element(WeightFormat::kNvfp4), 24772608.0);
    EXPECT_DOUBLE_EQ(p * weight_bytes_per_element(WeightFormat::kMxfp4), 23396352.0);
}

TEST(WeightFormat, ParsesWeightDtypeOption) {
    WeightFormats base{WeightFormat::kFp8Block128, WeightFormat::kFp8Block128};
    auto all = parse_weight_dtype("bf16", base);
    ASSERT_TRUE(all.is_ok());
    EXPECT_EQ(*all, (WeightFormats{WeightFormat::kBf16, WeightFormat::kBf16}));
    auto experts = parse_weight_dtype("experts=int4", base);
    ASSERT_TRUE(experts.is_ok());
    EXPECT_EQ(*experts, (WeightFormats{WeightFormat::kInt4Group32, WeightFormat::kFp8Block128}));
    auto both = parse_weight_dtype("experts=mxfp4,dense=bf16", base);
    ASSERT_TRUE(both.is_ok());
    EXPECT_EQ(*both, (WeightFormats{WeightFormat::kMxfp4, WeightFormat::kBf16}));
    auto twice = parse_weight_dtype("experts=fp8,experts=bf16", base);
    ASSERT_FALSE(twice.is_ok());
    EXPECT_EQ(twice.status().message(), "--weight-dtype 'experts=fp8,experts=bf16': experts is given twice");
    for (const char* bad : {"int3", "experts=", "attention=bf16", "experts=int4,", ""}) {
        auto r = parse_weight_dtype(bad, base);
        ASSERT_FALSE(r.is_ok()) << bad;
        EXPECT_NE(r.status().message().find("--weight-dtype"), std::string::npos);
    }
    ModelConfig kimi = testing::kimi_k2_config();
    EXPECT_EQ(checkpoint_weight_formats(kimi),
              (WeightFormats{WeightFormat::kFp8Block128, WeightFormat::kFp8Block128}));
    kimi.quant_method = "mxfp4";
    EXPECT_EQ(checkpoint_weight_formats(kimi), (WeightFormats{WeightFormat::kMxfp4, WeightFormat::kBf16}));
}

TEST(CostFormula, ExpectedDistinctExperts) {
    // E·(1 − (1 − K/E)^T).
    EXPECT_NEAR(expected_distinct_experts(384, 8, 1), 8.0, 1e-9);                 // one token: its K experts
    EXPECT_NEAR(expected_distinct_experts(384, 8, 2), 15.833333333333357, 1e-9);  // 384·(1 − (376/384)²)
    EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 2, 4), 5.46875);  // 8·(1 − 0.75⁴) = 8·0.68359375
    EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 2, 0), 0.0);
    EXPECT_NEAR(expected_distinct_experts(384, 8, 1024), 384.0, 1e-6);  // every expert
}

TEST(CostFormula, ExpectedDestinationRanks) {
    // R·(1 − C(E − E/R, K)/C(E, K)).
    EXPECT_NEAR(expected_destination_ranks(8, 2, 4), 52.0 / 28.0, 1e-12);  // 4·(1 − C(6,2)/C(8,2)) = 4·13/28
    EXPECT_NEAR(expected_destination_ranks(384, 8, 8), 5.2800157235546, 1e-9);
    EXPECT_DOUBLE_EQ(expected_destination_ranks(384, 8, 1), 1.0);
    // Uneven blocks 6, 5, 5 of 16 experts, K = 2: (1 − 45/120) + 2·(1 − 55/120) = 205/120.
    EXPECT_NEAR(expected_destination_ranks(16, 2, 3), 205.0 / 120.0, 1e-12);
    // One expert per rank: exactly K ranks.
    EXPECT_NEAR(expected_destination_ranks(8, 2, 8), 2.0, 1e-12);
}

TEST(CostFormula, ExpectedMaxima) {
    EXPECT_NEAR(expected_max_standard_normal(2), 0.5641895835, 1e-6);  // 1/√π
    EXPECT_NEAR(expected_max_standard_normal(8), 1.4236003, 1e-5);     // tabulated
    EXPECT_DOUBLE_EQ(expected_max_standard_normal(1), 0.0);
    // Two Bernoulli(0.5): E[max] = P(any is 1) = 0.75. Two Binomial(2, 0.5): P(max ≥ 1) + P(max ≥ 2)
    // = (1 − 0.25²) + (1 − 0.75²) = 0.9375 + 0.4375 = 1.375.
    EXPECT_NEAR(expected_max_binomial(1, 0.5, 2), 0.75, 1e-12);
    EXPECT_NEAR(expected_max_binomial(2, 0.5, 2), 1.375, 1e-12);
    EXPECT_NEAR(expected_max_binomial(48, 0.25, 1), 12.0, 1e-12);  // one sample: the mean
    EXPECT_DOUBLE_EQ(expected_max_binomial(48, 1.0, 8), 48.0);
}

SizeTable size_table(int ranks, std::vector<std::pair<double, double>> points) {
    SizeTable table;
    table.ranks = ranks;
    table.points = std::move(points);
    return table;
}

TEST(CostFormula, CollectiveCost) {
    CollectiveSpec spec;
    spec.latency_us.value = 10.0;
    spec.bus_bandwidth_gbps.value = 100.0;
    // all_reduce of 1 MB over 8 ranks: 10 + 1e6 · 2·7/8 / (100 GB/s = 1e5 B/µs) = 10 + 17.5.
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllReduce, 1e6, 8), 27.5);
    // all_to_all / all_gather: (n−1)/n; 4 ranks, 4 MB: 10 + 4e6 · 0.75 / 1e5 = 40.
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllToAll, 4e6, 4), 40.0);
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllGather, 4e6, 4), 40.0);
    // send_recv: factor 1.
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kSendRecv, 1e6, 2), 20.0);
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllReduce, 1e6, 1), 0.0);

    // A table measured at 8 ranks (the RTX PRO 6000 all_reduce points of FACTS.md C.5).
    spec.bus_bandwidth_gbps.value = 40.0;
    spec.tables = {size_table(8, {{256, 24.1}, {65536, 24.6}, {262144, 28.0}})};
    // One Kimi token's hidden state, 7168 · 2 B = 14336 B: 24.1 + (14336 − 256)/(65536 − 256) · 0.5.
    EXPECT_NEAR(collective_time_us(spec, Collective::kAllReduce, 14336, 8), 24.207843137254905, 1e-9);
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllReduce, 8, 8), 24.1);  // below the table
    // Above: 28.0 + (1 MiB − 256 KiB) · 1.75 / 4e4.
    EXPECT_NEAR(collective_time_us(spec, Collective::kAllReduce, 1048576, 8), 28.0 + 786432 * 1.75 / 4e4,
                1e-9);
    // Another group size ignores the table: 4 ranks, 1 MB: 10 + 1e6 · 1.5 / 4e4 = 47.5.
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllReduce, 1e6, 4), 47.5);
}

TEST(CostFormula, CollectiveCostPicksTheTableOfTheGroupSize) {
    // A 4-GPU profile with tables at 2 and 4 ranks (the shapes of the H200 NVLink all_reduce: ~50 µs at 2
    // ranks, ~300 µs at 4) and the 4-rank fit 300 µs + 500 GB/s.
    CollectiveSpec spec;
    spec.latency_us.value = 300.0;
    spec.bus_bandwidth_gbps.value = 500.0;
    spec.tables = {size_table(2, {{1024, 50.0}, {16384, 56.0}}),
                   size_table(4, {{1024, 260.0}, {16384, 350.0}})};
    ASSERT_NE(spec.table_for(2), nullptr);
    EXPECT_EQ(spec.table_for(2)->ranks, 2);
    EXPECT_EQ(spec.table_for(4)->ranks, 4);
    EXPECT_EQ(spec.table_for(8), nullptr);
    // 2 ranks, 8704 B (halfway): 50 + 0.5 · 6 = 53; 4 ranks: 260 + 0.5 · 90 = 305.
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllReduce, 8704, 2), 53.0);
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllReduce, 8704, 4), 305.0);
    // Above the 2-rank table: 56 + (1e6 − 16384) · f(2) = 1 / (500 GB/s = 5e5 B/µs) = 56 + 1.967232.
    EXPECT_NEAR(collective_time_us(spec, Collective::kAllReduce, 1e6, 2), 57.967232, 1e-9);
    // 8 ranks: no table, the fit: 300 + 1e6 · 2·7/8 / 5e5 = 303.5.
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllReduce, 1e6, 8), 303.5);
    // One rank: nothing to move.
    EXPECT_DOUBLE_EQ(collective_time_us(spec, Collective::kAllReduce, 8704, 1), 0.0);
}

TEST(CostFormula, Roofline) {
    Roofline r = roofline(1e9, 1e12, 1000.0, 100.0);  // 1 GB at 1000 GB/s; 1 TFLOP at 100 TFLOP/s
    EXPECT_DOUBLE_EQ(r.memory_us, 1000.0);
    EXPECT_DOUBLE_EQ(r.compute_us, 10000.0);
    EXPECT_DOUBLE_EQ(r.time_us(), 10000.0);
    EXPECT_FALSE(r.memory_bound());
}

TEST(CostFormula, ExpertMemoryEfficiencyByRows) {
    GpuSpec gpu;
    gpu.memory_efficiency.value = 0.8;
    // No table: memory_efficiency at any rows.
    EXPECT_DOUBLE_EQ(expert_memory_efficiency(gpu, 1.0), 0.8);
    EXPECT_DOUBLE_EQ(expert_memory_efficiency(gpu, 64.0), 0.8);
    // Points (1, 0.4), (4, 0.8), (16, 0.7): linear in log(rows) between them, the end points outside.
    gpu.expert_memory_efficiency_by_rows.points = {{1.0, 0.4}, {4.0, 0.8}, {16.0, 0.7}};
    EXPECT_DOUBLE_EQ(expert_memory_efficiency(gpu, 0.5), 0.4);  // below the first point
    EXPECT_DOUBLE_EQ(expert_memory_efficiency(gpu, 1.0), 0.4);
    EXPECT_NEAR(expert_memory_efficiency(gpu, std::sqrt(2.0)), 0.4 + 0.25 * 0.4, 1e-12);  // log(√2)/log(4)
    EXPECT_NEAR(expert_memory_efficiency(gpu, 2.0), 0.6, 1e-12);                          // half way in log
    EXPECT_NEAR(expert_memory_efficiency(gpu, 3.0), 0.4 + std::log(3.0) / std::log(4.0) * 0.4, 1e-12);
    EXPECT_NEAR(expert_memory_efficiency(gpu, 4.0), 0.8, 1e-12);   // on a point
    EXPECT_NEAR(expert_memory_efficiency(gpu, 8.0), 0.75, 1e-12);  // falling
    EXPECT_DOUBLE_EQ(expert_memory_efficiency(gpu, 64.0), 0.7);    // above the last point
    // One point: that efficiency everywhere.
    gpu.expert_memory_efficiency_by_rows.points = {{4.0, 0.5}};
    EXPECT_DOUBLE_EQ(expert_memory_efficiency(gpu, 1.0), 0.5);
    EXPECT_DOUBLE_EQ(expert_memory_efficiency(gpu, 100.0), 0.5);
}

TEST(CostFormula, ExpertMatmulEfficiencyByRows) {
    GpuSpec gpu;
    gpu.matmul_efficiency.value = 0.8;
    // No table and no expert figure (a GpuSpec built in code): matmul_efficiency; with the figure, it.
    EXPECT_DOUBLE_EQ(expert_matmul_efficiency(gpu, 64.0), 0.8);
    gpu.expert_matmul_efficiency.value = 0.2;
    EXPECT_DOUBLE_EQ(expert_matmul_efficiency(gpu, 64.0), 0.2);
    // The H200's points (64, 0.2), (256, 0.38), (1024, 0.42): the first below them, linear in log(rows).
    gpu.expert_matmul_efficiency_by_rows.points = {{64.0, 0.2}, {256.0, 0.38}, {1024.0, 0.42}};
    EXPECT_DOUBLE_EQ(expert_matmul_efficiency(gpu, 8.0), 0.2);
    EXPECT_NEAR(expert_matmul_efficiency(gpu, 128.0), 0.29, 1e-12);  // half way in log
    EXPECT_NEAR(expert_matmul_efficiency(gpu, 512.0), 0.40, 1e-12);
    EXPECT_DOUBLE_EQ(expert_matmul_efficiency(gpu, 4096.0), 0.42);
    // The routed experts' rate: the peak of their format × that efficiency.
    gpu.bf16_tflops.value = 1000.0;
    EXPECT_NEAR(effective_expert_tflops(gpu, MathRate::kBf16, 128.0), 290.0, 1e-9);
}

TEST(CostFormula, AttentionTflopsByKernel) {
    // GQA decode rows at matmul_efficiency, GQA prompts at the prefill figure, MLA at the latent one (its
    // decode rows are memory-bound in every step test, so only this check sees a wrong figure for them).
    GpuSpec gpu;
    gpu.bf16_tflops.value = 1000.0;
    gpu.matmul_efficiency.value = 0.8;
    EXPECT_DOUBLE_EQ(attention_tflops(gpu, false, true), 800.0);  // figures of 0: matmul_efficiency
    gpu.prefill_attention_matmul_efficiency.value = 0.4;
    gpu.latent_attention_matmul_efficiency.value = 0.3;
    EXPECT_DOUBLE_EQ(attention_tflops(gpu, false, false), 800.0);
    EXPECT_DOUBLE_EQ(attention_tflops(gpu, false, true), 400.0);
    EXPECT_DOUBLE_EQ(attention_tflops(gpu, true, false), 300.0);
    EXPECT_DOUBLE_EQ(attention_tflops(gpu, true, true), 300.0);
}

TEST(CostFormula, PipelineBubble) {
    // The engine's schedule (a step's micro-batches fill and drain the pipeline; nothing overlaps across
    // steps). Changed with the 2× H200 calibration: it was max(Σ t_s, m · max t_s), a steady state the
    // engine never reaches. Four stages of 2 µs, no sends. One micro-batch walks all stages (8 µs), each
    // stage idles 6 of 8 µs.
    PipelineTiming one = pipeline_timing({2, 2, 2, 2}, 1);
    EXPECT_DOUBLE_EQ(one.step_us, 8.0);
    EXPECT_DOUBLE_EQ(one.bubble_us, 6.0);
    EXPECT_DOUBLE_EQ(one.wait_us, 0.0);
    // Four micro-batches: fill and drain, (4 + 4 − 1) · 2 = 14; each stage busy 8 of 14 µs.
    PipelineTiming four = pipeline_timing({2, 2, 2, 2}, 4);
    EXPECT_DOUBLE_EQ(four.step_us, 14.0);
    EXPECT_DOUBLE_EQ(four.bubble_us, 6.0);
    EXPECT_DOUBLE_EQ(four.wait_us, 6.0);
    // Eight: (8 + 3) · 2 = 22.
    PipelineTiming eight = pipeline_timing({2, 2, 2, 2}, 8);
    EXPECT_DOUBLE_EQ(eight.step_us, 22.0);
    EXPECT_DOUBLE_EQ(eight.wait_us, 14.0);
    // Uneven stages: micro-batch 0 leaves stage 0 at 1, stage 1 at 4; micro-batch 1 reaches stage 1 at 2 and
    // waits for it: 4 + 3 = 7. The slow stage is busy 6 of 7 µs.
    PipelineTiming uneven = pipeline_timing({1, 3}, 2);
    EXPECT_DOUBLE_EQ(uneven.step_us, 7.0);
    EXPECT_DOUBLE_EQ(uneven.wait_us, 3.0);
    EXPECT_DOUBLE_EQ(uneven.bubble_us, 1.0);
}

TEST(ModelCosts, KvBytesPerTokenMlaVsGqa) {
    // MLA caches the latent: kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576 elements, 1152 B in bf16
    // per layer (FACTS.md A.6), 70,272 B over Kimi's 61 layers; the same on every attention-TP rank.
    ModelCosts kimi = model_costs(testing::kimi_k2_config());
    EXPECT_EQ(kimi.kv_elems_per_token_per_layer, 576);
    EXPECT_EQ(kimi.kv_elems_per_token_per_layer * 2 * kimi.num_layers, 70272);
    EXPECT_EQ(rank_share(kimi, ParallelLayout{1, 8, 1, 8, 1}).kv_elems_per_token, 576);
    // GQA caches K and V of every KV head: Qwen3-235B 2 · 4 · 128 = 1024 elements, 2048 B (FACTS.md A.6).
    ModelConfig qwen = testing::tiny_gqa_config();
    qwen.num_attention_heads = 64;
    qwen.num_key_value_heads = 4;
    qwen.head_dim = 128;
    ModelCosts q = model_costs(qwen);
    EXPECT_EQ(q.kv_elems_per_token_per_layer * 2, 2048);
    // Split by KV head under attention TP 2, replicated (one head per rank) under TP 8.
    EXPECT_EQ(rank_share(q, ParallelLayout{1, 2, 1, 2, 1}).kv_elems_per_token, 512);
    EXPECT_EQ(rank_share(q, ParallelLayout{1, 8, 1, 8, 1}).kv_elems_per_token, 256);
}

TEST(ModelCosts, ScoreFlopsPerContextToken) {
    // MLA in the absorbed form, decode rows and prompt chunks alike (the GPU engine absorbs every chunk):
    // scores over the 576-wide latent and the output in the 512-wide latent, 2 · 64 heads · (512 + 64 +
    // 512) = 139,264 FLOPs per query token per context token for Kimi K2 (the expanded form's
    // 2 · 64 · (128 + 64 + 128) = 40,960 is not what runs).
    EXPECT_EQ(model_costs(testing::kimi_k2_config()).score_flops_per_ctx, 139264.0);
    // GQA: q·k and p·v over D = 128 for each of the 8 query heads, 2 · 8 · 2 · 128 = 4096.
    EXPECT_EQ(model_costs(testing::tiny_gqa_config()).score_flops_per_ctx, 4096.0);
}

TEST(ModelCosts, KimiParameterCounts) {
    ModelCosts m = model_costs(testing::kimi_k2_config());
    // MLA per layer: q_a 7168·1536 + 1536, q_b 1536·64·192, kv_a 7168·576 + 512, kv_b 512·64·256,
    // o 64·128·7168.
    EXPECT_EQ(m.attn_split_params + m.attn_replicated_params, 101124096);
    EXPECT_EQ(m.num_moe_layers, 60);
    EXPECT_EQ(m.num_dense_layers, 1);
    EXPECT_EQ(m.shared_expert_params, 44040192);
    EXPECT_EQ(m.dense_mlp_params, 3LL * 7168 * 18432);
    // 2·V·H + final norm + 61·(attention + 2 norms) + 60·(shared + router 384·H + bias + 384 experts)
    // + dense MLP.
    EXPECT_EQ(m.total_params(), 1026408232448LL);
}

TEST(Layouts, SpecsRoundTrip) {
    ModelCosts kimi = model_costs(testing::kimi_k2_config());
    std::vector<ParallelLayout> layouts = enumerate_layouts(8, kimi);
    ASSERT_FALSE(layouts.empty());
    EXPECT_EQ(layout_spec(layouts[0]), "tp8");
    EXPECT_EQ(layout_spec(layouts[1]), "ep8");
    EXPECT_EQ(layout_spec(layouts[2]), "dp8-ep8");
    for (const ParallelLayout& l : layouts) {
        auto parsed = parse_layout_spec(layout_spec(l));
        ASSERT_TRUE(parsed.is_ok()) << layout_spec(l) << ": " << parsed.status().message();
        EXPECT_EQ(*parsed, l) << layout_spec(l);
    }
    EXPECT_EQ(layout_spec(ParallelLayout{1, 2, 4, 4, 2}), "tp8-dp4-ep2");
    EXPECT_EQ(layout_spec(ParallelLayout{2, 1, 1, 1, 1}), "pp2");
    EXPECT_EQ(layout_spec(ParallelLayout{}), "tp1");
    for (const char* bad : {"tp", "xx8", "tp8-tp4", "tp0", "", "tp8-ep3"}) {
        EXPECT_FALSE(parse_layout_spec(bad).is_ok()) << bad;
    }
}

// A malformed spec is one message naming the whole spec and what is wrong with it ("tp-1" was "bad token
// 'tp'").
TEST(Layouts, BadSpecsNameTheSpecAndTheFault) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"tp-1",
         "--layout 'tp-1': degree of 'tp' must be a positive integer (at most 999999) right after it, "
         "got '-1'"},
        {"ep-2",
         "--layout 'ep-2': degree of 'ep' must be a positive integer (at most 999999) right after it, "
         "got '-2'"},
        {"tp0",
         "--layout 'tp0': degree of 'tp' must be a positive integer (at most 999999) right after it, "
         "got '0'"},
        {"tpx",
         "--layout 'tpx': degree of 'tp' must be a positive integer (at most 999999) right after it, "
         "got 'x'"},
        {"dp8-EP",
         "--layout 'dp8-EP': degree of 'EP' must be a positive integer (at most 999999) right after "
         "it, got nothing"},
        {"tp4ep2",
         "--layout 'tp4ep2': degree of 'tp' must be a positive integer (at most 999999) right after "
         "it, got '4ep2'"},
        {"pp1234567", "got '1234567'"},
        {"tp8--ep8", "--layout 'tp8--ep8': an empty token (a '-' at an end or doubled)"},
        {"tp8-", "--layout 'tp8-': an empty token"},
        {"-tp8", "--layout '-tp8': an empty token"},
        {"zz8", "--layout 'zz8': unknown token 'zz8'"},
        {"tp8-tp4", "--layout 'tp8-tp4': 'tp' given twice"},
        {"tp8-ep3", "--layout 'tp8-ep3': --ep 3 does not divide the 8 ranks per stage"},
    };
    for (const auto& [spec, message] : cases) {
        const Result<ParallelLayout> parsed = parse_layout_spec(spec);
        ASSERT_FALSE(parsed.is_ok()) << spec;
        EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << spec;
        EXPECT_NE(parsed.status().message().find(message), std::string::npos) << parsed.status().message();
    }
    const Result<ParallelLayout> upper = parse_layout_spec("DP008-Ep8"), lower = parse_layout_spec("dp8-ep8");
    ASSERT_TRUE(upper.is_ok() && lower.is_ok()) << upper.status().message() << lower.status().message();
    EXPECT_EQ(*upper, *lower);
}

}  // namespace
}  // namespace epinfer::planner
