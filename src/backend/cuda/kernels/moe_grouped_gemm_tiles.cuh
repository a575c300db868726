// Tile bookkeeping shared by the grouped expert GEMM kernels (moe_grouped_gemm.cu: mma.sync, every
// architecture; moe_grouped_gemm_sm90.cu: wgmma, sm_90a): where a tile sits in the device-side group
// layout, which weight rows it reads, and the shared-memory swizzle both kernels stage operands with.
// Device code only (include from .cu files).
#pragma once

#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/moe_grouped_gemm.cuh"

namespace epinfer::cuda::moe_gemm {

constexpr int kBK = 64;           // K per pipeline stage: 8 chunks of 16 bytes per row
constexpr int kChunksPerRow = kBK / 8;
constexpr int kBlockN = 16;       // weight tiles per rasterisation block (module comment)

// The kWide tile of every kernel: token rows per tile (moe_gemm_tile_rows) and weight rows per tile
// (moe_gemm_tile_features; kSwiGlu: half gate, half up rows).
constexpr int kWideTokens = 128;
constexpr int kWideFeatures = 256;

struct TileCoord {
    int64_t group = 0;
    int64_t n_tile = 0;
    int64_t row0 = 0;     // first GEMM row of the tile
    int rows_valid = 0;   // GEMM rows of the tile inside the group (≥ 1)
};

// Tile `tile` of the launch: group by group; inside a group, blocks of kBlockN weight tiles × all row tiles,
// the weight tile fastest. False when the tile is past the device-side total.
// Warp-collective (every lane of the warp calls it with the same tile): the group is found by the lanes
// reading the offsets 32 at a time and counting those ≤ the tile's row tile (the offsets do not decrease),
// so a block waits for one round of loads rather than a binary search's log2(G) dependent ones — at decode
// sizes that wait was most of a tile's time.
template <int BN>
__device__ bool locate_tile(const MoeGroupedGemmArgs& args, int64_t tile, int64_t n_tiles, TileCoord& tc) {
    constexpr int kPerRound = 4;  // offsets per lane in flight
    const int32_t* offsets = args.group_tile_offsets;  // [G + 1]
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int64_t total_m = offsets[args.num_groups];
    const int64_t m_lin = tile / n_tiles;
    int64_t count = 0;  // groups g < G with offsets[g] ≤ m_lin
    for (int64_t base = 0; base < args.num_groups; base += 32 * kPerRound) {
        int32_t v[kPerRound];
#pragma unroll
        for (int i = 0; i < kPerRound; ++i) {
            const int64_t idx = base + lane + 32 * i;
            v[i] = idx < args.num_groups ? __ldg(offsets + idx) : INT32_MAX;
        }
#pragma unroll
        for (int i = 0; i < kPerRound; ++i) count += __popc(__ballot_sync(0xffffffffu, v[i] <= m_lin));
    }
    if (tile >= n_tiles * total_m) return false;
    const int64_t g = count - 1;
    const int64_t m_tiles = offsets[g + 1] - offsets[g];
    const int64_t local = tile - n_tiles * offsets[g];
    const int64_t block = local / (kBlockN * m_tiles);
    const int64_t rem = local - block * kBlockN * m_tiles;
    const int64_t block_size = min(int64_t{kBlockN}, n_tiles - block * kBlockN);
    const int64_t m_tile = rem / block_size;
    tc.group = g;
    tc.n_tile = block * kBlockN + rem % block_size;
    tc.row0 = args.group_row_begin[g] + m_tile * BN;
    tc.rows_valid = static_cast<int>(min(int64_t{BN}, args.group_row_end[g] - tc.row0));
    return true;
}

// Weight row of local A row r of tile n_tile (N_w space), or −1 past the end.
template <int BM, bool kSwiGlu>
__device__ __forceinline__ int64_t weight_row(int r, int64_t n_tile, int64_t n) {
    if constexpr (kSwiGlu) {
        const int64_t f = n_tile * (BM / 2) + (r % (BM / 2));
        return f < n ? (r < BM / 2 ? f : n + f) : -1;
    } else {
        const int64_t f = n_tile * BM + r;
        return f < n ? f : -1;
    }
}

__device__ __forceinline__ int swizzle(int row, int chunk) {
    return row * kBK + ((chunk ^ (row & 7)) * 8);
}

// The weights of group g: rows [0, N) from `first`, and (kSwiGlu) the up rows [N, 2N) from `second`.
struct GroupWeights {
    const bf16* first;   // [N, Kd]
    const bf16* second;  // [N, Kd] (kSwiGlu), else unused
};

template <bool kSwiGlu>
__device__ __forceinline__ GroupWeights group_weights(const MoeGroupedGemmArgs& args, int64_t g) {
    const int64_t rows_kd = args.out_features * args.in_features;
    const bf16* w;
    if (g >= args.num_weight_groups) {
        w = static_cast<const bf16*>(args.extra_weights);
    } else if (args.weight_ptrs != nullptr) {
        const void* const* ptrs = args.weight_ptrs + g * args.weight_ptr_stride;
        return {static_cast<const bf16*>(ptrs[0]), kSwiGlu ? static_cast<const bf16*>(ptrs[1]) : nullptr};
    } else {
        w = static_cast<const bf16*>(args.weights) + g * args.weight_group_stride;
    }
    return {w, w + rows_kd};
}


// The 16-byte chunks one thread copies into every pipeline stage of a tile: chunk `tid mod 8` of the
// kWLoads weight rows and kXLoads GEMM rows row_first + i·kRowStep (row_first = tid / 8), into kWRows ×
// kBK and (kXLoads · kRowStep) × kBK swizzled bf16 stages. Weight rows past N_w and K past Kd are zero-
// filled; GEMM rows past the group are not copied (their stale columns are never stored).
template <int kWRows, int kWLoads, int kXLoads, int kRowStep, bool kSwiGlu>
struct StageLoader {
    const bf16* w_src[kWLoads];  // nullptr: past the weights' end
    const bf16* x_src[kXLoads];  // nullptr: past the group's end
    const bf16* zero_src;        // a valid address for the zero-filling copies
    int64_t kd;
    int row_first;
    int chunk;

