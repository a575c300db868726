// The attention block's temporaries in the memory model (engine_facts.h engine_attention_temp_bytes, one
// term of plan_memory's activations) pinned to hand counts of layers/attention_mla.cc and attention_gqa.cc:
// DeepSeek-V3 (tests/data/configs/deepseek_v3.json) on a GPU with the latent kernel, on the CPU backend
// and on a GPU without it; Qwen3-30B-A3B (GQA) whose activations the term leaves as they were.
#include <gtest/gtest.h>

#include <string>

#include "planner/engine_facts.h"
#include "planner/hardware_profile.h"
#include "planner/layouts.h"
#include "planner/memory_model.h"
#include "planner/model_costs.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

const std::string kDataDir = std::string(EPINFER_TEST_DATA_DIR);

ModelCosts costs_of(const std::string& config_name) {
    return testing::config_file_costs(config_name);
}

GpuSpec h200() {
    auto hw = load_hardware_profile_file(kDataDir + "/../../profiles/h200_sxm.json");
    EXPECT_TRUE(hw.is_ok()) << hw.status().message();
    return hw.is_ok() ? hw->gpu : GpuSpec{};
}

EngineAttentionTempArgs args_of(int64_t rows, int64_t context_tokens, int attn_tp, EngineDevice device) {
    EngineAttentionTempArgs a;
    a.rows = rows;
    a.context_tokens = context_tokens;
    a.attn_tp = attn_tp;
    a.device = device;
    return a;
}

constexpr EngineDevice kCpu{170, 0};         // mla_absorb_max_rows of DeepSeek-V3's dims; no GEMM copies
constexpr EngineDevice kGpuNoLatent{170, 2};  // sm_86/89/120: the CUDA backend without the latent kernel

TEST(AttentionTemps, PlansPriceAGpuWithTheLatentKernel) {
    const MemoryOptions o;
    EXPECT_EQ(o.device.mla_absorb_max_rows, kEngineMlaAbsorbAllRows);
    EXPECT_EQ(o.device.gemm_input_copy_bytes_per_element, 2);
}

// DeepSeek-V3: H 7168, q_lora 1536, R 512, Dr 64, Dn 128, Dv 128 (Dqk 192), 128 heads; T 2048, fp32 (4 B).
TEST(AttentionTemps, DeepSeekV3AbsorbsEveryChunkOnTheLatentKernel) {
    const ModelCosts m = costs_of("deepseek_v3.json");
    // tp1, h 128. Held: 4·2048·(128·192 + 576 + 128·128) = 4·2048·41,536 = 340,262,912 B (q, latent, out).
    // Absorbed: q_abs + attn_latent 4·2048·128·(2·512 + 64) = 1,140,850,688 B, + the bf16 input of · W_UVᵀ
    // 2·2048·128·512 = 268,435,456 B → 1,409,286,144 B; larger than the q projection's 4·2048·1536 +
    // 2·2048·7168 = 41,943,040 B and o_proj's 2·2048·128·128 = 67,108,864 B. No expanded form, any context.
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(2048, 4096, 1, EngineDevice{})), 1749549056);
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(2048, 163840, 1, EngineDevice{})), 1749549056);
    // tp8, h 16: held 4·2048·(16·192 + 576 + 16·128) = 46,661,632 B; absorbed 4·2048·16·1088 +
    // 2·2048·16·512 = 176,160,768 B.
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(2048, 4096, 8, EngineDevice{})), 222822400);
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(0, 4096, 1, EngineDevice{})), 0);
}

