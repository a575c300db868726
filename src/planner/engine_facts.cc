#include "planner/engine_facts.h"

#include <algorithm>

namespace epinfer::planner {

EngineKernels engine_kernels(const ModelCosts& m, int64_t rows) {
    const int64_t big = rows > kEngineSmallMatmulMaxRows ? 1 : 0;
    EngineKernels k;
    if (m.mla) {
        k.attention = m.q_lora_rank > 0 ? 17 + 4 * big : 15 + 3 * big;
    } else {
        k.attention = 11 + (m.qk_norm ? 2 : 0) + 4 * big;
    }
    k.moe = 8 + big + engine_moe_permute_kernels(rows * m.top_k, m.n_experts);
    if (m.shared_width > 0) k.moe += 5 + 3 * big + (m.shared_expert_gate ? 1 + big : 0);
    k.dense_mlp = 6 + 3 * big;
    k.head = 4 + big;
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
            a * (8 * H + 4 * q_lora + 4 * q_w + 5 * latent + 2 * v_w) + big * 4 * (2 * H + q_lora + v_w);
    } else {
        const double q_w = static_cast<double>(m.num_heads * m.head_dim) / tp;
        const double kv_w = static_cast<double>(kv_heads_per_rank * m.head_dim);
        const double qkn = m.qk_norm ? 1.0 : 0.0;
        b.attention_per_token =
            a * (9 * H + (6 + 2 * qkn) * q_w + (8 + 2 * qkn) * kv_w) + big * 4 * (3 * H + q_w);
    }
    if (m.n_experts > 0) {
        b.moe_per_token = a * (8 * H + 2 * static_cast<double>(m.n_experts)) + e * H + big * 4 * H;
        b.moe_per_pair = e * (5 * H + 2 * static_cast<double>(m.expert_width) / mtp);
        if (m.shared_width > 0) {
            const double F = static_cast<double>(m.shared_width) / tp;
            b.moe_per_token += a * (6 * H + 6 * F) + big * 4 * (2 * H + F);
            if (m.shared_expert_gate) b.moe_per_token += a * H + big * 4 * H;
        }
    }
    if (m.dense_width > 0) {
        const double F = static_cast<double>(m.dense_width) / tp;
        b.dense_mlp_per_token = a * (8 * H + 6 * F) + big * 4 * (2 * H + F);
    }
    b.head_per_row = a * (4 * H + 2 * static_cast<double>(m.vocab) / tp) + big * 4 * H;
    return b;
}

}  // namespace epinfer::planner
