// Pipeline stages: which decoder layers each pipeline-parallel stage runs.
//
// Contiguous layer ranges, as even as possible (sizes differ by at most one; the first
// num_hidden_layers % pp stages run the extra layer). The embedding lives on the first stage, the final
// norm and LM head on the last; a stage boundary sends the [T, H] hidden states to the next stage.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "parallel/sharding.h"

namespace epinfer {

struct PipelineStage {
    int stage = 0;
    ShardRange layers;           // decoder layers [layers.begin, layers.end())
    bool has_embedding = false;  // stage 0
    bool has_lm_head = false;    // stage pp − 1 (final norm + LM head)
    bool operator==(const PipelineStage&) const = default;
};

// The pp stages of a model with num_hidden_layers decoder layers.
// Errors: kInvalidArgument when pp < 1 or pp > num_hidden_layers (a stage without layers).
Result<std::vector<PipelineStage>> pipeline_stages(int64_t num_hidden_layers, int pp);

}  // namespace epinfer
