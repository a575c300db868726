// The kGemv tile of the grouped expert GEMM (moe_grouped_gemm.cuh), for groups of few rows: a warp per four
// weight rows, 16-byte weight loads batched per lane, fp32 accumulation, the MMA kernels' epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/moe_grouped_gemm.cuh"

namespace epinfer::cuda {

// The most GEMM rows a kGemv tile holds (MoeGroupedGemmArgs::gemv_rows is 1, 2 or this): a group of more
// rows takes several tiles, each reading the group's weights again.
inline constexpr int kGemvMaxRows = 4;

// gemv_rows for a step whose groups have at most max_group_rows rows (a decode step of T tokens: T): the
// smallest of 1, 2 and kGemvMaxRows that holds them, else kGemvMaxRows.
int moe_gemv_tile_rows(int64_t max_group_rows);

// Weight rows one block reads (moe_gemm_tile_features(kGemv)).
int64_t moe_gemv_weight_rows_per_block();

// @pre args as launch_moe_grouped_gemm with tile kGemv, split_k 1, group_tile_offsets for args.gemv_rows rows.
// Errors: cudaErrorInvalidValue for gemv_rows other than 1, 2, kGemvMaxRows.
cudaError_t launch_moe_grouped_gemv(const MoeGroupedGemmArgs& args, cudaStream_t stream);

}  // namespace epinfer::cuda
