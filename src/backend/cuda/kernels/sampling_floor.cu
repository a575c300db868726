#include "backend/cuda/kernels/sampling_floor.cuh"

#include <algorithm>
#include <cstdint>

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/kernels/argmax.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/row_walk.cuh"
#include "backend/sampling_floor.h"

namespace epinfer::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // float4 loads in flight per thread
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kRounds = 3;  // digits: order bits [21, 32), [10, 21), [0, 10)
constexpr int64_t kMaxBlocks = 1 << 20;  // rows beyond this loop inside a block
// A weight (≤ 2^40) is added to a bin as three 14-bit limbs in 32-bit counters (native shared-memory
// atomics; a 64-bit one is a compare-and-swap loop, which contended bins made the kernel's main cost). A
// limb sum stays below 2^32 over kChunk keys, after which the counters are flushed into the 64-bit bins.
constexpr int kLimbBits = 14;
constexpr int kLimbs = 3;
constexpr int64_t kChunk = int64_t{1} << (32 - kLimbBits);

using BlockScan = cub::BlockScan<unsigned long long, kThreads>;
using BlockReduce = cub::BlockReduce<float, kThreads>;

struct MaxOp {
    __device__ float operator()(float x, float y) const { return fmaxf(x, y); }
};

struct Shared {
    unsigned long long hist[kBins];  // [bins] the round's counts or masses by digit, this block's keys
    uint32_t limb[kLimbs][kBins];    // [limbs, bins] the chunk's partial sums (a count uses limb 0 only)
    union {
        BlockScan::TempStorage scan;
        BlockReduce::TempStorage reduce;
    } temp;
    float max_key;  // this block's slice maximum
    uint32_t digit;  // the round's chosen digit
    unsigned long long above;  // weight of the candidates above it
};

// The blocks that share a row: a thread-block cluster on sm_90+ (each block a slice of the row, shared
// memory read across the cluster), else the block alone.
struct RowBlocks {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    __device__ unsigned size() const { return cluster.num_blocks(); }
    __device__ unsigned rank() const { return cluster.block_rank(); }
    __device__ void sync() { cluster.sync(); }
    template <typename T>
    __device__ T* at(T* p, unsigned block) {
        return cluster.map_shared_rank(p, block);
    }
#else
    __device__ unsigned size() const { return 1; }
    __device__ unsigned rank() const { return 0; }
    __device__ void sync() { __syncthreads(); }
    template <typename T>
    __device__ T* at(T* p, unsigned) {
        return p;
    }
#endif
};

// Calls f(key) for every logit of row [V] (sampling_key applied), each thread on its share (row_walk.cuh).
template <typename F>
__device__ __forceinline__ void for_each_key(const float* __restrict__ row, int64_t V, F&& f) {
    for_each_row_element<kThreads, kUnroll>(row, 0, V, [&f](float v, int32_t) { f(sampling_key(v)); });
}

// What one selection weighs: counts (top-k) or the nucleus's fixed-point masses (top-p).
struct Weigh {
    bool mass = false;
    float max_key = 0.0f;
    float inv_temperature = 0.0f;
};

// Adds the limb counters into the 64-bit bins and clears them; each thread its own bins.
__device__ __forceinline__ void flush_limbs(Shared& sh) {
    __syncthreads();  // every atomic of the chunk done
    for (int j = 0; j < kBinsPerThread; ++j) {
        const int b = threadIdx.x * kBinsPerThread + j;
        unsigned long long sum = 0;
        for (int l = 0; l < kLimbs; ++l) {
            sum += static_cast<unsigned long long>(sh.limb[l][b]) << (l * kLimbBits);
            sh.limb[l][b] = 0;
        }
        sh.hist[b] += sum;
    }
    __syncthreads();
}

