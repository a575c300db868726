// Few-row dense matmul kernels (see matmul_small_t.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels/matmul_small_t.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {
namespace {

constexpr int kWarps = 4;  // per block
// Weight rows per warp: 4 for 5–8 activation rows (kT = 8: each x chunk serves four weight rows), else 2.
// Measured on the H200, Qwen3-30B-A3B decode steps (docs/benchmarks/serving.md): with 4 rows, 8 rows per
// step 12.00 → 11.52 ms, but one row 3.56 → 3.65 ms and 16 rows 16.6 → 17.4 ms (kT = 16's 64 accumulators).
template <int kT>
constexpr int rows_per_warp() {
    return kT == 8 ? 4 : 2;
}

// 16-byte chunks of a weight row in flight per lane (loaded before any is used), so a warp waits for memory
// about chunks / (32 · kBatch) times rather than chunks / 32; fewer with more activation rows (registers).
// At 8 and 16 rows, 2 for rows of at least kLongRowChunks chunks (the bytes of kMatmulLongK bf16 elements):
// measured on the H200 (docs/benchmarks/serving.md, session 16), decode steps of DeepSeek-V3 (4 layers; K
// 7168 to 18432) at 8 rows 4.83–4.84 → 4.76–4.77 ms and at 16 rows 13.04 → 11.40–11.50 ms. For every K, 2
// cost Qwen3-30B-A3B (K 2048 and 4096) 2 % (8 rows 11.00 → 11.22–11.27 ms, 16 rows 15.84–15.89 →
// 16.23–16.25 ms); below the threshold it keeps 1 (11.07 and 16.15 ms against 11.06–11.11 and 16.05–16.13).
// (Those were bf16 weights, which now leave such rows above kMatmulLongKMaxRows rows to cuBLAS; f16 and
// f32 weights, and fp32-activation runs, still take this path there.)
constexpr int64_t kLongRowChunks = kMatmulLongK * 2 / 16;
template <int kT>
constexpr int chunk_batch(bool long_rows) {
    return kT <= 2 ? 4 : (kT <= 4 || long_rows ? 2 : 1);
}

__device__ __forceinline__ float to_f32(float v) {
    return v;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
__device__ __forceinline__ float to_f32(__half v) {
    return __half2float(v);
}

// One launch for the matmuls of a group: block b runs matmul p, the first with b < block_end[p], as its
// block b − block_end[p − 1].
struct SmallTLaunch {
    MatmulGroupArgs group;
    int64_t block_end[MatmulGroupArgs::kMaxMatmuls] = {};
};

// The matmul of this block and the block's index within it (a chain of uniform selects: no local-memory
// copy of the parameter array).
__device__ __forceinline__ MatmulArgs block_matmul(const SmallTLaunch& l, int64_t* block) {
    MatmulArgs a = l.group.matmuls[0];
    int64_t begin = 0;
#pragma unroll
    for (int i = 1; i < MatmulGroupArgs::kMaxMatmuls; ++i) {
        if (i < l.group.num_matmuls && *block >= l.block_end[i - 1]) {
            a = l.group.matmuls[i];
            begin = l.block_end[i - 1];
        }
    }
    *block -= begin;
    return a;
}

__device__ __forceinline__ float load_bias(const void* bias, DType dtype, int64_t i) {
    switch (dtype) {
        case DType::kBF16:
            return __bfloat162float(static_cast<const __nv_bfloat16*>(bias)[i]);
        case DType::kF16:
            return __half2float(static_cast<const __half*>(bias)[i]);
        default:
            return static_cast<const float*>(bias)[i];
    }
}

// Sums acc over the warp: every lane ends with the sums (a butterfly of shuffles).
template <int kT, int kRows = rows_per_warp<kT>()>
__device__ __forceinline__ void warp_sum(float (&acc)[kRows][kT]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int t = 0; t < kT; ++t) {
            float v = acc[r][t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            acc[r][t] = v;
        }
    }
}

// Writes y[t, n] = acc[n − n0][t] (+ bias) for the valid rows and outputs.
template <int kT, int kRows = rows_per_warp<kT>()>
__device__ __forceinline__ void store_rows(const MatmulArgs& a, const float (&acc)[kRows][kT], int64_t n0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int64_t n = n0 + r;
        if (n >= a.out_features) continue;
        const float b = a.bias != nullptr ? load_bias(a.bias, a.bias_dtype, n) : 0.0f;
#pragma unroll
        for (int t = 0; t < kT; ++t) {
            if (t < a.num_rows) a.y[t * a.y_row_stride + n] = acc[r][t] + b;
        }
    }
}

