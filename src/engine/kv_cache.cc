#include "engine/kv_cache.h"

#include <algorithm>

namespace epinfer {

Result<SequenceKvCache> SequenceKvCache::create(const Model& model, int64_t capacity) {
    SequenceKvCache cache;
    cache.backend_ = &model.backend();
    cache.k_width_ = model.kv_k_width();
    cache.v_width_ = model.kv_v_width();
    const auto num_layers = static_cast<size_t>(model.config().num_hidden_layers);
    cache.k_.resize(num_layers);
    cache.v_.resize(num_layers);
    cache.layers_.resize(num_layers);
    EPI_RETURN_IF_ERROR(cache.reserve(std::max<int64_t>(capacity, 1)));
    return cache;
}

Status SequenceKvCache::reserve(int64_t num_tokens) {
    if (num_tokens <= capacity()) return Status::ok();
    const int64_t new_capacity = std::max(num_tokens, 2 * capacity());
    for (size_t l = 0; l < layers_.size(); ++l) {
        LayerKvCache& view = layers_[l];
        EPI_ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::alloc_f32(*backend_, new_capacity * k_width_));
        EPI_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::alloc_f32(*backend_, new_capacity * v_width_));
        EPI_RETURN_IF_ERROR(backend_->copy_on_device(
            k.data(), k_[l].data(), static_cast<size_t>(view.num_tokens * k_width_) * sizeof(float)));
        EPI_RETURN_IF_ERROR(backend_->copy_on_device(
            v.data(), v_[l].data(), static_cast<size_t>(view.num_tokens * v_width_) * sizeof(float)));
        k_[l] = std::move(k);
        v_[l] = std::move(v);
        view.k = k_[l].f32();
        view.v = v_width_ > 0 ? v_[l].f32() : nullptr;
        view.capacity = new_capacity;
    }
    return Status::ok();
}

}  // namespace epinfer
