// Weighted combine (unpermute) on the GPU: the device twin of layers/moe/permute.h moe_combine_rows, plus
// the unweighted shared-expert add of the MoE block:
//   out[t] = Σ_{k = 0..K−1} w[t, k] · y[slot_of_token_k[t, k]]   (fp32, from 0, in k order, dropped picks
//            skipped), then out[t] += shared_y[t] when a shared expert is given.
// Pick mode (slot_of_token_k null; the GEMMs' MoeGemmPicks): y row t·K + k holds pick (t, k), dropped
// when topk_ids[t, k] − first_expert is outside [0, num_experts).
// Every product and sum is rounded as the CPU code does (no fused multiply-add), so for the same bf16 y
// the result is bit-exact with moe_combine_rows (+ the CPU add op).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace epinfer::cuda {

struct MoeCombineArgs {
    const void* y = nullptr;                  // [S_cap, H] bf16, device: expert outputs by slot
    const float* topk_weights = nullptr;      // [T, K] fp32, device
    const int32_t* slot_of_token_k = nullptr; // [T, K] int32, device; −1 = dropped; nullptr: pick mode
    const int32_t* topk_ids = nullptr;        // [T, K] int32, device (pick mode)
    int64_t first_expert = 0;                 // pick mode: this rank's experts are
    int64_t num_experts = 0;                  //   [first_expert, first_expert + num_experts)
    const void* shared_y = nullptr;           // [T, H] bf16, device (shared expert output), or nullptr
    float* out = nullptr;                     // [T, H] fp32, device
    int64_t num_tokens = 0;                   // T (0 allowed)
    int64_t top_k = 0;                        // K
    int64_t hidden = 0;                       // H, a multiple of 8
};

// A block per (token, 1024 columns), 16-byte loads, up to 8 picks' rows in flight per thread. Errors:
// cudaErrorInvalidValue when H is not a multiple of 8, or in pick mode without topk_ids or with K > 64.
cudaError_t launch_moe_combine(const MoeCombineArgs& args, cudaStream_t stream);

}  // namespace epinfer::cuda
