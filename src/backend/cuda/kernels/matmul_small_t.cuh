// Dense matmul for few rows (decode): y = x · Wᵀ + bias with fp32 activations, F32/F16/BF16 weights read
// in place and fp32 accumulation, bound by reading W once.
//
// Each warp owns 2 consecutive weight rows (outputs; 4 for 5–8 activation rows) and streams them with 16-byte
// loads, lane l taking the 16-byte chunks l, l + 32, ... (up to four of them per row in flight at once
// for T ≤ 2); every chunk is multiplied with the T activation
// rows (fp32, read through L1/L2, shared by the warps of the GPU) into T·rows fp32 accumulators, which
// a butterfly of shuffles sums at the end. So W is read exactly once, at full width, whatever T is. A
// launch of few blocks (fewer than 512: a matrix of few rows) splits K over 2 or 4 warps of a block, whose
// sums the block adds in a fixed order through shared memory.
// Precision: the CPU reference's products in fp32 (fmaf), summed in another order (lane-strided partial
// sums, then a tree): fp32 summation-order differences only.
// Falls back to 4-byte loads when W, x or the row strides are not 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_args.h"

namespace epinfer::cuda {

inline constexpr int64_t kMatmulSmallTMaxRows = 16;  // T this kernel takes
// Rows of at least kMatmulLongK elements with a tensor-core GEMM above (bf16 weights, bf16-rounded
// activations): this kernel only up to kMatmulLongKMaxRows activation rows. On the H200 cuBLAS reads
// DeepSeek-V3's 7168- to 18432-wide rows faster from 6 rows on: its 4-layer decode step at 6 / 8 / 12 / 16
// rows 4.53–4.57 / 4.82–4.92 / 10.96–10.97 / 11.41–11.42 → 3.05–3.14 / 3.32–3.34 / 4.18–4.22 / 4.69–4.83 ms,
// 4 rows unchanged at 3.01–3.02 (docs/benchmarks/serving.md, session 16).
inline constexpr int64_t kMatmulLongK = 7168;
inline constexpr int64_t kMatmulLongKMaxRows = 4;

// Whether the CUDA backend runs a matmul of T rows over K (in_features) on this kernel, else on cuBLAS;
// tensor_cores: cuBLAS would run it on tensor cores (bf16 weights, activations rounded to bf16).
constexpr bool matmul_small_t_takes(int64_t num_rows, int64_t in_features, bool tensor_cores) {
    const bool long_rows = tensor_cores && in_features >= kMatmulLongK;
    return num_rows <= (long_rows ? kMatmulLongKMaxRows : kMatmulSmallTMaxRows);
}

// The matmuls of a group in one launch, each block on one of them (a single matmul is a group of one).
// Falls back to 4-byte loads for the whole launch when any entry is not 16-byte aligned.
// @pre matmul_group_check(group) is OK, 1 ≤ T ≤ kMatmulSmallTMaxRows and every entry has the same w_dtype.
cudaError_t launch_matmul_small_t(const MatmulGroupArgs& group, cudaStream_t stream);

}  // namespace epinfer::cuda
