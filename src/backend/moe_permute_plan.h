// MoE permutation plan: the bookkeeping shared by dispatch/combine, the grouped expert FFN and the
// moe_experts op of every backend (R4). Host code: the CPU reference of backend/cuda/kernels/moe_permute.cuh.
//
// A slot is one valid (token t, position k) pick of the router. Slots are ordered by expert, then by token
// index, then by k (a stable counting sort), so expert e owns the contiguous slots
// [expert_offsets[e], expert_offsets[e + 1]) and the grouped GEMM reads each expert's rows in one block.
// Everything here is integer bookkeeping or byte copies: bit-exact and deterministic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace epinfer {

struct MoeRoutePlan {
    int64_t num_tokens = 0;                // T
    int64_t top_k = 0;                     // K
    int64_t num_experts = 0;               // E
    std::vector<int32_t> expert_counts;    // [E] slots per expert
    std::vector<int32_t> expert_offsets;   // [E + 1] exclusive prefix sum of expert_counts; back() == S
    std::vector<int32_t> token_of_slot;    // [S] token index t of each slot
    std::vector<int32_t> k_of_slot;        // [S] top-k position k of each slot
    std::vector<int32_t> slot_of_token_k;  // [T, K] slot of pick (t, k); −1 = dropped (id outside [0, E))

    int64_t num_slots() const { return static_cast<int64_t>(token_of_slot.size()); }  // S
};

// Builds the plan of `topk_ids` ([T, K] int32, host; −1 = no expert). Ids outside [0, E) are dropped
// (no slot). @pre T ≥ 0, K ≥ 1, E ≥ 1, T·K < 2^31.
// @post Σ expert_counts == S == number of ids in [0, E); token_of_slot/k_of_slot and slot_of_token_k are
// inverse maps: slot_of_token_k[token_of_slot[s]·K + k_of_slot[s]] == s for every slot s.
MoeRoutePlan moe_permute_plan(const int32_t* topk_ids, int64_t num_tokens, int64_t top_k,
                              int64_t num_experts);

// Permute: x_perm[s] = x[token_of_slot[s]] for every slot, copied byte for byte (any dtype).
// x: [T, row_bytes] host; x_perm: [S, row_bytes] host.
void moe_permute_rows(const MoeRoutePlan& plan, const void* x, size_t row_bytes, void* x_perm);

// Weighted combine (unpermute): out[t] = Σ_{k = 0..K−1} w[t, k] · y[slot_of_token_k[t, k]], accumulated in
// fp32 from 0 in that fixed k order, dropped picks skipped (a token with no pick gets a zero row).
// y: [S, H] fp32 host (expert outputs in slot order); topk_weights: [T, K] fp32 host; out: [T, H] fp32 host.
void moe_combine_rows(const MoeRoutePlan& plan, const float* y, const float* topk_weights, int64_t hidden,
                      float* out);

}  // namespace epinfer
