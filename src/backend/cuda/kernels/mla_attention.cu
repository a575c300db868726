// MLA's absorbed attention over the bf16 latent cache (see mla_attention.cuh).
#include <algorithm>
#include <cmath>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/flash_softmax.cuh"
#include "backend/cuda/kernels/mla_attention.cuh"
#include "backend/cuda/kernels/mla_attention_sm90.cuh"
#include "backend/cuda/kernels/mla_attention_store.cuh"
#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {

namespace {

constexpr int kDqk = static_cast<int>(kMlaLatentDim + kMlaRopeDim);  // 576
constexpr int kDv = static_cast<int>(kMlaLatentDim);                 // 512
constexpr int kChunks = kDqk / 8;                                    // 16-byte chunks per row: 72
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kHeads = 64;       // query heads per block: 4 row groups of 16
constexpr int kTileKeys = 32;    // keys per shared-memory tile
constexpr int kStages = 2;
constexpr int kHalfK = kDqk / 2;  // the score dims a warp takes: 288 = 18 k-steps
constexpr int kHalfV = kDv / 2;   // the output columns a warp accumulates: 256
constexpr int64_t kMinKeysPerSplit = 4 * kTileKeys;
constexpr float kLog2e = 1.4426950408889634f;
constexpr size_t kQBytes = size_t{kHeads} * kDqk * sizeof(bf16);
constexpr size_t kTileBytes = size_t{kTileKeys} * kDqk * sizeof(bf16);
constexpr size_t kExchangeBytes = size_t{kWarps} * 16 * kTileKeys * sizeof(float);
constexpr size_t kSmemBytes = kQBytes + kStages * kTileBytes + kExchangeBytes;  // 160 KiB
static_assert(kSmemBytes == kMlaAttentionSmemBytes, "mla_attention.cuh states the kernel's shared memory");

// Offset (elements) of 16-byte chunk `chunk` of row `row` in a [rows, 576] bf16 tile: 72 chunks per row,
// XORed within groups of 8 so that the 8 rows an ldmatrix reads hit different banks.
__device__ __forceinline__ int swizzle(int row, int chunk) {
    return row * kDqk + ((chunk ^ (row & 7)) << 3);
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_attention_kernel(AttentionArgs a, int num_chunks, int block_shift, KeySplit split, int32_t* error_flag) {
    pdl_begin();
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* q_s = reinterpret_cast<bf16*>(smem_raw);                         // [64, 576]
    bf16* k_s = q_s + kHeads * kDqk;                                       // [kStages][32, 576]
    float* x_s = reinterpret_cast<float*>(k_s + kStages * kTileKeys * kDqk);  // [kWarps][16, 32]

    int64_t block = blockIdx.x;
    const int split_index = static_cast<int>(block % split.num_splits);
    block /= split.num_splits;
    const int chunk = static_cast<int>(block % num_chunks);
    const int64_t t = block / num_chunks;
    const int64_t h0 = static_cast<int64_t>(chunk) * kHeads;
    const int heads = static_cast<int>(min(static_cast<int64_t>(kHeads), a.num_heads - h0));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rg = warp % 4, half = warp / 4;  // row group (16 heads), half of the dims / output columns
    const int g = lane / 4, q4 = lane % 4;
    const bool paged = a.kv_block_tables != nullptr;

    const int32_t pos_in = a.positions[t];
    const int32_t seq_in = paged && a.token_sequence != nullptr ? a.token_sequence[t] : 0;
    const bool bad = pos_in < 0 || pos_in >= a.num_kv_tokens || (paged && (seq_in < 0 || seq_in >= a.num_sequences));
    if (bad && threadIdx.x == 0) *error_flag = 1;

    // Q of the block's heads as bf16, rows past `heads` zero.
    for (int i = threadIdx.x; i < kHeads * kDqk / 2; i += kThreads) {
        const int r = i / (kDqk / 2), d = 2 * (i % (kDqk / 2));
        float2 v = make_float2(0.0f, 0.0f);
        if (r < heads) {
            const float* qrow = a.q + t * a.q_token_stride + (h0 + r) * a.q_head_stride;
            v = make_float2(qrow[d], qrow[d + 1]);
        }
        *reinterpret_cast<__nv_bfloat162*>(q_s + swizzle(r, d / 8) + d % 8) = __floats2bfloat162_rn(v.x, v.y);
    }

    const int key_begin = split_index * static_cast<int>(split.keys_per_split);
    const int key_end = bad ? key_begin : min(pos_in + 1, key_begin + static_cast<int>(split.keys_per_split));
    const int num_tiles = key_end <= key_begin ? 0 : (key_end - key_begin + kTileKeys - 1) / kTileKeys;
    const int32_t* table = paged ? a.kv_block_tables + static_cast<int64_t>(seq_in) * a.block_table_stride : nullptr;
    const bf16* k_base = static_cast<const bf16*>(a.k);
    const int k_stride = static_cast<int>(a.k_token_stride), bs = static_cast<int>(a.kv_block_size);

    constexpr int kLoads = kTileKeys * kChunks / kThreads;  // 9 chunks per thread per tile
    static_assert(kTileKeys * kChunks % kThreads == 0, "a tile's chunks divide over the threads");
    auto load_tile = [&](int tile) {
        bf16* sk = k_s + (tile % kStages) * kTileKeys * kDqk;
        const int key0 = key_begin + tile * kTileKeys;
        int32_t blk[kLoads];
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
            const int j = key0 + (threadIdx.x + i * kThreads) / kChunks;
            if (table == nullptr || j >= key_end) {
                blk[i] = 0;
                continue;
            }
            blk[i] = __ldg(table + (block_shift >= 0 ? j >> block_shift : j / bs));
        }
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
            const int idx = threadIdx.x + i * kThreads, key = idx / kChunks, ch = idx % kChunks, j = key0 + key;
            bool ok = j < key_end;
            if (ok && blk[i] < 0) {
                *error_flag = 1;
                ok = false;
            }
            const int row = table == nullptr ? j : blk[i] * bs + (block_shift >= 0 ? j & (bs - 1) : j % bs);
            const bf16* src = ok ? k_base + static_cast<int64_t>(row) * k_stride + ch * 8 : k_base;
            cp_async_16(sk + swizzle(key, ch), src, ok ? 16 : 0);
        }
    };

