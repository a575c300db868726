#include "server/openai_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "engine/sampler.h"

namespace epinfer::server {

namespace {

using nlohmann::json;

std::string type_name(const json& j) {
    if (j.is_boolean()) return "a boolean";
    if (j.is_number_integer()) return "an integer";
    if (j.is_number()) return "a number";
    if (j.is_string()) return "a string";
    if (j.is_array()) return "an array";
    if (j.is_object()) return "an object";
    return "null";
}

// "'<field>' must be <want>, got <type>", with the value when it is a number (an integer past uint64 parses
// as a float: "got a number 1e+20").
Status wrong_type(const std::string& field, const std::string& want, const json& got) {
    return invalid_argument("'" + field + "' must be " + want + ", got " + type_name(got) +
                            (got.is_number() ? " " + got.dump() : ""));
}

std::string format_number(double value) {  // the shortest text that reads back as the value
    return fmt::format("{}", value);
}

// The field when present and not null.
const json* field(const json& body, const char* name) {
    const auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
}

// An integer in int64 (JSON integers above INT64_MAX are reported as out of range).
Result<int64_t> as_int64(const json& j, const std::string& name) {
    if (!j.is_number_integer()) return wrong_type(name, "an integer", j);
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return invalid_argument("'" + name + "' = " + j.dump() + " is out of range");
    return j.get<int64_t>();
}

Result<double> as_double(const json& j, const std::string& name) {
    if (!j.is_number()) return wrong_type(name, "a number", j);
    return j.get<double>();
}

Result<bool> as_bool(const json& j, const std::string& name) {
    if (!j.is_boolean()) return wrong_type(name, "a boolean", j);
    return j.get<bool>();
}

// One token id: an integer in [0, V).
Result<int32_t> as_token_id(const json& j, const std::string& name, int64_t vocab_size) {
    if (!j.is_number_integer()) return wrong_type(name, "an integer token id", j);
    const bool negative = j.is_number_integer() && !j.is_number_unsigned() && j.get<int64_t>() < 0;
    if (negative || j.get<uint64_t>() >= static_cast<uint64_t>(vocab_size))
        return invalid_argument("'" + name + "' = " + j.dump() + " is outside the vocabulary [0, " +
                                std::to_string(vocab_size) + ")");
    return static_cast<int32_t>(j.get<int64_t>());
}

Result<std::vector<int32_t>> parse_prompt(const json& body, int64_t vocab_size) {
    const json* prompt = field(body, "prompt");
    if (prompt == nullptr) return invalid_argument("'prompt' is required (an array of token ids)");
    if (prompt->is_string())
        return invalid_argument("'prompt' must be an array of token ids: this server has no tokenizer");
    if (!prompt->is_array()) return wrong_type("prompt", "an array of token ids", *prompt);
    const json* ids = prompt;
    std::string name = "prompt";
    if (!prompt->empty() && prompt->front().is_array()) {  // [[ids]]: one prompt
        if (prompt->size() != 1)
            return invalid_argument("'prompt' holds " + std::to_string(prompt->size()) +
                                    " prompts; send one prompt per request");
        ids = &prompt->front();
        name = "prompt[0]";
    }
    if (ids->empty()) return invalid_argument("'" + name + "' is empty; it needs at least one token id");
    std::vector<int32_t> out;
    out.reserve(ids->size());
    for (size_t i = 0; i < ids->size(); ++i) {
        EPI_ASSIGN_OR_RETURN(const int32_t id,
                             as_token_id((*ids)[i], name + "[" + std::to_string(i) + "]", vocab_size));
        out.push_back(id);
    }
    return out;
}

// Fields this server does not implement: accepted only at their no-op values.
Status check_unsupported(const json& body) {
    if (const json* n = field(body, "n")) {
        EPI_ASSIGN_OR_RETURN(const int64_t v, as_int64(*n, "n"));
        if (v != 1) return invalid_argument("'n' must be 1 (one completion per request), got " + std::to_string(v));
    }
    if (const json* b = field(body, "best_of")) {
        EPI_ASSIGN_OR_RETURN(const int64_t v, as_int64(*b, "best_of"));
        if (v != 1) return invalid_argument("'best_of' must be 1, got " + std::to_string(v));
    }
    if (const json* e = field(body, "echo")) {
        EPI_ASSIGN_OR_RETURN(const bool v, as_bool(*e, "echo"));
        if (v) return invalid_argument("'echo' is not supported");
    }
    if (const json* l = field(body, "logprobs")) {
        EPI_ASSIGN_OR_RETURN(const int64_t v, as_int64(*l, "logprobs"));
        if (v != 0) return invalid_argument("'logprobs' is not supported");
    }
    if (field(body, "suffix") != nullptr) return invalid_argument("'suffix' is not supported");
    // Sampling penalties and filters this server does not apply change the tokens: refused unless at
    // their neutral values (0, or 1 for the multiplicative repetition_penalty and for typical_p), so a
    // client does not get unpenalized or unfiltered tokens silently (vLLM's extra fields min_p, typical_p).
    for (const auto& [key, neutral] : {std::pair<const char*, double>{"presence_penalty", 0.0},
                                       {"frequency_penalty", 0.0},
                                       {"repetition_penalty", 1.0},
                                       {"min_p", 0.0},
                                       {"typical_p", 1.0}}) {
        if (const json* p = field(body, key)) {
            EPI_ASSIGN_OR_RETURN(const double v, as_double(*p, key));
            if (v != neutral)
                return invalid_argument("'" + std::string(key) +
                                        "' is not supported (only its neutral value)");
        }
    }
    if (const json* b = field(body, "logit_bias")) {
        if (!b->is_null() && !(b->is_object() && b->empty()))
            return invalid_argument("'logit_bias' is not supported");
    }
    if (const json* s = field(body, "stop")) {
        const bool empty = (s->is_string() && s->get_ref<const std::string&>().empty()) ||
                           (s->is_array() && s->empty());
        if (!s->is_string() && !s->is_array()) return wrong_type("stop", "a string or an array of strings", *s);
        if (!empty)
            return invalid_argument("'stop' strings need a tokenizer, which this server has not; use "
                                    "'stop_token_ids'");
    }
    return Status::ok();
}

}  // namespace

Result<CompletionRequest> parse_completion_request(std::string_view body_text, const CompletionLimits& limits,
                                                   uint64_t default_seed) {
    json body;
    try {
        body = json::parse(body_text);
    } catch (const json::exception&
                 e) {  // e.g. "[json.exception.out_of_range.406] number overflow parsing '1e400'"
        const std::string_view what = e.what();
        const size_t tag_end = what.find("] ");
        return invalid_argument(
            "the request body is not valid JSON: " +
            std::string(tag_end == std::string_view::npos ? what : what.substr(tag_end + 2)));
    }
    if (!body.is_object()) return invalid_argument("the request body must be a JSON object, got " + type_name(body));

    if (const json* model = field(body, "model")) {
        if (!model->is_string()) return wrong_type("model", "a string", *model);
        if (model->get_ref<const std::string&>() != limits.model_name)
            return not_found("the model '" + model->get<std::string>() + "' does not exist; this server serves '" +
                             limits.model_name + "'");
    }
    EPI_RETURN_IF_ERROR(check_unsupported(body));

    CompletionRequest r;
    RequestParams& p = r.params;
    EPI_ASSIGN_OR_RETURN(p.prompt_ids, parse_prompt(body, limits.vocab_size));
    const json* max_tokens = field(body, "max_tokens");
    if (max_tokens != nullptr) {
        EPI_ASSIGN_OR_RETURN(p.max_tokens, as_int64(*max_tokens, "max_tokens"));
        if (p.max_tokens < 1)
            return invalid_argument("'max_tokens' must be ≥ 1, got " + std::to_string(p.max_tokens));
    }
    const int64_t prompt_tokens = static_cast<int64_t>(p.prompt_ids.size());
    if (prompt_tokens > limits.max_context_tokens - 1)
        return invalid_argument("the prompt has " + std::to_string(prompt_tokens) +
                                " tokens; the model's context is " + std::to_string(limits.max_context_tokens) +
                                " tokens, prompt and completion together");
    // Omitted (or null): the default fitted to the room the prompt leaves (as vLLM); given: it must fit.
    if (max_tokens == nullptr)
        p.max_tokens = std::min(kDefaultMaxTokens, limits.max_context_tokens - prompt_tokens);
    if (p.max_tokens > limits.max_context_tokens - prompt_tokens)
        return invalid_argument("prompt (" + std::to_string(prompt_tokens) + " tokens) + max_tokens (" +
                                std::to_string(p.max_tokens) + ") exceeds the model's context of " +
                                std::to_string(limits.max_context_tokens) + " tokens");

    SamplingParams& s = p.sampling;
    s.temperature = 1.0;
    s.seed = default_seed;
    if (const json* t = field(body, "temperature")) {
        EPI_ASSIGN_OR_RETURN(s.temperature, as_double(*t, "temperature"));
        if (!(s.temperature >= 0.0))
            return invalid_argument("'temperature' must be ≥ 0, got " + format_number(s.temperature));
    }
    if (const json* t = field(body, "top_p")) {
        EPI_ASSIGN_OR_RETURN(s.top_p, as_double(*t, "top_p"));
        if (!(s.top_p > 0.0 && s.top_p <= 1.0))
            return invalid_argument("'top_p' must be in (0, 1], got " + format_number(s.top_p));
    }
    if (const json* t = field(body, "top_k")) {
        EPI_ASSIGN_OR_RETURN(s.top_k, as_int64(*t, "top_k"));
        if (s.top_k < -1)
            return invalid_argument("'top_k' must be ≥ -1 (-1 and 0: no top-k filter), got " +
                                    std::to_string(s.top_k));
        if (s.top_k == -1) s.top_k = 0;
    }
    if (const json* t = field(body, "seed")) {
        if (t->is_number_unsigned()) {
            s.seed = t->get<uint64_t>();  // up to 2^64 − 1, as generate's --seed
        } else {
            EPI_ASSIGN_OR_RETURN(const int64_t seed, as_int64(*t, "seed"));
            if (seed < 0)  // not a fixed seed 2^64 - 1 for -1, which other servers read as "random"
                return invalid_argument("'seed' must be ≥ 0 (omit it for a fresh seed), got " +
                                        std::to_string(seed));
            s.seed = static_cast<uint64_t>(seed);
        }
    }
    EPI_RETURN_IF_ERROR(sampling_params_check(s));

    if (const json* t = field(body, "stop_token_ids")) {
        if (!t->is_array()) return wrong_type("stop_token_ids", "an array of token ids", *t);
        for (size_t i = 0; i < t->size(); ++i) {
            EPI_ASSIGN_OR_RETURN(const int32_t id, as_token_id((*t)[i], "stop_token_ids[" + std::to_string(i) + "]",
                                                               limits.vocab_size));
            p.stop_token_ids.push_back(id);
        }
    }
    if (const json* t = field(body, "ignore_eos")) {
        EPI_ASSIGN_OR_RETURN(p.ignore_eos, as_bool(*t, "ignore_eos"));
    }
    if (const json* t = field(body, "stream")) {
        EPI_ASSIGN_OR_RETURN(r.stream, as_bool(*t, "stream"));
    }
    return r;
}

int http_status_of(const Status& status) {
    switch (status.code()) {
        case StatusCode::kInvalidArgument: return 400;
        case StatusCode::kNotFound: return 404;
        case StatusCode::kUnavailable: return 503;
        case StatusCode::kTimeout: return 504;
        default: return 500;
    }
}

nlohmann::json error_json(int http_status, const std::string& message) {
    return {{"error",
             {{"message", message},
              {"type", http_status >= 500 ? "server_error" : "invalid_request_error"},
              {"code", http_status}}}};
}

namespace {

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
}

json choice_json(const std::vector<int32_t>& token_ids, FinishReason finish) {
    return {{"index", 0},
            {"text", ""},
            {"token_ids", token_ids},
            {"logprobs", nullptr},
            {"finish_reason", finish == FinishReason::kNone ? json(nullptr) : json(finish_reason_name(finish))}};
}

}  // namespace

nlohmann::json completion_json(const CompletionIds& ids, const std::vector<int32_t>& token_ids,
                               FinishReason finish, int64_t prompt_tokens, int64_t completion_tokens) {
    return {{"id", ids.id},
            {"object", "text_completion"},
            {"created", ids.created},
            {"model", ids.model},
            {"choices", json::array({choice_json(token_ids, finish)})},
            {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

nlohmann::json stream_chunk_json(const CompletionIds& ids, const RequestOutput& output) {
    json chunk = {{"id", ids.id},
                  {"object", "text_completion"},
                  {"created", ids.created},
                  {"model", ids.model},
                  {"choices", json::array({choice_json(output.new_token_ids, output.finish)})}};
    if (output.finish != FinishReason::kNone)
        chunk["usage"] = usage_json(output.prompt_tokens, output.completion_tokens);
    return chunk;
}

std::string dump_json(const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace epinfer::server
