#include "engine/kv_block_pool.h"

#include <algorithm>
#include <limits>
#include <string>

namespace epinfer {

KvPoolShape kv_pool_shape(const Model& model, DType dtype) {
    KvPoolShape shape;
    shape.num_layers = model.config().num_hidden_layers;
    shape.layers = model.parallel() != nullptr ? model.parallel()->pipeline_stage.layers
                                               : ShardRange{0, shape.num_layers};
    shape.k_width = model.kv_k_width();
    shape.v_width = model.kv_v_width();
    shape.dtype = dtype;
    return shape;
}

Result<KvBlockPool> KvBlockPool::create(const Model& model, int64_t num_blocks, int64_t block_size,
                                        DType dtype) {
    return create(model.backend(), kv_pool_shape(model, dtype), num_blocks, block_size);
}

Result<KvBlockPool> KvBlockPool::create(Backend& backend, const KvPoolShape& shape, int64_t num_blocks,
                                        int64_t block_size) {
    const std::string what = "KV block pool: ";
    if (num_blocks < 1) return invalid_argument(what + "num_blocks " + std::to_string(num_blocks) + " < 1");
    if (block_size < 1) return invalid_argument(what + "block_size " + std::to_string(block_size) + " < 1");
    if (num_blocks > std::numeric_limits<int32_t>::max()) {
        return invalid_argument(what + "num_blocks " + std::to_string(num_blocks) +
                                " exceeds int32 block ids");
    }
    if (shape.num_layers < 1 || shape.layers.begin < 0 || shape.layers.size < 0 ||
        shape.layers.end() > shape.num_layers) {
        return invalid_argument(what + "layers [" + std::to_string(shape.layers.begin) + ", " +
                                std::to_string(shape.layers.end()) + ") are not inside [0, " +
                                std::to_string(shape.num_layers) + ")");
    }
    if (shape.k_width < 1 || shape.v_width < 0) {
        return invalid_argument(what + "k_width " + std::to_string(shape.k_width) + " / v_width " +
                                std::to_string(shape.v_width) + " (need k_width ≥ 1, v_width ≥ 0)");
    }
    if (shape.dtype != DType::kF32 && shape.dtype != DType::kBF16) {
        return invalid_argument(what + "dtype " + dtype_name(shape.dtype) +
                                " is not supported (F32 or BF16)");
    }
    const auto element_bytes = static_cast<int64_t>(dtype_size(shape.dtype));
    const int64_t rows = num_blocks * block_size;
    if (rows > std::numeric_limits<int64_t>::max() / element_bytes / (shape.k_width + shape.v_width) /
                   std::max<int64_t>(shape.layers.size, 1)) {
        return invalid_argument(what + std::to_string(num_blocks) + " blocks of " +
                                std::to_string(block_size) + " tokens overflow a byte count");
    }
    KvBlockPool pool;
    pool.backend_ = &backend;
    pool.shape_ = shape;
    pool.block_size_ = block_size;
    pool.num_blocks_ = num_blocks;
    pool.storage_bytes_ = rows * (shape.k_width + shape.v_width) * element_bytes * shape.layers.size;
    pool.k_.resize(static_cast<size_t>(shape.num_layers));
    pool.v_.resize(static_cast<size_t>(shape.num_layers));
    const std::string oom_context =
        what + std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + " tokens for " +
        std::to_string(shape.layers.size) + " layers need " + std::to_string(pool.storage_bytes_) + " bytes";
    for (int64_t l = shape.layers.begin; l < shape.layers.end(); ++l) {
        const auto at = static_cast<size_t>(l);
        Result<DeviceBuffer> k =
            DeviceBuffer::alloc(backend, static_cast<size_t>(rows * shape.k_width * element_bytes));
        if (!k.is_ok()) return k.status().with_context(oom_context);
        Result<DeviceBuffer> v =
            DeviceBuffer::alloc(backend, static_cast<size_t>(rows * shape.v_width * element_bytes));
        if (!v.is_ok()) return v.status().with_context(oom_context);
        pool.k_[at] = std::move(k).value();
        pool.v_[at] = std::move(v).value();
    }
    pool.free_.resize(static_cast<size_t>(num_blocks));
    for (int64_t i = 0; i < num_blocks; ++i)
        pool.free_[static_cast<size_t>(i)] = static_cast<int32_t>(num_blocks - 1 - i);  // id 0 at the back
    pool.allocated_.assign(static_cast<size_t>(num_blocks), 0);
    return pool;
}

Status KvBlockPool::allocate(int64_t count, std::vector<int32_t>* table) {
    if (count < 0) return invalid_argument("KV block pool: allocate count " + std::to_string(count) + " < 0");
    if (count > num_free_blocks()) {
        return Status(StatusCode::kOutOfMemory,
                      "KV block pool: " + std::to_string(count) + " blocks asked for, " +
                          std::to_string(num_free_blocks()) + " of " + std::to_string(num_blocks_) + " free");
    }
    table->reserve(table->size() + static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
        const int32_t id = free_.back();
        free_.pop_back();
        allocated_[static_cast<size_t>(id)] = 1;
        table->push_back(id);
    }
    return Status::ok();
}

void KvBlockPool::release(std::vector<int32_t>* table) {
    // In reverse, so that the next allocate hands the same ids out in the same order.
    for (auto it = table->rbegin(); it != table->rend(); ++it) {
        const int32_t id = *it;
        if (id < 0 || id >= num_blocks_ || allocated_[static_cast<size_t>(id)] == 0) continue;
        allocated_[static_cast<size_t>(id)] = 0;
        free_.push_back(id);
    }
    table->clear();
}

std::vector<LayerKvCache> KvBlockPool::views(std::span<const int32_t> block_table, int64_t num_tokens) const {
    std::vector<LayerKvCache> out(static_cast<size_t>(shape_.num_layers));
    for (int64_t l = 0; l < shape_.num_layers; ++l) {
        LayerKvCache& view = out[static_cast<size_t>(l)];
        view.block_size = block_size_;
        view.num_tokens = num_tokens;
        view.dtype = shape_.dtype;
        if (l < shape_.layers.begin || l >= shape_.layers.end()) continue;  // another pipeline stage
        view.k_pool = k_[static_cast<size_t>(l)].data();
        view.v_pool = shape_.v_width > 0 ? v_[static_cast<size_t>(l)].data() : nullptr;
        view.block_table = block_table;
        view.num_blocks = num_blocks_;
    }
    return out;
}

}  // namespace epinfer
