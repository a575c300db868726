// The kGemv tile of the grouped expert GEMM (moe_grouped_gemm.cuh): groups of at most a few rows (decode at
// one to four tokens), where the MMA tiles' pipelines and split-K cost more than the weight bytes. Each
// warp streams four weight rows (SwiGLU: gate rows f, f + 1 and up rows N + f, N + f + 1; kStore: rows
// f … f + 3) with 16-byte loads, kBatch chunks per row in flight per lane, and multiplies them with the
// ≤ kRows x rows of its tile (bf16, or fp32 rounded to bf16 as read: MoeGroupedGemmArgs::x_f32; through
// L1/L2), fp32 accumulation; a shuffle tree sums the lanes and lane 0 applies the epilogue (silu(g)·u, or the
// store) and writes bf16 — the same epilogue as the MMA kernels. The tile height kRows (1, 2 or 4:
// args.gemv_rows) sizes the accumulators, so a one-token step keeps few registers and more blocks resident
// (with the loads below, the layer at one token went from 0.29 to 0.34 SOL for Qwen3-30B-A3B and 0.64 to 0.73
// for DeepSeek-V3 on the H200, docs/benchmarks/moe_h200.md). A tile is found from the permutation plan
// (locate_tile) or, in pick mode, from the pick's expert id alone.
#include "backend/cuda/kernels/moe_grouped_gemm_tiles.cuh"
#include "backend/cuda/kernels/moe_grouped_gemv.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {
namespace {

using namespace moe_gemm;

constexpr int kWarps = 4;
constexpr int kWeightRowsPerWarp = 4;
constexpr int kBatch = 2;  // 16-byte chunks per weight row in flight per lane

template <bool kSwiGlu>
constexpr int outputs_per_block() {
    return kWarps * (kSwiGlu ? kWeightRowsPerWarp / 2 : kWeightRowsPerWarp);
}

// 16 bytes of a weight row, read once: not kept in L1 (where the x rows are reused), L2 fetching 256-byte
// blocks.
__device__ __forceinline__ uint4 load_weight_chunk(const bf16* src) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(src));
    return v;
}

// Tile `tile` of a pick-mode launch (MoeGemmPicks): row tile / n_tiles, one row. False for a skipped row.
__device__ __forceinline__ bool pick_tile(const MoeGroupedGemmArgs& args, int64_t tile, int64_t n_tiles,
                                          TileCoord& tc) {
    const MoeGemmPicks& p = args.picks;
    const int64_t r = tile / n_tiles, picks = p.num_tokens * p.top_k;
    int64_t g = args.num_weight_groups;  // the extra group
    if (r < picks) {
        g = local_expert(p.expert_ids[r], p.first_expert, args.num_weight_groups);
        if (g < 0) return false;
    } else if (args.extra_weights == nullptr || r >= picks + p.num_tokens) {
        return false;
    }
    tc.group = g;
    tc.n_tile = tile - r * n_tiles;
    tc.row0 = r;
    tc.rows_valid = 1;
    return true;
}

// The x row GEMM row r reads.
__device__ __forceinline__ int64_t x_row_of(const MoeGroupedGemmArgs& args, bool picks, int64_t r) {
    if (!picks) return args.x_row_of_row != nullptr ? args.x_row_of_row[r] : r;
    const MoeGemmPicks& p = args.picks;
    const int64_t num_picks = p.num_tokens * p.top_k;
    return !p.x_per_token ? r : (r < num_picks ? r / p.top_k : r - num_picks);
}

// Eight x values of row `row` at element c · 8 as four bf16 pairs: read as bf16, or (kXF32) read as fp32 and
// rounded to nearest even, as launch_f32_rows_to_bf16 would have stored them.
template <bool kXF32>
__device__ __forceinline__ uint4 load_x_chunk(const void* row, int64_t c) {
    if constexpr (kXF32) {
        const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(row) + c * 8);
        const float4 a = __ldg(src), b = __ldg(src + 1);
        return uint4{pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w)};
    } else {
        return __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(row) + c * 8));
    }
}

