// GQA's q/k/v preparation in one kernel (op_args.h QkNormRopeKvStoreArgs): per-head q/k RMSNorm, half-split
// RoPE of q and k, k and v rows into the KV cache pools. One warp per (token, head) of the Nh + 2·Nkv heads
// (q heads, then k, then v); lane l holds the rotary pairs (i, i + rotary_dim/2) for i = l, l + 32, ... and
// the unrotated elements rotary_dim + l, ...: the head stays in registers from load to store.
// Precision: the same per-element arithmetic as the separate kernels (rms_norm's w · (x · inv_rms), rope's
// sincosf of the fp32 angle, the cache's bf16 rounding of kv_cast.cuh); the norm's sum of squares in a warp
// tree order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_args.h"

namespace epinfer::cuda {

// True when the fused kernel takes these arguments: half-split RoPE (not interleaved), rotary_dim ≤ 256,
// head_dim − rotary_dim ≤ 128. Otherwise run the six ops (Backend::qk_norm_rope_kv_store).
bool qk_norm_rope_kv_store_fusable(const QkNormRopeKvStoreArgs& args);

// A token whose slot_mapping entry is outside [0, num_pool_rows) stores no k/v row and sets *error_flag to 1
// (kv_cache_store's flag); its q and k are still written.
// @pre qk_norm_rope_kv_store_check(args) is OK and qk_norm_rope_kv_store_fusable(args).
cudaError_t launch_qk_norm_rope_kv_store(const QkNormRopeKvStoreArgs& args, int32_t* error_flag,
                                         cudaStream_t stream);

}  // namespace epinfer::cuda
