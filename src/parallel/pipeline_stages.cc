#include "parallel/pipeline_stages.h"

#include <fmt/format.h>

namespace epinfer {

Result<std::vector<PipelineStage>> pipeline_stages(int64_t num_hidden_layers, int pp) {
    if (pp < 1) return invalid_argument(fmt::format("pipeline: pp {} must be at least 1", pp));
    if (pp > num_hidden_layers) {
        return invalid_argument(
            fmt::format("pipeline: pp {} exceeds num_hidden_layers {}", pp, num_hidden_layers));
    }
    std::vector<PipelineStage> stages;
    for (int s = 0; s < pp; ++s) {
        stages.push_back({s, split_evenly(num_hidden_layers, pp, s), s == 0, s == pp - 1});
    }
    return stages;
}

}  // namespace epinfer
