// The planner: every layout of N GPUs for a model on a machine, its memory plan, decode steps at each
// concurrency and prefill, the recommended layout per concurrency and the terms that decide it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "core/status.h"
#include "parallel/layout.h"
#include "planner/cost_model.h"
#include "planner/engine_facts.h"
#include "planner/hardware_profile.h"
#include "planner/memory_model.h"
#include "planner/model_costs.h"

namespace epinfer::planner {

// The most tokens per step a plan takes (--max-step-tokens): the engine's buffers are sized by it.
inline constexpr int64_t kMaxPlanStepTokens = int64_t{1} << 20;

struct PlanRequest {
    std::string model_label;  // shown in reports, e.g. the config file's name
    int gpus = 0;             // all GPUs of the run
    int nodes = 1;            // the GPUs split evenly over this many nodes
    std::vector<int64_t> concurrency = {1, 8, 32, 64, 256, 1024};
    int64_t input_len = 2048;  // prompt tokens for the prefill estimate and the closed loop
    int64_t output_len = 0;    // > 0: TPOT of a closed-loop run (cost_model.h ClosedLoopResult)
    int64_t max_step_tokens = kEngineMaxStepTokens;  // the engine's --max-step-tokens (closed loop)
    int micro_batches = 0;                           // pipeline micro-batches; 0 = pp
    MemoryOptions memory;                            // weights, context, KV dtype, buffers
    // The share of gpu.memory_bytes the plan may use (`--memory-fraction`, as serve's); unset: the
    // profile's gpu.usable_memory_fraction.
    std::optional<double> memory_fraction;
    // The engine's KV rule (`--kv-cache-tokens`, as serve's), when set: a layout fits when the runtime's
    // check (fit_check.h check_fits) passes with the KV of kv_cache_tokens tokens, or of one request of
    // max_position_embeddings when it is 0, and its KV pool per rank holds kv_cache_tokens (0: what is
    // left). Unset: a layout fits when one request of memory.context_tokens does; the pool is what is left.
    std::optional<int64_t> kv_cache_tokens;
    std::vector<ParallelLayout> layouts;             // empty = every layout enumerate_layouts() finds
    // layouts[i] as the user wrote it (e.g. "pp1" for tp1), for the errors that name it; missing entries:
    // layout_spec's name.
    std::vector<std::string> layout_names;
};

struct LayoutPlan {
    ParallelLayout layout;
    std::string spec;  // layout_spec(), e.g. "dp8-ep8"
    MemoryPlan memory;  // with kv_cache_tokens set: kv_tokens_per_rank is the engine's pool
    std::string refusal;  // kv_cache_tokens set and no fit: the runtime's one-line refusal (check_fits)
    std::vector<DecodeResult> decode;  // one per PlanRequest::concurrency
    PrefillResult prefill;
};

struct Recommendation {
    int64_t concurrency = 0;
    int layout = -1;     // index into Plan::layouts; −1 = nothing fits at this concurrency
    int runner_up = -1;  // the next best that fits, −1 = none
    std::string reason;  // one or two deciding terms, in words with numbers
};

struct Plan {
    PlanRequest request;
    ModelCosts model;
    std::string model_type;
    HardwareProfile hardware;
    std::vector<LayoutPlan> layouts;
    std::vector<Recommendation> recommendations;  // one per concurrency
    bool any_fits = false;
    std::string memory_verdict;  // when nothing fits: why, naming the largest term
    // Figures the plan extended past what the profile measured: a collective at a rank count for which
    // the profile has tables at other counts only, priced from its fitted latency and bus bandwidth.
    std::vector<std::string> notes;
};

// Errors: kInvalidArgument, one line naming the flag and value, for gpus < 1, nodes < 1, GPUs that do not
// split evenly over the nodes or exceed the profile's gpus_per_node, several nodes on a profile without an
// inter-node link, a concurrency, context or input length < 1, an output length of 1 or < 0, a
// max_step_tokens < 1, a memory_fraction outside (0, 1], a kv_cache_tokens < 0, a requested layout the
// model or the GPU
// count does not admit (validate_layout's message), or no admissible layout at all.
Result<Plan> make_plan(const ModelConfig& config, const HardwareProfile& hardware,
                       const PlanRequest& request);

// Tokens per second as the report prints them: whole numbers from 10 on, two significant digits below (a
// plan of tiny steps would otherwise read "0 tok/s" where work is done).
std::string format_tokens_per_s(double tokens_per_s);

// The deciding terms of `winner` over `loser` at one concurrency, e.g.
// "loses at C=1: 122 all_reduce × 24.6 µs = 3.0 ms per step (dp8-ep8: 120 all_to_all × 31.0 µs = 3.7 ms)";
// within 1 % of the winner's tokens/s, "ties with dp8-ep8 at C=1 (within 1 %); the term that tips it: …".
std::string explain_difference(const LayoutPlan& winner, const DecodeResult& win, const LayoutPlan& loser,
                               const DecodeResult& lose);

}  // namespace epinfer::planner