TEST(AttentionTemps, DeepSeekV3ExpandsChunksOfMoreThanAbsorbMaxRows) {
    const ModelCosts m = costs_of("deepseek_v3.json");
    // CPU, tp1: held 340,262,912 B; absorbed (no copies) 1,140,850,688 B; expanded over S keys
    // 4·S·(576 + 128·256 + 128·192) = 4·S·57,920: 948,961,280 B at S 4096 (the absorbed form is larger) and
    // 3,795,845,120 B at S 16384.
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(2048, 4096, 1, kCpu)), 340262912LL + 1140850688);
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(2048, 16384, 1, kCpu)), 340262912LL + 3795845120);
    // No sequence holds more than max_position_embeddings (163,840) keys: 4·163840·57,920 = 37,958,451,200 B
    // for any larger context (the runtime's check with a --kv-cache-tokens pool of 10^9).
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(2048, 1000000000, 1, kCpu)), 340262912LL + 37958451200);
    // A GPU without the latent kernel adds kv_b_proj's bf16 input 2·16384·512 = 16,777,216 B.
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(2048, 16384, 1, kGpuNoLatent)),
              340262912LL + 3795845120 + 16777216);
    // Chunks of at most 170 rows (T 128) are all absorbed: held 4·128·41,536 = 21,266,432 B + absorbed
    // 4·128·128·1088 = 71,303,168 B.
    EXPECT_EQ(engine_attention_temp_bytes(m, args_of(128, 16384, 1, kCpu)), 21266432 + 71303168);
}

// dp8-ep8 (attn_tp 1): 8·2048·7168·4 = 469,762,048 B of hidden-state buffers + max(MoE 2048·8·8·32/256 =
// 16,384 rows · (3·2048 + 2·7168)·4 = 1,342,177,280 B, dense MLP 2048·3·18432·4 = 452,984,832 B, attention
// 1,749,549,056 B) + logits 1024·129280·4 = 529,530,880 B. tp8: the MoE's 16,384 · (3·2048/8 + 2·7168)·4 =
// 989,855,744 B stays above the attention's 222,822,400 B.
TEST(AttentionTemps, DeepSeekV3ActivationsByHand) {
    const ModelCosts m = costs_of("deepseek_v3.json");
    const MemoryOptions o;
    const MemoryPlan dp8_ep8 = plan_memory(m, ParallelLayout{1, 1, 8, 1, 8}, h200(), o);
    EXPECT_EQ(dp8_ep8.stages[0].activation_bytes, 469762048LL + 1749549056 + 529530880);
    const MemoryPlan tp8 = plan_memory(m, ParallelLayout{1, 8, 1, 8, 1}, h200(), o);
    EXPECT_EQ(tp8.stages[0].activation_bytes, 469762048LL + 989855744 + 16160 * 1024 * 4);
}

// Qwen3-30B-A3B: H 2048, 32 heads, 4 KV heads of 128. tp1: q, out 2·2048·4096·4 + k, v 2·2048·512·4 =
// 75,497,472 B + o_proj's bf16 input 2·2048·4096 = 16,777,216 B (above the projections' 2·2048·2048).
TEST(AttentionTemps, Qwen3GqaActivationsUnchanged) {
    const ModelCosts m = costs_of("qwen3_30b_a3b.json");
    EngineAttentionTempArgs a = args_of(2048, 4096, 1, EngineDevice{});
    a.kv_heads_per_rank = 4;
    EXPECT_EQ(engine_attention_temp_bytes(m, a), 75497472 + 16777216);
    // tp1 as before the term: 8·2048·2048·4 = 134,217,728 B + MoE 16,384 rows · (3·768 + 2·2048)·4 =
    // 419,430,400 B + logits 1024·151936·4 = 622,329,856 B.
    const MemoryOptions o;
    EXPECT_EQ(plan_memory(m, ParallelLayout{1, 1, 1, 1, 1}, h200(), o).stages[0].activation_bytes,
              134217728 + 419430400 + 622329856);
    // On every layout of 8 GPUs the MoE's term stays the larger: the attention's changes nothing.
    for (const ParallelLayout& l : enumerate_layouts(8, m)) {
        const RankShare share = rank_share(m, l);
        a.attn_tp = l.attn_tp;
        a.kv_heads_per_rank = share.kv_heads_per_rank;
        const int64_t moe_rows = 2048LL * l.attn_dp * m.top_k * share.local_experts / m.n_experts;
        const int64_t moe = moe_rows * (3 * m.expert_width / l.moe_tp + 2 * m.hidden) * 4;
        EXPECT_LT(engine_attention_temp_bytes(m, a), moe) << layout_spec(l);
        const int64_t rest = 2048LL * 8 * m.hidden * 4 + 1024 * share.vocab_slice * 4;
        EXPECT_EQ(plan_memory(m, l, h200(), o).stages[0].activation_bytes, rest + moe) << layout_spec(l);
    }
}

}  // namespace
}  // namespace epinfer::planner
