// Flash attention over a bf16 KV cache (see flash_attention.cuh).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/flash_attention.cuh"
#include "backend/cuda/kernels/flash_kv_tile.cuh"
#include "backend/cuda/kernels/flash_prefill_sm90.cuh"
#include "backend/cuda/kernels/flash_softmax.cuh"
#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileKeys = 64;   // keys per shared-memory tile
// The kernel's layout and pipeline: stages (tiles in flight) and blocks per SM (__launch_bounds__; key splits
// fill whole waves of them). Decode takes 3 blocks of 2 stages (12 warps per SM: a short loop is latency-bound),
// or, where each block walks at least kLongDecodeKeys keys, 2 blocks of 3: a tile more in flight per block
// (H200, Qwen3-30B-A3B shape: 64 × 2048 89.8 → 77.6–79.3 µs, 64 × 4096 147.6 → 137.9; GLM-4.5 64 × 2048 165.0
// → 142.7; at 256 keys the same or up to 4 % slower; docs/benchmarks/attention_h200.md); prefill 2 blocks of 3.
enum class Pipe { kDecode, kLongDecode, kPrefill };
template <Pipe P>
constexpr int stages() {
    return P == Pipe::kDecode ? 2 : 3;
}
template <Pipe P>
constexpr int blocks_per_sm() {
    return P == Pipe::kDecode ? 3 : 2;
}
constexpr int64_t kLongDecodeKeys = 1024;
constexpr int kRows = 16;       // query rows per warp (the MMA's M)
constexpr int kMaxHeadsPerChunk = 16;
constexpr int kMaxTokensPerBlock = kWarps * kRows;  // prefill with one head per chunk
constexpr int64_t kMinKeysPerSplit = 4 * kTileKeys;
constexpr int64_t kBlockOverheadKeys = 2 * kTileKeys;  // decode: a block's start and merge, in keys' time
constexpr int kPrefillWaves = 2;  // prefill splits keys only while its blocks fill fewer waves than this
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Layout {
    int heads_per_chunk = 0;
    int num_chunks = 0;
    int tokens_per_block = 0;
    int block_shift = -1;  // log2(kv_block_size) when it is a power of two: shifts instead of divisions
};

// Shared memory of D: the pipeline's K and V tiles, reused by the final merge.
template <int D, Pipe P>
constexpr size_t pipe_bytes() {
    return size_t{stages<P>()} * 2 * kTileKeys * D * sizeof(bf16);
}

// Offset (elements) of 16-byte chunk `chunk` of row `key` in a [kTileKeys, D] tile.
template <int D>
__device__ __forceinline__ int swizzle(int key, int chunk) {
    return key * D + ((chunk ^ (key & 7)) << 3);
}

