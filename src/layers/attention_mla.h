// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2).
//
//   q      = q_b_proj(q_a_layernorm(q_a_proj(x)))  or  q_proj(x)            [T, Nh, Dn + Dr]
//   latent = kv_a_proj_with_mqa(x) = [c_kv (R) | k_pe (Dr)]; c_kv ← kv_a_layernorm(c_kv)
//   RoPE on q_pe (last Dr of each q head) and on k_pe (one head shared by all)
//   cache ← latent (R + Dr per token, into the sequence's blocks)
//   kv_b_proj = per head h the rows [W_UK_h (Dn × R) ; W_UV_h (Dv × R)]; scale = (Dn + Dr)^-0.5 · mscale²
//   (YaRN, see models/rope_table.h); out = o_proj(attention) with, per sequence, one of two exact forms:
//   - expanded (transformers' form): the S cached rows are gathered and, for all S tokens,
//     kv_b_proj(c_kv) → [S, Nh, Dn + Dv] = [k_nope | v]; K = [k_nope | k_pe], V = v;
//     attention = softmax(q·Kᵀ·scale) V.
//   - absorbed (DeepSeek-V2 paper §2.1.2; vLLM's and FlashMLA's decode): per head
//     q_latent = q_nope · W_UK_h [R], scores = [q_latent | q_pe] · [c_kv | k_pe]ᵀ · scale over the paged
//     latent cache itself (one KV head of width R + Dr shared by all Nh heads, V = its first R),
//     attention = (softmax · c_kv) · W_UV_hᵀ. The same scores and sums reassociated; nothing of size S × Nh
//     is formed.
//   A sequence with at most absorb_max_rows new rows takes the absorbed form, one with more the expanded
//   form. The model sets it (models/model.cc): on a backend with a latent-attention kernel
//   (Backend::has_latent_attention_kernel, CUDA) every chunk; else mla_absorb_max_rows, where the
//   expansion starts to cost fewer multiply-adds (long prefill chunks).
// Source: transformers 5.17 DeepseekV3Attention, DeepseekV2Attention.
#pragma once

#include <cstdint>

#include "layers/kv_cache.h"
#include "layers/linear.h"

namespace epinfer {

struct MlaAttentionWeights {
    Linear q_proj;                 // [Nh·(Dn+Dr), H], when q_lora_rank = 0
    Linear q_a_proj;               // [q_lora_rank, H], when q_lora_rank > 0
    RmsNormWeight q_a_layernorm;   // [q_lora_rank]
    Linear q_b_proj;               // [Nh·(Dn+Dr), q_lora_rank]
    Linear kv_a_proj_with_mqa;     // [R + Dr, H]
    RmsNormWeight kv_a_layernorm;  // [R]
    Linear kv_b_proj;              // [Nh·(Dn+Dv), R]
    Linear o_proj;                 // [H, Nh·Dv]
};

struct MlaAttentionParams {
    int64_t num_heads = 0;         // Nh
    int64_t q_lora_rank = 0;       // 0 = q_proj
    int64_t kv_lora_rank = 0;      // R
    int64_t qk_nope_head_dim = 0;  // Dn
    int64_t qk_rope_head_dim = 0;  // Dr
    int64_t v_head_dim = 0;        // Dv
    bool rope_interleaved = false;
    const float* inv_freq = nullptr;  // [Dr / 2] fp32, device
    float rope_attention_scaling = 1.0f;
    float softmax_scale = 0.0f;
    int64_t absorb_max_rows = 0;  // new rows of a sequence up to which the absorbed form runs (0: never)
};

// The largest n for which n new rows of a sequence cost fewer multiply-adds absorbed than expanded. Per
// head and cached key: absorbed n · (2R + Dr) (scores over R + Dr, the sum over R); expanded R · (Dn + Dv)
// (kv_b_proj of the key) + n · (Dn + Dr + Dv), so absorbed wins while n · (2R − Dn − Dv) < R · (Dn + Dv).
// DeepSeek-V3 / Kimi K2 (R 512, Dn 128, Dv 128): 170; INT64_MAX when 2R ≤ Dn + Dv (absorbed always
// cheaper). A kv_b_proj with a bias (no HF MLA model has one) always takes the expanded form.
int64_t mla_absorb_max_rows(const MlaAttentionParams& params);

// y = attention(x) for the T rows of `batch`; writes each sequence's new latent rows into its cache.
// x: [T, H] fp32 device; y: [T, H] fp32 device (must not overlap x).
// Errors: kInvalidArgument when a cache lacks the capacity for its new rows; op errors.
Status mla_attention_forward(Backend& backend, const MlaAttentionWeights& weights,
                             const MlaAttentionParams& params, const AttentionBatch& batch, const float* x,
                             int64_t num_rows, float* y);

}  // namespace epinfer