// The largest order value t ≥ lo (a kept key's) such that the weight of the row's keys with order ≥ t
// reaches the target: `target` itself for counts; for masses nucleus_target(total, top_p) of the total
// weight of the keys ≥ lo, which the first round's histogram gives. The row [begin, end) of `row` is this
// block's slice; the blocks' histograms are summed across `blocks`, and every block makes the same choice.
// Three rounds fix the order's digits from the top; `above` carries the weight of the candidates whose
// decided digits exceed the prefix.
__device__ uint32_t select_order(const float* __restrict__ slice, int64_t slice_len, uint32_t lo, const Weigh& weigh,
                                 uint64_t target, float top_p, Shared& sh, RowBlocks& blocks) {
    uint32_t prefix = 0;
    unsigned long long above = 0;
#pragma unroll 1
    for (int round = 0; round < kRounds; ++round) {
        const int shift = round == 0 ? 21 : (round == 1 ? 10 : 0), bits = round == 2 ? 10 : 11;
        const uint32_t digit_mask = (1u << bits) - 1u;
        for (int j = 0; j < kBinsPerThread; ++j) {
            const int b = threadIdx.x * kBinsPerThread + j;
            sh.hist[b] = 0;
            for (int l = 0; l < kLimbs; ++l) sh.limb[l][b] = 0;
        }
        for (int64_t c = 0; c < slice_len; c += kChunk) {
            __syncthreads();  // counters cleared (or flushed)
            for_each_key(slice + c, min(kChunk, slice_len - c), [&](float key) {
                const uint32_t order = sampling_order(key);
                if (order < lo) return;
                if (round > 0 && (order >> (shift + bits)) != prefix) return;
                const int digit = static_cast<int>((order >> shift) & digit_mask);
                if (!weigh.mass) {
                    atomicAdd(&sh.limb[0][digit], 1u);
                    return;
                }
                const uint64_t w = nucleus_weight(key, weigh.max_key, weigh.inv_temperature);
                for (int l = 0; l < kLimbs; ++l) {
                    const uint32_t limb = static_cast<uint32_t>(w >> (l * kLimbBits)) & ((1u << kLimbBits) - 1u);
                    if (limb != 0) atomicAdd(&sh.limb[l][digit], limb);
                }
            });
            flush_limbs(sh);
        }
        blocks.sync();  // every block's histogram complete
        // Inclusive sums over the digits from the top, of the blocks' summed bins: thread t holds digits
        // kBins − 1 − (4t + j).
        unsigned long long v[kBinsPerThread], incl[kBinsPerThread], total = 0;
        for (int j = 0; j < kBinsPerThread; ++j) {
            const int b = kBins - 1 - (threadIdx.x * kBinsPerThread + j);
            v[j] = 0;
            for (unsigned r = 0; r < blocks.size(); ++r) v[j] += *blocks.at(&sh.hist[b], r);
        }
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
        blocks.sync();  // every block has read the others' bins and its digit: the next round clears them
    }
    return prefix;
}

// One cluster of blocks per row (grid-stride over rows when R exceeds the grid's clusters); block b of a
// cluster takes the b-th of equal slices of the row.
__global__ void __launch_bounds__(kThreads) sampling_floor_kernel(ArgmaxArgs a) {
    pdl_begin();
    __shared__ Shared sh;
    RowBlocks blocks;
    const int64_t V = a.vocab_size;
    const int64_t per_block = (V + blocks.size() - 1) / blocks.size();
    const int64_t begin = min(V, blocks.rank() * per_block), end = min(V, begin + per_block);
    for (int64_t r = blockIdx.x / blocks.size(); r < a.num_rows; r += gridDim.x / blocks.size()) {
        const TokenDraw d = a.draws[r];
        const bool top_k = d.top_k > 0 && d.top_k < V;
        const bool top_p = d.top_p < 1.0f;
        const bool first = blocks.rank() == 0 && threadIdx.x == 0;
        if (!(d.inv_temperature > 0.0f) || (!top_k && !top_p)) {
            if (first) a.floor[r] = -INFINITY;
            continue;
        }
        const float* __restrict__ slice = a.logits + r * a.row_stride + begin;
        float m = -INFINITY;
        for_each_key(slice, end - begin, [&m](float key) { m = fmaxf(m, key); });
        m = BlockReduce(sh.temp.reduce).Reduce(m, MaxOp{});
        if (threadIdx.x == 0) sh.max_key = m;
        blocks.sync();
        m = -INFINITY;
        for (unsigned b = 0; b < blocks.size(); ++b) m = fmaxf(m, *blocks.at(&sh.max_key, b));
        float floor = -INFINITY;
        if (isfinite(m)) {
            uint32_t lo = 0;  // the order of the smallest kept key (0: every key)
            if (top_k) lo = select_order(slice, end - begin, 0, Weigh{}, static_cast<uint64_t>(d.top_k), 1.0f, sh, blocks);
            if (top_p) lo = select_order(slice, end - begin, lo, Weigh{true, m, d.inv_temperature}, 0, d.top_p, sh, blocks);
            floor = sampling_order_key(lo);
        }
        if (first) a.floor[r] = floor;
        blocks.sync();  // every block has read sh.max_key: the next row rewrites it
    }
}

}  // namespace

cudaError_t launch_sampling_floor(const ArgmaxArgs& args, int num_sms, cudaStream_t stream) {
    if (args.num_rows == 0) return cudaSuccess;
    const int cluster = pdl_supported() ? argmax_blocks_per_row(args.num_rows, num_sms) : 1;  // clusters: sm_90+
    const unsigned grid = static_cast<unsigned>(std::min(args.num_rows, kMaxBlocks / cluster) * cluster);
    return launch_pdl_cluster(sampling_floor_kernel, dim3(grid), dim3(kThreads), static_cast<unsigned>(cluster), 0,
                              stream, args);
}

}  // namespace epinfer::cuda
