// fp32 row gather and weighted combine of the MoE experts op's general path (any weight dtype, any H):
// the device twins of backend/moe_permute_plan.h moe_permute_rows and moe_combine_rows on fp32 rows,
// with every product and sum rounded as the CPU code does (no fused multiply-add), so for the same y the
// combine is bit-exact with moe_combine_rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace epinfer::cuda {

// x_perm[s, :] = x[token_of_slot[s], :] for s < num_slots.
// x: [T, H] fp32, device; token_of_slot: [S] int32, device; x_perm: [S, H] fp32, device.
cudaError_t launch_moe_gather_rows_f32(const float* x, const int32_t* token_of_slot, int64_t num_slots,
                                       int64_t hidden, float* x_perm, cudaStream_t stream);

// out[t, :] = Σ_{k = 0..K−1, slot ≥ 0} w[t, k] · y[slot_of_token_k[t, k], :], fp32 from 0 in k order.
// y: [S, H] fp32, device; topk_weights: [T, K] fp32, device; slot_of_token_k: [T, K] int32, device (−1 =
// dropped); out: [T, H] fp32, device.
cudaError_t launch_moe_combine_f32(const float* y, const float* topk_weights, const int32_t* slot_of_token_k,
                                   int64_t num_tokens, int64_t top_k, int64_t hidden, float* out,
                                   cudaStream_t stream);

}  // namespace epinfer::cuda
