#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/engine.h"

namespace epinfer {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The driver's outputs and timings to every rank: [N] lengths, the tokens, then the two timings.
Status broadcast_outputs(Communicator& world, GenerateOutput& out) {
    const size_t n = out.output_ids.size();
    std::vector<int64_t> lengths(n);
    for (size_t i = 0; i < n; ++i) lengths[i] = static_cast<int64_t>(out.output_ids[i].size());
    EPI_RETURN_IF_ERROR(world.broadcast(lengths.data(), static_cast<int64_t>(n), DType::kI64, 0));
    std::vector<int32_t> flat;
    for (const auto& ids : out.output_ids) flat.insert(flat.end(), ids.begin(), ids.end());
    int64_t total = 0;
    for (const int64_t len : lengths) total += len;
    flat.resize(static_cast<size_t>(total));
    EPI_RETURN_IF_ERROR(world.broadcast(flat.data(), total, DType::kI32, 0));
    double seconds[2] = {out.stats.prefill_seconds, out.stats.decode_seconds};
    EPI_RETURN_IF_ERROR(world.broadcast(seconds, 2, DType::kF64, 0));
    size_t pos = 0;
    for (size_t i = 0; i < n; ++i) {
        out.output_ids[i].assign(flat.begin() + static_cast<int64_t>(pos),
                                 flat.begin() + static_cast<int64_t>(pos) + lengths[i]);
        pos += static_cast<size_t>(lengths[i]);
    }
    out.stats.prefill_seconds = seconds[0];
    out.stats.decode_seconds = seconds[1];
    return Status::ok();
}

// Driver: queues every request, steps until all are done. The first step prefills every prompt (the
// budget holds them all) and samples the first tokens; the rest are decode steps.
Status drive(Engine& engine, std::span<const GenerateRequest> requests, GenerateOutput& out) {
    std::vector<RequestId> ids;
    for (const GenerateRequest& r : requests) {
        RequestParams p;
        p.prompt_ids = r.prompt_ids;
        p.max_tokens = r.max_new_tokens;
        p.sampling = r.sampling;
        p.ignore_eos = r.ignore_eos;
        EPI_ASSIGN_OR_RETURN(const RequestId id, engine.add_request(p));
        ids.push_back(id);
    }
    // Ids are 1, 2, ... in call order (engine.h).
    const RequestId first = ids.front();
    bool prefill = true;
    auto start = std::chrono::steady_clock::now();
    while (engine.has_unfinished()) {
        EPI_ASSIGN_OR_RETURN(const std::vector<RequestOutput> outputs, engine.step());
        for (const RequestOutput& o : outputs) {
            std::vector<int32_t>& dst = out.output_ids[static_cast<size_t>(o.id - first)];
            dst.insert(dst.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        }
        if (prefill) {
            out.stats.prefill_seconds = seconds_since(start);
            start = std::chrono::steady_clock::now();
            prefill = false;
        }
    }
    out.stats.decode_seconds = seconds_since(start);
    return Status::ok();
}

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
    const auto prompt_len = static_cast<int64_t>(r.prompt_ids.size());
    if (r.max_new_tokens > config.max_position_embeddings - prompt_len) {
        return invalid_argument(
            "prompt of " + std::to_string(prompt_len) + " tokens + max_new_tokens " +
            std::to_string(r.max_new_tokens) + " = " +
            std::to_string(prompt_len + std::min(r.max_new_tokens, INT64_MAX - prompt_len)) +
            " exceeds max_position_embeddings " + std::to_string(config.max_position_embeddings));
    }
    return sampling_params_check(r.sampling);
}

Result<GenerateOutput> generate(Model& model, std::span<const GenerateRequest> requests,
                                const GenerateKvCache& kv_cache) {
    const ParallelContext* par = model.parallel();
    const bool multi_rank = par != nullptr && par->world->size() > 1;
    const bool driver = par == nullptr || par->world->rank() == 0;
    const int64_t dp = par != nullptr ? par->layout.attn_dp : 1;
    const int64_t dp_rank = par != nullptr ? par->coords.attn_dp_rank : 0;
    if (kv_cache.block_size < 1)
        return invalid_argument("KV block size must be ≥ 1, got " + std::to_string(kv_cache.block_size));
    const int64_t block_size = kv_cache.block_size;
    for (size_t i = 0; i < requests.size(); ++i) {
        EPI_RETURN_IF_ERROR_CTX(generate_request_check(model.config(), requests[i]),
                                "request " + std::to_string(i));
        const int64_t prompt_len = static_cast<int64_t>(requests[i].prompt_ids.size());
        const int64_t tokens = prompt_len + requests[i].max_new_tokens;
        if (kv_cache.num_kv_blocks > 0 && (tokens + block_size - 1) / block_size > kv_cache.num_kv_blocks) {
            return invalid_argument(
                "request " + std::to_string(i) + ": prompt of " + std::to_string(prompt_len) +
                " tokens + max_new_tokens " + std::to_string(requests[i].max_new_tokens) + " = " +
                std::to_string(tokens) + " tokens exceed the KV pool of " +
                std::to_string(kv_cache.num_kv_blocks * block_size) + " tokens (num_kv_blocks " +
                std::to_string(kv_cache.num_kv_blocks) + " × block_size " + std::to_string(block_size) + ")");
        }
    }
    GenerateOutput out;
    out.output_ids.resize(requests.size());
    if (requests.empty()) return out;

    // The engine puts request i on attention-DP group i mod attn_dp (all are queued before the first
    // step; fewest running + waiting, ties to the lowest group). Its budget holds every prompt, so the
    // first step prefills all, and, unless kv_cache sets the pool, its pool every request of the busiest
    // group, so nothing is preempted.
    std::vector<int64_t> group_blocks(static_cast<size_t>(dp), 0);
    EngineOptions options;
    options.block_size = block_size;
    options.max_step_tokens = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
        const int64_t tokens =
            static_cast<int64_t>(requests[i].prompt_ids.size()) + requests[i].max_new_tokens;
        group_blocks[i % static_cast<size_t>(dp)] += (tokens + block_size - 1) / block_size;
        options.max_step_tokens += static_cast<int64_t>(requests[i].prompt_ids.size());
    }
    options.num_kv_blocks = kv_cache.num_kv_blocks > 0
                                ? kv_cache.num_kv_blocks
                                : *std::max_element(group_blocks.begin(), group_blocks.end());
    options.max_running = static_cast<int64_t>(requests.size());
    options.max_step_tokens += options.max_running;
    options.max_waiting = static_cast<int64_t>(requests.size());
    options.kv_cache_dtype = kv_cache.dtype;
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(model, options));

    if (driver) {
        const Status driven = drive(*engine, requests, out);
        const Status shut = engine->shutdown();  // no message after a failed step (engine.h)
        EPI_RETURN_IF_ERROR(driven);
        EPI_RETURN_IF_ERROR(shut);
    } else {
        EPI_RETURN_IF_ERROR(engine->run_follower());
    }
    if (multi_rank) EPI_RETURN_IF_ERROR_CTX(broadcast_outputs(*par->world, out), "generate outputs");

    // Stats of this rank's own sequences (its attention-DP group's); the first token of each comes from
    // the prefill step, the others from decode steps.
    for (size_t i = 0; i < requests.size(); ++i) {
        if (static_cast<int64_t>(i) % dp != dp_rank) continue;
        out.stats.prefill_tokens += static_cast<int64_t>(requests[i].prompt_ids.size());
        out.stats.decode_tokens += std::max<int64_t>(static_cast<int64_t>(out.output_ids[i].size()) - 1, 0);
    }
    return out;
}

}  // namespace epinfer
