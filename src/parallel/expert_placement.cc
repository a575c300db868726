#include "parallel/expert_placement.h"

#include <fmt/format.h>

#include <algorithm>

#include "parallel/sharding.h"

namespace epinfer {

Result<ExpertPlacement> ExpertPlacement::contiguous(int64_t num_experts, int ep_size) {
    if (ep_size < 1)
        return invalid_argument(fmt::format("expert placement: ep {} must be at least 1", ep_size));
    if (num_experts < 1 || num_experts > INT32_MAX) {
        return invalid_argument(
            fmt::format("expert placement: {} routed experts (need 1 to 2^31 − 1)", num_experts));
    }
    if (ep_size > num_experts) {
        return invalid_argument(
            fmt::format("expert placement: ep {} exceeds the {} routed experts", ep_size, num_experts));
    }
    ExpertPlacement placement;
    placement.replicas_.resize(static_cast<size_t>(num_experts));
    placement.slots_.resize(static_cast<size_t>(ep_size));
    for (int r = 0; r < ep_size; ++r) {
        const ShardRange block = split_evenly(num_experts, ep_size, r);
        for (int64_t e = block.begin; e < block.end(); ++e) {
            const int slot = static_cast<int>(e - block.begin);
            placement.replicas_[static_cast<size_t>(e)].push_back({r, slot});
            placement.slots_[static_cast<size_t>(r)].push_back(static_cast<int32_t>(e));
        }
    }
    return placement;
}

int ExpertPlacement::max_local_slots() const {
    size_t most = 0;
    for (const auto& slots : slots_) most = std::max(most, slots.size());
    return static_cast<int>(most);
}

}  // namespace epinfer
