// MoE permutation plan on the GPU: the device twin of layers/moe/permute.h (moe_permute_plan), bit-exact
// with it, plus the row schedule of the grouped expert GEMM (moe_grouped_gemm.cuh).
//
// Slots are ordered by expert, then token, then k: a stable radix sort (CUB) of the pick keys
// (expert id; dropped ids sort last) over pick indices t·K + k gives exactly that order. Everything is
// integer bookkeeping, deterministic, with no host synchronisation (the counts stay on the device).
//
// GEMM rows: the grouped GEMM runs over "rows" = the S slots at rows [0, S), followed, when a shared
// expert rides along as one more group, by the T tokens at rows [T·K, T·K + T) (row T·K + t = token t).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace epinfer::cuda {

struct MoePermuteArgs {
    const int32_t* topk_ids = nullptr;  // [T, K] int32, device; ids outside [0, E) are dropped (no slot)
    int64_t num_tokens = 0;             // T (0 allowed), T·K < 2^31
    int64_t top_k = 0;                  // K ≥ 1
    int64_t num_experts = 0;            // E ≥ 1
    int64_t first_expert = 0;           // pick i is expert topk_ids[i] − first_expert (MoeExpertsArgs)
    // The plan (permute.h MoeRoutePlan), device:
    int32_t* expert_counts = nullptr;    // [E] slots per expert
    int32_t* expert_offsets = nullptr;   // [E + 1] exclusive prefix sum; [E] = S
    int32_t* token_of_row = nullptr;     // [T·K + T·shared_group] token of each GEMM row; [0, S) = token_of_slot
    int32_t* k_of_slot = nullptr;        // [T·K] k of each slot (first S valid)
    int32_t* slot_of_token_k = nullptr;  // [T, K] slot of pick (t, k); −1 = dropped
    // The grouped-GEMM schedule, device: G = E + shared_group groups.
    int32_t* group_row_begin = nullptr;     // [G] first row of group g (expert e: expert_offsets[e])
    int32_t* group_row_end = nullptr;       // [G] one past its last row
    int32_t* group_tile_offsets = nullptr;  // [G + 1] exclusive prefix sum of ceil(rows_g / tile_rows)
    int64_t tile_rows = 64;                 // rows per GEMM tile: moe_gemm_tile_rows of the launch's tile
    bool shared_group = false;              // group E = the shared expert over all T tokens
};

// Device workspace launch_moe_permute needs (256-byte aligned pieces: sort keys/values and CUB's own).
size_t moe_permute_workspace_bytes(const MoePermuteArgs& args);

// Builds the plan and the schedule: one kernel for T·K ≤ 640 (a one-block counting sort), else keys →
// CUB radix sort → slots → finalize. No host sync, graph-capturable; E ≤ ~50,000 (shared memory). @pre the
// pointers of args are valid for the sizes above.
// @post expert_offsets, token_of_row[0, S), k_of_slot[0, S) and slot_of_token_k equal moe_permute_plan().
cudaError_t launch_moe_permute(const MoePermuteArgs& args, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace epinfer::cuda
