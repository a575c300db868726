// The kGemv tile of the grouped expert GEMM (moe_grouped_gemm.cuh), for groups of few rows: a warp per four
// weight rows, 16-byte weight loads batched per lane, fp32 accumulation, the MMA kernels' epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/moe_grouped_gemm.cuh"

namespace epinfer::cuda {

// GEMM rows per kGemv tile (moe_gemm_tile_rows(kGemv)): a group of more rows takes several tiles, each
// reading the group's weights again.
inline constexpr int kGemvRows = 4;

// Weight rows one block reads (moe_gemm_tile_features(kGemv)).
int64_t moe_gemv_weight_rows_per_block();

// @pre args as launch_moe_grouped_gemm with tile kGemv, split_k 1, group_tile_offsets for kGemvRows rows.
cudaError_t launch_moe_grouped_gemv(const MoeGroupedGemmArgs& args, cudaStream_t stream);

}  // namespace epinfer::cuda
