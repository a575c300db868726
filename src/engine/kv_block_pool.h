// The paged KV cache of one rank: per layer of this rank's pipeline stage, a pool of fixed-size blocks
// of KV rows, and the free list of block ids. A sequence owns a block table (block ids in position order):
// position p lives in block table[p / block_size], row p % block_size of that block.
//
// Storage per layer (KvPoolShape::dtype, fp32 or bf16, on the model's backend):
//   k: [num_blocks, block_size, Model::kv_k_width()]  (GQA: K after q/k norm and RoPE; MLA: the latent)
//   v: [num_blocks, block_size, Model::kv_v_width()]  (GQA only; MLA has no V rows)
// A bf16 pool holds half the bytes of an fp32 one (rows rounded to nearest even when stored; attention
// computes in fp32 either way).
// Block ids are the same in every layer. Only the layers of this rank's pipeline stage hold storage. The
// sizing (how many blocks fit) is the caller's: see planner/memory_model.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "layers/kv_cache.h"
#include "models/model.h"
#include "parallel/sharding.h"

namespace epinfer {

// What a pool holds per token and for which layers.
struct KvPoolShape {
    int64_t num_layers = 0;  // L: views() returns L views
    ShardRange layers;       // layers with storage, [layers.begin, layers.end()) ⊆ [0, L)
    int64_t k_width = 0;     // elements per token per layer of k, ≥ 1
    int64_t v_width = 0;     // of v; 0 = no V rows (MLA)
    DType dtype = DType::kF32;  // element of k and v: kF32 or kBF16
};

// The shape `model` needs on this rank: every layer, or under a layout (Model::parallel()) the layers of
// this rank's pipeline stage; widths Model::kv_k_width() / kv_v_width() (this rank's KV heads); elements
// of `dtype`.
KvPoolShape kv_pool_shape(const Model& model, DType dtype = DType::kF32);

class KvBlockPool {
public:
    // num_blocks ≥ 1 blocks of block_size ≥ 1 tokens of `dtype` elements for the layers `model` runs on
    // this rank (kv_pool_shape(model, dtype)), on model.backend().
    // Errors: kInvalidArgument (a size < 1, a dtype other than F32 and BF16), kOutOfMemory naming the
    // bytes asked for.
    static Result<KvBlockPool> create(const Model& model, int64_t num_blocks, int64_t block_size,
                                      DType dtype = DType::kF32);
    // The same for an explicit shape (tests, tools). Errors: also kInvalidArgument for a bad shape.
    static Result<KvBlockPool> create(Backend& backend, const KvPoolShape& shape, int64_t num_blocks,
                                      int64_t block_size);

    int64_t block_size() const { return block_size_; }
    int64_t num_blocks() const { return num_blocks_; }
    int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()); }
    // Blocks needed to hold num_tokens tokens: ceil(num_tokens / block_size).
    int64_t blocks_for(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
    const KvPoolShape& shape() const { return shape_; }
    // Bytes of K/V storage this pool holds (every layer with storage): rows · (k_width + v_width) ·
    // dtype_size(dtype) · layers.
    int64_t storage_bytes() const { return storage_bytes_; }

    // Appends `count` ≥ 0 free block ids to *table (lowest free ids first on a fresh pool, so a
    // sequence's blocks tend to be contiguous); kOutOfMemory (and *table unchanged) when fewer are free,
    // kInvalidArgument for count < 0.
    Status allocate(int64_t count, std::vector<int32_t>* table);
    // Returns every block of *table to the free list and clears it. Ids that are not allocated (out of
    // range, or already released) are skipped, so a second release of the same ids is harmless.
    void release(std::vector<int32_t>* table);

    // [L] per-layer views of one sequence for Model::forward (layers of other pipeline stages are empty
    // views: null pools, empty block table, but block_size and num_tokens set, as Model::forward reads
    // num_tokens of layer 0). block_table: host [n] ids; num_tokens: positions already filled. The views
    // carry the pool's dtype and point into block_table, which must outlive them.
    std::vector<LayerKvCache> views(std::span<const int32_t> block_table, int64_t num_tokens) const;

private:
    KvBlockPool() = default;

    Backend* backend_ = nullptr;
    KvPoolShape shape_;
    int64_t block_size_ = 0;
    int64_t num_blocks_ = 0;
    int64_t storage_bytes_ = 0;
    std::vector<DeviceBuffer> k_, v_;  // [L] of [num_blocks, block_size, width] dtype; empty off the stage
    std::vector<int32_t> free_;        // free ids, the next to hand out at the back
    std::vector<uint8_t> allocated_;   // [num_blocks] 1 = in some block table
};

}  // namespace epinfer
