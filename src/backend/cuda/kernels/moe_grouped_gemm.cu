// Grouped expert GEMM kernels (see moe_grouped_gemm.cuh).
//
// One CTA computes one tile: BM weight rows (A, the MMA's M side) × BN GEMM rows (B, the tokens, gathered
// through x_row_of_row) over a K range, with a kStages-deep cp.async pipeline into XOR-swizzled shared
// memory (16-byte chunks, chunk' = chunk ^ (row mod 8), so ldmatrix is conflict-free), ldmatrix, and
// mma.sync m16n8k16 bf16 → fp32. The fused epilogue stages the fp32 tile through shared memory and writes
// 16-byte rows of bf16 (SwiGLU pairs gate row f with up row N + f there).
#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/moe_grouped_gemm.cuh"
#include "backend/cuda/kernels/moe_grouped_gemm_sm90.cuh"
#include "backend/cuda/kernels/moe_grouped_gemm_tiles.cuh"
#include "backend/cuda/kernels/moe_grouped_gemv.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/sm90a.cuh"

namespace epinfer::cuda {
namespace {

using namespace moe_gemm;

constexpr int kEpiloguePad = 4;   // fp32 padding per staged row: conflict-free fragment stores

template <int BM, int BN, int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct TileConfig {
    static constexpr int kMinBlocks = MinBlocks;  // CTAs per SM the register budget is cut for
    static constexpr int kBM = BM;
    static constexpr int kBN = BN;
    static constexpr int kStages = Stages;
    static constexpr int kWarpsM = WarpsM;
    static constexpr int kThreads = WarpsM * WarpsN * 32;
    static constexpr int kWM = BM / WarpsM;  // weight rows per warp
    static constexpr int kWN = BN / WarpsN;  // tokens per warp
    static constexpr int kMFrags = kWM / 16;
    static constexpr int kNFrags = kWN / 8;
    static constexpr int kAStage = BM * kBK;  // elements
    static constexpr int kBStage = BN * kBK;
    static constexpr int kALoads = BM * kChunksPerRow / kThreads;  // 16-byte chunks per thread per stage
    static constexpr int kBLoads = BN * kChunksPerRow / kThreads;
    static constexpr int kRowStep = kThreads / kChunksPerRow;     // rows between one thread's chunks
    static constexpr size_t kPipeBytes = size_t{Stages} * (kAStage + kBStage) * sizeof(bf16);
    static constexpr size_t kEpilogueBytes = size_t{BN} * (BM + kEpiloguePad) * sizeof(float);
    static constexpr size_t kSmemBytes = kPipeBytes > kEpilogueBytes ? kPipeBytes : kEpilogueBytes;
    static_assert(kWM % 16 == 0 && kWN % 16 == 0 && kRowStep % 8 == 0);
};
// Narrow: warp 32 × 32, 5 stages of 20 KB: 2 CTAs per SM on H100/H200. Decode sizes wait on DRAM with
// few bytes in flight (Nsight Compute, Qwen3-30B-A3B at 8 tokens: 2 warps per scheduler, DRAM 64 % busy),
// so a stage holds 32 GEMM rows rather than 64 and the ring is one stage deeper: 4 × 16 KB of weights in
// flight per CTA instead of 3. Measured on the H200 against 128 × 64 in 4 stages (docs/benchmarks/
// moe_h200.md, session 21): Qwen3-30B-A3B decode TPOT at 8 requests 11.0 → 10.3 ms. Where a block cannot
// have 100 KB (sm_86, sm_89, sm_120: 99 KB), 4 stages.
using NarrowTile = TileConfig<128, 32, 4, 1, 5, 2>;
using NarrowTileSmall = TileConfig<128, 32, 4, 1, 4, 2>;
// Wide: warp 64 × 64, 8 warps, 144 KB: 85 FLOP per byte staged through shared memory (the 128 × 128 tile's
// 64 FLOP/B left the tensor cores waiting on L2). Where a block gets less shared memory (sm_120), the
// 128 × 128 tile of 96 KB instead.
using WideTile = TileConfig<256, 128, 4, 2, 3, 1>;
using WideTileSmall = TileConfig<128, 128, 2, 2, 3, 2>;
static_assert(WideTile::kBN == kWideTokens && WideTileSmall::kBN == kWideTokens && WideTile::kBM == kWideFeatures,
              "one kWide tile geometry for every wide kernel");

// Split-K reduction of one tile, by the CTA of its last split to finish: sums the tile's partials in split
// order (deterministic, whichever split finishes last), applies the epilogue, writes bf16. Partials are
// read through L2 (__ldcg): other CTAs wrote them.
template <class Cfg, bool kSwiGlu>
__device__ void reduce_tile(const MoeGroupedGemmArgs& args, const TileCoord& tc) {
    const int64_t n = args.out_features;
    const int64_t n_w = kSwiGlu ? 2 * n : n;
    constexpr int kOutPerTile = kSwiGlu ? Cfg::kBM / 2 : Cfg::kBM;
    constexpr int kChunks = kOutPerTile / 8;
    const int64_t split_stride = args.partial_rows * n_w;
    bf16* out = static_cast<bf16*>(args.out);  // [rows, N]
    for (int c = threadIdx.x; c < tc.rows_valid * kChunks; c += blockDim.x) {
        const int tok = c / kChunks;
        const int64_t f = tc.n_tile * kOutPerTile + (c % kChunks) * 8;
        if (f >= n) continue;
        const float* src = args.partials + (tc.row0 + tok) * n_w + f;  // split 0
        float g[8], u[8];
        #pragma unroll
        for (int e = 0; e < 8; ++e) {
            g[e] = __ldcg(src + e);
            u[e] = kSwiGlu ? __ldcg(src + n + e) : 0.0f;
        }
        for (int s = 1; s < args.split_k; ++s) {
            const float* part = src + s * split_stride;
            #pragma unroll
            for (int e = 0; e < 8; ++e) {
                g[e] = __fadd_rn(g[e], __ldcg(part + e));
                if (kSwiGlu) u[e] = __fadd_rn(u[e], __ldcg(part + n + e));
            }
        }
        uint4 packed;
        __nv_bfloat162* p2 = reinterpret_cast<__nv_bfloat162*>(&packed);
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float v0 = kSwiGlu ? silu_mul(g[2 * e], u[2 * e]) : g[2 * e];
            const float v1 = kSwiGlu ? silu_mul(g[2 * e + 1], u[2 * e + 1]) : g[2 * e + 1];
            p2[e] = __floats2bfloat162_rn(v0, v1);
        }
        *reinterpret_cast<uint4*>(out + (tc.row0 + tok) * n + f) = packed;
    }
}

template <class Cfg, bool kSwiGlu, bool kSplit>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) moe_grouped_gemm_kernel(MoeGroupedGemmArgs args) {
    pdl_begin();
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* smem_a = reinterpret_cast<bf16*>(smem);                   // [Stages][BM][BK] bf16, swizzled
    bf16* smem_b = smem_a + Cfg::kStages * Cfg::kAStage;            // [Stages][BN][BK] bf16, swizzled

    const int64_t n = args.out_features;
    const int64_t kd = args.in_features;
    const int64_t n_tiles = ceil_div<int64_t>(n, kSwiGlu ? Cfg::kBM / 2 : Cfg::kBM);
    const int64_t tile = blockIdx.x / args.split_k;
    const int split = static_cast<int>(blockIdx.x % args.split_k);
    TileCoord tc;
    if (!locate_tile<Cfg::kBN>(args, tile, n_tiles, tc)) return;

    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int wm = warp % Cfg::kWarpsM;
    const int wn = warp / Cfg::kWarpsM;
    // K range of this split.
    const int64_t k_tiles = ceil_div<int64_t>(kd, kBK);
    const int64_t k_per_split = ceil_div<int64_t>(k_tiles, args.split_k);
    const int64_t kt_begin = split * k_per_split;
    const int64_t kt_end = min(k_tiles, kt_begin + k_per_split);

    const StageLoader<Cfg::kBM, Cfg::kALoads, Cfg::kBLoads, Cfg::kRowStep, kSwiGlu> loader(args, tc, tid);
    auto load_stage = [&](int stage, int64_t kt) {
        loader.load(smem_a + stage * Cfg::kAStage, smem_b + stage * Cfg::kBStage, kt);
    };

    float acc[Cfg::kMFrags][Cfg::kNFrags][4];
    #pragma unroll
    for (int i = 0; i < Cfg::kMFrags; ++i)
        #pragma unroll
        for (int j = 0; j < Cfg::kNFrags; ++j)
            #pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

    // Token-column pairs (16 tokens) of this warp inside the group: MMAs past them are skipped (CTA- and
    // warp-uniform); the second half of the last pair may hold stale rows, whose columns are never stored.
    const int warp_rows = tc.rows_valid - wn * Cfg::kWN;
    const int active_pairs = warp_rows <= 0 ? 0 : min(Cfg::kNFrags / 2, (warp_rows + 15) / 16);

    auto compute_stage = [&](int stage) {
        const bf16* sa = smem_a + stage * Cfg::kAStage;
        const bf16* sb = smem_b + stage * Cfg::kBStage;
        #pragma unroll
        for (int ks = 0; ks < kBK / 16; ++ks) {
            uint32_t a[Cfg::kMFrags][4];
            uint32_t b[Cfg::kNFrags / 2][4];
            #pragma unroll
            for (int i = 0; i < Cfg::kMFrags; ++i) {
                const int row = wm * Cfg::kWM + i * 16 + lane % 16;
                ldmatrix_x4(a[i], sa + swizzle(row, ks * 2 + lane / 16));
            }
            #pragma unroll
            for (int jp = 0; jp < Cfg::kNFrags / 2; ++jp) {
                if (jp < active_pairs) {
                    const int row = wn * Cfg::kWN + jp * 16 + lane % 8 + (lane / 16) * 8;
                    ldmatrix_x4(b[jp], sb + swizzle(row, ks * 2 + (lane / 8) % 2));
                }
            }
            #pragma unroll
            for (int jp = 0; jp < Cfg::kNFrags / 2; ++jp) {
                if (jp < active_pairs) {
                    #pragma unroll
                    for (int i = 0; i < Cfg::kMFrags; ++i) {
                        mma_bf16_16816(acc[i][2 * jp], a[i], b[jp][0], b[jp][1]);
                        mma_bf16_16816(acc[i][2 * jp + 1], a[i], b[jp][2], b[jp][3]);
                    }
                }
            }
        }
    };

    #pragma unroll
    for (int s = 0; s < Cfg::kStages - 1; ++s) {
        if (kt_begin + s < kt_end) load_stage(s, kt_begin + s);
        cp_async_commit();
    }
    for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
        cp_async_wait<Cfg::kStages - 2>();
        __syncthreads();
        const int64_t kt_next = kt + Cfg::kStages - 1;
        if (kt_next < kt_end) load_stage(static_cast<int>((kt_next - kt_begin) % Cfg::kStages), kt_next);
        cp_async_commit();
        compute_stage(static_cast<int>((kt - kt_begin) % Cfg::kStages));
    }
    cp_async_wait<0>();
    __syncthreads();

    if constexpr (kSplit) {
        // fp32 partial sums: partials[split][row][weight row].
        const int64_t n_w = kSwiGlu ? 2 * n : n;
        float* part = args.partials + static_cast<int64_t>(split) * args.partial_rows * n_w;
        #pragma unroll
        for (int i = 0; i < Cfg::kMFrags; ++i) {
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = wm * Cfg::kWM + i * 16 + lane / 4 + half * 8;
                const int64_t wr = weight_row<Cfg::kBM, kSwiGlu>(r, tc.n_tile, n);
                if (wr < 0) continue;
                #pragma unroll
                for (int j = 0; j < Cfg::kNFrags; ++j) {
                    #pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const int tok = wn * Cfg::kWN + j * 8 + 2 * (lane % 4) + v;
                        if (tok < tc.rows_valid) part[(tc.row0 + tok) * n_w + wr] = acc[i][j][half * 2 + v];
                    }
                }
            }
        }
        // The last split of the tile to finish reduces it (CUDA's threadFenceReduction pattern): every
        // split publishes its partials, then counts itself in; the counter goes back to zero for the next
        // launch.
        __shared__ bool last_split;
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            last_split = atomicAdd(args.tile_counters + tile, 1) == args.split_k - 1;
            if (last_split) args.tile_counters[tile] = 0;
        }
        __syncthreads();
        if (!last_split) return;
        __threadfence();
        reduce_tile<Cfg, kSwiGlu>(args, tc);
        return;
    }

    // Fused epilogue: stage the tile as fp32 [BN tokens][BM + pad], then write 8 outputs per thread.
    constexpr int kLd = Cfg::kBM + kEpiloguePad;
    float* staged = reinterpret_cast<float*>(smem);  // [BN][kLd] fp32
    #pragma unroll
    for (int i = 0; i < Cfg::kMFrags; ++i) {
        #pragma unroll
        for (int j = 0; j < Cfg::kNFrags; ++j) {
            const int r = wm * Cfg::kWM + i * 16 + lane / 4;
            const int tok = wn * Cfg::kWN + j * 8 + 2 * (lane % 4);
            staged[tok * kLd + r] = acc[i][j][0];
            staged[(tok + 1) * kLd + r] = acc[i][j][1];
            staged[tok * kLd + r + 8] = acc[i][j][2];
            staged[(tok + 1) * kLd + r + 8] = acc[i][j][3];
        }
    }
    __syncthreads();
    constexpr int kOutPerTile = kSwiGlu ? Cfg::kBM / 2 : Cfg::kBM;  // outputs per row in this tile
    constexpr int kChunks = kOutPerTile / 8;
    bf16* out = static_cast<bf16*>(args.out);  // [rows, N]
    for (int c = tid; c < tc.rows_valid * kChunks; c += Cfg::kThreads) {
        const int tok = c / kChunks;
        const int f8 = (c % kChunks) * 8;
        const int64_t f = tc.n_tile * kOutPerTile + f8;
        if (f >= n) continue;
        const float* src = staged + tok * kLd + f8;
        float v[8];
        #pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = kSwiGlu ? silu_mul(src[e], src[e + Cfg::kBM / 2]) : src[e];
        uint4 packed;
        __nv_bfloat162* p2 = reinterpret_cast<__nv_bfloat162*>(&packed);
        #pragma unroll
        for (int e = 0; e < 4; ++e) p2[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
        *reinterpret_cast<uint4*>(out + (tc.row0 + tok) * n + f) = packed;
    }
}

