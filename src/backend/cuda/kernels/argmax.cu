#include "backend/cuda/kernels/argmax.cuh"

#include <algorithm>
#include <cstdint>

#include <cooperative_groups.h>

#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/row_walk.cuh"
#include "backend/gumbel_noise.h"

namespace epinfer::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 8;  // 16-byte loads in flight per thread
constexpr int kWarpSize = 32;
constexpr int64_t kMaxBlocks = 65535LL * 16;  // rows beyond this loop inside a block
constexpr int kMaxBlocksPerRow = 8;         // the portable cluster size

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

// A drawn row scores each logit ≥ its floor with its Gumbel noise (backend/gumbel_noise.h) and skips the
// rest; a greedy row (inv_temperature 0) scores every logit itself.
struct RowDraw {
    float inv_temperature = 0.0f;
    uint64_t key = 0;
    float floor = -INFINITY;
};

// Folds logit v at index i (its score) into a thread's candidate and its non-finite flag. A thread folds its
// indices in ascending order, so of equal scores the first it meets is the lower index: a strict > (false
// for NaN) suffices, plus the first non-NaN score when the candidate is still absent (a row of −inf).
__device__ __forceinline__ void fold(Best& best, bool& non_finite, float v, int32_t i, const RowDraw& draw) {
    non_finite |= !(fabsf(v) < INFINITY);  // NaN or ±inf
    if (draw.inv_temperature > 0.0f && !(v >= draw.floor)) return;
    const float score = draw.inv_temperature > 0.0f ? gumbel_score(v, draw.inv_temperature, draw.key, i) : v;
    if (score > best.val || (best.idx < 0 && score == score)) best = Best{score, i};
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

// The best candidate of logits [begin, end) of `row` (element indices), folded into best/non_finite by the
// block's threads, each in ascending index order (row_walk.cuh), as fold() needs. The threads' candidates then
// merge through better(), commutative and associative, so the result does not depend on how the range is
// spread over threads or blocks.
__device__ __forceinline__ void fold_range(const float* __restrict__ row, int64_t begin, int64_t end, const RowDraw& draw,
                                           Best& best, bool& non_finite) {
    for_each_row_element<kThreads, kUnroll>(row, begin, end,
                                            [&](float v, int32_t i) { fold(best, non_finite, v, i, draw); });
}

// One cluster of `cluster` blocks per row (grid-stride over rows when R exceeds the grid's clusters):
// block b of the cluster folds the b-th of `cluster` equal slices of the row, and block 0 reduces the
// blocks' candidates through distributed shared memory (sm_90+; below it every launch has clusters of one).
__global__ void __launch_bounds__(kThreads, 2) argmax_kernel(ArgmaxArgs a) {
    pdl_begin();
    __shared__ Best block_result;
    __shared__ int block_non_finite;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int64_t cluster_size = cluster.num_blocks();
    const int64_t rank = cluster.block_rank();
#else
    constexpr int64_t cluster_size = 1, rank = 0;
#endif
    const int64_t V = a.vocab_size;
    const int64_t slice = (V + cluster_size - 1) / cluster_size;
    const int64_t begin = min(V, rank * slice), end = min(V, begin + slice);
    for (int64_t r = blockIdx.x / cluster_size; r < a.num_rows; r += gridDim.x / cluster_size) {
        Best best{-INFINITY, -1};
        bool non_finite = false;
        RowDraw draw;
        if (a.draws != nullptr) {
            const TokenDraw d = a.draws[r];
            if (d.inv_temperature > 0.0f) draw = RowDraw{d.inv_temperature, d.noise_key, a.floor[r]};
        }
        fold_range(a.logits + r * a.row_stride, begin, end, draw, best, non_finite);
        const bool any_non_finite = __syncthreads_or(non_finite) != 0;
        best = block_best(best);
        if (cluster_size > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (threadIdx.x == 0) {
                block_result = best;
                block_non_finite = any_non_finite ? 1 : 0;
            }
            cluster.sync();  // every block's result written
            if (rank == 0 && threadIdx.x == 0) {
                int flag = 0;
                for (unsigned b = 0; b < cluster_size; ++b) {
                    best = better(best, *cluster.map_shared_rank(&block_result, b));
                    flag |= *cluster.map_shared_rank(&block_non_finite, b);
                }
                a.out_ids[r] = best.idx < 0 ? 0 : best.idx;
                a.out_non_finite[r] = flag;
            }
            cluster.sync();  // block 0 has read them: the next row may overwrite them, the blocks may exit
#endif
        } else if (threadIdx.x == 0) {
            a.out_ids[r] = best.idx < 0 ? 0 : best.idx;
            a.out_non_finite[r] = any_non_finite ? 1 : 0;
        }
    }
}

}  // namespace

int argmax_blocks_per_row(int64_t num_rows, int num_sms) {
    if (num_rows * kMaxBlocksPerRow <= num_sms) return kMaxBlocksPerRow;
    return num_rows * 2 <= num_sms ? 2 : 1;
}

cudaError_t launch_argmax(const ArgmaxArgs& args, int num_sms, cudaStream_t stream) {
    if (args.num_rows == 0) return cudaSuccess;
    const int cluster = pdl_supported() ? argmax_blocks_per_row(args.num_rows, num_sms) : 1;  // clusters: sm_90+
    const unsigned grid = static_cast<unsigned>(std::min(args.num_rows, kMaxBlocks / cluster) * cluster);
    return launch_pdl_cluster(argmax_kernel, dim3(grid), dim3(kThreads), static_cast<unsigned>(cluster), 0, stream,
                              args);
}

}  // namespace epinfer::cuda
