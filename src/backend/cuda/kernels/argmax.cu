#include "backend/cuda/kernels/argmax.cuh"

#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 8;  // 16-byte loads in flight per thread
constexpr int kWarpSize = 32;
constexpr int64_t kMaxBlocks = 65535LL * 16;  // rows beyond this loop inside a block

// A candidate of the reduction: idx < 0 means "no non-NaN value seen yet" (val is then meaningless).
struct Best {
    float val;
    int32_t idx;
};

// The better of two candidates: a present one over an absent one, then the larger value, then the lower
// index. Commutative and associative over non-NaN values, so any reduction order gives the same result.
__device__ __forceinline__ Best better(Best a, Best b) {
    if (b.idx < 0) return a;
    if (a.idx < 0) return b;
    if (b.val > a.val || (b.val == a.val && b.idx < a.idx)) return b;
    return a;
}

// Folds logit v at index i into a thread's candidate and its non-finite flag.
__device__ __forceinline__ void fold(Best& best, bool& non_finite, float v, int64_t i) {
    non_finite |= !isfinite(v);
    if (!isnan(v)) best = better(best, Best{v, static_cast<int32_t>(i)});
}

// The four logits of v, at indices i … i + 3.
__device__ __forceinline__ void fold4(Best& best, bool& non_finite, float4 v, int64_t i) {
    fold(best, non_finite, v.x, i);
    fold(best, non_finite, v.y, i + 1);
    fold(best, non_finite, v.z, i + 2);
    fold(best, non_finite, v.w, i + 3);
}

// @pre blockDim.x == kThreads. The block's best candidate, valid in every thread. Ends with a barrier, so
// the shared scratch may be reused by the next call.
__device__ Best block_best(Best best) {
    __shared__ float warp_val[kThreads / kWarpSize];    // [num_warps] fp32
    __shared__ int32_t warp_idx[kThreads / kWarpSize];  // [num_warps] int32
    for (int o = kWarpSize / 2; o > 0; o >>= 1) {
        const Best other{__shfl_xor_sync(0xffffffffu, best.val, o), __shfl_xor_sync(0xffffffffu, best.idx, o)};
        best = better(best, other);
    }
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    if (lane == 0) {
        warp_val[warp] = best.val;
        warp_idx[warp] = best.idx;
    }
    __syncthreads();
    best = lane < kThreads / kWarpSize ? Best{warp_val[lane], warp_idx[lane]} : Best{0.0f, -1};
    for (int o = kWarpSize / 2; o > 0; o >>= 1) {
        const Best other{__shfl_xor_sync(0xffffffffu, best.val, o), __shfl_xor_sync(0xffffffffu, best.idx, o)};
        best = better(best, other);
    }
    __syncthreads();
    return best;
}

// One block per row (grid-stride over rows when R exceeds the grid).
__global__ void __launch_bounds__(kThreads) argmax_kernel(ArgmaxArgs a) {
    pdl_begin();
    const int64_t V = a.vocab_size;
    for (int64_t r = blockIdx.x; r < a.num_rows; r += gridDim.x) {
        const float* __restrict__ row = a.logits + r * a.row_stride;  // [V] fp32
        // Elements before the first 16-byte boundary of the row, read one by one, then float4 loads.
        const int64_t misalign = static_cast<int64_t>((reinterpret_cast<uintptr_t>(row) & 15u) / sizeof(float));
        const int64_t head = min(V, (4 - misalign) & 3);
        const int64_t num_vec = (V - head) / 4;
        const float4* __restrict__ body = reinterpret_cast<const float4*>(row + head);  // [num_vec] float4
        Best best{0.0f, -1};
        bool non_finite = false;
        for (int64_t i = threadIdx.x; i < head; i += kThreads) fold(best, non_finite, __ldg(row + i), i);
        // kUnroll loads in flight per thread before their folds (a row of 152k logits is ~75 loads per
        // thread: one at a time, each waited for, the batch-1 argmax took ~50 µs); the fold order does not
        // change the result (better() is commutative and associative).
        int64_t j = threadIdx.x;
        for (; j + (kUnroll - 1) * kThreads < num_vec; j += kUnroll * kThreads) {
            float4 v[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(body + j + u * kThreads);
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) fold4(best, non_finite, v[u], head + 4 * (j + u * kThreads));
        }
        for (; j < num_vec; j += kThreads) fold4(best, non_finite, __ldg(body + j), head + 4 * j);
        for (int64_t i = head + 4 * num_vec + threadIdx.x; i < V; i += kThreads)
            fold(best, non_finite, __ldg(row + i), i);
        const bool any_non_finite = __syncthreads_or(non_finite) != 0;
        best = block_best(best);
        if (threadIdx.x == 0) {
            a.out_ids[r] = best.idx < 0 ? 0 : best.idx;
            a.out_non_finite[r] = any_non_finite ? 1 : 0;
        }
    }
}

}  // namespace

cudaError_t launch_argmax(const ArgmaxArgs& args, cudaStream_t stream) {
    if (args.num_rows == 0) return cudaSuccess;
    const unsigned grid = static_cast<unsigned>(std::min(args.num_rows, kMaxBlocks));
    return launch_pdl(argmax_kernel, grid, dim3(kThreads), 0, stream, args);
}

}  // namespace epinfer::cuda
