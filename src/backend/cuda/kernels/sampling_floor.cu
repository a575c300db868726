#include "backend/cuda/kernels/sampling_floor.cuh"

#include <algorithm>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/kernels/pdl.cuh"
#include "backend/sampling_floor.h"

namespace epinfer::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // float4 loads in flight per thread
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kRounds = 3;  // digits: order bits [21, 32), [10, 21), [0, 10)
constexpr int64_t kMaxBlocks = 1 << 20;  // rows beyond this loop inside a block

using BlockScan = cub::BlockScan<unsigned long long, kThreads>;
using BlockReduce = cub::BlockReduce<float, kThreads>;

struct MaxOp {
    __device__ float operator()(float x, float y) const { return fmaxf(x, y); }
};

struct Shared {
    unsigned long long hist[kBins];  // [bins] the round's counts or masses by digit
    union {
        BlockScan::TempStorage scan;
        BlockReduce::TempStorage reduce;
    } temp;
    float max_key;
    uint32_t digit;              // the round's chosen digit
    unsigned long long above;    // weight of the candidates above it
};

// Calls f(key) for every logit of row [V] (sampling_key applied), each thread on its share in no fixed
// order: float4 loads from the row's first 16-byte boundary, kUnroll of them in flight per thread (one
// scalar load at a time, each waited for, left a row's pass at ~110 µs), scalar head and tail.
template <typename F>
__device__ __forceinline__ void for_each_key(const float* __restrict__ row, int64_t V, F&& f) {
    const int64_t misalign = static_cast<int64_t>((reinterpret_cast<uintptr_t>(row) & 15u) / sizeof(float));
    const int64_t head = min(V, (4 - misalign) & 3);
    for (int64_t i = threadIdx.x; i < head; i += kThreads) f(sampling_key(__ldg(row + i)));
    const float4* __restrict__ body = reinterpret_cast<const float4*>(row + head);
    const int64_t num_vecs = (V - head) / 4;
    const auto f4 = [&f](float4 v) {
        f(sampling_key(v.x));
        f(sampling_key(v.y));
        f(sampling_key(v.z));
        f(sampling_key(v.w));
    };
    int64_t j = threadIdx.x;
    for (; j + (kUnroll - 1) * kThreads < num_vecs; j += kUnroll * kThreads) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(body + j + u * kThreads);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) f4(v[u]);
    }
    for (; j < num_vecs; j += kThreads) f4(__ldg(body + j));
    for (int64_t i = head + 4 * num_vecs + threadIdx.x; i < V; i += kThreads) f(sampling_key(__ldg(row + i)));
}

// What one selection weighs: counts (top-k) or the nucleus's fixed-point masses (top-p).
struct Weigh {
    bool mass = false;
    float max_key = 0.0f;
    float inv_temperature = 0.0f;
};

