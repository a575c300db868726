// The KV cache of one sequence: per layer, contiguous fp32 rows [capacity, width] on the backend, grown
// by doubling (contents kept). The paged cache replaces it in a later issue.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "layers/kv_cache.h"
#include "models/model.h"

namespace epinfer {

class SequenceKvCache {
public:
    // An empty cache with room for `capacity` tokens, laid out for `model` (Model::kv_k_width/kv_v_width).
    static Result<SequenceKvCache> create(const Model& model, int64_t capacity);

    // Ensures room for num_tokens tokens (grows to max(num_tokens, 2·capacity), copying the filled rows).
    Status reserve(int64_t num_tokens);
    int64_t num_tokens() const { return layers_.empty() ? 0 : layers_.front().num_tokens; }
    int64_t capacity() const { return layers_.empty() ? 0 : layers_.front().capacity; }
    // [L] views for Model::forward.
    std::span<LayerKvCache> layers() { return layers_; }

private:
    Backend* backend_ = nullptr;
    int64_t k_width_ = 0;               // elements per token per layer
    int64_t v_width_ = 0;               // 0 = no V rows (MLA)
    std::vector<DeviceBuffer> k_, v_;   // [L] of [capacity, width] fp32
    std::vector<LayerKvCache> layers_;  // [L]
};

}  // namespace epinfer
