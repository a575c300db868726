// Batch generation on top of the serving engine (engine/engine.h): every request is queued at once, the
// first step prefills every prompt in one forward, then one decode forward per new token through the
// paged KV cache (the prefix is never recomputed); all sequences of a call share each forward.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "models/model.h"

namespace epinfer {

struct GenerateRequest {
    std::vector<int32_t> prompt_ids;  // [P] token ids, P ≥ 1
    int64_t max_new_tokens = 16;      // ≥ 1
    SamplingParams sampling;
    bool ignore_eos = false;  // false: stop after a token of config.eos_token_ids
};

struct GenerateStats {
    int64_t prefill_tokens = 0;  // Σ prompt lengths
    double prefill_seconds = 0.0;
    int64_t decode_tokens = 0;  // tokens produced by the decode forwards (one per sequence per step)
    double decode_seconds = 0.0;
    double prefill_tokens_per_s() const {
        return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0.0;
    }
    double decode_tokens_per_s() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0; }
};

struct GenerateOutput {
    std::vector<std::vector<int32_t>> output_ids;  // [num_requests][new tokens], prompt excluded
    GenerateStats stats;
};

// kInvalidArgument naming the value: an empty prompt, a prompt id outside [0, vocab_size), max_new_tokens
// < 1, prompt + max_new_tokens > max_position_embeddings, bad sampling parameters.
Status generate_request_check(const ModelConfig& config, const GenerateRequest& request);

// The KV pool of a generate() call, per rank. num_kv_blocks 0: sized for every request (those of the busiest
// attention-DP group at once), so nothing is preempted; N > 0: N blocks (requests that do not fit together
// wait or are preempted; one that does not fit alone is refused).
struct GenerateKvCache {
    DType dtype = DType::kF32;  // kF32 or kBF16
    int64_t num_kv_blocks = 0;
    int64_t block_size = 16;  // tokens per block, ≥ 1
};

// Generates for every request; output_ids[i] has max_new_tokens tokens unless request i stopped at EOS.
// Under a parallel layout (Model::parallel()) every rank calls it with the same requests: world rank 0
// drives an Engine, the others follow it (Engine::run_follower); with DP attention request i runs on
// attention-DP group i mod attn_dp; the outputs are broadcast from rank 0 so that every rank returns all
// of them. The KV pool is kv_cache's. stats: token counts of this rank's own sequences (its attention-DP
// group's), seconds as measured by rank 0 (prefill: the first step, which also samples each request's
// first token). Errors: as generate_request_check (naming the request); kInvalidArgument for a request
// of more tokens than a pool of kv_cache.num_kv_blocks > 0 holds, naming both; then those of Engine (a
// kv_cache.dtype other than kF32 and kBF16, Model::forward, the communicator, kDataLoss for non-finite
// logits).
Result<GenerateOutput> generate(Model& model, std::span<const GenerateRequest> requests,
                                const GenerateKvCache& kv_cache = {});

}  // namespace epinfer
