// What an attention layer sees of the KV cache: a paged view of one sequence in one layer (the layer's
// pool of fixed-size blocks and the sequence's block table), the rows of a batch that belong to each
// sequence, the batch's paged-attention metadata in backend memory (built once per forward, the same in
// every layer), and the helpers that write new rows into the blocks and gather a prefix back out. The
// storage and the free list are owned by engine/kv_block_pool.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/status.h"

namespace epinfer {

// The paged cache of one sequence in one layer. Position p of the sequence lives in block
// block_table[p / block_size], row p % block_size of that block: pool row
//   block_table[p / block_size] · block_size + p % block_size.
//   GQA: k_pool, v_pool: [num_blocks, block_size, Nkv·D] dtype (k after q/k norm and RoPE).
//   MLA: k_pool: [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim] dtype, the latent after
//        kv_a_layernorm and with RoPE applied to the k_pe part; v_pool unused (nullptr).
// dtype is F32 or BF16 (rows rounded to nearest even when stored); attention reads either in fp32
// arithmetic.
// A layer of another pipeline stage gets an empty view (null pools, empty block table) that still carries
// num_tokens.
struct LayerKvCache {
    void* k_pool = nullptr;                // [num_blocks, block_size, k_width] dtype, device
    void* v_pool = nullptr;                // [num_blocks, block_size, v_width] dtype, device; nullptr for MLA
    DType dtype = DType::kF32;             // of both pools: kF32 or kBF16
    std::span<const int32_t> block_table;  // [n] int32, host: block ids in position order
    int64_t num_blocks = 0;  // blocks of the pools
    int64_t block_size = 0;  // tokens per block, ≥ 1
    int64_t num_tokens = 0;  // rows already filled (positions 0 .. num_tokens − 1)

    // Tokens the block table can hold.
    int64_t capacity() const { return static_cast<int64_t>(block_table.size()) * block_size; }
};

// One sequence's rows in a batch: rows [row_begin, row_begin + num_rows) of every [T, ...] tensor, at
// positions kv->num_tokens + i. The layer writes their K/V into positions kv->num_tokens + i of *kv (which
// must have the capacity) and does not advance kv->num_tokens: the model does that after the last layer.
struct AttentionSequence {
    int64_t row_begin = 0;
    int64_t num_rows = 0;
    LayerKvCache* kv = nullptr;
};

// kInvalidArgument when seq.kv has no storage (a layer of another pipeline stage) or its block table
// cannot take seq.num_rows more rows.
inline Status check_kv_capacity(const AttentionSequence& seq) {
    if (seq.kv == nullptr) return invalid_argument("attention: sequence without a KV cache");
    if (seq.kv->k_pool == nullptr || seq.kv->block_size < 1) {
        return invalid_argument(
            "attention: the KV cache view has no storage (a layer of another pipeline stage?)");
    }
    if (seq.kv->num_tokens + seq.num_rows > seq.kv->capacity()) {
        return invalid_argument("attention: KV cache of " + std::to_string(seq.kv->capacity()) +
                                " tokens cannot take " + std::to_string(seq.num_rows) + " more after " +
                                std::to_string(seq.kv->num_tokens));
    }
    return Status::ok();
}

// The paged-attention metadata of a batch in backend memory (AttentionArgs' batch paging and
// KvCacheStoreArgs' slot mapping). Block ids are the same in every layer's pool, so one metadata serves
// every layer of a forward.
struct KvBatchMetadata {
    DeviceBuffer slot_mapping;    // [T] int64: the pool row of each new row (position kv.num_tokens + i)
    DeviceBuffer block_tables;    // [num_sequences, block_table_stride] int32, −1 past a sequence's blocks
    DeviceBuffer token_sequence;  // [T] int32: the sequence (block table row) of each row
    int64_t num_rows = 0;         // T
    int64_t num_sequences = 0;
    int64_t block_table_stride = 0;  // ≥ 1
};

// The same on the host, before upload.
struct KvBatchHostMetadata {
    std::vector<int64_t> slot_mapping;    // [T]
    std::vector<int32_t> block_tables;    // [num_sequences, block_table_stride]
    std::vector<int32_t> token_sequence;  // [T]
    int64_t num_sequences = 0;
    int64_t block_table_stride = 0;
};

// The metadata of `sequences` (one layer's views, in row order, covering rows [0, num_rows)), with rows of
// block_table_stride entries (0: the longest table; else at least that).
// Errors: kInvalidArgument when the sequences do not cover [0, num_rows) in order, a view has no storage,
// a block table lacks the capacity for its new rows (check_kv_capacity) or holds a negative id among them,
// or block_table_stride is below the longest table.
Result<KvBatchHostMetadata> kv_batch_host_metadata(std::span<const AttentionSequence> sequences,
                                                   int64_t num_rows, int64_t block_table_stride = 0);

// kv_batch_host_metadata uploaded to `backend` (three small host→device copies).
// Errors: as kv_batch_host_metadata; alloc/copy errors.
Result<KvBatchMetadata> build_kv_batch_metadata(Backend& backend, std::span<const AttentionSequence> sequences,
                                                int64_t num_rows);

struct AttentionBatch {
    const int32_t* positions = nullptr;            // [T] int32, device
    std::span<const AttentionSequence> sequences;  // this layer's views, in row order, covering [0, T)
    const KvBatchMetadata* kv_metadata = nullptr;  // build_kv_batch_metadata of these sequences
};

// The layer's cache (pools, block size, number of blocks) that every sequence of `batch` shares.
// Errors: kInvalidArgument when the batch has no sequences or metadata, a view has no storage (a layer of
// another pipeline stage?) or the views do not share their pools (and dtype).
Result<const LayerKvCache*> batch_layer_cache(const AttentionBatch& batch);

// Writes row t of `rows` ([T, width] fp32, device, packed) to pool row slot_mapping[t] of `pool` (the
// layer's k_pool or v_pool, [num_blocks · block_size, width] layer.dtype; bf16 rounds to nearest even):
// one kv_cache_store op for the batch.
// Errors: op errors (kNotSupported for a layer.dtype other than F32 and BF16).
Status kv_cache_store_rows(Backend& backend, const AttentionBatch& batch, const LayerKvCache& layer,
                           void* pool, int64_t width, const float* rows);

// Sets the paged fields of `args` (k/v pools are the caller's) from the batch metadata and `layer`:
// kv_dtype = layer.dtype; num_kv_tokens = block_table_stride · block_size (a bound on every position,
// fixed for a table width).
void set_paged_attention(const AttentionBatch& batch, const LayerKvCache& layer, AttentionArgs* args);

// Copies positions 0 .. num_rows − 1 of `pool` (kv's k_pool or v_pool, kv.dtype, through kv's block
// table) into out: [num_rows, width] fp32, device (packed), per run contiguous in the pool one
// copy_on_device (F32 pool) or one cast to fp32 (BF16 pool, exact).
// Errors: kInvalidArgument when num_rows exceeds the block table's capacity, a negative block id, or width
// < 1; kNotSupported for a kv.dtype other than F32 and BF16; copy and cast errors.
Status kv_cache_gather_rows(Backend& backend, const LayerKvCache& kv, const void* pool, int64_t width,
                            int64_t num_rows, float* out);

}  // namespace epinfer
