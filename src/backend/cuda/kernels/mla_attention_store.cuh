// What the two MLA latent kernels (mla_attention.cu, mla_attention_sm90.cu) share: the store of a thread's
// output rows. Device code only (include from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/mla_attention.cuh"
#include "backend/op_args.h"

namespace epinfer::cuda {

// Row hr (0: g = lane / 4, 1: g + 8) of the thread's m16n8-layout accumulators o — columns col0 + 8j +
// 2·(lane mod 4) + {0, 1} of head h of token t — as out = o / l (zeros when l = 0: a row that saw no key),
// or, with key splits, as split split_index's partial output and (with write_ml) its (max m · ln 2, sum l).
// m: the row's running max in log2 units (flash_softmax.cuh); l: its full sum over the four lanes.
template <int kN>
__device__ __forceinline__ void store_mla_row(const AttentionArgs& a, const KeySplit& split, int split_index,
                                              int64_t t, int64_t h, int col0, const float (&o)[kN][4], int hr,
                                              float m, float l, bool write_ml) {
    const int q4 = threadIdx.x % 4;
    const bool split_out = split.num_splits > 1;
    const int64_t part = (t * a.num_heads + h) * split.num_splits + split_index;
    float* row = split_out ? split.partial_acc + part * kMlaLatentDim + col0
                           : a.out + t * a.out_token_stride + h * a.out_head_stride + col0;
    const float scale = split_out ? 1.0f : (l > 0.0f ? 1.0f / l : 0.0f);
    // The thread's pairs of columns as 8-byte stores where the row allows (its offsets are even).
    const bool pairs = reinterpret_cast<uintptr_t>(row) % 8 == 0;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
        float* p = row + j * 8 + 2 * q4;
        const float x = o[j][2 * hr] * scale, y = o[j][2 * hr + 1] * scale;
        if (pairs) {
            *reinterpret_cast<float2*>(p) = make_float2(x, y);
        } else {
            p[0] = x;
            p[1] = y;
        }
    }
    if (!split_out) return;
    if (write_ml && q4 == 0) {
        split.partial_ml[part * 2] = l > 0.0f ? m * 0.6931471805599453f : -INFINITY;  // ln 2
        split.partial_ml[part * 2 + 1] = l;
    }
}

}  // namespace epinfer::cuda
