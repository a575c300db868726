// Causal attention of the CUDA backend (AttentionArgs, op_args.h) over contiguous or paged fp32 K/V, and
// the paged KV-cache write (KvCacheStoreArgs). One kernel for prefill and decode of every sequence of a
// batch: a block per (query token, KV head, chunk of ≤ 8 query heads of that KV head's group), so each key
// and value row is read once for the whole group (GQA). Its warps take tiles of 32 keys (a lane per key
// for q·k, then the tile's probabilities broadcast by shuffle for p·v), each warp with an online softmax
// (running max and sum, Milakov & Gimelshein 2018), merged across warps at the end. No T×S score matrix
// in memory. Not yet split over keys across blocks (flash-decoding), so very long contexts at small
// batch use few SMs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_args.h"

namespace epinfer::cuda {

// Largest head_dim_v the kernel takes (each lane keeps Dv / 32 accumulators per query head in registers).
inline constexpr int64_t kAttentionMaxHeadDimV = 512;

// Queries whose position is outside [0, S) or whose token_sequence is outside [0, num_sequences) get
// zeros and set *error_flag to 1 (never cleared here); a negative block id a query reaches also sets it
// (that key is skipped).
// @pre attention_check(args) is OK, head_dim_v ≤ kAttentionMaxHeadDimV; error_flag: [1] int32, device.
cudaError_t launch_attention(const AttentionArgs& args, int32_t* error_flag, cudaStream_t stream);

// A slot outside [0, num_pool_rows) skips its row and sets *error_flag to 1 (never cleared here).
// @pre kv_cache_store_check(args) is OK; error_flag: [1] int32, device.
cudaError_t launch_kv_cache_store(const KvCacheStoreArgs& args, int32_t* error_flag, cudaStream_t stream);

}  // namespace epinfer::cuda
