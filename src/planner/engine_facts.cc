#include "planner/engine_facts.h"

#include <algorithm>

namespace epinfer::planner {

EngineKernels engine_kernels(const ModelCosts& m, int64_t rows, int64_t moe_tokens, int attn_tp) {
    const int64_t big = rows > kEngineSmallMatmulMaxRows ? 1 : 0;
    EngineKernels k;
    if (m.mla) {
        k.attention = m.q_lora_rank > 0 ? 16 + 4 * big : 14 + 3 * big;
    } else if (m.qk_norm_full_projection && attn_tp > 1) {  // q, k (each normed and sliced) and v alone
        k.attention = 11 + 4 * big;
    } else {  // per-head q/k norms run inside qk_norm_rope_kv_store; whole-projection ones before it
        k.attention = 5 + (m.qk_norm_full_projection ? 2 : 0) + 2 * big;
    }
    // Up to kEngineMoeGemvMaxTokens tokens the gemv tile reads the fp32 x itself: no f32→bf16 kernel.
    k.moe = (moe_tokens <= kEngineMoeGemvMaxTokens ? 6 : 7) + big;
    // One token: pick mode (CudaMoeTiling::picks), the gemv reads the top-k ids, no permutation plan.
    if (moe_tokens != 1) k.moe += engine_moe_permute_kernels(rows * m.top_k, m.n_experts);
    if (m.shared_width > 0) k.moe += 4 + 3 * big + (m.shared_expert_gate ? 1 + big : 0);
    k.dense_mlp = 4 + 3 * big;
    k.head = 4 + big;
    k.stage_send = 1;
    return k;
}

int64_t engine_moe_permute_kernels(int64_t picks, int64_t num_experts) {
    if (picks <= kEnginePermuteOneBlockPicks) return 1;
    if (picks <= kEngineSortOneTilePicks) return 4;
    int64_t bits = 1;  // keys 0..E (E = a pick of another rank)
    while ((int64_t{1} << bits) <= num_experts) ++bits;
    return 7 + 2 * ((bits + 7) / 8);
}

int64_t engine_dp_moe_kernels(int moe_ep) {
    return 2 * static_cast<int64_t>(moe_ep);
}

bool engine_uses_decode_graph(const ModelCosts&, int world_size, int64_t decode_rows,
                              int64_t prefill_rows) {
    return world_size == 1 && prefill_rows == 0 && decode_rows >= 1 &&
           decode_rows <= kEngineMaxGraphRows;
}

namespace {

// Bytes of the bf16 copy of a matmul's input [rows, K] (the cuBLAS path, above the small-T kernel's rows).
int64_t matmul_input_copy_bytes(const EngineDevice& device, int64_t rows, int64_t K) {
    return rows > kEngineSmallMatmulMaxRows ? device.gemm_input_copy_bytes_per_element * rows * K : 0;
}

int64_t mla_attention_temp_bytes(const ModelCosts& m, const EngineAttentionTempArgs& x) {
    const EngineDevice& dev = x.device;
    const int64_t T = x.rows, a = x.act, c = dev.gemm_input_copy_bytes_per_element;
    int64_t S = x.context_tokens;  // keys of the longest sequence: the engine refuses one past the model's
    if (m.max_position_embeddings > 0) S = std::min(S, m.max_position_embeddings);
    const int64_t h = m.num_heads / std::max(1, x.attn_tp), H = m.hidden, q_lora = m.q_lora_rank;
    const int64_t R = m.kv_lora_rank, Dr = m.qk_rope_dim, Dqk = m.head_dim, Dn = Dqk - Dr, Dv = m.v_head_dim;
    const int64_t held = a * T * (h * Dqk + R + Dr + h * Dv);  // q, latent, attention output
    int64_t phase = matmul_input_copy_bytes(dev, T, H);        // q_proj or kv_a_proj_with_mqa
    if (q_lora > 0) phase = a * T * q_lora + matmul_input_copy_bytes(dev, T, std::max(H, q_lora));
    if (dev.mla_absorb_max_rows >= 1)  // q_abs, attn_latent, the larger batched GEMM input
        phase = std::max(phase, a * T * h * (2 * R + Dr) + c * T * h * std::max(Dn, R));
    if (std::min(T, S) > dev.mla_absorb_max_rows)  // cached latent, kv_b_proj output, keys, its input
        phase =
            std::max(phase, a * S * (R + Dr + h * (Dn + Dv) + h * Dqk) + matmul_input_copy_bytes(dev, S, R));
    phase = std::max(phase, matmul_input_copy_bytes(dev, T, h * Dv));  // o_proj
    return held + phase;
}

int64_t gqa_attention_temp_bytes(const ModelCosts& m, const EngineAttentionTempArgs& x) {
    const int64_t T = x.rows, a = x.act, D = m.head_dim, kv = x.kv_heads_per_rank;
    const int64_t h = m.num_heads / std::max(1, x.attn_tp);
    const int64_t held = a * T * (2 * h * D + 2 * kv * D);  // q, attention output; k, v
    int64_t project = matmul_input_copy_bytes(x.device, T, m.hidden);
    if (m.qk_norm_full_projection && x.attn_tp > 1) project += a * T * m.num_heads * D;  // every q head
    return held + std::max(project, matmul_input_copy_bytes(x.device, T, h * D));
}

}  // namespace

int64_t engine_attention_temp_bytes(const ModelCosts& m, const EngineAttentionTempArgs& args) {
    if (args.rows <= 0) return 0;
    return m.mla ? mla_attention_temp_bytes(m, args) : gqa_attention_temp_bytes(m, args);
}

EngineActivationBytes engine_activation_bytes(const ModelCosts& m, int attn_tp, int moe_tp,
                                              int64_t kv_heads_per_rank, int act, int64_t rows) {
    const double big = rows > kEngineSmallMatmulMaxRows ? 1.0 : 0.0;
    const double a = act, e = kEngineExpertRowBytesPerElement;
    const double H = static_cast<double>(m.hidden);
    const double tp = std::max(1, attn_tp), mtp = std::max(1, moe_tp);
    EngineActivationBytes b;
    if (m.mla) {
        const double q_w = static_cast<double>(m.num_heads * m.head_dim) / tp;
        const double v_w = static_cast<double>(m.num_heads * m.v_head_dim) / tp;
        const double q_lora = static_cast<double>(m.q_lora_rank);
        const double latent = static_cast<double>(m.kv_lora_rank + m.qk_rope_dim);
        b.attention_per_token =
            a * (7 * H + 4 * q_lora + 4 * q_w + 5 * latent + 2 * v_w) + big * 4 * (2 * H + q_lora + v_w);
    } else {
        const double q_w = static_cast<double>(m.num_heads * m.head_dim) / tp;
        const double kv_w = static_cast<double>(kv_heads_per_rank * m.head_dim);
        const double qkf = m.qk_norm_full_projection ? 1.0 : 0.0;
        b.attention_per_token =
            a * (8 * H + (6 + 2 * qkf) * q_w + (7 + 2 * qkf) * kv_w) + big * 4 * (H + q_w);
    }
    if (m.n_experts > 0) {
        b.moe_per_token = a * (7 * H + 2 * static_cast<double>(m.n_experts)) + e * H + big * 4 * H;
        b.moe_per_pair = e * (5 * H + 2 * static_cast<double>(m.expert_width) / mtp);
        if (m.shared_width > 0) {
            const double F = static_cast<double>(m.shared_width) / tp;
            b.moe_per_token += a * (6 * H + 6 * F) + big * 4 * (H + F);
            if (m.shared_expert_gate) b.moe_per_token += a * H + big * 4 * H;
        }
    }
    if (m.dense_width > 0) {
        const double F = static_cast<double>(m.dense_width) / tp;
        b.dense_mlp_per_token = a * (7 * H + 6 * F) + big * 4 * (H + F);
    }
    b.head_per_row = a * (4 * H + 2 * static_cast<double>(m.vocab) / tp) + big * 4 * H;
    b.stage_send_per_token = a * H;
    return b;
}

}  // namespace epinfer::planner
