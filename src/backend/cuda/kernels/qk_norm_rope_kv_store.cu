// GQA's q/k/v preparation in one kernel (see qk_norm_rope_kv_store.cuh).
#include "backend/cuda/kernels/qk_norm_rope_kv_store.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/kernels/kv_cast.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {
namespace {

constexpr int kWarps = 4;     // heads per block
constexpr int kMaxPairs = 4;  // rotary pairs per lane: rotary_dim ≤ 2 · 32 · 4
constexpr int kMaxTail = 4;   // unrotated elements per lane: head_dim − rotary_dim ≤ 32 · 4

__device__ __forceinline__ float load_weight(const void* w, DType dtype, int64_t i) {
    switch (dtype) {
        case DType::kBF16:
            return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[i]);
        case DType::kF16:
            return __half2float(static_cast<const __half*>(w)[i]);
        default:
            return static_cast<const float*>(w)[i];
    }
}

// Block (t, y), warp w: head y · kWarps + w of token t among the q heads [0, Nh), the k heads [Nh, Nh + Nkv)
// and the v heads [Nh + Nkv, Nh + 2·Nkv). Lane l holds pair elements i and i + half for i = l + 32·j < half,
// and the unrotated elements rotary_dim + l + 32·j < D.
template <typename KV>
__global__ void __launch_bounds__(kWarps * 32)
    qk_norm_rope_kv_store_kernel(QkNormRopeKvStoreArgs a, int32_t* error_flag) {
    const int lane = threadIdx.x % 32;
    const int64_t t = blockIdx.x, Nh = a.num_heads, Nkv = a.num_kv_heads, D = a.head_dim;
    const int64_t head = static_cast<int64_t>(blockIdx.y) * kWarps + threadIdx.x / 32;
    if (head >= Nh + 2 * Nkv) return;
    const int kind = head < Nh ? 0 : (head < Nh + Nkv ? 1 : 2);  // q, k, v
    const int64_t h = kind == 0 ? head : (kind == 1 ? head - Nh : head - Nh - Nkv);
    const int64_t half = a.rotary_dim / 2, tail0 = a.rotary_dim;
    const void* norm = kind == 0 ? a.q_norm : (kind == 1 ? a.k_norm : nullptr);

    // The norm weights first: no kernel writes them, so their latency overlaps the previous kernel.
    float w_lo[kMaxPairs] = {}, w_hi[kMaxPairs] = {}, w_tail[kMaxTail] = {};
    if (norm != nullptr) {
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) {
            const int64_t i = lane + 32 * j;
            if (i < half) {
                w_lo[j] = load_weight(norm, a.norm_dtype, i);
                w_hi[j] = load_weight(norm, a.norm_dtype, i + half);
            }
        }
#pragma unroll
        for (int j = 0; j < kMaxTail; ++j) {
            const int64_t e = tail0 + lane + 32 * j;
            if (e < D) w_tail[j] = load_weight(norm, a.norm_dtype, e);
        }
    }
    pdl_begin();

    // (the launch resolved the token strides: none is 0)
    float* inplace = kind == 0 ? a.q + t * a.q_token_stride + h * D
                               : (kind == 1 ? a.k + t * a.k_token_stride + h * D : nullptr);
    const float* src = kind == 2 ? a.v + t * a.v_token_stride + h * D : inplace;  // [D]
    float lo[kMaxPairs] = {}, hi[kMaxPairs] = {}, tail[kMaxTail] = {};
#pragma unroll
    for (int j = 0; j < kMaxPairs; ++j) {
        const int64_t i = lane + 32 * j;
        if (i < half) {
            lo[j] = src[i];
            hi[j] = src[i + half];
        }
    }
#pragma unroll
    for (int j = 0; j < kMaxTail; ++j) {
        const int64_t e = tail0 + lane + 32 * j;
        if (e < D) tail[j] = src[e];
    }

    if (norm != nullptr) {  // rms_norm's w · (x · inv_rms)
        float sum_sq = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) sum_sq += lo[j] * lo[j] + hi[j] * hi[j];
#pragma unroll
        for (int j = 0; j < kMaxTail; ++j) sum_sq += tail[j] * tail[j];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, o);
        const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(D) + a.norm_eps);
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) {
            lo[j] = w_lo[j] * (lo[j] * inv_rms);
            hi[j] = w_hi[j] * (hi[j] * inv_rms);
        }
#pragma unroll
        for (int j = 0; j < kMaxTail; ++j) tail[j] = w_tail[j] * (tail[j] * inv_rms);
    }

    if (kind != 2) {  // rope's half-split rotation, then q/k written back
        const float pos = static_cast<float>(a.positions[t]);
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) {
            const int64_t i = lane + 32 * j;
            if (i >= half) continue;
            float s, c;
            sincosf(pos * a.inv_freq[i], &s, &c);
            c *= a.attention_scaling;
            s *= a.attention_scaling;
            const float x1 = lo[j], x2 = hi[j];
            lo[j] = x1 * c - x2 * s;
            hi[j] = x2 * c + x1 * s;
            inplace[i] = lo[j];
            inplace[i + half] = hi[j];
        }
#pragma unroll
        for (int j = 0; j < kMaxTail; ++j) {
            const int64_t e = tail0 + lane + 32 * j;
            if (e < D) inplace[e] = tail[j];
        }
    }

    if (kind != 0) {  // k and v rows into their pool row slot_mapping[t]
        const int64_t slot = a.slot_mapping[t];
        if (slot < 0 || slot >= a.num_pool_rows) {
            if (lane == 0) *error_flag = 1;
            return;
        }
        KV* dst = static_cast<KV*>(kind == 1 ? a.k_pool : a.v_pool) + (slot * Nkv + h) * D;  // [D]
#pragma unroll
        for (int j = 0; j < kMaxPairs; ++j) {
            const int64_t i = lane + 32 * j;
            if (i < half) {
                dst[i] = to_kv<KV>(lo[j]);
                dst[i + half] = to_kv<KV>(hi[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < kMaxTail; ++j) {
            const int64_t e = tail0 + lane + 32 * j;
            if (e < D) dst[e] = to_kv<KV>(tail[j]);
        }
    }
}

}  // namespace

bool qk_norm_rope_kv_store_fusable(const QkNormRopeKvStoreArgs& a) {
    return !a.interleaved && a.rotary_dim <= 2 * 32 * kMaxPairs && a.head_dim - a.rotary_dim <= 32 * kMaxTail;
}

cudaError_t launch_qk_norm_rope_kv_store(const QkNormRopeKvStoreArgs& args, int32_t* error_flag,
                                         cudaStream_t stream) {
    if (args.num_tokens == 0) return cudaSuccess;
    QkNormRopeKvStoreArgs a = args;
    const QkvTokenStrides strides = qkv_token_strides(args);
    a.q_token_stride = strides.q;
    a.k_token_stride = strides.k;
    a.v_token_stride = strides.v;
    const int64_t heads = a.num_heads + 2 * a.num_kv_heads;
    const dim3 grid(static_cast<unsigned>(a.num_tokens),
                    static_cast<unsigned>((heads + kWarps - 1) / kWarps));
    if (a.pool_dtype == DType::kBF16) {
        return launch_pdl(qk_norm_rope_kv_store_kernel<__nv_bfloat16>, grid, dim3(kWarps * 32), 0, stream, a,
                          error_flag);
    }
    return launch_pdl(qk_norm_rope_kv_store_kernel<float>, grid, dim3(kWarps * 32), 0, stream, a, error_flag);
}

}  // namespace epinfer::cuda
