// Grouped expert GEMM on Hopper (sm_90a): the kWide tile with warpgroup MMAs (see moe_grouped_gemm.cuh for
// the contract, moe_grouped_gemm.cu for the mma.sync kernel every architecture runs).
//
// One CTA of two warpgroups computes one tile: 128 GEMM rows (tokens, gathered through x_row_of_row; the
// wgmma's M side, 64 per warpgroup) × 256 weight rows (the N side: one wgmma.m64n256k16 per 16 of K;
// kSwiGlu: 128 gate rows then the 128 matching up rows, so a thread holds each gate accumulator and its up
// accumulator and applies SwiGLU in registers). Operands are staged by cp.async into a 4-stage ring in the
// 128-byte-swizzled K-major layout wgmma reads through shared-memory descriptors (16-byte chunk c of row r
// at chunk c ^ (r mod 8) in 128-byte rows, 8-row atoms of 1024 bytes: the swizzle moe_grouped_gemm.cu uses
// for ldmatrix), one wgmma batch stays in flight while the next stages load. A warpgroup whose 64 rows are
// all past the group's end issues no MMA. fp32 accumulation, bf16 output.
// Layout, descriptors and the MMA instruction: wgmma.cuh.
#include "backend/cuda/kernels/moe_grouped_gemm_sm90.cuh"
#include "backend/cuda/kernels/moe_grouped_gemm_tiles.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace epinfer::cuda {
namespace {

using namespace moe_gemm;

constexpr int kTokens = kWideTokens;     // GEMM rows per tile (M), 64 per warpgroup
constexpr int kWeights = kWideFeatures;  // weight rows per tile (N)
constexpr int kStages = 4;
constexpr int kThreads = 256;
constexpr int kXStage = kTokens * kBK;    // elements per stage
constexpr int kWStage = kWeights * kBK;
constexpr int kXLoads = kTokens * kChunksPerRow / kThreads;   // 16-byte chunks per thread per stage
constexpr int kWLoads = kWeights * kChunksPerRow / kThreads;
constexpr int kRowStep = kThreads / kChunksPerRow;
constexpr int kAccum = kWeights / 2;      // fp32 accumulators per thread: 64 × 256 / 128
constexpr size_t kSmemAlign = 1024;       // the swizzle pattern repeats every 8 rows of 128 bytes
constexpr size_t kSmemBytes = size_t{kStages} * (kXStage + kWStage) * sizeof(bf16) + kSmemAlign;

template <bool kSwiGlu>
__global__ void __launch_bounds__(kThreads, 1) moe_grouped_gemm_sm90_kernel(MoeGroupedGemmArgs args) {
    pdl_begin();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    unsigned char* smem = smem_raw + ((kSmemAlign - raw % kSmemAlign) % kSmemAlign);
    bf16* smem_x = reinterpret_cast<bf16*>(smem);   // [kStages][kTokens][kBK] bf16, swizzled
    bf16* smem_w = smem_x + kStages * kXStage;      // [kStages][kWeights][kBK] bf16, swizzled

    const int64_t n = args.out_features;
    const int64_t kd = args.in_features;
    const int64_t n_tiles = ceil_div<int64_t>(n, kSwiGlu ? kWeights / 2 : kWeights);
    TileCoord tc;
    if (!locate_tile<kTokens>(args, blockIdx.x, n_tiles, tc)) return;

    const int tid = threadIdx.x;
    const int warpgroup = tid / 128;
    const StageLoader<kWeights, kWLoads, kXLoads, kRowStep, kSwiGlu> loader(args, tc, tid);
    auto load_stage = [&](int stage, int64_t kt) {
        loader.load(smem_w + stage * kWStage, smem_x + stage * kXStage, kt);
    };

    float acc[kAccum];
    #pragma unroll
    for (int i = 0; i < kAccum; ++i) acc[i] = 0.0f;
    const bool active = warpgroup * 64 < tc.rows_valid;  // warpgroup-uniform

    const int64_t k_tiles = ceil_div<int64_t>(kd, kBK);
    #pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < k_tiles) load_stage(s, s);
        cp_async_commit();
    }
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
        const int stage = static_cast<int>(kt % kStages);
        cp_async_wait<kStages - 2>();
        fence_proxy_async();
        __syncthreads();
        if (active) {
            const bf16* sx = smem_x + stage * kXStage + warpgroup * 64 * kBK;
            const bf16* sw = smem_w + stage * kWStage;
            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < kBK / 16; ++kk) {
                wgmma_m64n256k16(acc, smem_descriptor(sx + kk * 16), smem_descriptor(sw + kk * 16));
            }
            wgmma_commit();
            wgmma_wait<1>();  // the batch of step kt − 1 is done: its stage may be refilled
        }
        __syncthreads();
        const int64_t kt_next = kt + kStages - 1;
        if (kt_next < k_tiles) load_stage(static_cast<int>(kt_next % kStages), kt_next);
        cp_async_commit();
    }
    wgmma_wait<0>();
    if (!active) return;
    fence_registers(acc);

    // Accumulator fragment of .m64nNk16: warp q of the warpgroup holds rows 16q + lane/4 (+8); for each 8
    // columns j, acc[4j + 2h + v] is row +8h, column 8j + 2·(lane mod 4) + v.
    const int lane = tid % 32;
    const int row_base = warpgroup * 64 + ((tid % 128) / 32) * 16 + lane / 4;
    bf16* out = static_cast<bf16*>(args.out);  // [rows, N]
    constexpr int kOutBlocks = (kSwiGlu ? kWeights / 2 : kWeights) / 8;
    #pragma unroll
    for (int j = 0; j < kOutBlocks; ++j) {
        const int64_t f = tc.n_tile * (kOutBlocks * 8) + 8 * j + 2 * (lane % 4);
        if (f >= n) continue;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int tok = row_base + 8 * h;
            if (tok >= tc.rows_valid) continue;
            const float* g = acc + 4 * j + 2 * h;
            __nv_bfloat162 v;
            if constexpr (kSwiGlu) {
                const float* u = acc + 4 * (j + kOutBlocks) + 2 * h;
                v = __floats2bfloat162_rn(silu_mul(g[0], u[0]), silu_mul(g[1], u[1]));
            } else {
                v = __floats2bfloat162_rn(g[0], g[1]);
            }
            *reinterpret_cast<__nv_bfloat162*>(out + (tc.row0 + tok) * n + f) = v;
        }
    }
#endif
}

template <bool kSwiGlu>
cudaError_t launch(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    const int64_t n_tiles = ceil_div<int64_t>(args.out_features, kSwiGlu ? kWeights / 2 : kWeights);
    const int64_t num_tiles = n_tiles * args.max_row_tiles;
    if (num_tiles == 0) return cudaSuccess;
    auto kernel = moe_grouped_gemm_sm90_kernel<kSwiGlu>;
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
    if (err != cudaSuccess) return err;
    return launch_pdl(kernel, dim3(static_cast<unsigned>(num_tiles)), dim3(kThreads), kSmemBytes, stream,
                      args);
}

}  // namespace

cudaError_t launch_moe_grouped_gemm_sm90(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    return args.epilogue == MoeGemmEpilogue::kSwiGlu ? launch<true>(args, stream) : launch<false>(args, stream);
}

}  // namespace epinfer::cuda