// 16-byte loads: W rows and x rows 16-byte aligned, K a multiple of the chunk. kT ≥ T (rows past T read
// row T − 1 again and are not stored). prefetch: lane 0 of each warp first prefetches the warp's weight rows
// into L2, before pdl_begin(), so they stream from DRAM while the previous kernel runs.
// kSplit (1, 2 or 4) warps of the block share a warp's rows, each over a contiguous kSplit-th of K, and the
// block adds their sums in warp order through shared memory (split-K inside the block: kSplit times the
// warps, and the bytes in flight, on a matrix of few rows; the order is fixed, so results do not vary).
// kBatch: chunk_batch.
template <typename W, int kT, int kSplit, int kBatch>
__global__ void __launch_bounds__(kWarps * 32) matmul_small_t_vec_kernel(SmallTLaunch l, bool prefetch) {
    constexpr int kElems = 16 / sizeof(W);
    constexpr int kRows = rows_per_warp<kT>();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % kSplit;
    int64_t block = blockIdx.x;
    const MatmulArgs a = block_matmul(l, &block);
    const int64_t n0 = (block * (kWarps / kSplit) + warp / kSplit) * kRows;
    // With kSplit > 1 every warp reaches the block's barrier: rows past N are computed (reread) and not stored.
    if (kSplit == 1 && n0 >= a.out_features) return;
    const int64_t K = a.in_features;
    if (prefetch && lane == 0 && part == 0 && n0 < a.out_features) {
        const int64_t rows = a.out_features - n0 < kRows ? a.out_features - n0 : kRows;
        prefetch_l2(static_cast<const W*>(a.w) + n0 * K, static_cast<uint32_t>(rows * K * sizeof(W)));
    }
    pdl_begin();
    const int64_t all_chunks = K / kElems;
    const int64_t chunk0 = all_chunks * part / kSplit;  // this warp's chunks [chunk0, chunk0 + chunks)
    const int64_t chunks = all_chunks * (part + 1) / kSplit - chunk0;
    const W* w = static_cast<const W*>(a.w);  // [N, K]
    float acc[kRows][kT];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kT; ++t) acc[r][t] = 0.0f;
    const W* w_row[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int64_t n =
            n0 + r < a.out_features ? n0 + r : a.out_features - 1;  // past N: reread, not stored
        w_row[r] = w + n * K + chunk0 * kElems;
    }
    const float* x_row[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t)
        x_row[t] = a.x + (t < a.num_rows ? t : a.num_rows - 1) * a.x_row_stride + chunk0 * kElems;

    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kBatch) {
        uint4 raw[kBatch][kRows];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t c = c0 + 32 * b;
#pragma unroll
            for (int r = 0; r < kRows; ++r)
                raw[b][r] = c < chunks ? __ldg(reinterpret_cast<const uint4*>(w_row[r] + c * kElems)) : uint4{};
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t c = c0 + 32 * b;
            if (c >= chunks) break;
            float wv[kRows][kElems];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const W* e = reinterpret_cast<const W*>(&raw[b][r]);
#pragma unroll
                for (int i = 0; i < kElems; ++i) wv[r][i] = to_f32(e[i]);
            }
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                float xv[kElems];
                const float4* xp = reinterpret_cast<const float4*>(x_row[t] + c * kElems);
#pragma unroll
                for (int q = 0; q < kElems / 4; ++q) {
                    const float4 f = xp[q];
                    xv[4 * q] = f.x;
                    xv[4 * q + 1] = f.y;
                    xv[4 * q + 2] = f.z;
                    xv[4 * q + 3] = f.w;
                }
