// The memory check the runtime runs before it allocates anything (issue 6 item 6): the planner's own
// memory model (plan_memory, planner/memory_model.h) on the device one rank actually has.
//
//   usable = device_bytes · usable_fraction
//   a layout fits when, on every pipeline stage, weights + buffers (EP buffers, CUDA-graph reserve)
//   + activations + the KV of one request of memory.context_tokens ≤ usable;
//   the KV cache may then hold kv_tokens_per_rank = ⌊(usable − weights − buffers − activations) /
//   KV bytes per token⌋ tokens on every rank (the minimum over stages).
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/model_config.h"
#include "core/status.h"
#include "parallel/layout.h"
#include "planner/memory_model.h"

namespace epinfer::planner {

struct FitOptions {
    int64_t device_bytes = 0;      // memory of one rank's device: GPU free memory, or its share of the host's
    double usable_fraction = 0.9;  // of device_bytes epinfer may use, in (0, 1]
    std::string device;            // names the device in the message, e.g. "cuda:0: free memory"
    MemoryOptions memory;          // formats, context_tokens (KV that must fit), KV/activation bytes, buffers
    std::string kv_tokens_source;  // why context_tokens, for the message, e.g. "one request of
                                   // max_position_embeddings"; empty = "one request"
};

// The plan of `layout` (validated against `config` by the caller) on one device of options.device_bytes;
// plan.kv_tokens_per_rank is what the KV cache may hold, plan.worst() the stage with the least room.
// Errors: kInvalidArgument for device_bytes ≤ 0, a fraction outside (0, 1] or context_tokens < 1;
// kOutOfMemory, one line with the worst stage's breakdown, e.g.
//   "tp1 does not fit: per rank, weights 2.1 MiB + buffers 0 B + activations 9.3 MiB + KV of 512 tokens
//    (one request) 1.2 MiB = 12.6 MiB > usable 1.0 KiB = 1e-06 × 1.0 GiB (cpu: MemAvailable); largest
//    term: activations 9.3 MiB" (the largest of the weight parts, buffers, activations and the KV)
Result<MemoryPlan> check_fits(const ModelConfig& config, const ParallelLayout& layout, const FitOptions& options);

}  // namespace epinfer::planner
