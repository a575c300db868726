// Grouped-query attention (Qwen2/3-MoE, Mixtral, OLMoE, GLM-4.5): q/k/v projections with optional biases,
// optional q/k RMSNorm (per head, or over the whole projection as OLMoE), RoPE on the first rotary_dim of
// each head (half-split pairs), causal attention against the KV cache, o_proj.
// Source: transformers 5.17 Qwen3MoeAttention, Glm4MoeAttention, OlmoeAttention, MixtralAttention.
#pragma once

#include <cstdint>

#include "layers/kv_cache.h"
#include "layers/linear.h"

namespace epinfer {

enum class QkNormMode { kNone, kPerHead, kFullProjection };

// Under attention TP (layers/parallel_context.h) each rank holds its heads' rows of q/k/v_proj and the
// matching columns of o_proj; Nh and Nkv below are then this rank's counts.
struct GqaAttentionWeights {
    Linear q_proj;         // [Nh·D, H]
    Linear k_proj;         // [Nkv·D, H]
    Linear v_proj;         // [Nkv·D, H]
    Linear o_proj;         // [H, Nh·D]
    RmsNormWeight q_norm;  // [D] (per head) or [Nh·D] (full projection)
    RmsNormWeight k_norm;  // [D] or [Nkv·D]
};

struct GqaAttentionParams {
    int64_t num_heads = 0;     // Nh
    int64_t num_kv_heads = 0;  // Nkv
    int64_t head_dim = 0;      // D
    QkNormMode qk_norm = QkNormMode::kNone;
    int64_t rotary_dim = 0;  // rotated dims at the start of each head, even, ≤ D
    bool rope_interleaved = false;
    const float* inv_freq = nullptr;  // [rotary_dim / 2] fp32, device
    float rope_attention_scaling = 1.0f;
    float softmax_scale = 0.0f;  // D^-0.5
    // Heads split across attention TP with kFullProjection q/k norm (OLMoE): the norm spans every head, so
    // q_proj/k_proj hold all heads and this rank keeps heads [head_begin, head_begin + num_heads) and KV
    // heads [kv_head_begin, kv_head_begin + num_kv_heads) after the norm. 0 = q_proj/k_proj hold only this
    // rank's heads (no split, or another norm mode).
    int64_t full_num_heads = 0;
    int64_t full_num_kv_heads = 0;
    int64_t head_begin = 0;
    int64_t kv_head_begin = 0;
};

// y = attention(x) for the T rows of `batch`; writes every sequence's new K/V into its cache blocks (one
// kv_cache_store per pool), and one attention op reads K/V of every sequence from the pools through the
// block tables (no gather).
// x: [T, H] fp32 device; y: [T, H] fp32 device (must not overlap x).
// Errors: kInvalidArgument when a cache lacks the capacity for its new rows; op errors.
Status gqa_attention_forward(Backend& backend, const GqaAttentionWeights& weights,
                             const GqaAttentionParams& params, const AttentionBatch& batch, const float* x,
                             int64_t num_rows, float* y);

}  // namespace epinfer