#pragma unroll
                for (int r = 0; r < kRows; ++r)
#pragma unroll
                    for (int e = 0; e < kElems; ++e) acc[r][t] = fmaf(wv[r][e], xv[e], acc[r][t]);
            }
        }
    }
    warp_sum<kT>(acc);
    if constexpr (kSplit > 1) {  // part 0 adds the other parts' sums, in part order
        __shared__ float parts[kWarps][kRows][kT];
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < kRows; ++r)
#pragma unroll
                for (int t = 0; t < kT; ++t) parts[warp][r][t] = acc[r][t];
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int t = 0; t < kT; ++t)
#pragma unroll
                for (int p = 1; p < kSplit; ++p) acc[r][t] += parts[warp + p][r][t];
    }
    if (lane == 0) store_rows<kT>(a, acc, n0);
}

// Any alignment: one element per lane per step.
template <typename W>
__global__ void __launch_bounds__(kWarps * 32) matmul_small_t_scalar_kernel(SmallTLaunch l) {
    pdl_begin();
    constexpr int kT = static_cast<int>(kMatmulSmallTMaxRows);
    constexpr int kRows = rows_per_warp<kT>();
    const int lane = threadIdx.x % 32;
    int64_t block = blockIdx.x;
    const MatmulArgs a = block_matmul(l, &block);
    const int64_t n0 = (block * kWarps + threadIdx.x / 32) * kRows;
    if (n0 >= a.out_features) return;
    const int64_t K = a.in_features;
    const W* w = static_cast<const W*>(a.w);  // [N, K]
    float acc[kRows][kT];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kT; ++t) acc[r][t] = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
        float wv[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int64_t n = n0 + r < a.out_features ? n0 + r : a.out_features - 1;
            wv[r] = to_f32(w[n * K + k]);
        }
#pragma unroll
        for (int t = 0; t < kT; ++t) {
            if (t >= a.num_rows) break;
            const float xv = a.x[t * a.x_row_stride + k];
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r][t] = fmaf(wv[r], xv, acc[r][t]);
        }
    }
    warp_sum<kT>(acc);
    if (lane == 0) store_rows<kT>(a, acc, n0);
}

// A launch's weights (all of a group's) up to this size are prefetched into L2 before pdl_begin() (half the H100/H200's 50 MB L2: a
// larger matrix, e.g. an LM head, would evict its own first rows before they are read).
constexpr int64_t kPrefetchMaxBytes = int64_t{24} << 20;

// Blocks of a launch with rows_per_block outputs each, and each matmul's end in l->block_end.
inline int64_t group_blocks(SmallTLaunch* l, int64_t rows_per_block) {
    int64_t blocks = 0;
    for (int i = 0; i < l->group.num_matmuls; ++i) {
        blocks += (l->group.matmuls[i].out_features + rows_per_block - 1) / rows_per_block;
        l->block_end[i] = blocks;
    }
    return blocks;
}

// Launches `kernel` (kT activation rows, kSplit warps per row set) over every block of the group.
template <int kT, int kSplit, typename... KernelArgs, typename... Extra>
cudaError_t launch_blocks(void (*kernel)(KernelArgs...), SmallTLaunch l, cudaStream_t stream, Extra... extra) {
    const int64_t blocks = group_blocks(&l, int64_t{kWarps / kSplit} * rows_per_warp<kT>());
    if (blocks == 0) return cudaSuccess;
    return launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, stream, l, extra...);
}

// K is split over the warps of a block (matmul_small_t_vec_kernel's kSplit) when the launch unsplit has
// fewer blocks than this (about 4 per SM on the H200's 132: too few loads in flight for a matrix of few
// rows), into the most parts, of 4 or 2, that leave every warp at least one full batch of chunks per lane.
// Measured on the H200 at one row (Nsight Compute, Qwen3-30B-A3B): o_proj (2048 × 4096, 256 blocks) 9.7 →
// 7.8 µs split in 4, the router (128 × 2048, 16 blocks) 4.1 → 3.2 µs in 2, but q/k/v (5120 × 2048, 640
// blocks) 9.5 → 10.1 µs in 2.
constexpr int64_t kSplitBelowBlocks = 512;

