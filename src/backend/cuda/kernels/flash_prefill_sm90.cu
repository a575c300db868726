// Flash-attention prefill on wgmma (see flash_prefill_sm90.cuh).
#include <cmath>

#include "backend/cuda/kernels/flash_kv_tile.cuh"
#include "backend/cuda/kernels/flash_prefill_sm90.cuh"
#include "backend/cuda/kernels/flash_softmax.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/pdl.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace epinfer::cuda {
namespace {

constexpr int D = 128;
constexpr int kRows = kFlashPrefillSm90Rows;  // 64 per warpgroup
constexpr int kThreads = 256;
constexpr int kTileKeys = 128;
constexpr int kStages = 3;               // K/V tiles: the one landing, S(t)'s, and P(t − 1)·V(t − 1)'s
constexpr int kPanel = 64;               // elements per 128-byte swizzled row
constexpr int kQPanel = kRows * kPanel;  // elements of one 64-column panel of Q
constexpr int kKvPanel = kTileKeys * kPanel;   // … of K or V
constexpr int kQElems = D / kPanel * kQPanel;  // D = two panels
constexpr int kKvElems = D / kPanel * kKvPanel;
constexpr size_t kSmemAlign = 1024;
constexpr size_t kSmemBytes = (size_t{kQElems} + size_t{kStages} * 2 * kKvElems) * sizeof(bf16) + kSmemAlign;

struct Layout {
    int heads_per_chunk = 0;
    int num_chunks = 0;
    int tokens_per_block = 0;
    int block_shift = -1;
};

__global__ void __launch_bounds__(kThreads, 1)
    flash_prefill_sm90_kernel(AttentionArgs a, Layout lay, int32_t* error_flag) {
    pdl_begin();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    bf16* smem = reinterpret_cast<bf16*>(smem_raw + ((kSmemAlign - raw % kSmemAlign) % kSmemAlign));
    bf16* smem_q = smem;             // [2 panels][kRows][64], swizzled
    bf16* smem_kv = smem + kQElems;  // [kStages][K, V][2 panels][kTileKeys][64], swizzled
    __shared__ int tok_pos[kRows];   // −1: a bad query
    __shared__ int tok_seq[kRows];
    // Per stage: landed[s] completes when every thread's copies of the stage's tile have landed, read[s] when
    // every thread's warpgroup has finished P·V on it (its last reader), so the stage can be refilled.
    __shared__ __align__(8) uint64_t landed[kStages], read[kStages];

    const int64_t group = a.num_heads / a.num_kv_heads;
    int64_t block = blockIdx.x;
    const int chunk = static_cast<int>(block % lay.num_chunks);
    block /= lay.num_chunks;
    const int64_t kvh = block % a.num_kv_heads;
    // The last token tiles (the most keys, causal) first, so short ones fill the tail.
    const int64_t num_tiles_t = (a.num_tokens + lay.tokens_per_block - 1) / lay.tokens_per_block;
    const int64_t t0 = (num_tiles_t - 1 - block / a.num_kv_heads) * lay.tokens_per_block;
    const int num_tok = static_cast<int>(min(static_cast<int64_t>(lay.tokens_per_block), a.num_tokens - t0));
    const int64_t h0 = kvh * group + static_cast<int64_t>(chunk) * lay.heads_per_chunk;
    const int heads =
        static_cast<int>(min(static_cast<int64_t>(lay.heads_per_chunk), group - chunk * lay.heads_per_chunk));
    const int tid = threadIdx.x;
    const int wg = tid / 128, lane = tid % 32;

    if (tid < kStages) {
        mbarrier_init(&landed[tid], kThreads);
        mbarrier_init(&read[tid], kThreads);
    }
    load_query_tokens(a, t0, num_tok, tok_pos, tok_seq, error_flag);
    // Q rows to shared memory as bf16 (zeros for rows past the tile's tokens or heads).
    for (int i = tid; i < kRows * (D / 8); i += kThreads) {
        const int r = i / (D / 8), c = i % (D / 8);
        const int tq = r / lay.heads_per_chunk, gh = r % lay.heads_per_chunk;
        float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (tq < num_tok && gh < heads) {
            const float* q = a.q + (t0 + tq) * a.q_token_stride + (h0 + gh) * a.q_head_stride + c * 8;
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = q[e];
        }
        const uint4 packed = {pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                              pack_bf16(v[6], v[7])};
        *reinterpret_cast<uint4*>(smem_q + swizzled_offset<kRows>(r, c)) = packed;
    }
    fence_proxy_async();
    __syncthreads();

    // This thread's two rows (wgmma accumulator rows 16·warp + lane/4, +8 of its warpgroup's 64).
    int row_tok[2], row_head[2];
    bool row_ok[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = wg * 64 + ((tid % 128) / 32) * 16 + lane / 4 + 8 * hr;
        row_tok[hr] = r / lay.heads_per_chunk;
        row_head[hr] = r % lay.heads_per_chunk;
        row_ok[hr] = row_tok[hr] < num_tok && row_head[hr] < heads;
    }

    float s[kTileKeys / 2];          // scores of a tile: m64n128 accumulators (kTileKeys / 8 blocks of 4)
    float o[D / 2];                  // output: m64n128 accumulators
    uint32_t pa[kTileKeys / 16][4];  // the probabilities of the last tile, bf16: P·V's A operand
    auto& s4 = reinterpret_cast<float(&)[kTileKeys / 8][4]>(s);
    auto& o4 = reinterpret_cast<float(&)[D / 8][4]>(o);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float scale_log2 = a.scale * 1.4426950408889634f;  // log2(e)
    const uint32_t q_addr = smem_u32(smem_q + wg * 64 * kPanel);
    const uint32_t kv_addr = smem_u32(smem_kv);
    KvTileLoader<D, kTileKeys, kThreads> loader(a, kvh);

    // Tokens of one sequence at a time.
    int g = 0;  // tiles this CTA has taken so far
    for (int run_begin = 0; run_begin < num_tok;) {
        const int run_seq = tok_seq[run_begin];
        const QueryRun run = next_query_run(tok_pos, tok_seq, run_begin, num_tok);
        const int run_end = run.end, max_pos = run.max_pos;
        int key_limit[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const bool active = row_ok[hr] && row_tok[hr] >= run_begin && row_tok[hr] < run_end;
            key_limit[hr] = active ? tok_pos[row_tok[hr]] + 1 : 0;  // a bad query's −1 sees no key
        }
        const int key_end = run_seq < 0 ? 0 : max_pos + 1;
        loader.start(a, lay.block_shift, run_seq, 0, key_end);
        // Tile t of this run is tile g + t of the CTA, in stage (g + t) mod kStages.
        const auto produce = [&](int tile) {
            const int gt = g + tile, stage = gt % kStages;
            if (gt >= kStages) mbarrier_wait(&read[stage], (gt / kStages - 1) & 1);  // tile gt − kStages read
            bf16* sk = smem_kv + stage * 2 * kKvElems;
            loader.load(
                a, lay.block_shift, tile, sk, sk + kKvElems,
                [](int key, int c) { return swizzled_offset<kTileKeys>(key, c); }, error_flag);
            mbarrier_arrive_cp_async(&landed[stage]);
        };
        const auto wait_landed = [&](int tile) {
            const int gt = g + tile;
            mbarrier_wait(&landed[gt % kStages], (gt / kStages) & 1);
            fence_proxy_async();  // the other threads' copies (generic proxy), seen, before wgmma reads them
        };
        const auto release = [&](int tile) { mbarrier_arrive(&read[(g + tile) % kStages]); };
        // S = Q·Kᵀ over D in k16 steps: panel kk / 4, 32 bytes per step inside the 128-byte rows.
        const auto issue_qk = [&](int tile) {
            uint32_t qa = q_addr;
            asm volatile("" : "+r"(qa));  // the eight descriptors are made here, not kept in registers
            const uint32_t ka = kv_addr + ((g + tile) % kStages) * 2 * kKvElems * sizeof(bf16);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const uint32_t off = ((kk / 4) * kQPanel + (kk % 4) * 16) * sizeof(bf16);
                const uint32_t koff = ((kk / 4) * kKvPanel + (kk % 4) * 16) * sizeof(bf16);
                wgmma_m64n128k16(s, smem_descriptor_at(qa + off), smem_descriptor_at(ka + koff), kk > 0);
            }
            wgmma_commit();
        };
        // O += P·V over the tile's keys in k16 steps: P from registers, V's 16 key rows (2048 bytes) at a
        // step, MN-major, its two 64-column panels kKvPanel elements apart.
        const auto issue_pv = [&](int tile) {
            uint32_t va = kv_addr + (((g + tile) % kStages) * 2 * kKvElems + kKvElems) * sizeof(bf16);
            asm volatile("" : "+r"(va));
#pragma unroll
            for (int kk = 0; kk < kTileKeys / 16; ++kk) {
                wgmma_m64n128k16_rs(
                    o, pa[kk],
                    smem_descriptor_mn_at(va + kk * 16 * kPanel * sizeof(bf16), kKvPanel * sizeof(bf16)));
            }
            wgmma_commit();
        };
        // The online softmax of `tile`'s scores (masked only where a row's keys end inside the tile).
        const auto softmax = [&](int tile, float(&corr)[2]) {
            if ((tile + 1) * kTileKeys > min(key_limit[0], key_limit[1])) {
                online_softmax_tile<kTileKeys / 8, true>(s4, tile * kTileKeys, key_limit, scale_log2, m, l,
                                                         corr);
            } else {
                online_softmax_tile<kTileKeys / 8, false>(s4, tile * kTileKeys, key_limit, scale_log2, m, l,
                                                          corr);
            }
        };
        const auto scores_to_p = [&] {
#pragma unroll
            for (int kk = 0; kk < kTileKeys / 16; ++kk) probabilities_a_operand(s4, kk, pa[kk]);
        };

        // FlashAttention-3's overlap inside a warpgroup: step t issues S(t) = Q·K(t)ᵀ and O += P(t−1)·V(t−1),
        // then runs the softmax of S(t) while P(t−1)·V(t−1) is still on the tensor cores, and rescales O once
        // that has landed. The warpgroups meet only at the stages' barriers: one may run up to a step ahead
        // of the other (its softmax then overlaps the other's MMAs). Two tiles are in flight ahead of S(t).
        const int n = loader.num_tiles;
        if (n > 0) {
            float corr[2];
            produce(0);
            if (n > 1) produce(1);
            wait_landed(0);
            wgmma_fence();
            issue_qk(0);
            wgmma_wait<0>();
            fence_registers(s);
            softmax(0, corr);
            rescale_rows(o4, corr);
            scores_to_p();
        }
        for (int tile = 1; tile < n; ++tile) {
            float corr[2];
            if (tile + 1 < n) produce(tile + 1);  // into the stage of tile − 2
            wait_landed(tile);
            wgmma_fence();
            issue_qk(tile);
            issue_pv(tile - 1);
            wgmma_wait<1>();  // S(t) landed; P(t−1)·V(t−1) may still run
            fence_registers(s);
            softmax(tile, corr);
            wgmma_wait<0>();
            fence_registers(o);
            release(tile - 1);
            rescale_rows(o4, corr);
            scores_to_p();
        }
        if (n > 0) {
            wgmma_fence();
            issue_pv(n - 1);
            wgmma_wait<0>();
            fence_registers(o);
            release(n - 1);
        }
        g += n;
        run_begin = run_end;
    }

