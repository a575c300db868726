#include "backend/cuda/kernels/dense_ops.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load_f32(const void* base, DType dtype, int64_t i) {
    switch (dtype) {
        case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
        case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
        default: return static_cast<const float*>(base)[i];
    }
}

unsigned grid_for(int64_t n) {
    return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535LL * 16));
}

__global__ void embedding_kernel(EmbeddingArgs a, int32_t* error_flag) {
    pdl_begin();
    const int64_t t = blockIdx.x;
    const int32_t id = a.token_ids[t];
    const bool valid = id >= 0 && id < a.vocab_size;
    if (!valid && threadIdx.x == 0) *error_flag = 1;
    float* out = a.out + t * a.hidden_size;
    for (int64_t i = threadIdx.x; i < a.hidden_size; i += blockDim.x)
        out[i] = valid ? load_f32(a.table, a.table_dtype, static_cast<int64_t>(id) * a.hidden_size + i) : 0.0f;
}

// Sum over the block of v (any blockDim that is a multiple of 32, ≤ 1024).
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int num_warps = blockDim.x / 32;
    v = lane < num_warps ? partial[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // partial may be reused by a later call
    return v;
}

__global__ void rms_norm_kernel(RmsNormArgs a) {
    pdl_begin();
    const float* x = a.x + static_cast<int64_t>(blockIdx.x) * a.x_row_stride;
    float* out = a.out + static_cast<int64_t>(blockIdx.x) * a.out_row_stride;
    float sum_sq = 0.0f;
    for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x) sum_sq += x[i] * x[i];
    sum_sq = block_sum(sum_sq);
    const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(a.width) + a.eps);
    for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x)
        out[i] = load_f32(a.weight, a.weight_dtype, i) * (x[i] * inv_rms);
}

// Half-split RoPE: one block per token; threads over (head, pair).
__global__ void rope_kernel(RopeArgs a) {
    pdl_begin();
    const int64_t t = blockIdx.x, half = a.rotary_dim / 2;
    const float pos = static_cast<float>(a.positions[t]);
    for (int64_t item = threadIdx.x; item < a.num_heads * half; item += blockDim.x) {
        const int64_t h = item / half, i = item % half;
        float s, c;
        sincosf(pos * a.inv_freq[i], &s, &c);
        c *= a.attention_scaling;
        s *= a.attention_scaling;
        float* x = a.x + t * a.token_stride + h * a.head_stride + a.rot_offset;
        const float x1 = x[i], x2 = x[i + half];  // this thread's pair only: no cross-thread hazard
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

// Interleaved RoPE: one block per (token, head), the head's rotary slice staged in shared memory.
__global__ void rope_interleaved_kernel(RopeArgs a) {
    pdl_begin();
    extern __shared__ float tmp[];  // [rotary_dim]
    const int64_t t = blockIdx.x / a.num_heads, h = blockIdx.x % a.num_heads, half = a.rotary_dim / 2;
    float* x = a.x + t * a.token_stride + h * a.head_stride + a.rot_offset;
    for (int64_t i = threadIdx.x; i < a.rotary_dim; i += blockDim.x) tmp[i] = x[i];
    __syncthreads();
    const float pos = static_cast<float>(a.positions[t]);
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(pos * a.inv_freq[i], &s, &c);
        c *= a.attention_scaling;
        s *= a.attention_scaling;
        const float x1 = tmp[2 * i], x2 = tmp[2 * i + 1];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

__global__ void silu_mul_kernel(SiluMulArgs a) {
    pdl_begin();
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < a.num_elements;
         i += int64_t{gridDim.x} * blockDim.x) {
        const float g = a.gate[i];
        a.out[i] = g / (1.0f + expf(-g)) * a.up[i];
    }
}

__global__ void add_kernel(AddArgs a) {
    pdl_begin();
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < a.num_elements;
         i += int64_t{gridDim.x} * blockDim.x)
        a.out[i] = a.a[i] + a.b[i];
}

__global__ void add_sigmoid_gated_kernel(AddSigmoidGatedArgs a) {
    pdl_begin();
    const int64_t n = a.num_rows * a.width;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
        const float g = 1.0f / (1.0f + expf(-a.gate[i / a.width]));
        a.out[i] = a.a[i] + g * a.b[i];
    }
}

__global__ void to_f32_kernel(const void* src, DType dtype, float* dst, int64_t n) {
    pdl_begin();
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
        dst[i] = load_f32(src, dtype, i);
}

__global__ void f32_rows_to_bf16_kernel(const float* x, int64_t stride, int64_t rows, int64_t cols,
                                        __nv_bfloat16* dst) {
    pdl_begin();
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        dst[i] = __float2bfloat16_rn(x[r * stride + c]);
    }
}