template <typename W, int kT, int kBatch>
cudaError_t launch_vec(SmallTLaunch l, int64_t chunks, bool prefetch, cudaStream_t stream) {
    const int64_t unsplit = group_blocks(&l, int64_t{kWarps} * rows_per_warp<kT>());
    const int64_t per_warp = int64_t{32} * kBatch;
    if (unsplit < kSplitBelowBlocks && chunks >= 4 * per_warp)
        return launch_blocks<kT, 4>(matmul_small_t_vec_kernel<W, kT, 4, kBatch>, l, stream, prefetch);
    if (unsplit < kSplitBelowBlocks && chunks >= 2 * per_warp)
        return launch_blocks<kT, 2>(matmul_small_t_vec_kernel<W, kT, 2, kBatch>, l, stream, prefetch);
    return launch_blocks<kT, 1>(matmul_small_t_vec_kernel<W, kT, 1, kBatch>, l, stream, prefetch);
}

template <typename W, int kT>
cudaError_t launch_vec(SmallTLaunch l, int64_t chunks, bool prefetch, cudaStream_t stream) {
    if (chunk_batch<kT>(true) != chunk_batch<kT>(false) && chunks >= kLongRowChunks)
        return launch_vec<W, kT, chunk_batch<kT>(true)>(l, chunks, prefetch, stream);
    return launch_vec<W, kT, chunk_batch<kT>(false)>(l, chunks, prefetch, stream);
}

template <typename W>
cudaError_t launch_typed(const SmallTLaunch& l, cudaStream_t stream) {
    constexpr int64_t kElems = 16 / sizeof(W);
    bool aligned = true;
    int64_t weight_bytes = 0;
    for (int i = 0; i < l.group.num_matmuls; ++i) {
        const MatmulArgs& a = l.group.matmuls[i];
        aligned = aligned && reinterpret_cast<uintptr_t>(a.w) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.in_features % kElems == 0 && a.x_row_stride % 4 == 0;
        weight_bytes += a.out_features * a.in_features * static_cast<int64_t>(sizeof(W));
    }
    const bool prefetch = weight_bytes <= kPrefetchMaxBytes;
    const int64_t T = l.group.matmuls[0].num_rows;
    const int64_t chunks = l.group.matmuls[0].in_features / kElems;  // the same K for every entry
    constexpr int kScalarT = static_cast<int>(kMatmulSmallTMaxRows);
    if (!aligned) {
        return launch_blocks<kScalarT, 1>(matmul_small_t_scalar_kernel<W>, l, stream);
    } else if (T == 1) {
        return launch_vec<W, 1>(l, chunks, prefetch, stream);
    } else if (T == 2) {
        return launch_vec<W, 2>(l, chunks, prefetch, stream);
    } else if (T <= 4) {
        return launch_vec<W, 4>(l, chunks, prefetch, stream);
    } else if (T <= 8) {
        return launch_vec<W, 8>(l, chunks, prefetch, stream);
    } else {
        return launch_vec<W, 16>(l, chunks, prefetch, stream);
    }
}

}  // namespace

cudaError_t launch_matmul_small_t(const MatmulGroupArgs& group, cudaStream_t stream) {
    if (group.num_matmuls < 1 || group.num_matmuls > MatmulGroupArgs::kMaxMatmuls) return cudaErrorInvalidValue;
    const MatmulArgs& first = group.matmuls[0];
    if (first.num_rows < 1 || first.num_rows > kMatmulSmallTMaxRows) return cudaErrorInvalidValue;
    for (int i = 0; i < group.num_matmuls; ++i)
        if (group.matmuls[i].w_dtype != first.w_dtype) return cudaErrorInvalidValue;
    SmallTLaunch l;
    l.group = group;
    switch (first.w_dtype) {
        case DType::kBF16:
            return launch_typed<__nv_bfloat16>(l, stream);
        case DType::kF16:
            return launch_typed<__half>(l, stream);
        case DType::kF32:
            return launch_typed<float>(l, stream);
        default:
            return cudaErrorInvalidValue;
    }
}

}  // namespace epinfer::cuda
