// Element-wise and row-wise ops of the CUDA backend (op_args.h): embedding, RMSNorm, RoPE, silu·mul, add,
// sigmoid-gated add, and the helpers of the dense matmul (weights → fp32, activations → bf16, bias add).
// fp32 activations, F32/F16/BF16 weights read in place, fp32 accumulation. Framework-free launches on a
// caller's stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_args.h"

namespace epinfer::cuda {

// Rows of an out-of-range token id are written as zeros and set *error_flag to 1 (never cleared here).
// @pre embedding_check(args) is OK; error_flag: [1] int32, device.
cudaError_t launch_embedding(const EmbeddingArgs& args, int32_t* error_flag, cudaStream_t stream);

// @pre rms_norm_check(args) is OK. Sum of squares in fp32 (block tree order, not the CPU's).
cudaError_t launch_rms_norm(const RmsNormArgs& args, cudaStream_t stream);

// @pre rope_check(args) is OK. cos/sin from sincosf of the fp32 angle (CUDA's full-range path).
cudaError_t launch_rope(const RopeArgs& args, cudaStream_t stream);

// @pre silu_mul_check / add_check / add_sigmoid_gated_check are OK.
cudaError_t launch_silu_mul(const SiluMulArgs& args, cudaStream_t stream);
cudaError_t launch_add(const AddArgs& args, cudaStream_t stream);
cudaError_t launch_add_sigmoid_gated(const AddSigmoidGatedArgs& args, cudaStream_t stream);

// dst[i] = float(src[i]) for num_elements values of F32/F16/BF16 (a weight upcast before an fp32 GEMM).
cudaError_t launch_to_f32(const void* src, DType src_dtype, float* dst, int64_t num_elements,
                          cudaStream_t stream);  // src, dst: [n], device

// dst[r, c] = bf16(x[r, c]) (round to nearest even) for R rows of C columns: the activation rows of a bf16
// GEMM. x: [R, C] fp32, device, row stride x_row_stride; dst: [R, C] bf16, device, packed.
cudaError_t launch_f32_rows_to_bf16(const float* x, int64_t x_row_stride, int64_t num_rows, int64_t num_cols,
                                    void* dst, cudaStream_t stream);

// dst[t, b, k] = bf16(x[t·x_token_stride + b·x_batch_stride + k]) (round to nearest even) for T × B rows of K:
// the activations of a batched bf16 GEMM (BatchedMatmulArgs). dst: [T, B, K] bf16, device, packed.
cudaError_t launch_f32_batched_rows_to_bf16(const float* x, int64_t x_token_stride, int64_t x_batch_stride,
                                            int64_t num_rows, int64_t num_batches, int64_t num_cols, void* dst,
                                            cudaStream_t stream);

// y[t, n] += float(bias[n]) for T rows of N columns (row stride y_row_stride).
cudaError_t launch_add_bias(float* y, int64_t y_row_stride, const void* bias, DType bias_dtype, int64_t num_rows,
                            int64_t num_cols, cudaStream_t stream);  // y: [T, N] fp32, bias: [N], device

}  // namespace epinfer::cuda