// kDecode: the block's ≤ 16 rows are shared by all warps, each taking 16 keys of a tile; else each warp
// has its own 16 rows and takes every key.
template <int D, Pipe P>
__global__ void __launch_bounds__(kThreads, blocks_per_sm<P>())
    flash_attention_kernel(AttentionArgs a, Layout lay, KeySplit split, int32_t* error_flag) {
    constexpr bool kDecode = P != Pipe::kPrefill;
    pdl_begin();
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* smem = reinterpret_cast<bf16*>(smem_raw);
    __shared__ int tok_pos[kMaxTokensPerBlock];  // −1: a bad query
    __shared__ int tok_seq[kMaxTokensPerBlock];
    __shared__ float m_s[kWarps * kRows], l_s[kWarps * kRows];
    constexpr int kStages = stages<P>();
    constexpr int kSliceKeys = kDecode ? kTileKeys / kWarps : kTileKeys;  // keys per warp per tile
    constexpr int kLd = D + 4;  // fp32 row stride of the final merge: rows 8 apart land on other banks

    const int64_t group = a.num_heads / a.num_kv_heads;
    int64_t block = blockIdx.x;
    const int split_index = static_cast<int>(block % split.num_splits);
    block /= split.num_splits;
    const int chunk = static_cast<int>(block % lay.num_chunks);
    block /= lay.num_chunks;
    const int64_t kvh = block % a.num_kv_heads;
    // Prefill: the last token tiles (the most keys, causal) first, so short ones fill the tail.
    const int64_t num_tiles_t = (a.num_tokens + lay.tokens_per_block - 1) / lay.tokens_per_block;
    const int64_t tile_t = kDecode ? block / a.num_kv_heads : num_tiles_t - 1 - block / a.num_kv_heads;
    const int64_t t0 = tile_t * lay.tokens_per_block;
    const int num_tok = static_cast<int>(min(static_cast<int64_t>(lay.tokens_per_block), a.num_tokens - t0));
    const int64_t h0 = kvh * group + static_cast<int64_t>(chunk) * lay.heads_per_chunk;
    const int heads = static_cast<int>(min(static_cast<int64_t>(lay.heads_per_chunk), group - chunk * lay.heads_per_chunk));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, q4 = lane % 4;

    load_query_tokens(a, t0, num_tok, tok_pos, tok_seq, error_flag);  // read after the barrier below

    // This thread's two rows (g and g + 8 of the warp's 16): token index in the tile and query head.
    int row_tok[2], row_head[2];
    bool row_ok[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = (kDecode ? 0 : warp * kRows) + g + 8 * hr;
        row_tok[hr] = kDecode ? 0 : r / lay.heads_per_chunk;
        row_head[hr] = kDecode ? r : r % lay.heads_per_chunk;
        row_ok[hr] = row_tok[hr] < num_tok && row_head[hr] < heads;
    }
    // Q as the A operand, bf16: qf[k-step][a0..a3].
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        float v[2][2][2];  // [row half][column half][pair]
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const float* qrow = a.q + (t0 + row_tok[hr]) * a.q_token_stride + (h0 + row_head[hr]) * a.q_head_stride;
#pragma unroll
            for (int ch = 0; ch < 2; ++ch) {
                const int d = kk * 16 + ch * 8 + 2 * q4;
                v[hr][ch][0] = row_ok[hr] ? qrow[d] : 0.0f;
                v[hr][ch][1] = row_ok[hr] ? qrow[d + 1] : 0.0f;
            }
        }
        qf[kk][0] = pack_bf16(v[0][0][0], v[0][0][1]);
        qf[kk][1] = pack_bf16(v[1][0][0], v[1][0][1]);
        qf[kk][2] = pack_bf16(v[0][1][0], v[0][1][1]);
        qf[kk][3] = pack_bf16(v[1][1][0], v[1][1][1]);
    }
    __syncthreads();  // tok_pos, tok_seq (after the q loads, so both reads are in flight together)

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float scale_log2 = a.scale * kLog2e;
    const int key_begin = split_index * static_cast<int>(split.keys_per_split);  // positions are int32
    const int key_slice = kDecode ? warp * kSliceKeys : 0;
    KvTileLoader<D, kTileKeys, kThreads> loader(a, kvh);

    // Tokens of one sequence at a time (a decode block has one token).
    for (int run_begin = 0; run_begin < num_tok;) {
        const int run_seq = tok_seq[run_begin];
        const QueryRun run = next_query_run(tok_pos, tok_seq, run_begin, num_tok);
        const int run_end = run.end, max_pos = run.max_pos;
        bool active[2];
        int pos[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            active[hr] = row_ok[hr] && row_tok[hr] >= run_begin && row_tok[hr] < run_end;
            pos[hr] = active[hr] ? tok_pos[row_tok[hr]] : -1;
        }
        const int key_end =
            run_seq < 0 ? key_begin : min(max_pos + 1, key_begin + static_cast<int>(split.keys_per_split));
        loader.start(a, lay.block_shift, run_seq, key_begin, key_end);
        const int num_tiles = loader.num_tiles;
        auto load_tile = [&](int tile) {
            bf16* sk = smem + (tile % kStages) * 2 * kTileKeys * D;
            loader.load(
                a, lay.block_shift, tile, sk, sk + kTileKeys * D,
                [](int key, int c) { return swizzle<D>(key, c); }, error_flag);
        };

#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) {
            if (s < num_tiles) load_tile(s);
            cp_async_commit();
        }
        for (int tile = 0; tile < num_tiles; ++tile) {
            cp_async_wait<kStages - 2>();
            __syncthreads();
            if (tile + kStages - 1 < num_tiles) load_tile(tile + kStages - 1);
            cp_async_commit();

            const bf16* sk = smem + (tile % kStages) * 2 * kTileKeys * D;
            const bf16* sv = sk + kTileKeys * D;
            // Scores s = q · k for this warp's kSliceKeys keys. Decode's 16 keys are two accumulators: the even
            // and odd k-steps go to separate ones (summed after), so four MMA chains are in flight, not two.
            constexpr int kChains = kSliceKeys / 8 < 4 ? 2 : 1;
            float sc[kChains][kSliceKeys / 8][4];
#pragma unroll
            for (int c = 0; c < kChains; ++c)
#pragma unroll
                for (int n = 0; n < kSliceKeys / 8; ++n) sc[c][n][0] = sc[c][n][1] = sc[c][n][2] = sc[c][n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
                for (int np = 0; np < kSliceKeys / 16; ++np) {
                    uint32_t r[4];
                    const int key = key_slice + np * 16 + (lane / 16) * 8 + lane % 8;
                    ldmatrix_x4(r, sk + swizzle<D>(key, 2 * kk + (lane / 8) % 2));
                    mma_bf16_16816(sc[kk % kChains][2 * np], qf[kk], r[0], r[1]);
                    mma_bf16_16816(sc[kk % kChains][2 * np + 1], qf[kk], r[2], r[3]);
                }
            }
            float (&s)[kSliceKeys / 8][4] = sc[0];
#pragma unroll
            for (int c = 1; c < kChains; ++c)
#pragma unroll
                for (int n = 0; n < kSliceKeys / 8; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[n][e] += sc[c][n][e];
            // Online softmax, rows g (hr 0) and g + 8 (hr 1): keys up to the row's position and the split's end.
            const int key_limit[2] = {min(pos[0] + 1, key_end), min(pos[1] + 1, key_end)};
            float corr[2];
            online_softmax_tile(s, key_begin + tile * kTileKeys + key_slice, key_limit, scale_log2, m, l, corr);
            rescale_rows(o, corr);
            // o += p · v: the score accumulators are the A fragments (FlashAttention-2's register reuse).
#pragma unroll
            for (int kk = 0; kk < kSliceKeys / 16; ++kk) {
                uint32_t pa[4];
                probabilities_a_operand(s, kk, pa);
#pragma unroll
                for (int nn = 0; nn < D / 16; ++nn) {
                    uint32_t r[4];
                    const int key = key_slice + kk * 16 + ((lane / 8) % 2) * 8 + lane % 8;
                    ldmatrix_x4_trans(r, sv + swizzle<D>(key, 2 * nn + lane / 16));
                    mma_bf16_16816(o[2 * nn], pa, r[0], r[1]);
                    mma_bf16_16816(o[2 * nn + 1], pa, r[2], r[3]);
                }
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // the next run (or the merge) reuses the stages
        run_begin = run_end;
    }

    // Each warp's rows to shared memory, then merged (decode: the four warps' key slices) and written.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
    }
    float* o_s = reinterpret_cast<float*>(smem_raw);  // [kWarps, kRows, kLd]
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = g + 8 * hr;
        if (q4 == 0) {
            m_s[warp * kRows + r] = m[hr];
            l_s[warp * kRows + r] = l[hr];
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o_s[(warp * kRows + r) * kLd + n * 8 + 2 * q4] = o[n][2 * hr];
            o_s[(warp * kRows + r) * kLd + n * 8 + 2 * q4 + 1] = o[n][2 * hr + 1];
        }
    }
    __syncthreads();
    constexpr int kOutRows = kDecode ? kRows : kWarps * kRows;
    constexpr int kMerge = kDecode ? kWarps : 1;
    const int out_rows = kDecode ? heads : kOutRows;  // decode: the group's rows only
    static_assert(kOutRows <= kThreads, "a thread per output row computes its weights");
    // Per output row, once (not per element: that was a third of a batch-1 decode block's time): the merged
    // max and sum, and each merged warp's weight exp2(m_w − m_all), 0 for a warp that saw no key.
    __shared__ float f_s[kMerge][kOutRows], m_all_s[kOutRows], l_all_s[kOutRows];
    if (threadIdx.x < out_rows) {
        const int r = threadIdx.x;
        const int w0 = kDecode ? 0 : r / kRows, rl = kDecode ? r : r % kRows;
        float m_all = -INFINITY;
        for (int w = w0; w < w0 + kMerge; ++w)
            if (l_s[w * kRows + rl] > 0.0f) m_all = fmaxf(m_all, m_s[w * kRows + rl]);
        float l_all = 0.0f;
        for (int j = 0; j < kMerge; ++j) {
            const float lw = l_s[(w0 + j) * kRows + rl];
            const float f = lw == 0.0f ? 0.0f : exp2f(m_s[(w0 + j) * kRows + rl] - m_all);
            l_all += lw * f;
            f_s[j][r] = f;
        }
        m_all_s[r] = m_all;
        l_all_s[r] = l_all;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < out_rows * D; i += kThreads) {
        const int r = i / D, d = i % D;
        const int tq = kDecode ? 0 : r / lay.heads_per_chunk, gh = kDecode ? r : r % lay.heads_per_chunk;
        if (tq >= num_tok || gh >= heads) continue;
        const int w0 = kDecode ? 0 : r / kRows, rl = kDecode ? r : r % kRows;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kMerge; ++j) {
            if (l_s[(w0 + j) * kRows + rl] == 0.0f) continue;
            sum += o_s[((w0 + j) * kRows + rl) * kLd + d] * f_s[j][r];
        }
        const float m_all = m_all_s[r], l_all = l_all_s[r];
        const int64_t t = t0 + tq, h = h0 + gh;
        if (split.num_splits == 1) {
            a.out[t * a.out_token_stride + h * a.out_head_stride + d] = l_all > 0.0f ? sum / l_all : 0.0f;
            continue;
        }
        const int64_t part = (t * a.num_heads + h) * split.num_splits + split_index;
        split.partial_acc[part * D + d] = sum;
        if (d == 0) {
            split.partial_ml[part * 2] = l_all > 0.0f ? m_all * kLn2 : -INFINITY;
            split.partial_ml[part * 2 + 1] = l_all;
        }
    }
}

