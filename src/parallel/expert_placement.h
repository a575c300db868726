// ExpertPlacement: which EP rank holds each routed expert, and in which local slot.
//
// One table, global expert → replicas (ep_rank, local_slot), plus its inverse, ep_rank → global expert of
// each local slot. The default is contiguous blocks (DeepSeek/SGLang/vLLM): rank r holds experts
// [begin_r, end_r), slot i = expert begin_r + i. E need not divide by ep: blocks differ by at most one and
// the first E % ep ranks hold the extra expert (16 experts over 3 ranks: 6, 5, 5).
// Every expert has one replica today; redundant replicas (EPLB) append to an expert's replica list and
// give ranks extra slots, without changing the shape of the table.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace epinfer {

struct ExpertReplica {
    int ep_rank = 0;
    int local_slot = 0;
    bool operator==(const ExpertReplica&) const = default;
};

class ExpertPlacement {
public:
    // Contiguous blocks of num_experts over ep_size ranks.
    // Errors: kInvalidArgument when ep_size < 1, num_experts < 1, or ep_size > num_experts.
    static Result<ExpertPlacement> contiguous(int64_t num_experts, int ep_size);

    int num_experts() const { return static_cast<int>(replicas_.size()); }
    int ep_size() const { return static_cast<int>(slots_.size()); }
    // Every replica of `expert` (0 ≤ expert < E), at least one; [0] is the primary.
    std::span<const ExpertReplica> replicas(int expert) const {
        return replicas_[static_cast<size_t>(expert)];
    }
    const ExpertReplica& primary(int expert) const { return replicas_[static_cast<size_t>(expert)][0]; }
    // The global expert id held in each local slot of `ep_rank`: [num_local_slots(ep_rank)] int32.
    std::span<const int32_t> local_experts(int ep_rank) const { return slots_[static_cast<size_t>(ep_rank)]; }
    int num_local_slots(int ep_rank) const {
        return static_cast<int>(slots_[static_cast<size_t>(ep_rank)].size());
    }
    // The largest num_local_slots over ranks (sizes per-rank expert buffers).
    int max_local_slots() const;

private:
    std::vector<std::vector<ExpertReplica>> replicas_;  // [E] → replicas
    std::vector<std::vector<int32_t>> slots_;           // [ep] → global expert per local slot
};

}  // namespace epinfer
