// MLA's absorbed attention over the bf16 latent cache on wgmma (see mla_attention_sm90.cuh).
#include <cmath>

#include "backend/cuda/kernels/flash_softmax.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/mla_attention.cuh"
#include "backend/cuda/kernels/mla_attention_sm90.cuh"
#include "backend/cuda/kernels/mla_attention_store.cuh"
#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace epinfer::cuda {
namespace {

constexpr int kDqk = static_cast<int>(kMlaLatentDim + kMlaRopeDim);  // 576
constexpr int kDv = static_cast<int>(kMlaLatentDim);                 // 512
constexpr int kHeads = 64;                                           // query heads per CTA: the MMA's M
constexpr int kTileKeys = static_cast<int>(kMlaSm90TileKeys);
constexpr int kThreads = 256;
constexpr int kStages = 4;
constexpr int kPanel = 64;                             // elements per 128-byte swizzled row
constexpr int kQPanelElems = kHeads * kPanel;          // a 64-column panel of Q
constexpr int kKvPanelElems = kTileKeys * kPanel;      // … of a tile of the latent
constexpr int kQElems = kDqk / kPanel * kQPanelElems;  // 9 panels
constexpr int kTileElems = kDqk / kPanel * kKvPanelElems;
constexpr int kHalfV = kDv / 2;    // output columns per warpgroup
constexpr int kChunks = kDqk / 8;  // 16-byte chunks per latent row
constexpr float kLog2e = 1.4426950408889634f;
constexpr size_t kSmemAlign = 1024;
constexpr size_t kSmemBytes =
    (size_t{kQElems} + size_t{kStages} * kTileElems + kQPanelElems) * sizeof(bf16) + kSmemAlign;
static_assert(kSmemBytes == kMlaAttentionSm90SmemBytes, "mla_attention_sm90.cuh states the shared memory");
static_assert(kTileKeys % 16 == 0 && kTileKeys <= kPanel, "P is one 64-column panel of 64 heads");
static_assert(kTileKeys * kChunks % 128 == 0 && 128 % kTileKeys == 0,
              "a tile's copies divide over 128 threads");
// Named barriers (0 is __syncthreads'): P(t) and its rows' factors written by warpgroup 0 / read by
// warpgroup 1's MMAs.
constexpr int kBarPFull = 1, kBarPFree = 2;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void named_barrier_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

#endif

__global__ void __launch_bounds__(kThreads, 1)
    mla_attention_sm90_kernel(AttentionArgs a, int num_chunks, int block_shift, KeySplit split,
                              int32_t* error_flag) {
    pdl_begin();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    bf16* smem = reinterpret_cast<bf16*>(smem_raw + ((kSmemAlign - raw % kSmemAlign) % kSmemAlign));
    bf16* q_s = smem;                         // [9 panels][64 heads][64], swizzled
    bf16* kv_s = q_s + kQElems;               // [kStages][9 panels][kTileKeys keys][64], swizzled
    bf16* p_s = kv_s + kStages * kTileElems;  // [64 heads][64] (the first kTileKeys columns), swizzled
    __shared__ float corr_s[kHeads], l_s[kHeads];
    // Per stage: landed[s] completes when warpgroup 1's copies of the stage's tile have landed, read[s] when
    // both warpgroups' P·V on it is done (its last readers), so that it can be refilled.
    __shared__ __align__(8) uint64_t landed[kStages], read[kStages];

    int64_t block = blockIdx.x;
    const int chunk = static_cast<int>(block % num_chunks);
    block /= num_chunks;
    const int split_index = static_cast<int>(block % split.num_splits);
    const int64_t t = block / split.num_splits;
    const int64_t h0 = int64_t{chunk} * kHeads;
    const int heads = static_cast<int>(min(int64_t{kHeads}, a.num_heads - h0));
    const int tid = threadIdx.x, lane = tid % 32, q4 = lane % 4;
    // The warpgroup, warp-uniform as far as the compiler can see (a shuffle of lane 0's): wgmma in a branch
    // on it is then not serialised as if the warp could diverge.
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int row0 = (tid % 128) / 32 * 16 + lane / 4;  // this thread's accumulator rows: row0, row0 + 8
    const bool paged = a.kv_block_tables != nullptr;

    const int32_t pos = a.positions[t];
    const int32_t seq = paged && a.token_sequence != nullptr ? a.token_sequence[t] : 0;
    const bool bad = pos < 0 || pos >= a.num_kv_tokens || (paged && (seq < 0 || seq >= a.num_sequences));
    if (bad && tid == 0) *error_flag = 1;
    const int key_begin = split_index * static_cast<int>(split.keys_per_split);
    const int key_end = bad ? key_begin : min(pos + 1, key_begin + static_cast<int>(split.keys_per_split));
    const int n = key_end <= key_begin ? 0 : (key_end - key_begin + kTileKeys - 1) / kTileKeys;

    if (tid < kStages) {
        mbarrier_init(&landed[tid], 128);
        mbarrier_init(&read[tid], kThreads);
    }
    __syncthreads();

    // Warpgroup 1's thread i copies 16-byte chunks i mod kSpan + kSpan·c of key i / kSpan of a tile (kSpan
    // threads read 16·kSpan contiguous bytes of a row per copy); keys at or past key_end, and keys whose
    // block id is negative (*error_flag = 1), are zeros.
    const int32_t* table = paged ? a.kv_block_tables + int64_t{seq} * a.block_table_stride : nullptr;
    const auto produce = [&](int tile) {
        bf16* sk = kv_s + (tile % kStages) * kTileElems;
        constexpr int kSpan = 128 / kTileKeys;
        const int i = tid - 128, bs = static_cast<int>(a.kv_block_size);
        const int key = i / kSpan, j = key_begin + tile * kTileKeys + key;
        bool ok = j < key_end;
        int64_t row = j;
        if (ok && table != nullptr) {
            const int32_t blk = __ldg(table + (block_shift >= 0 ? j >> block_shift : j / bs));
            if (blk < 0) *error_flag = 1;
            ok = blk >= 0;
            row = int64_t{blk} * bs + (block_shift >= 0 ? j & (bs - 1) : j % bs);
        }
        const bf16* src = static_cast<const bf16*>(a.k) + (ok ? row * a.k_token_stride : 0);
#pragma unroll
        for (int cc = 0; cc < kChunks / kSpan; ++cc) {
            const int c = i % kSpan + kSpan * cc;
            cp_async_16(sk + swizzled_offset<kTileKeys>(key, c), src + c * 8, ok ? 16 : 0);
        }
        mbarrier_arrive_cp_async(&landed[tile % kStages]);
    };
    if (wg == 1) {
        for (int tile = 0; tile < min(n, kStages); ++tile) produce(tile);
    }

    // Q of the CTA's heads as bf16 (rows past `heads` zero), while the first tiles land: each thread's 18
    // chunks of 8 in batches whose loads are all in flight together, as two 16-byte loads where Q's rows
    // are 16-byte aligned.
    constexpr int kQBatch = 6;
    static_assert(kHeads * kChunks % (kThreads * kQBatch) == 0, "Q's chunks divide into whole batches");
    const bool q_vec =
        reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && a.q_token_stride % 4 == 0 && a.q_head_stride % 4 == 0;
    for (int idx0 = tid; idx0 < kHeads * kChunks; idx0 += kThreads * kQBatch) {
        float v[kQBatch][8];
#pragma unroll
        for (int b = 0; b < kQBatch; ++b) {
            const int idx = idx0 + b * kThreads, r = idx / kChunks, c = idx % kChunks;
            const float* q = a.q + t * a.q_token_stride + (h0 + r) * a.q_head_stride + c * 8;
            if (r < heads && q_vec) {
                const float4 lo = *reinterpret_cast<const float4*>(q),
                             hi = *reinterpret_cast<const float4*>(q + 4);
                v[b][0] = lo.x, v[b][1] = lo.y, v[b][2] = lo.z, v[b][3] = lo.w;
                v[b][4] = hi.x, v[b][5] = hi.y, v[b][6] = hi.z, v[b][7] = hi.w;
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) v[b][e] = r < heads ? q[e] : 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < kQBatch; ++b) {
            const int idx = idx0 + b * kThreads, r = idx / kChunks, c = idx % kChunks;
            const uint4 packed = {pack_bf16(v[b][0], v[b][1]), pack_bf16(v[b][2], v[b][3]),
                                  pack_bf16(v[b][4], v[b][5]), pack_bf16(v[b][6], v[b][7])};
            *reinterpret_cast<uint4*>(q_s + swizzled_offset<kHeads>(r, c)) = packed;
        }
    }
    fence_proxy_async();
    __syncthreads();

    float o[kHalfV / 2];  // O[:, 256·wg, +256): m64n256 accumulators
    auto& o4 = reinterpret_cast<float(&)[kHalfV / 8][4]>(o);
#pragma unroll
    for (int i = 0; i < kHalfV / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const uint32_t kv_addr = smem_u32(kv_s);
    // P·V's B operand for k16 step kk of `tile`: V's 16 key rows, MN-major, the warpgroup's four 64-column
    // panels kKvPanelElems apart. Descriptors are made from a base plus constants (a few uniform adds per
    // MMA).
    const uint64_t v_base =
        smem_descriptor_mn_at(kv_addr + wg * 4 * kKvPanelElems * sizeof(bf16), kKvPanelElems * sizeof(bf16));
    const auto v_desc = [&](int tile, int kk) {
        return smem_descriptor_plus(v_base,
                                    ((tile % kStages) * kTileElems + kk * 16 * kPanel) * sizeof(bf16));
    };

    if (wg == 0) {
        const uint64_t q_desc = smem_descriptor_at(smem_u32(q_s));
        const uint64_t kv_desc = smem_descriptor_at(kv_addr);
        const float scale_log2 = a.scale * kLog2e;
        const int key_limit[2] = {key_end, key_end};
        // Scores of a tile (m64n32 accumulators) as two independent sums, of the even and of the odd k16
        // steps, so that consecutive MMAs of the chain do not wait for each other.
        float s[kTileKeys / 2], s_odd[kTileKeys / 2];
        auto& s4 = reinterpret_cast<float(&)[kTileKeys / 8][4]>(s);
        uint32_t pa[kTileKeys / 16][4];  // P(t), bf16: the A operand of this warpgroup's P·V
        for (int tile = 0; tile < n; ++tile) {
            const int stage = tile % kStages;
            mbarrier_wait(&landed[stage], (tile / kStages) & 1);
            fence_proxy_async();  // warpgroup 1's copies (generic proxy), seen, before wgmma reads them
            wgmma_fence();
            const uint64_t k_desc = smem_descriptor_plus(kv_desc, stage * kTileElems * sizeof(bf16));
            // S = Q·Kᵀ over the 576 dims in k16 steps: panel kk / 4, 32 bytes per step inside its rows.
#pragma unroll
            for (int kk = 0; kk < kDqk / 16; ++kk) {
                const uint32_t qoff = ((kk / 4) * kQPanelElems + (kk % 4) * 16) * sizeof(bf16);
                const uint32_t koff = ((kk / 4) * kKvPanelElems + (kk % 4) * 16) * sizeof(bf16);
                wgmma_m64n32k16(kk % 2 == 0 ? s : s_odd, smem_descriptor_plus(q_desc, qoff),
                                smem_descriptor_plus(k_desc, koff), kk > 1);
            }
            wgmma_commit();
            if (tile > 0) {
                wgmma_wait<1>();  // P(t − 1)·V(t − 1) done: its stage may be refilled
                fence_registers(o);
                mbarrier_arrive(&read[(tile - 1) % kStages]);
            }
            wgmma_wait<0>();
            fence_registers(s);
            fence_registers(s_odd);
#pragma unroll
            for (int i = 0; i < kTileKeys / 2; ++i) s[i] += s_odd[i];
            float corr[2];
            const int key0 = key_begin + tile * kTileKeys;
            if (key0 + kTileKeys > key_end) {
                online_softmax_tile<kTileKeys / 8, true>(s4, key0, key_limit, scale_log2, m, l, corr);
            } else {
                online_softmax_tile<kTileKeys / 8, false>(s4, key0, key_limit, scale_log2, m, l, corr);
            }
#pragma unroll
            for (int kk = 0; kk < kTileKeys / 16; ++kk) probabilities_a_operand(s4, kk, pa[kk]);
            if (tile > 0) named_barrier_sync(kBarPFree);  // warpgroup 1's MMAs have read P(t − 1)
                // P(t) for warpgroup 1: keys 8c … 8c + 7 of a row are its 16-byte chunk c.
#pragma unroll
            for (int c = 0; c < kTileKeys / 8; ++c) {
                *reinterpret_cast<uint32_t*>(p_s + swizzled_offset<kHeads>(row0, c) + 2 * q4) =
                    pa[c / 2][2 * (c % 2)];
                *reinterpret_cast<uint32_t*>(p_s + swizzled_offset<kHeads>(row0 + 8, c) + 2 * q4) =
                    pa[c / 2][2 * (c % 2) + 1];
            }
            if (q4 == 0) {
                corr_s[row0] = corr[0];
                corr_s[row0 + 8] = corr[1];
            }
            fence_proxy_async();
            named_barrier_arrive(kBarPFull);
            rescale_rows(o4, corr);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kTileKeys / 16; ++kk) wgmma_m64n256k16_rs(o, pa[kk], v_desc(tile, kk));
            wgmma_commit();
        }
        wgmma_wait<0>();
        fence_registers(o);
        if (n > 0) mbarrier_arrive(&read[(n - 1) % kStages]);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
            l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
        }
        if (q4 == 0) {
            l_s[row0] = l[0];
            l_s[row0 + 8] = l[1];
        }
    } else {
        const uint64_t p_desc = smem_descriptor_at(smem_u32(p_s));
        for (int tile = 0; tile < n; ++tile) {
            named_barrier_sync(kBarPFull);
            const float corr[2] = {corr_s[row0], corr_s[row0 + 8]};
            rescale_rows(o4, corr);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kTileKeys / 16; ++kk) {
                wgmma_m64n256k16<1>(o, smem_descriptor_plus(p_desc, kk * 16 * sizeof(bf16)),
                                    v_desc(tile, kk));
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_registers(o);
            if (tile + 1 < n) named_barrier_arrive(kBarPFree);
            mbarrier_arrive(&read[tile % kStages]);
            if (tile + kStages < n) {
                mbarrier_wait(&read[tile % kStages], (tile / kStages) & 1);
                produce(tile + kStages);
            }
        }
    }
    __syncthreads();  // l_s

    // Output rows: O / l, or the split's partials.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = row0 + 8 * hr;
        if (r < heads)
            store_mla_row(a, split, split_index, t, h0 + r, wg * kHalfV, o4, hr, m[hr], l_s[r], wg == 0);
    }
#endif
}

}  // namespace

cudaError_t launch_mla_attention_sm90(const AttentionArgs& args, int num_chunks, int block_shift,
                                      const KeySplit& split, int32_t* error_flag, cudaStream_t stream) {
    const int64_t num_blocks = args.num_tokens * num_chunks * split.num_splits;
    const cudaError_t err = cudaFuncSetAttribute(
        mla_attention_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
    if (err != cudaSuccess) return err;
    return launch_pdl(mla_attention_sm90_kernel, dim3(static_cast<unsigned>(num_blocks)), dim3(kThreads),
                      kSmemBytes, stream, args, num_chunks, block_shift, split, error_flag);
}

}  // namespace epinfer::cuda
