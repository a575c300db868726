// What the flash-attention kernels (flash_attention.cu, flash_prefill_sm90.cu) share: their block's query
// tokens (load_query_tokens, next_query_run) and the K/V tile copy (KvTileLoader): tiles of kTileKeys keys of
// one KV head of one sequence, K and V rows of D bf16, from the paged pool (or contiguous rows) into shared
// memory by cp.async, rows past the sequence's keys zero-filled. Device code only.
//
// Thread t copies 16-byte chunk t mod (D / 8) of the kLoads consecutive keys (t / (D / 8)) · kLoads + i of
// each tile. When the block size is a power of two and a multiple of kLoads (the engine's 16), one
// block-table entry covers the thread's keys (read one tile ahead, off the copies' path) and their rows are
// consecutive pool rows of that block: a pointer stepped by the row stride. A negative block id a key
// reaches sets *error_flag to 1 and its rows read as zeros.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/op_args.h"

namespace epinfer::cuda {

// The block's query tokens t0 … t0 + num_tok − 1, read by its first num_tok threads (num_tok ≤ blockDim.x):
// tok_pos[i], tok_seq[i] [num_tok] shared, the token's position and sequence (0 unpaged, or without
// token_sequence), both −1 for a bad token — a position outside [0, num_kv_tokens) or, paged, a sequence
// outside [0, num_sequences) — which sets *error_flag to 1. The caller synchronises before reading them.
__device__ __forceinline__ void load_query_tokens(const AttentionArgs& a, int64_t t0, int num_tok,
                                                  int* tok_pos, int* tok_seq, int32_t* error_flag) {
    const int i = static_cast<int>(threadIdx.x);
    if (i >= num_tok) return;
    const bool paged = a.kv_block_tables != nullptr;
    const int32_t pos = a.positions[t0 + i];
    const int32_t seq = paged && a.token_sequence != nullptr ? a.token_sequence[t0 + i] : 0;
    const bool bad = pos < 0 || pos >= a.num_kv_tokens || (paged && (seq < 0 || seq >= a.num_sequences));
    if (bad) *error_flag = 1;
    tok_pos[i] = bad ? -1 : pos;
    tok_seq[i] = bad ? -1 : seq;
}

// The run of consecutive tokens of one sequence that starts at token `begin` (the kernels take a block's
// tokens one sequence after the other): its end (exclusive) and the largest position in it.
struct QueryRun {
    int end;
    int max_pos;
};
__device__ __forceinline__ QueryRun next_query_run(const int* tok_pos, const int* tok_seq, int begin,
                                                   int num_tok) {
    QueryRun run{begin + 1, tok_pos[begin]};
    while (run.end < num_tok && tok_seq[run.end] == tok_seq[begin])
        run.max_pos = max(run.max_pos, tok_pos[run.end++]);
    return run;
}

template <int D, int kTileKeys, int kThreads>
struct KvTileLoader {
    static constexpr int kChunks = D / 8;                          // 16-byte chunks per row
    static constexpr int kLoads = kTileKeys * kChunks / kThreads;  // rows per thread per tile, K and V each
    static_assert(kThreads % kChunks == 0 && kLoads * kThreads == kTileKeys * kChunks,
                  "a thread copies one chunk column of whole rows");

    // Strides, block size and block_shift (log2(kv_block_size) when a power of two, else −1) are read from
    // the kernel's parameters at each use (constant memory, no registers).
    const bf16* k_chunk;  // this thread's chunk of row 0 of the KV head
    const bf16* v_chunk;
    const int32_t* table = nullptr;  // the sequence's block table; nullptr: contiguous rows
    int key_begin = 0, key_end = 0, num_tiles = 0;
    bool one_block = false;
    int next_block = 0;

    // KV head kvh; start() picks the keys.
    __device__ KvTileLoader(const AttentionArgs& a, int64_t kvh)
        : k_chunk(static_cast<const bf16*>(a.k) + kvh * a.k_head_stride + chunk() * 8),
          v_chunk(static_cast<const bf16*>(a.v) + kvh * a.v_head_stride + chunk() * 8) {}