template <int D, Pipe P>
cudaError_t launch(const AttentionArgs& a, const Layout& lay, const KeySplit& split, int64_t num_blocks,
                   int32_t* error_flag, cudaStream_t stream) {
    constexpr size_t smem = pipe_bytes<D, P>();
    static_assert(size_t{kWarps} * kRows * (D + 4) * sizeof(float) <= smem, "the merge fits in the pipeline's memory");
    // Dynamic and static shared memory together pass the default 48 KB even at D = 64.
    const cudaError_t err = cudaFuncSetAttribute(
        flash_attention_kernel<D, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    return launch_pdl(flash_attention_kernel<D, P>, dim3(static_cast<unsigned>(num_blocks)), dim3(kThreads),
                      smem, stream, a, lay, split, error_flag);
}

}  // namespace

bool flash_attention_supports(const AttentionArgs& a) {
    const auto aligned = [](const void* p, int64_t token_stride, int64_t head_stride) {
        return reinterpret_cast<uintptr_t>(p) % 16 == 0 && token_stride % 8 == 0 && head_stride % 8 == 0 &&
               token_stride <= INT32_MAX;
    };
    if (a.num_kv_tokens > INT32_MAX || a.kv_block_size > INT32_MAX) return false;
    return a.kv_dtype == DType::kBF16 && a.head_dim_qk == a.head_dim_v &&
           (a.head_dim_qk == 64 || a.head_dim_qk == 128) && aligned(a.k, a.k_token_stride, a.k_head_stride) &&
           aligned(a.v, a.v_token_stride, a.v_head_stride);
}

