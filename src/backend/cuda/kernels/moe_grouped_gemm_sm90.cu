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
// Layout and descriptor format: PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"
// (matrix descriptor; register fragments of .m64nNk16 with .f32 accumulators).
#include "backend/cuda/kernels/moe_grouped_gemm_sm90.cuh"
#include "backend/cuda/kernels/moe_grouped_gemm_tiles.cuh"
#include "backend/cuda/kernels/pdl.cuh"

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

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle: start address, leading
// byte offset (unused by this layout: 16), stride byte offset 1024 (one 8-row atom), swizzle mode 1.
__device__ __forceinline__ uint64_t smem_descriptor(const void* p) {
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{16 >> 4} << 16) | (uint64_t{1024 >> 4} << 32) |
           (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// cp.async's writes (generic proxy) made visible to wgmma's reads (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accesses of d across an in-flight wgmma.
__device__ __forceinline__ void fence_accumulators(float (&d)[kAccum]) {
    #pragma unroll
    for (int i = 0; i < kAccum; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d[64 × 256] += a[64 × 16] · b[256 × 16]ᵀ, both K-major bf16 in shared memory, fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[kAccum], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
        "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, "
        "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, "
        "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),
          "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),
          "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),
          "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

#endif

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
    fence_accumulators(acc);

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

bool moe_grouped_gemm_sm90_available(int device) {
#if defined(EPINFER_CUDA_HAS_SM90A)
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
    return major == 9 && minor == 0;
#else
    (void)device;
    return false;
#endif
}

cudaError_t launch_moe_grouped_gemm_sm90(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    return args.epilogue == MoeGemmEpilogue::kSwiGlu ? launch<true>(args, stream) : launch<false>(args, stream);
}

}  // namespace epinfer::cuda