template <class Cfg, bool kSwiGlu, bool kSplit>
cudaError_t launch_config(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    const int64_t n_tiles = ceil_div<int64_t>(args.out_features, kSwiGlu ? Cfg::kBM / 2 : Cfg::kBM);
    const int64_t num_tiles = n_tiles * args.max_row_tiles;
    if (num_tiles == 0) return cudaSuccess;
    auto kernel = moe_grouped_gemm_kernel<Cfg, kSwiGlu, kSplit>;
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::kSmemBytes));
    if (err != cudaSuccess) return err;
    return launch_pdl(kernel, dim3(static_cast<unsigned>(num_tiles * args.split_k)), dim3(Cfg::kThreads),
                      Cfg::kSmemBytes, stream, args);
}

// The launch of tile Cfg for args' epilogue, split in K (kNarrow tiles only) or not.
template <class Cfg, bool kNarrow>
cudaError_t launch_tile(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    const bool swiglu = args.epilogue == MoeGemmEpilogue::kSwiGlu;
    if constexpr (kNarrow) {
        if (args.split_k > 1) {
            return swiglu ? launch_config<Cfg, true, true>(args, stream)
                          : launch_config<Cfg, false, true>(args, stream);
        }
    }
    return swiglu ? launch_config<Cfg, true, false>(args, stream)
                  : launch_config<Cfg, false, false>(args, stream);
}

}  // namespace

