#include "planner/fit_check.h"

#include <fmt/format.h>

#include <cmath>

#include "planner/layouts.h"

namespace epinfer::planner {

Result<MemoryPlan> check_fits(const ModelConfig& config, const ParallelLayout& layout, const FitOptions& options) {
    if (options.device_bytes <= 0)
        return invalid_argument(fmt::format("memory check: {} reports {} bytes of memory", options.device,
                                            options.device_bytes));
    if (!(options.usable_fraction > 0.0 && options.usable_fraction <= 1.0))
        return invalid_argument(
            fmt::format("memory check: usable fraction {:g} is not in (0, 1]", options.usable_fraction));
    if (options.memory.context_tokens < 1)
        return invalid_argument(fmt::format("memory check: context of {} tokens is not >= 1",
                                            options.memory.context_tokens));

    GpuSpec device;
    device.name = options.device;
    device.memory_bytes.value = static_cast<double>(options.device_bytes);
    device.usable_memory_fraction.value = options.usable_fraction;
    MemoryPlan plan = plan_memory(config, layout, device, options.memory);
    if (plan.fits) return plan;

    const StageMemory& s = plan.worst();
    const int64_t buffers = s.ep_buffer_bytes + s.cuda_graph_bytes;
    const int64_t one_request = options.memory.context_tokens * s.kv_bytes_per_token;
    const int64_t need = s.weights.total() + buffers + s.activation_bytes + one_request;
    const std::string where =
        plan.stages.size() > 1 ? fmt::format(" (stage {} of {})", s.stage, plan.stages.size()) : "";
    const bool kv_largest = one_request > plan.largest_term_bytes;
    return Status(StatusCode::kOutOfMemory,
                  fmt::format("{} does not fit: per rank{}, weights {} + buffers {} + activations {} + KV of {} "
                              "tokens ({}) {} = {} > usable {} = {:g} × {} ({}); largest term: {} {}",
                              layout_spec(layout), where, format_bytes(s.weights.total()), format_bytes(buffers),
                              format_bytes(s.activation_bytes), options.memory.context_tokens,
                              options.kv_tokens_source.empty() ? "one request" : options.kv_tokens_source,
                              format_bytes(one_request), format_bytes(need), format_bytes(plan.usable_bytes),
                              options.usable_fraction, format_bytes(options.device_bytes), options.device,
                              kv_largest ? "KV" : plan.largest_term,
                              format_bytes(kv_largest ? one_request : plan.largest_term_bytes)));
}

}  // namespace epinfer::planner
