// Causal GQA attention of the CUDA backend (AttentionArgs, op_args.h): fp32 q/k/v, one block per
// (query token, head), its warps splitting the visible keys, each with an online softmax (running max and
// sum, Milakov & Gimelshein 2018), merged across warps at the end. No T×S score matrix in memory.
// A simple correct kernel; the fast bf16 decode/prefill kernels of issue 4 come later.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_args.h"

namespace epinfer::cuda {

// Largest head_dim_v the kernel takes (each lane keeps Dv / 32 accumulators in registers).
inline constexpr int64_t kAttentionMaxHeadDimV = 512;

// Paged K/V (args.kv_block_table) are read through the block table, one lookup per key.
// Queries whose position is outside [0, S) get zeros and set *error_flag to 1 (never cleared here); a
// negative block id also sets it (that key is skipped).
// @pre attention_check(args) is OK, head_dim_v ≤ kAttentionMaxHeadDimV; error_flag: [1] int32, device.
cudaError_t launch_attention(const AttentionArgs& args, int32_t* error_flag, cudaStream_t stream);

}  // namespace epinfer::cuda