    __device__ __forceinline__ StageLoader(const MoeGroupedGemmArgs& args, const TileCoord& tc, int tid)
        : kd(args.in_features), row_first(tid / kChunksPerRow), chunk(tid % kChunksPerRow) {
        const int64_t n = args.out_features;
        const GroupWeights gw = group_weights<kSwiGlu>(args, tc.group);
        zero_src = gw.first;
        #pragma unroll
        for (int i = 0; i < kWLoads; ++i) {
            const int64_t wr = weight_row<kWRows, kSwiGlu>(row_first + i * kRowStep, tc.n_tile, n);
            w_src[i] = wr < 0 ? nullptr : (wr < n ? gw.first + wr * kd : gw.second + (wr - n) * kd) + chunk * 8;
        }
        const bf16* x = static_cast<const bf16*>(args.x);  // [rows_x, Kd]
        #pragma unroll
        for (int j = 0; j < kXLoads; ++j) {
            const int r = row_first + j * kRowStep;
            if (r < tc.rows_valid) {
                const int64_t row = tc.row0 + r;
                const int64_t x_row = args.x_row_of_row ? args.x_row_of_row[row] : row;
                x_src[j] = x + x_row * kd + chunk * 8;
            } else {
                x_src[j] = nullptr;
            }
        }
    }

    // Issues the copies of K step kt into the stage's weight rows sw and GEMM rows sx (not committed).
    __device__ __forceinline__ void load(bf16* sw, bf16* sx, int64_t kt) const {
        const int64_t k0 = kt * kBK;
        const bool k_ok = k0 + chunk * 8 < kd;
        #pragma unroll
        for (int i = 0; i < kWLoads; ++i) {
            const bool ok = w_src[i] != nullptr && k_ok;
            cp_async_16(sw + swizzle(row_first + i * kRowStep, chunk), ok ? w_src[i] + k0 : zero_src, ok ? 16 : 0);
        }
        #pragma unroll
        for (int j = 0; j < kXLoads; ++j) {
            if (x_src[j] == nullptr) continue;
            cp_async_16(sx + swizzle(row_first + j * kRowStep, chunk), k_ok ? x_src[j] + k0 : x_src[j], k_ok ? 16 : 0);
        }
    }
};

}  // namespace epinfer::cuda::moe_gemm
