// Causal attention prefill over a bf16 KV cache on Hopper's warpgroup MMAs (sm_90a), head dim 128: the
// prefill layout of flash_attention.cuh (the same AttentionArgs contract, positions, paging and errors)
// with FlashAttention-2's loop (Dao 2023, arXiv:2307.08691) on wgmma in the way of FlashAttention-3
// (Shah et al. 2024, arXiv:2407.08608): S = Q·Kᵀ with both operands in shared memory, the online softmax
// on the accumulator registers, then O += P·V with P from those registers and V transposed by the MMA.
//
// A CTA of two warpgroups takes 128 query rows — tokens × heads_per_chunk query heads of one KV head's
// group, 64 rows per warpgroup — and streams that KV head's keys in tiles of 128 (cp.async, three stages
// whose "landed" and "read" mbarriers order the copies and the MMAs, the 128-byte swizzle of wgmma.cuh),
// reading each K/V row once for the rows' heads; tile t's softmax overlaps tile t − 1's P·V. Tokens of
// different sequences in one tile are taken one sequence after the other. No key splits; no T×S matrix in
// memory.
// Q (fp32) is rounded to bf16 for the MMA, and so are the probabilities before P·V; scores, max, sums and
// the output are fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/flash_attention.cuh"
#include "backend/op_args.h"

namespace epinfer::cuda {

inline constexpr int kFlashPrefillSm90Rows = 128;  // query rows per CTA

// Query heads per CTA for a GQA group of `group` heads: the largest power of two dividing it, at most 16
// (so tokens_per_block = 128 / heads_per_chunk fills the rows).
int flash_prefill_sm90_heads_per_chunk(int64_t group);

// @pre flash_attention_supports(args), head_dim_qk = head_dim_v = 128, the device runs sm_90a code
// (sm90a.cuh); plan from plan_flash_attention with plan.sm90 (its heads_per_chunk, num_chunks and
// tokens_per_block are this kernel's layout); block_shift = log2(kv_block_size) when a power of two, else −1;
// error_flag: [1] int32, device (as launch_flash_attention).
cudaError_t launch_flash_prefill_sm90(const AttentionArgs& args, const FlashAttentionPlan& plan,
                                      int block_shift, int32_t* error_flag, cudaStream_t stream);

}  // namespace epinfer::cuda
