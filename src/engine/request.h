// What a client asks of the engine and what it gets back, one request at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace epinfer {

using RequestId = uint64_t;

struct RequestParams {
    std::vector<int32_t> prompt_ids;  // [P] token ids, 1 ≤ P, each in [0, vocab_size)
    int64_t max_tokens = 16;          // new tokens at most, ≥ 1; P + max_tokens ≤ max_position_embeddings
    SamplingParams sampling;          // per request (temperature 0 = greedy)
    std::vector<int32_t> stop_token_ids;  // stop after producing one of these (the stop token is returned)
    bool ignore_eos = false;              // false: also stop after an id of ModelConfig::eos_token_ids
};

enum class FinishReason {
    kNone,     // still running
    kLength,   // produced max_tokens
    kStop,     // produced an EOS or stop token id
    kAborted,  // cancelled by the client (Engine::abort)
};

// "length", "stop", "abort", or "" for kNone (the OpenAI finish_reason strings).
const char* finish_reason_name(FinishReason reason);

// The tokens a request produced in one engine step (usually one), and whether it is done.
struct RequestOutput {
    RequestId id = 0;
    std::vector<int32_t> new_token_ids;  // produced in this step, in order (may be empty when aborted)
    FinishReason finish = FinishReason::kNone;
    int64_t prompt_tokens = 0;      // P
    int64_t completion_tokens = 0;  // tokens produced so far, this step's included
};

}  // namespace epinfer