    float o[kHalfV / 8][4];
#pragma unroll
    for (int n = 0; n < kHalfV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float scale_log2 = a.scale * kLog2e;
    float* x_mine = x_s + warp * 16 * kTileKeys;
    const float* x_other = x_s + (warp ^ 4) * 16 * kTileKeys;

    if (num_tiles > 0) load_tile(0);
    cp_async_commit();
    for (int tile = 0; tile < num_tiles; ++tile) {
        cp_async_wait<0>();
        __syncthreads();  // tile ready (and Q on the first); the other stage and x_s free
        if (tile + 1 < num_tiles) load_tile(tile + 1);
        cp_async_commit();
        const bf16* sk = k_s + (tile % kStages) * kTileKeys * kDqk;

        // Partial scores over this warp's 288 dims.
        float s[kTileKeys / 8][4];
#pragma unroll
        for (int n = 0; n < kTileKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 6
        for (int kk = 0; kk < kHalfK / 16; ++kk) {
            const int kc = half * (kHalfK / 16) + kk;  // 16-dim step of the 576
            uint32_t qa[4];
            ldmatrix_x4(qa, q_s + swizzle(rg * 16 + lane % 16, 2 * kc + lane / 16));
#pragma unroll
            for (int np = 0; np < kTileKeys / 16; ++np) {
                uint32_t r[4];
                ldmatrix_x4(r, sk + swizzle(np * 16 + (lane / 16) * 8 + lane % 8, 2 * kc + (lane / 8) % 2));
                mma_bf16_16816(s[2 * np], qa, r[0], r[1]);
                mma_bf16_16816(s[2 * np + 1], qa, r[2], r[3]);
            }
        }
        // The two halves' partial sums, exchanged through shared memory.
#pragma unroll
        for (int n = 0; n < kTileKeys / 8; ++n) {
            *reinterpret_cast<float2*>(x_mine + g * kTileKeys + n * 8 + 2 * q4) = make_float2(s[n][0], s[n][1]);
            *reinterpret_cast<float2*>(x_mine + (g + 8) * kTileKeys + n * 8 + 2 * q4) = make_float2(s[n][2], s[n][3]);
        }
        __syncthreads();
#pragma unroll
        for (int n = 0; n < kTileKeys / 8; ++n) {
            const float2 lo = *reinterpret_cast<const float2*>(x_other + g * kTileKeys + n * 8 + 2 * q4);
            const float2 hi = *reinterpret_cast<const float2*>(x_other + (g + 8) * kTileKeys + n * 8 + 2 * q4);
            s[n][0] += lo.x;
            s[n][1] += lo.y;
            s[n][2] += hi.x;
            s[n][3] += hi.y;
        }
        // Online softmax, rows g (hr 0) and g + 8 (hr 1): keys up to the split's end (key_end ≤ position + 1).
        const int key_limit[2] = {key_end, key_end};
        float corr[2];
        online_softmax_tile(s, key_begin + tile * kTileKeys, key_limit, scale_log2, m, l, corr);
        rescale_rows(o, corr);
        // o += p · V over this warp's 256 columns of the latent.
#pragma unroll
        for (int kk = 0; kk < kTileKeys / 16; ++kk) {
            uint32_t pa[4];
            probabilities_a_operand(s, kk, pa);
#pragma unroll
            for (int nn = 0; nn < kHalfV / 16; ++nn) {
                uint32_t r[4];
                const int key = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8;
                ldmatrix_x4_trans(r, sk + swizzle(key, half * (kHalfV / 8) + 2 * nn + lane / 16));
                mma_bf16_16816(o[2 * nn], pa, r[0], r[1]);
                mma_bf16_16816(o[2 * nn + 1], pa, r[2], r[3]);
            }
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
        const int r = rg * 16 + g + 8 * hr;
        if (r >= heads) continue;
        store_mla_row(a, split, split_index, t, h0 + r, half * kHalfV, o, hr, m[hr], l[hr], half == 0);
    }
}

}  // namespace

bool mla_attention_supports(const AttentionArgs& a) {
    return a.kv_dtype == DType::kBF16 && a.num_kv_heads == 1 && a.head_dim_qk == kDqk && a.head_dim_v == kDv &&
           a.v == a.k && a.v_token_stride == a.k_token_stride && reinterpret_cast<uintptr_t>(a.k) % 16 == 0 &&
           a.k_token_stride % 8 == 0 && a.k_token_stride <= INT32_MAX && a.num_kv_tokens <= INT32_MAX &&
           a.kv_block_size <= INT32_MAX;
}

MlaAttentionPlan plan_mla_attention(const AttentionArgs& a, int num_sms, bool sm90a) {
    MlaAttentionPlan plan;
    plan.num_chunks = static_cast<int>((a.num_heads + kHeads - 1) / kHeads);
    plan.sm90 = sm90a;
    // One block per SM either way (160 or 225 KiB of shared memory); splits of whole tiles, at least four
    // 32-key tiles.
    const int64_t blocks = a.num_tokens * plan.num_chunks;
    const int64_t tile = sm90a ? kMlaSm90TileKeys : kTileKeys;
    plan.split = plan_whole_wave_splits(a, blocks, {num_sms, kMinKeysPerSplit, tile, 2 * tile});
    return plan;
}

cudaError_t launch_mla_attention(const AttentionArgs& args, const MlaAttentionPlan& plan, void* workspace,
                                 int32_t* error_flag, cudaStream_t stream) {
    if (args.num_tokens == 0) return cudaSuccess;
    int block_shift = -1;
    const int64_t bs = args.kv_block_size;
    if (bs > 0 && (bs & (bs - 1)) == 0) {
        block_shift = 0;
        while ((int64_t{1} << block_shift) < bs) ++block_shift;
    }
    const KeySplit split = key_split_in(args, plan.split, workspace);
    cudaError_t err;
    if (plan.sm90) {
        err = launch_mla_attention_sm90(args, plan.num_chunks, block_shift, split, error_flag, stream);
        if (err != cudaSuccess || split.num_splits == 1) return err;
        return launch_attention_combine(args, split, stream);
    }
    const int64_t num_blocks = args.num_tokens * plan.num_chunks * split.num_splits;
    err = cudaFuncSetAttribute(mla_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kSmemBytes));
    if (err != cudaSuccess) return err;
    err = launch_pdl(mla_attention_kernel, dim3(static_cast<unsigned>(num_blocks)), dim3(kThreads),
                     kSmemBytes, stream, args, plan.num_chunks, block_shift, split, error_flag);
    if (err != cudaSuccess || split.num_splits == 1) return err;
    return launch_attention_combine(args, split, stream);
}

}  // namespace epinfer::cuda
