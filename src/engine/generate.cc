#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/kv_cache.h"

namespace epinfer {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct ActiveSequence {
    size_t request_idx = 0;
    SequenceKvCache cache;
    Sampler sampler;
    int32_t next_token = 0;
};

}  // namespace

Status generate_request_check(const ModelConfig& config, const GenerateRequest& r) {
    if (r.prompt_ids.empty()) return invalid_argument("prompt_ids is empty");
    for (const int32_t id : r.prompt_ids) {
        if (id < 0 || id >= config.vocab_size) {
            return invalid_argument("prompt id " + std::to_string(id) + " is outside [0, vocab_size " +
                                    std::to_string(config.vocab_size) + ")");
        }
    }
    if (r.max_new_tokens < 1) {
        return invalid_argument("max_new_tokens must be ≥ 1, got " + std::to_string(r.max_new_tokens));
    }
    const int64_t total = static_cast<int64_t>(r.prompt_ids.size()) + r.max_new_tokens;
    if (total > config.max_position_embeddings) {
        return invalid_argument("prompt of " + std::to_string(r.prompt_ids.size()) +
                                " tokens + max_new_tokens " + std::to_string(r.max_new_tokens) + " = " +
                                std::to_string(total) + " exceeds max_position_embeddings " +
                                std::to_string(config.max_position_embeddings));
    }
    return sampling_params_check(r.sampling);
}

Result<GenerateOutput> generate(Model& model, std::span<const GenerateRequest> requests) {
    const ModelConfig& config = model.config();
    const auto V = static_cast<size_t>(config.vocab_size);
    GenerateOutput out;
    out.output_ids.resize(requests.size());
    std::vector<ActiveSequence> active;
    for (size_t i = 0; i < requests.size(); ++i) {
        EPI_RETURN_IF_ERROR_CTX(generate_request_check(config, requests[i]), "request " + std::to_string(i));
        const int64_t capacity =
            static_cast<int64_t>(requests[i].prompt_ids.size()) + requests[i].max_new_tokens;
        EPI_ASSIGN_OR_RETURN(SequenceKvCache cache, SequenceKvCache::create(model, capacity));
        active.push_back({i, std::move(cache), Sampler(requests[i].sampling), 0});
    }
    if (active.empty()) return out;

    std::vector<float> logits;
    std::vector<SequenceInput> inputs;
    // Runs one forward over `active` (prompts on the first step, else each sequence's last token), samples
    // one token per sequence, and drops the sequences that are done.
    const auto step = [&](bool prefill) -> Status {
        inputs.clear();
        for (ActiveSequence& a : active) {
            const GenerateRequest& r = requests[a.request_idx];
            inputs.push_back({prefill ? std::span<const int32_t>(r.prompt_ids)
                                      : std::span<const int32_t>(&a.next_token, 1),
                              a.cache.layers()});
        }
        logits.resize(active.size() * V);
        ForwardArgs args;
        args.sequences = inputs;
        args.logits_mode = LogitsMode::kLastRowPerSequence;
        args.logits = logits.data();
        EPI_RETURN_IF_ERROR(model.forward(args));
        std::vector<ActiveSequence> still;
        for (size_t s = 0; s < active.size(); ++s) {
            ActiveSequence& a = active[s];
            const GenerateRequest& r = requests[a.request_idx];
            const int32_t token = a.sampler.sample(std::span<const float>(logits.data() + s * V, V));
            std::vector<int32_t>& produced = out.output_ids[a.request_idx];
            produced.push_back(token);
            const bool eos =
                !r.ignore_eos && std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(),
                                           static_cast<int64_t>(token)) != config.eos_token_ids.end();
            if (eos || static_cast<int64_t>(produced.size()) >= r.max_new_tokens) continue;
            a.next_token = token;
            still.push_back(std::move(a));
        }
        active = std::move(still);
        return Status::ok();
    };

    auto start = std::chrono::steady_clock::now();
    for (const ActiveSequence& a : active)
        out.stats.prefill_tokens += static_cast<int64_t>(requests[a.request_idx].prompt_ids.size());
    EPI_RETURN_IF_ERROR(step(true));
    out.stats.prefill_seconds = seconds_since(start);
    start = std::chrono::steady_clock::now();
    while (!active.empty()) {
        out.stats.decode_tokens += static_cast<int64_t>(active.size());
        EPI_RETURN_IF_ERROR(step(false));
    }
    out.stats.decode_seconds = seconds_since(start);
    return out;
}

}  // namespace epinfer