    // Output rows: o / l, fp32 (a row that saw no key — a bad query — is zeros).
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
        if (!row_ok[hr]) continue;
        const float inv = l[hr] > 0.0f ? 1.0f / l[hr] : 0.0f;
        float* out =
            a.out + (t0 + row_tok[hr]) * a.out_token_stride + (h0 + row_head[hr]) * a.out_head_stride;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            const int d = 8 * j + 2 * (lane % 4);
            out[d] = o4[j][2 * hr] * inv;
            out[d + 1] = o4[j][2 * hr + 1] * inv;
        }
    }
#endif
}

}  // namespace

int flash_prefill_sm90_heads_per_chunk(int64_t group) {
    int h = 1;
    while (h < 16 && group % (2 * h) == 0) h *= 2;
    return h;
}

cudaError_t launch_flash_prefill_sm90(const AttentionArgs& args, const FlashAttentionPlan& plan,
                                      int block_shift, int32_t* error_flag, cudaStream_t stream) {
    if (args.num_tokens == 0) return cudaSuccess;
    Layout lay;
    lay.heads_per_chunk = plan.heads_per_chunk;
    lay.num_chunks = plan.num_chunks;
    lay.tokens_per_block = plan.tokens_per_block;
    lay.block_shift = block_shift;
    const int64_t tiles = (args.num_tokens + lay.tokens_per_block - 1) / lay.tokens_per_block;
    const int64_t num_blocks = tiles * args.num_kv_heads * lay.num_chunks;
    const cudaError_t err = cudaFuncSetAttribute(
        flash_prefill_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
    if (err != cudaSuccess) return err;
    return launch_pdl(flash_prefill_sm90_kernel, dim3(static_cast<unsigned>(num_blocks)), dim3(kThreads),
                      kSmemBytes, stream, args, lay, error_flag);
}

}  // namespace epinfer::cuda
