#include "model_layout_util.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "engine/kv_block_pool.h"

namespace epinfer {

LayoutFlags layout_flags_from_env() {
    LayoutFlags f;
    const char* text = std::getenv("EPINFER_TEST_LAYOUT");
    std::istringstream in(text != nullptr ? text : "");
    std::string flag;
    int value = 0;
    while (in >> flag >> value) {
        if (flag == "--tp") f.tp = value;
        if (flag == "--ep") f.ep = value;
        if (flag == "--dp") f.dp = value;
        if (flag == "--pp") f.pp = value;
    }
    return f;
}

Result<std::vector<float>> prefill_logits(Model& model, const std::vector<std::vector<int32_t>>& prompts) {
    constexpr int64_t kBlockSize = 4;
    int64_t rows = 0, num_blocks = 0;
    for (const auto& p : prompts) {
        rows += static_cast<int64_t>(p.size());
        num_blocks += (static_cast<int64_t>(p.size()) + kBlockSize - 1) / kBlockSize;
    }
    EPI_ASSIGN_OR_RETURN(KvBlockPool pool,
                         KvBlockPool::create(model, std::max<int64_t>(num_blocks, 1), kBlockSize));
    std::vector<std::vector<int32_t>> tables(prompts.size());
    std::vector<std::vector<LayerKvCache>> caches;
    std::vector<SequenceInput> inputs;
    for (size_t s = 0; s < prompts.size(); ++s) {
        EPI_RETURN_IF_ERROR(
            pool.allocate(pool.blocks_for(static_cast<int64_t>(prompts[s].size())), &tables[s]));
        caches.push_back(pool.views(tables[s], 0));
    }
    for (size_t s = 0; s < prompts.size(); ++s) inputs.push_back({prompts[s], caches[s]});
    std::vector<float> logits(static_cast<size_t>(rows * model.config().vocab_size));
    ForwardArgs args;
    args.sequences = inputs;
    args.logits_mode = LogitsMode::kAllRows;
    args.logits = logits.data();
    EPI_RETURN_IF_ERROR(model.forward(args));
    return logits;
}

}  // namespace epinfer