FlashAttentionPlan plan_flash_attention(const AttentionArgs& a, int num_sms, bool sm90a) {
    FlashAttentionPlan plan;
    const int64_t group = a.num_heads / a.num_kv_heads;
    // Every sequence one query token (or a single query): decode.
    const int64_t sequences = a.kv_block_tables != nullptr ? a.num_sequences : 1;
    plan.decode = a.num_tokens <= sequences;
    if (sm90a && !plan.decode && a.head_dim_qk == 128 &&
        a.num_tokens >= kFlashSm90MinRowsPerSequence * sequences) {
        plan.sm90 = true;
        plan.heads_per_chunk = flash_prefill_sm90_heads_per_chunk(group);
        plan.num_chunks = static_cast<int>(group / plan.heads_per_chunk);
        plan.tokens_per_block = kFlashPrefillSm90Rows / plan.heads_per_chunk;
        return plan;
    }
    plan.heads_per_chunk = static_cast<int>(std::min<int64_t>(group, kMaxHeadsPerChunk));
    plan.num_chunks = static_cast<int>((group + plan.heads_per_chunk - 1) / plan.heads_per_chunk);
    plan.tokens_per_block = plan.decode ? 1 : kMaxTokensPerBlock / plan.heads_per_chunk;
    const int64_t tiles = (a.num_tokens + plan.tokens_per_block - 1) / plan.tokens_per_block;
    const int64_t blocks = tiles * a.num_kv_heads * plan.num_chunks;
    if (plan.decode) {
        const auto splits = [&](int per_sm) {
            return plan_whole_wave_splits(
                a, blocks, {int64_t{per_sm} * num_sms, kMinKeysPerSplit, kTileKeys, kBlockOverheadKeys});
        };
        // The deeper pipeline where the blocks' key ranges (in its waves) are long enough.
        plan.split = splits(blocks_per_sm<Pipe::kLongDecode>());
        plan.long_decode = plan.split.keys_per_split >= kLongDecodeKeys;
        if (!plan.long_decode) plan.split = splits(blocks_per_sm<Pipe::kDecode>());
    } else {
        // Causal tiles differ in work, so no whole-wave model: split only to fill kPrefillWaves waves.
        const int64_t slots = int64_t{kPrefillWaves} * blocks_per_sm<Pipe::kPrefill>() * num_sms;
        plan.split = plan_key_splits(a, blocks, {slots, slots, kMinKeysPerSplit, kTileKeys});
    }
    return plan;
}

