// The online softmax of FlashAttention-2 (Dao 2023, arXiv:2307.08691) on mma.sync m16n8 score fragments,
// shared by the flash and MLA attention kernels. A thread holds two rows of a warp's 16: s[n][0..1] are row
// g = lane / 4 and s[n][2..3] row g + 8, at keys key0 + n · 8 + 2 · (lane % 4) + {0, 1}; the four lanes of a
// row hold its other keys. Base 2: scores are scaled by scale · log2(e) and exponentiated with exp2_ftz.
// Device code only (include from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/moe_common.cuh"

namespace epinfer::cuda {

// 2^x on the SFU alone (PTX ex2.approx.ftz.f32: max relative error 2^-22; results below 2^-126 are zero, as
// are their contributions to a softmax sum of at least 1). exp2f compiles to ex2.approx.f32, whose denormal
// handling costs three more instructions per element.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Turns one tile's scores into probabilities in place: keys at or past key_limit[hr] of row hr are masked
// out, m (the running max) and l (this lane's running sum) move to the tile, corr[hr] = exp2(m_old − m_new)
// is the factor the row's output accumulator must take (1 when the max did not move). kMask false: the
// caller knows every key of the tile is below both limits (no compare).
template <int kN, bool kMask = true>
__device__ __forceinline__ void online_softmax_tile(float (&s)[kN][4], int key0, const int (&key_limit)[2],
                                                    float scale_log2, float (&m)[2], float (&l)[2],
                                                    float (&corr)[2]) {
    const int q4 = threadIdx.x % 4;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        float mx = -INFINITY;  // of the unscaled scores: scale_log2 > 0 (attention_check)
#pragma unroll
        for (int n = 0; n < kN; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = key0 + n * 8 + 2 * q4 + e;
                if (kMask && j >= key_limit[hr]) s[n][2 * hr + e] = -INFINITY;
                mx = fmaxf(mx, s[n][2 * hr + e]);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[hr], mx * scale_log2);
        corr[hr] = m_new == -INFINITY ? 1.0f : exp2_ftz(m[hr] - m_new);
        // p = 2^(s · scale_log2 − m_new) as one FMA; a row with no key yet (m_new = −inf) has only −inf
        // scores, which give 0 with any finite offset.
        const float neg_m = m_new == -INFINITY ? 0.0f : -m_new;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kN; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float p = exp2_ftz(fmaf(s[n][2 * hr + e], scale_log2, neg_m));
                s[n][2 * hr + e] = p;
                sum += p;
            }
        }
        l[hr] = l[hr] * corr[hr] + sum;
        m[hr] = m_new;
    }
}

// Keys 16·kk … 16·kk + 15 of a tile's probabilities as the bf16 A operand of a k16 MMA: mma.sync
// m16n8k16's A fragment, which is also wgmma's register A fragment (wgmma.cuh) — rows g and g + 8, keys
// 2·(lane mod 4) + {0, 1} and the same + 8.
template <int kN>
__device__ __forceinline__ void probabilities_a_operand(const float (&s)[kN][4], int kk, uint32_t (&a)[4]) {
    a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// o[n][0..1] *= corr[0], o[n][2..3] *= corr[1], skipped by the whole warp when no row's max moved (after the
// first tiles it rarely does).
template <int kN>
__device__ __forceinline__ void rescale_rows(float (&o)[kN][4], const float (&corr)[2]) {
    if (__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f)) return;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
    }
}

}  // namespace epinfer::cuda