// Pick mode (MoeGemmPicks) is a launch of the one-row kernel; the others compile without its branches.
template <bool kSwiGlu, int kRows, bool kXF32>
__global__ void __launch_bounds__(kWarps * 32)
    moe_grouped_gemv_kernel(MoeGroupedGemmArgs args, int64_t n_tiles) {
    pdl_begin();
    TileCoord tc;
    const bool picks = kRows == 1 && args.picks.expert_ids != nullptr;
    const bool in_launch =
        picks ? pick_tile(args, blockIdx.x, n_tiles, tc) : locate_tile<kRows>(args, blockIdx.x, n_tiles, tc);
    if (!in_launch) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = args.out_features, kd = args.in_features;
    constexpr int kOutPerWarp = kSwiGlu ? kWeightRowsPerWarp / 2 : kWeightRowsPerWarp;
    const int64_t f0 = tc.n_tile * outputs_per_block<kSwiGlu>() + static_cast<int64_t>(warp) * kOutPerWarp;
    if (f0 >= n) return;
    const GroupWeights gw = group_weights<kSwiGlu>(args, tc.group);
    // Row j: output f0 + j % kOutPerWarp, of the gate (or only) half for j < kOutPerWarp, else of the up half.
    const bf16* w_row[kWeightRowsPerWarp];
#pragma unroll
    for (int j = 0; j < kWeightRowsPerWarp; ++j) {
        const int64_t f = min(f0 + j % kOutPerWarp, n - 1);  // past N: reread, not stored
        w_row[j] = (kSwiGlu && j >= kOutPerWarp ? gw.second : gw.first) + f * kd;
    }
    const char* x = static_cast<const char*>(args.x);
    constexpr int64_t kXBytes = kXF32 ? sizeof(float) : sizeof(bf16);
    const void* x_row[kRows];
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
        const int64_t r = tc.row0 + min(t, tc.rows_valid - 1);  // past the group: reread, not stored
        x_row[t] = x + x_row_of(args, picks, r) * kd * kXBytes;
    }
    float acc[kWeightRowsPerWarp][kRows] = {};
    const int64_t chunks = kd / 8;
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kBatch) {
        uint4 w[kBatch][kWeightRowsPerWarp];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t c = c0 + 32 * b;
#pragma unroll
            for (int j = 0; j < kWeightRowsPerWarp; ++j) w[b][j] = c < chunks ? load_weight_chunk(w_row[j] + c * 8) : uint4{};
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int64_t c = c0 + 32 * b;
            if (c >= chunks) break;
#pragma unroll
            for (int t = 0; t < kRows; ++t) {
                if (t >= tc.rows_valid) break;
                const uint4 xr = load_x_chunk<kXF32>(x_row[t], c);
                const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xr);
#pragma unroll
                for (int j = 0; j < kWeightRowsPerWarp; ++j) {
                    const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w[b][j]);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float2 xf = __bfloat1622float2(xp[e]), wf = __bfloat1622float2(wp[e]);
                        acc[j][t] = fmaf(wf.x, xf.x, acc[j][t]);
                        acc[j][t] = fmaf(wf.y, xf.y, acc[j][t]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < kWeightRowsPerWarp; ++j)
#pragma unroll
        for (int t = 0; t < kRows; ++t)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[j][t] += __shfl_xor_sync(0xffffffffu, acc[j][t], o);
    if (lane != 0) return;
    bf16* out = static_cast<bf16*>(args.out);  // [rows, N]
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
        if (t >= tc.rows_valid) break;
        bf16* o = out + (tc.row0 + t) * n;
#pragma unroll
        for (int j = 0; j < kOutPerWarp; ++j) {
            if (f0 + j >= n) break;
            const float v = kSwiGlu ? silu_mul(acc[j][t], acc[j + kOutPerWarp][t]) : acc[j][t];
            o[f0 + j] = __float2bfloat16_rn(v);
        }
    }
}

template <bool kSwiGlu, int kRows, bool kXF32>
cudaError_t launch(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    const int64_t n_tiles = ceil_div<int64_t>(args.out_features, outputs_per_block<kSwiGlu>());
    const int64_t num_blocks = n_tiles * args.max_row_tiles;
    if (num_blocks == 0) return cudaSuccess;
    return launch_pdl(moe_grouped_gemv_kernel<kSwiGlu, kRows, kXF32>, dim3(static_cast<unsigned>(num_blocks)),
                      dim3(kWarps * 32), 0, stream, args, n_tiles);
}

template <bool kSwiGlu, bool kXF32>
cudaError_t launch_rows(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    switch (args.gemv_rows) {
        case 1: return launch<kSwiGlu, 1, kXF32>(args, stream);
        case 2: return launch<kSwiGlu, 2, kXF32>(args, stream);
        case kGemvMaxRows: return launch<kSwiGlu, kGemvMaxRows, kXF32>(args, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

int moe_gemv_tile_rows(int64_t max_group_rows) {
    return max_group_rows <= 1 ? 1 : (max_group_rows <= 2 ? 2 : kGemvMaxRows);
}

int64_t moe_gemv_weight_rows_per_block() {
    return int64_t{kWarps} * kWeightRowsPerWarp;
}

cudaError_t launch_moe_grouped_gemv(const MoeGroupedGemmArgs& args, cudaStream_t stream) {
    const bool swiglu = args.epilogue == MoeGemmEpilogue::kSwiGlu;
    if (args.x_f32)
        return swiglu ? launch_rows<true, true>(args, stream) : launch_rows<false, true>(args, stream);
    return swiglu ? launch_rows<true, false>(args, stream) : launch_rows<false, false>(args, stream);
}

}  // namespace epinfer::cuda