int64_t moe_gemm_tile_rows(MoeGemmTile tile) {
    switch (tile) {
        case MoeGemmTile::kNarrow: return NarrowTile::kBN;
        case MoeGemmTile::kWide: return WideTile::kBN;
        default: return kGemvMaxRows;
    }
}

int64_t moe_gemm_tile_features(MoeGemmTile tile) {
    switch (tile) {
        case MoeGemmTile::kNarrow: return NarrowTile::kBM;
        case MoeGemmTile::kWide: return WideTile::kBM;
        default: return moe_gemv_weight_rows_per_block();
    }
}

int64_t moe_gemm_max_row_tiles(int64_t rows, int64_t groups, int64_t tile_rows) {
    return tile_rows == 1 ? rows : rows / tile_rows + (groups < rows ? groups : rows);
}

int64_t moe_gemm_num_tiles(const MoeGroupedGemmArgs& args) {
    const int64_t per_tile = args.epilogue == MoeGemmEpilogue::kSwiGlu ? NarrowTile::kBM / 2 : NarrowTile::kBM;
    return ceil_div<int64_t>(args.out_features, per_tile) * args.max_row_tiles;
}

int moe_gemm_pick_split_k(int64_t num_tiles, int64_t in_features, int num_sms) {
    const int64_t k_tiles = ceil_div<int64_t>(in_features, kBK);
    const int64_t target_units = int64_t{4} * 2 * num_sms;  // 2 CTAs per SM, 4 waves
    int64_t split = num_tiles > 0 ? ceil_div<int64_t>(target_units, num_tiles) : 1;
    const int64_t max_split = k_tiles / 8 > 1 ? k_tiles / 8 : 1;
    split = split < 1 ? 1 : (split > max_split ? max_split : split);
    const int64_t per_split = ceil_div<int64_t>(k_tiles, split);
    return static_cast<int>(ceil_div<int64_t>(k_tiles, per_split));  // every split gets ≥ 1 k-step
}

