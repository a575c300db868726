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

// With a.residual, each thread writes its elements of s = x + residual to sum_out and reads them back:
// the same thread's writes, so sum_out may alias x.
__global__ void rms_norm_kernel(RmsNormArgs a) {
    pdl_begin();
    const int64_t row = blockIdx.x;
    const float* x = a.x + row * a.x_row_stride;
    float* out = a.out + row * a.out_row_stride;
    float sum_sq = 0.0f;
    if (a.residual != nullptr) {
        const float* res = a.residual + row * a.x_row_stride;
        float* sum = a.sum_out + row * a.x_row_stride;
        for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x) {
            const float s = x[i] + res[i];
            sum[i] = s;
            sum_sq += s * s;
        }
        x = sum;
    } else {
        for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x) sum_sq += x[i] * x[i];
    }
    sum_sq = block_sum(sum_sq);
    const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(a.width) + a.eps);
    for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x)
        out[i] = load_f32(a.weight, a.weight_dtype, i) * (x[i] * inv_rms);
}

// Four weight elements [i, i + 4) as fp32; i a multiple of 4, the weight 8-byte (bf16, f16) or 16-byte (fp32)
// aligned.
__device__ __forceinline__ float4 load4_f32(const void* base, DType dtype, int64_t i) {
    switch (dtype) {
        case DType::kBF16: {
            const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i);
            const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
            const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
            return make_float4(lo.x, lo.y, hi.x, hi.y);
        }
        case DType::kF16: {
            const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __half*>(base) + i);
            const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
            const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
            return make_float4(lo.x, lo.y, hi.x, hi.y);
        }
        default: return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    }
}

// rms_norm_kernel for rows of at most kThreads · 4 · kChunks elements, held in registers as float4: one
// read of x, and the weight is read before pdl_begin() (no kernel writes weights), so its DRAM latency
// overlaps the previous kernel instead of following it. Same per-element arithmetic as rms_norm_kernel.
// kChunks is the fewest the row needs (1, 2, 4 or kNormMaxChunks): registers sized for the widest row (80)
// left three blocks per SM and made many-row norms (prefill, batch 1024) 13 % slower end to end.
constexpr int kNormMaxChunks = 8;

template <int kChunks>
__global__ void __launch_bounds__(kThreads) rms_norm_vec_kernel(RmsNormArgs a) {
    const int64_t n4 = a.width / 4;
    float4 w[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
        const int64_t i = threadIdx.x + int64_t{j} * kThreads;
        w[j] = i < n4 ? load4_f32(a.weight, a.weight_dtype, 4 * i) : float4{};
    }
    pdl_begin();
    const int64_t row = blockIdx.x;
    const float4* x = reinterpret_cast<const float4*>(a.x + row * a.x_row_stride);
    float4* out = reinterpret_cast<float4*>(a.out + row * a.out_row_stride);
    float4 v[kChunks];
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
        const int64_t i = threadIdx.x + int64_t{j} * kThreads;
        v[j] = i < n4 ? x[i] : float4{};
        if (a.residual != nullptr && i < n4) {  // s = x + residual, written to sum_out
            const float4 r = reinterpret_cast<const float4*>(a.residual + row * a.x_row_stride)[i];
            v[j] = make_float4(v[j].x + r.x, v[j].y + r.y, v[j].z + r.z, v[j].w + r.w);
            reinterpret_cast<float4*>(a.sum_out + row * a.x_row_stride)[i] = v[j];
        }
        sum_sq += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    sum_sq = block_sum(sum_sq);
    const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(a.width) + a.eps);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
        const int64_t i = threadIdx.x + int64_t{j} * kThreads;
        if (i < n4) {
            out[i] = make_float4(w[j].x * (v[j].x * inv_rms), w[j].y * (v[j].y * inv_rms),
                                 w[j].z * (v[j].z * inv_rms), w[j].w * (v[j].w * inv_rms));
        }
    }
}

// Half-split RoPE: one block per token; a thread takes pair i for every head of its group (heads g,
// g + groups, …), so it computes sin/cos(pos·inv_freq[i]) once rather than once per head.
__global__ void rope_kernel(RopeArgs a) {
    pdl_begin();
    const int64_t t = blockIdx.x, half = a.rotary_dim / 2;
    const int64_t pair_threads = half < blockDim.x ? half : blockDim.x;
    const int64_t groups = blockDim.x / pair_threads;
    const int64_t g = threadIdx.x / pair_threads;
    if (g >= groups) return;
    const float pos = static_cast<float>(a.positions[t]);
    float* token = a.x + t * a.token_stride + a.rot_offset;
    for (int64_t i = threadIdx.x % pair_threads; i < half; i += pair_threads) {
        float s, c;
        sincosf(pos * a.inv_freq[i], &s, &c);
        c *= a.attention_scaling;
        s *= a.attention_scaling;
        for (int64_t h = g; h < a.num_heads; h += groups) {
            float* x = token + h * a.head_stride;
            const float x1 = x[i], x2 = x[i + half];  // this thread's pair only: no cross-thread hazard
            x[i] = x1 * c - x2 * s;
            x[i + half] = x2 * c + x1 * s;
        }
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

// The same, four columns per thread (C, the row stride and x's address multiples of 4 floats, dst's of 4
// bf16): 16-byte loads, 8-byte stores, one index division per four values. Each value rounds as above.
__global__ void f32_rows_to_bf16_x4_kernel(const float4* x, int64_t stride4, int64_t rows, int64_t cols4,
                                           uint2* dst) {
    pdl_begin();
    const int64_t n = rows * cols4;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
         i += int64_t{gridDim.x} * blockDim.x) {
        const int64_t r = i / cols4, c = i % cols4;
        const float4 v = x[r * stride4 + c];
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        dst[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
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
    const size_t weight_align = args.weight_dtype == DType::kF32 ? 16 : 8;
    const bool vec = args.width % 4 == 0 && args.width <= int64_t{kThreads} * 4 * kNormMaxChunks &&
                     args.x_row_stride % 4 == 0 && args.out_row_stride % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(args.x) % 16 == 0 && reinterpret_cast<uintptr_t>(args.out) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(args.residual) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(args.sum_out) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(args.weight) % weight_align == 0;
    if (vec) {
        const int64_t chunks = (args.width / 4 + kThreads - 1) / kThreads;  // float4 per thread
        auto kernel = chunks <= 1   ? rms_norm_vec_kernel<1>
                      : chunks <= 2 ? rms_norm_vec_kernel<2>
                      : chunks <= 4 ? rms_norm_vec_kernel<4>
                                    : rms_norm_vec_kernel<kNormMaxChunks>;
        return launch_pdl(kernel, dim3(static_cast<unsigned>(args.num_rows)), dim3(kThreads), 0, stream, args);
    }
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
    if (num_cols % 4 == 0 && x_row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(dst) % 8 == 0) {
        // Measured on the H200 (docs/benchmarks/serving.md, session 21): 256 rows of 2048, 3.2 µs a launch
        // with one value per thread.
        return launch_pdl(f32_rows_to_bf16_x4_kernel, dim3(grid_for(num_rows * num_cols / 4)), dim3(kThreads),
                          0, stream, reinterpret_cast<const float4*>(x), x_row_stride / 4, num_rows,
                          num_cols / 4, static_cast<uint2*>(dst));
    }
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
