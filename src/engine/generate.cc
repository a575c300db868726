#include "engine/generate.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <string>

#include "engine/kv_cache.h"

namespace epinfer {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The number of sequences still active on any rank (this rank's count without a layout).
Result<int64_t> active_anywhere(const ParallelContext* par, size_t num_active) {
    int64_t n = static_cast<int64_t>(num_active);
    if (par == nullptr || par->world->size() == 1) return n;
    EPI_RETURN_IF_ERROR(par->world->all_reduce(&n, &n, 1, DType::kI64, ReduceOp::kMax));
    return n;
}

// Under DP attention each request's tokens live on the ranks of its DP group: gathers them to every
// rank (each request's row padded with −1; the ranks that hold a request agree on its tokens).
Status gather_outputs(const ParallelContext& par, std::span<const GenerateRequest> requests,
                      std::vector<std::vector<int32_t>>& output_ids) {
    int64_t width = 0;
    for (const GenerateRequest& r : requests) width = std::max(width, r.max_new_tokens);
    std::vector<int32_t> table(requests.size() * static_cast<size_t>(width), -1);  // [N, width]
    for (size_t i = 0; i < requests.size(); ++i)
        std::copy(output_ids[i].begin(), output_ids[i].end(),
                  table.begin() + static_cast<int64_t>(i) * width);
    EPI_RETURN_IF_ERROR(par.world->all_reduce(table.data(), table.data(), static_cast<int64_t>(table.size()),
                                              DType::kI32, ReduceOp::kMax));
    for (size_t i = 0; i < requests.size(); ++i) {
        output_ids[i].clear();
        for (int64_t j = 0; j < width; ++j) {
            const int32_t token = table[i * static_cast<size_t>(width) + static_cast<size_t>(j)];
            if (token < 0) break;
            output_ids[i].push_back(token);
        }
    }
    return Status::ok();
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
    const ParallelContext* par = model.parallel();
    const size_t dp = par != nullptr ? static_cast<size_t>(par->layout.attn_dp) : 1;
    const size_t dp_rank = par != nullptr ? static_cast<size_t>(par->coords.attn_dp_rank) : 0;
    GenerateOutput out;
    out.output_ids.resize(requests.size());
    std::vector<ActiveSequence> active;
    for (size_t i = 0; i < requests.size(); ++i) {
        EPI_RETURN_IF_ERROR_CTX(generate_request_check(config, requests[i]), "request " + std::to_string(i));
    }
    for (size_t i = 0; i < requests.size(); ++i) {
        if (i % dp != dp_rank) continue;  // DP attention: request i lives on DP group i mod attn_dp
        const int64_t capacity =
            static_cast<int64_t>(requests[i].prompt_ids.size()) + requests[i].max_new_tokens;
        EPI_ASSIGN_OR_RETURN(SequenceKvCache cache, SequenceKvCache::create(model, capacity));
        active.push_back({i, std::move(cache), Sampler(requests[i].sampling), 0});
    }
    if (requests.empty()) return out;

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
            const std::span<const float> row(logits.data() + s * V, V);
            const auto bad = std::find_if(row.begin(), row.end(), [](float x) { return !std::isfinite(x); });
            if (bad != row.end()) {
                return Status(StatusCode::kDataLoss,
                              "request " + std::to_string(a.request_idx) + ", new token " +
                                  std::to_string(out.output_ids[a.request_idx].size()) + ": logit of token " +
                                  std::to_string(bad - row.begin()) + " is " + std::to_string(*bad) +
                                  " (non-finite: do the checkpoint's weights hold NaN or inf?)");
            }
            const int32_t token = a.sampler.sample(row);
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
    // Every rank runs the same number of forwards (their collectives must match), also with no sequence.
    for (;;) {
        EPI_ASSIGN_OR_RETURN(const int64_t anywhere, active_anywhere(par, active.size()));
        if (anywhere == 0) break;
        out.stats.decode_tokens += static_cast<int64_t>(active.size());
        EPI_RETURN_IF_ERROR(step(false));
    }
    out.stats.decode_seconds = seconds_since(start);
    if (dp > 1) EPI_RETURN_IF_ERROR(gather_outputs(*par, requests, out.output_ids));
    return out;
}

}  // namespace epinfer