cudaError_t launch_moe_grouped_gemm(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    if (args.in_features % 8 != 0 || args.out_features % 8 != 0 || args.in_features <= 0 || args.split_k < 1) {
        return cudaErrorInvalidValue;
    }
    if (args.split_k > 1 &&
        (args.tile != MoeGemmTile::kNarrow || args.partials == nullptr || args.tile_counters == nullptr)) {
        return cudaErrorInvalidValue;
    }
    if (args.picks.expert_ids != nullptr &&
        (args.tile != MoeGemmTile::kGemv || args.gemv_rows != 1 || args.x_row_of_row != nullptr)) {
        return cudaErrorInvalidValue;
    }
    if (args.x_f32 && args.tile != MoeGemmTile::kGemv) return cudaErrorInvalidValue;
    if (args.tile == MoeGemmTile::kGemv) return launch_moe_grouped_gemv(args, stream);
    int device = 0, smem_optin = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    if (args.tile == MoeGemmTile::kWide && args.kernel == MoeGemmKernel::kAuto && sm90a_available(device)) {
        return launch_moe_grouped_gemm_sm90(args, stream);
    }
    err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    const size_t smem = static_cast<size_t>(smem_optin);
    if (args.tile == MoeGemmTile::kWide) {
        return smem >= WideTile::kSmemBytes ? launch_tile<WideTile, false>(args, stream)
                                            : launch_tile<WideTileSmall, false>(args, stream);
    }
    return smem >= NarrowTile::kSmemBytes ? launch_tile<NarrowTile, true>(args, stream)
                                          : launch_tile<NarrowTileSmall, true>(args, stream);
}

}  // namespace epinfer::cuda
