// The walk over a row of fp32 values that the token-choice kernels share (argmax.cu, sampling_floor.cu):
// each thread of a block visits its elements of [begin, end) in ascending index order — the scalars before
// the row's first 16-byte boundary one by one, then float4 loads with kUnroll of them in flight per thread
// before their values are used (one load at a time, each waited for, left a 152k-logit row's pass at ~50 µs
// for the argmax and ~110 µs for the floor on the H200), then the scalar tail. Device code only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace epinfer::cuda {

// Calls f(value, index) for the elements [begin, end) of `row` this thread takes, in ascending index order.
// @pre blockDim.x == kThreads; end ≤ INT32_MAX (indices are int32); row 4-byte aligned.
template <int kThreads, int kUnroll, typename F>
__device__ __forceinline__ void for_each_row_element(const float* __restrict__ row, int64_t begin,
                                                     int64_t end, F&& f) {
    const int64_t misalign = static_cast<int64_t>((reinterpret_cast<uintptr_t>(row) & 15u) / sizeof(float));
    const int64_t first_vec = (4 - misalign) & 3;  // the row's first element on a 16-byte boundary
    // Vectors of the range: float4 k covers elements first_vec + 4k … + 3.
    const int64_t vec_begin = begin <= first_vec ? 0 : (begin - first_vec + 3) / 4;
    const int64_t vec_end = end < first_vec ? 0 : (end - first_vec) / 4;
    const int64_t head_end = min(end, first_vec + 4 * vec_begin);  // scalar elements before the vectors
    const int64_t tail_begin = max(head_end, first_vec + 4 * max(vec_end, vec_begin));
    for (int64_t i = begin + threadIdx.x; i < head_end; i += kThreads)
        f(__ldg(row + i), static_cast<int32_t>(i));
    const float4* __restrict__ body = reinterpret_cast<const float4*>(row + first_vec);
    const auto f4 = [&f](float4 v, int32_t i) {
        f(v.x, i);
        f(v.y, i + 1);
        f(v.z, i + 2);
        f(v.w, i + 3);
    };
    const int32_t vb = static_cast<int32_t>(vec_begin), ve = static_cast<int32_t>(vec_end),
                  fv = static_cast<int32_t>(first_vec);
    int32_t j = vb + static_cast<int32_t>(threadIdx.x);
    for (; j + (kUnroll - 1) * kThreads < ve; j += kUnroll * kThreads) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(body + j + u * kThreads);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) f4(v[u], fv + 4 * (j + u * kThreads));
    }
    for (; j < ve; j += kThreads) f4(__ldg(body + j), fv + 4 * j);
    for (int64_t i = tail_begin + threadIdx.x; i < end; i += kThreads)
        f(__ldg(row + i), static_cast<int32_t>(i));
}

}  // namespace epinfer::cuda
