// What an attention layer sees of the KV cache: one sequence's contiguous cache for one layer, and the
// rows of a batch that belong to each sequence. The storage is owned by engine/kv_cache.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace epinfer {

// The cache of one sequence in one layer. Token i of the sequence (position i) is row i.
//   GQA: k, v: [capacity, Nkv, D] fp32 (k after q/k norm and RoPE).
//   MLA: k: [capacity, kv_lora_rank + qk_rope_head_dim] fp32, the latent after kv_a_layernorm and with
//        RoPE applied to the k_pe part; v unused (nullptr).
struct LayerKvCache {
    float* k = nullptr;      // [capacity, k_width] fp32, device
    float* v = nullptr;      // [capacity, v_width] fp32, device, or nullptr (MLA)
    int64_t capacity = 0;    // rows allocated
    int64_t num_tokens = 0;  // rows already filled (positions 0 .. num_tokens − 1)
};

// One sequence's rows in a batch: rows [row_begin, row_begin + num_rows) of every [T, ...] tensor, at
// positions kv->num_tokens + i. The layer writes their K/V into rows kv->num_tokens + i of *kv (which
// must have the capacity) and does not advance kv->num_tokens: the model does that after the last layer.
struct AttentionSequence {
    int64_t row_begin = 0;
    int64_t num_rows = 0;
    LayerKvCache* kv = nullptr;
};

// kInvalidArgument when seq.kv cannot take seq.num_rows more rows.
inline Status check_kv_capacity(const AttentionSequence& seq) {
    if (seq.kv == nullptr) return invalid_argument("attention: sequence without a KV cache");
    if (seq.kv->num_tokens + seq.num_rows > seq.kv->capacity) {
        return invalid_argument("attention: KV cache of " + std::to_string(seq.kv->capacity) +
                                " tokens cannot take " + std::to_string(seq.num_rows) + " more after " +
                                std::to_string(seq.kv->num_tokens));
    }
    return Status::ok();
}

struct AttentionBatch {
    const int32_t* positions = nullptr;            // [T] int32, device
    std::span<const AttentionSequence> sequences;  // in row order, covering [0, T)
};

}  // namespace epinfer