__global__ void f32_batched_rows_to_bf16_kernel(const float* x, int64_t token_stride, int64_t batch_stride,
                                                int64_t rows, int64_t batches, int64_t cols, __nv_bfloat16* dst) {
    pdl_begin();
    const int64_t n = rows * batches * cols;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t r = i / cols, c = i % cols, t = r / batches, b = r % batches;
        dst[i] = __float2bfloat16_rn(x[t * token_stride + b * batch_stride + c]);
    }
}

__global__ void add_bias_kernel(float* y, int64_t stride, const void* bias, DType dtype, int64_t rows, int64_t cols) {
    pdl_begin();
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        y[r * stride + c] += load_f32(bias, dtype, c);
    }
}

}  // namespace

cudaError_t launch_embedding(const EmbeddingArgs& args, int32_t* error_flag, cudaStream_t stream) {
    if (args.num_tokens == 0) return cudaSuccess;
    return launch_pdl(embedding_kernel, dim3(static_cast<unsigned>(args.num_tokens)), dim3(kThreads), 0,
                      stream, args, error_flag);
}

cudaError_t launch_rms_norm(const RmsNormArgs& args, cudaStream_t stream) {
    if (args.num_rows == 0) return cudaSuccess;
    return launch_pdl(rms_norm_kernel, dim3(static_cast<unsigned>(args.num_rows)), dim3(kThreads), 0, stream,
                      args);
}

cudaError_t launch_rope(const RopeArgs& args, cudaStream_t stream) {
    if (args.num_tokens == 0 || args.num_heads == 0) return cudaSuccess;
    if (args.interleaved) {
        const size_t smem = static_cast<size_t>(args.rotary_dim) * sizeof(float);
        return launch_pdl(rope_interleaved_kernel,
                          dim3(static_cast<unsigned>(args.num_tokens * args.num_heads)), dim3(128), smem,
                          stream, args);
    } else {
        return launch_pdl(rope_kernel, dim3(static_cast<unsigned>(args.num_tokens)), dim3(kThreads), 0,
                          stream, args);
    }
}

cudaError_t launch_silu_mul(const SiluMulArgs& args, cudaStream_t stream) {
    if (args.num_elements == 0) return cudaSuccess;
    return launch_pdl(silu_mul_kernel, dim3(grid_for(args.num_elements)), dim3(kThreads), 0, stream, args);
}

cudaError_t launch_add(const AddArgs& args, cudaStream_t stream) {
    if (args.num_elements == 0) return cudaSuccess;
    return launch_pdl(add_kernel, dim3(grid_for(args.num_elements)), dim3(kThreads), 0, stream, args);
}

cudaError_t launch_add_sigmoid_gated(const AddSigmoidGatedArgs& args, cudaStream_t stream) {
    if (args.num_rows == 0 || args.width == 0) return cudaSuccess;
    return launch_pdl(add_sigmoid_gated_kernel, dim3(grid_for(args.num_rows * args.width)), dim3(kThreads), 0,
                      stream, args);
}

cudaError_t launch_to_f32(const void* src, DType src_dtype, float* dst, int64_t num_elements, cudaStream_t stream) {
    if (num_elements == 0) return cudaSuccess;
    return launch_pdl(to_f32_kernel, dim3(grid_for(num_elements)), dim3(kThreads), 0, stream, src, src_dtype,
                      dst, num_elements);
}

cudaError_t launch_f32_rows_to_bf16(const float* x, int64_t x_row_stride, int64_t num_rows, int64_t num_cols,
                                    void* dst, cudaStream_t stream) {
    if (num_rows == 0 || num_cols == 0) return cudaSuccess;
    return launch_pdl(f32_rows_to_bf16_kernel, dim3(grid_for(num_rows * num_cols)), dim3(kThreads), 0, stream,
                      x, x_row_stride, num_rows, num_cols, static_cast<__nv_bfloat16*>(dst));
}

cudaError_t launch_f32_batched_rows_to_bf16(const float* x, int64_t x_token_stride, int64_t x_batch_stride,
                                            int64_t num_rows, int64_t num_batches, int64_t num_cols, void* dst,
                                            cudaStream_t stream) {
    if (num_rows == 0 || num_batches == 0 || num_cols == 0) return cudaSuccess;
    return launch_pdl(f32_batched_rows_to_bf16_kernel, dim3(grid_for(num_rows * num_batches * num_cols)),
                      dim3(kThreads), 0, stream, x, x_token_stride, x_batch_stride, num_rows, num_batches,
                      num_cols, static_cast<__nv_bfloat16*>(dst));
}

cudaError_t launch_add_bias(float* y, int64_t y_row_stride, const void* bias, DType bias_dtype, int64_t num_rows,
                            int64_t num_cols, cudaStream_t stream) {
    if (num_rows == 0 || num_cols == 0) return cudaSuccess;
    return launch_pdl(add_bias_kernel, dim3(grid_for(num_rows * num_cols)), dim3(kThreads), 0, stream, y,
                      y_row_stride, bias, bias_dtype, num_rows, num_cols);
}

}  // namespace epinfer::cuda