    // Keys [key_begin, key_end) of sequence seq (a.kv_block_tables' row; ignored unpaged), in tiles from
    // key_begin; sets num_tiles.
    __device__ void start(const AttentionArgs& a, int block_shift, int seq, int key_begin_, int key_end_) {
        table = a.kv_block_tables != nullptr
                    ? a.kv_block_tables + static_cast<int64_t>(seq) * a.block_table_stride
                    : nullptr;
        key_begin = key_begin_;
        key_end = key_end_;
        num_tiles = key_end <= key_begin ? 0 : (key_end - key_begin + kTileKeys - 1) / kTileKeys;
        one_block = table != nullptr && block_shift >= 0 && a.kv_block_size % kLoads == 0;
        next_block = one_block && num_tiles > 0 ? first_block(block_shift, 0) : 0;
    }

    // This thread's chunk column and the first of its kLoads keys in a tile.
    __device__ static int chunk() { return static_cast<int>(threadIdx.x) % kChunks; }
    __device__ static int key_first() { return static_cast<int>(threadIdx.x) / kChunks * kLoads; }

    // The block id of this thread's first key of `tile` (one_block).
    __device__ int first_block(int block_shift, int tile) const {
        const int j = key_begin + tile * kTileKeys + key_first();
        return j < key_end ? __ldg(table + (j >> block_shift)) : 0;
    }

    // Starts the copies of `tile` into sk and sv, row `key` chunk `c` at element offset(key, c) of each.
    // Tiles are loaded in order (the block-table read-ahead assumes it). error_flag: [1] int32, device.
    template <typename Offset>
    __device__ __forceinline__ void load(const AttentionArgs& a, int block_shift, int tile, bf16* sk,
                                         bf16* sv, Offset offset, int32_t* error_flag) {
        const int key0 = key_first(), ch = chunk();
        const int k_stride = static_cast<int>(a.k_token_stride),
                  v_stride = static_cast<int>(a.v_token_stride);
        const int bs = static_cast<int>(a.kv_block_size);
        const int j0 = key_begin + tile * kTileKeys + key0;
        if (one_block) {
            const int32_t blk = next_block;
            if (tile + 1 < num_tiles) next_block = first_block(block_shift, tile + 1);
            if (blk < 0 && j0 < key_end) *error_flag = 1;  // its keys read as zeros
            const int real = blk < 0 ? 0 : key_end - j0;   // the first `real` keys exist
            // Rows of block max(blk, 0): inside the pool also past key_end, where nothing is read.
            const int64_t row0 = static_cast<int64_t>(max(blk, 0)) * bs + (j0 & (bs - 1));
            const bf16* ksrc = k_chunk + row0 * k_stride;
            const bf16* vsrc = v_chunk + row0 * v_stride;
#pragma unroll
            for (int i = 0; i < kLoads; ++i) {
                const int bytes = i < real ? 16 : 0;
                cp_async_16(sk + offset(key0 + i, ch), ksrc, bytes);
                cp_async_16(sv + offset(key0 + i, ch), vsrc, bytes);
                ksrc += k_stride;
                vsrc += v_stride;
            }
            return;
        }
        // Contiguous K/V or any other block size: one lookup per key, all in flight together, then the
        // copies.
        int32_t blk[kLoads];
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
            const int j = j0 + i;
            blk[i] = table != nullptr && j < key_end
                         ? __ldg(table + (block_shift >= 0 ? j >> block_shift : j / bs))
                         : 0;
        }
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
            const int j = j0 + i;
            bool ok = j < key_end;
            if (ok && blk[i] < 0) {
                *error_flag = 1;
                ok = false;
            }
            const int row = table == nullptr ? j : blk[i] * bs + (block_shift >= 0 ? j & (bs - 1) : j % bs);
            const bf16* ksrc = ok ? k_chunk + static_cast<int64_t>(row) * k_stride : k_chunk;
            const bf16* vsrc = ok ? v_chunk + static_cast<int64_t>(row) * v_stride : v_chunk;
            cp_async_16(sk + offset(key0 + i, ch), ksrc, ok ? 16 : 0);
            cp_async_16(sv + offset(key0 + i, ch), vsrc, ok ? 16 : 0);
        }
    }
};

}  // namespace epinfer::cuda