// The largest order value t ≥ lo (a kept key's) such that the weight of the keys of row with order ≥ t
// reaches the target: `target` itself for counts; for masses nucleus_target(total, top_p) of the total
// weight of the keys ≥ lo, which the first round's histogram gives. Three rounds fix the order's digits
// from the top; `above` carries the weight of the candidates whose decided digits exceed the prefix.
__device__ uint32_t select_order(const float* __restrict__ row, int64_t V, uint32_t lo, const Weigh& weigh,
                                 uint64_t target, float top_p, Shared& sh) {
    uint32_t prefix = 0;
    unsigned long long above = 0;
#pragma unroll 1
    for (int round = 0; round < kRounds; ++round) {
        const int shift = round == 0 ? 21 : (round == 1 ? 10 : 0), bits = round == 2 ? 10 : 11;
        const uint32_t digit_mask = (1u << bits) - 1u;
        for (int j = 0; j < kBinsPerThread; ++j) sh.hist[threadIdx.x * kBinsPerThread + j] = 0;
        __syncthreads();
        // A thread adds runs of equal digits in a register: heavy digits (most keys share a few exponents)
        // then cost one shared atomic per run instead of one per key.
        int run_digit = -1;
        unsigned long long run = 0;
        for_each_key(row, V, [&](float key) {
            const uint32_t order = sampling_order(key);
            if (order < lo) return;
            if (round > 0 && (order >> (shift + bits)) != prefix) return;
            const unsigned long long w = weigh.mass ? nucleus_weight(key, weigh.max_key, weigh.inv_temperature) : 1;
            if (w == 0) return;
            const int digit = static_cast<int>((order >> shift) & digit_mask);
            if (digit != run_digit) {
                if (run != 0) atomicAdd(&sh.hist[run_digit], run);
                run_digit = digit;
                run = 0;
            }
            run += w;
        });
        if (run != 0) atomicAdd(&sh.hist[run_digit], run);
        __syncthreads();
        // Inclusive sums over the digits from the top: thread t holds digits kBins − 1 − (4t + j).
        unsigned long long v[kBinsPerThread], incl[kBinsPerThread], total = 0;
        for (int j = 0; j < kBinsPerThread; ++j) v[j] = sh.hist[kBins - 1 - (threadIdx.x * kBinsPerThread + j)];
        BlockScan(sh.temp.scan).InclusiveSum(v, incl, total);
        if (round == 0 && weigh.mass) target = nucleus_target(total, top_p);
        const unsigned long long need = target - above;  // > 0: the chosen digit holds weight
        for (int j = 0; j < kBinsPerThread; ++j) {
            if (incl[j] >= need && incl[j] - v[j] < need) {
                sh.digit = static_cast<uint32_t>(kBins - 1 - (threadIdx.x * kBinsPerThread + j)) & digit_mask;
                sh.above = above + (incl[j] - v[j]);
            }
        }
        __syncthreads();
        prefix = (prefix << bits) | sh.digit;
        above = sh.above;
        __syncthreads();  // every thread has read digit and above; the next round rewrites the histogram
    }
    return prefix;
}

__global__ void __launch_bounds__(kThreads) sampling_floor_kernel(ArgmaxArgs a) {
    pdl_begin();
    __shared__ Shared sh;
    const int64_t V = a.vocab_size;
    for (int64_t r = blockIdx.x; r < a.num_rows; r += gridDim.x) {
        const TokenDraw d = a.draws[r];
        const bool top_k = d.top_k > 0 && d.top_k < V;
        const bool top_p = d.top_p < 1.0f;
        if (!(d.inv_temperature > 0.0f) || (!top_k && !top_p)) {
            if (threadIdx.x == 0) a.floor[r] = -INFINITY;
            continue;
        }
        const float* __restrict__ row = a.logits + r * a.row_stride;
        float m = -INFINITY;
        for_each_key(row, V, [&m](float key) { m = fmaxf(m, key); });
        m = BlockReduce(sh.temp.reduce).Reduce(m, MaxOp{});
        if (threadIdx.x == 0) sh.max_key = m;
        __syncthreads();
        m = sh.max_key;
        if (!isfinite(m)) {
            if (threadIdx.x == 0) a.floor[r] = -INFINITY;
            __syncthreads();
            continue;
        }
        uint32_t lo = 0;  // the order of the smallest kept key (0: every key)
        if (top_k) lo = select_order(row, V, 0, Weigh{}, static_cast<uint64_t>(d.top_k), 1.0f, sh);
        if (top_p) lo = select_order(row, V, lo, Weigh{true, m, d.inv_temperature}, 0, d.top_p, sh);
        if (threadIdx.x == 0) a.floor[r] = sampling_order_key(lo);
        __syncthreads();  // sh.max_key is rewritten by the next row
    }
}

}  // namespace

cudaError_t launch_sampling_floor(const ArgmaxArgs& args, cudaStream_t stream) {
    if (args.num_rows == 0) return cudaSuccess;
    const unsigned grid = static_cast<unsigned>(std::min(args.num_rows, kMaxBlocks));
    return launch_pdl(sampling_floor_kernel, dim3(grid), dim3(kThreads), 0, stream, args);
}

}  // namespace epinfer::cuda
