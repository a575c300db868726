// The OpenAI completions protocol over token ids: the JSON body of POST /v1/completions → RequestParams,
// and the JSON objects the server answers with (a completion, a stream chunk, an error).
//
// Request body (unknown fields are ignored):
//   prompt          [P] token ids, or [[P] token ids] (one prompt); required, 1 ≤ P, each in [0, V)
//   model           string; when given it must be the served model's name (else 404)
//   max_tokens      integer ≥ 1; P + max_tokens ≤ the model's context (else 400); omitted or null:
//                   min(kDefaultMaxTokens = 16, the room left in the context), as vLLM
//   temperature     number ≥ 0 (default 1, as OpenAI; 0 = greedy)
//   top_p           number in (0, 1] (default 1)
//   top_k           integer ≥ −1 (default 0; 0 and −1 = no top-k filter)
//   seed            integer in [0, 2^64 − 1] (default: a fresh seed per request)
//   stop_token_ids  [token ids] (default []): stop after producing one of them (it is returned)
//   ignore_eos      bool (default false)
//   stream          bool (default false): server-sent events, one chunk per engine step
// Rejected with 400 because this server has no tokenizer or does not implement them: a string prompt,
// several prompts, "stop" strings, n ≠ 1, best_of ≠ 1, echo, logprobs, suffix, and penalties or filters
// away from their neutral values (presence_penalty, frequency_penalty, min_p 0; repetition_penalty,
// typical_p 1; logit_bias empty).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/request.h"

namespace epinfer::server {

// max_tokens when a request omits it, cut to the room its prompt leaves in the context.
constexpr int64_t kDefaultMaxTokens = 16;

// What the request is checked against.
struct CompletionLimits {
    std::string model_name;              // the served model's name
    int64_t vocab_size = 0;              // V
    int64_t max_context_tokens = 0;      // max_position_embeddings
};

struct CompletionRequest {
    RequestParams params;
    bool stream = false;
};

// Parses and checks a request body. `default_seed` is used when the body has no seed.
// Errors: kInvalidArgument (HTTP 400) naming the field: malformed JSON, a body that is not an object, a
// field of the wrong type, a missing or empty prompt, a token id outside [0, V), max_tokens < 1, a prompt
// that leaves no room in the context, prompt + a given max_tokens longer than the context, a bad sampling
// value, an unsupported field; kNotFound (HTTP 404) when "model" names another model.
Result<CompletionRequest> parse_completion_request(std::string_view body, const CompletionLimits& limits,
                                                   uint64_t default_seed);

// The HTTP status of a Status of the server or the engine: kInvalidArgument 400, kNotFound 404,
// kUnavailable 503, kTimeout 504, anything else 500.
int http_status_of(const Status& status);

// {"error": {"message": ..., "type": ..., "code": http_status}}; type is "invalid_request_error" for a
// 4xx status and "server_error" for a 5xx one.
nlohmann::json error_json(int http_status, const std::string& message);

// Fields every response object of one request shares.
struct CompletionIds {
    std::string id;     // "cmpl-..."
    int64_t created = 0;  // Unix seconds
    std::string model;
};

// The non-streaming response: {id, object: "text_completion", created, model, choices: [{index: 0,
// text: "", token_ids, finish_reason, logprobs: null}], usage: {prompt_tokens, completion_tokens,
// total_tokens}}.
nlohmann::json completion_json(const CompletionIds& ids, const std::vector<int32_t>& token_ids,
                               FinishReason finish, int64_t prompt_tokens, int64_t completion_tokens);

// One stream chunk: like completion_json with this step's token ids; finish_reason is null until the
// last chunk, which also carries usage.
nlohmann::json stream_chunk_json(const CompletionIds& ids, const RequestOutput& output);

// JSON text that never throws (invalid UTF-8 in strings is replaced).
std::string dump_json(const nlohmann::json& j);

}  // namespace epinfer::server