cudaError_t launch_flash_attention(const AttentionArgs& args, const FlashAttentionPlan& plan, void* workspace,
                                   int32_t* error_flag, cudaStream_t stream) {
    if (args.num_tokens == 0) return cudaSuccess;
    Layout lay;
    lay.heads_per_chunk = plan.heads_per_chunk;
    lay.num_chunks = plan.num_chunks;
    lay.tokens_per_block = plan.tokens_per_block;
    const int64_t bs = args.kv_block_size;
    if (bs > 0 && (bs & (bs - 1)) == 0) {
        lay.block_shift = 0;
        while ((int64_t{1} << lay.block_shift) < bs) ++lay.block_shift;
    }
    if (plan.sm90) return launch_flash_prefill_sm90(args, plan, lay.block_shift, error_flag, stream);
    const KeySplit split = key_split_in(args, plan.split, workspace);
    const int64_t tiles = (args.num_tokens + plan.tokens_per_block - 1) / plan.tokens_per_block;
    const int64_t num_blocks = tiles * args.num_kv_heads * plan.num_chunks * split.num_splits;
    const auto launch_d = [&](auto d) {
        constexpr int D = decltype(d)::value;
        if (!plan.decode) return launch<D, Pipe::kPrefill>(args, lay, split, num_blocks, error_flag, stream);
        return plan.long_decode
                   ? launch<D, Pipe::kLongDecode>(args, lay, split, num_blocks, error_flag, stream)
                   : launch<D, Pipe::kDecode>(args, lay, split, num_blocks, error_flag, stream);
    };
    const cudaError_t err = args.head_dim_qk == 64 ? launch_d(std::integral_constant<int, 64>{})
                                                   : launch_d(std::integral_constant<int, 128>{});
    if (err != cudaSuccess || split.num_splits == 1) return err;
    return launch_attention_combine(args, split, stream);
}

}  // namespace epinfer::cuda
