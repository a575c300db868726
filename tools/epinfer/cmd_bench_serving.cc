// epinfer bench (no subcommand): the serving benchmark. For each concurrency level C it keeps C requests
// of --input-len random prompt ids in flight until --num-prompts of them have produced exactly
// --output-len tokens each (ignore_eos; greedy, temperature 0), and prints
// one table row per level: requests, duration, output and total tok/s, TTFT and TPOT p50/p99
// (definitions: src/engine/bench_serving.h). --json also writes them with the command line, model,
// layout and date.
//
// Offline (default): the model runs in this process through an EngineLoop, set up by the model flags
// (model_setup.h: --model DIR, or --config FILE.json --random-weights [--num-layers N], --device, the
// layout, the KV cache); under a layout rank 0 drives and the other ranks run Engine::run_follower().
// Client (--url http://HOST:PORT): drives a running `epinfer serve` with streaming /v1/completions, one
// HTTP connection per in-flight request; the vocabulary comes from GET /v1/models when it reports
// vocab_size (a --vocab-size that differs is refused), else from --vocab-size.
//   epinfer bench --model DIR --concurrency 1,8,32 --input-len 128 --output-len 128 --json out.json
//   epinfer bench --config tests/data/configs/qwen3_30b_a3b.json --random-weights --num-layers 4 --device
//   cuda epinfer bench --url http://127.0.0.1:8000 --concurrency 1,64 --vocab-size 129280
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/hf_config.h"
#include "commands.h"
#include "core/timeout.h"
#include "engine/bench_serving.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "flag_values.h"
#include "model_setup.h"
#include "mpi_launch.h"

namespace epinfer::cli {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int64_t kMaxConcurrency = 65536;
constexpr int64_t kMaxLen = int64_t{1} << 22;
constexpr int64_t kMaxPrompts = int64_t{1} << 22;

// Numbers are kept as text and parsed here, so that a bad value is one line naming the flag.
struct BenchServingFlags {
    ModelSetupFlags setup;
    std::vector<const CLI::Option*> setup_options;  // the options of `setup` (add_model_setup_flags)
    std::string concurrency = "1,8,32,64,256,1024";
    std::string input_len = "128";
    std::string output_len = "128";
    std::string num_prompts = "0";  // 0: bench_default_num_prompts per level
    std::string seed = "0";
    std::string json_path;
    std::string url;
    std::string vocab_size = "0";
    std::string timeout_s = "3600";
    std::string warmup = "1";
    std::string temperature = "0";  // greedy by default, as the serving benchmarks of vLLM and SGLang
    std::string top_p = "1";
    std::string top_k = "0";
};

struct BenchServingValues {
    std::string url;  // --url as parse_server_url leaves it; empty: in process
    std::vector<int64_t> levels;
    std::vector<int64_t> num_prompts;  // [levels]; 0: bench_default_num_prompts
    int64_t input_len = 0, output_len = 0, vocab_size = 0, warmup = 0;
    uint64_t seed = 0;
    double timeout_s = 0.0;
    double temperature = 0.0, top_p = 1.0;
    int64_t top_k = 0;
};

// --url as cpp-httplib's Client takes it, SCHEME://HOST[:PORT] (SCHEME http or https, HOST a name, an IPv4
// address or a bracketed IPv6 one, PORT 1–65535), a trailing "/" dropped. Errors: one line naming the part
// that is wrong; a path other than "/" too (the benchmark adds /v1/... itself).
Result<std::string> parse_server_url(const std::string& url) {
    const std::string flag = fmt::format("--url '{}'", url);
    const size_t scheme_end = url.find("://");
    const std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end);
    if (scheme != "http" && scheme != "https")
        return invalid_argument(flag + ": must start with http:// or https://");
    std::string rest = url.substr(scheme_end + 3);
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    if (const size_t slash = rest.find('/'); slash != std::string::npos) {
        return invalid_argument(
            fmt::format("{}: give the server's root, {}://HOST:PORT, without the path '{}' "
                        "(the benchmark adds /v1/... itself)",
                        flag, scheme, rest.substr(slash)));
    }
    std::string host = rest;
    std::optional<std::string> port;
    if (!rest.empty() && rest.front() == '[') {  // [IPv6]:PORT
        const size_t close = rest.find(']');
        if (close == std::string::npos) return invalid_argument(flag + ": an IPv6 host's '[' is not closed");
        host = rest.substr(0, close + 1);
        const std::string tail = rest.substr(close + 1);
        if (!tail.empty() && tail.front() != ':')
            return invalid_argument(fmt::format("{}: '{}' after the host", flag, tail));
        if (!tail.empty()) port = tail.substr(1);
    } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
        host = rest.substr(0, colon);
        port = rest.substr(colon + 1);
    }
    if (host.empty() || host == "[]") return invalid_argument(flag + ": no host");
    if (port) {
        const bool digits =
            !port->empty() && port->size() <= 5 &&
            std::all_of(port->begin(), port->end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || std::stoi(*port) < 1 || std::stoi(*port) > 65535)
            return invalid_argument(fmt::format("{}: port '{}' is not a number in 1..65535", flag, *port));
    }
    return scheme + "://" + rest;
}

Result<BenchServingValues> parse_values(const BenchServingFlags& f) {
    BenchServingValues v;
    EPI_ASSIGN_OR_RETURN(v.levels, parse_concurrency_list(f.concurrency, "--concurrency", kMaxConcurrency));
    EPI_ASSIGN_OR_RETURN(v.input_len, parse_flag_int(f.input_len, "--input-len", 1, kMaxLen));
    EPI_ASSIGN_OR_RETURN(v.output_len, parse_flag_int(f.output_len, "--output-len", 1, kMaxLen));
    {  // one value for every level, or one per level
        std::vector<std::string> items(1);
        for (const char ch : f.num_prompts) {
            if (ch == ',') {
                items.emplace_back();
            } else {
                items.back() += ch;
            }
        }
        for (const std::string& item : items) {
            EPI_ASSIGN_OR_RETURN(const int64_t n, parse_flag_int(item, "--num-prompts", 0, kMaxPrompts));
            v.num_prompts.push_back(n);
        }
        if (v.num_prompts.size() == 1) v.num_prompts.assign(v.levels.size(), v.num_prompts.front());
        if (v.num_prompts.size() != v.levels.size()) {
            return invalid_argument(fmt::format("--num-prompts '{}': {} values for {} --concurrency levels (give one, "
                                                "or one per level)",
                                                f.num_prompts, items.size(), v.levels.size()));
        }
    }
    EPI_ASSIGN_OR_RETURN(v.seed, parse_flag_uint64(f.seed, "--seed"));
    EPI_ASSIGN_OR_RETURN(v.vocab_size, parse_flag_int(f.vocab_size, "--vocab-size", 0, INT32_MAX));
    EPI_ASSIGN_OR_RETURN(v.warmup, parse_flag_int(f.warmup, "--warmup", 0, 1024));
    const Result<double> timeout = parse_flag_double(f.timeout_s, "--timeout-s");
    if (!timeout.is_ok() || *timeout <= 0.0 || *timeout > kMaxTimeoutSeconds) {
        return invalid_argument(fmt::format("--timeout-s '{}': must be a number of seconds in (0, {:g}]",
                                            f.timeout_s, kMaxTimeoutSeconds));
    }
    v.timeout_s = *timeout;
    EPI_ASSIGN_OR_RETURN(v.temperature, parse_flag_double(f.temperature, "--temperature"));
    EPI_ASSIGN_OR_RETURN(v.top_p, parse_flag_double(f.top_p, "--top-p"));
    EPI_ASSIGN_OR_RETURN(v.top_k, parse_flag_int(f.top_k, "--top-k", 0, INT64_MAX));  // ≥ V: no filter
    EPI_RETURN_IF_ERROR(check_sampling_flags(v.temperature, v.top_p, v.top_k));
    v.temperature += 0.0;  // -0 → +0
    if (!f.url.empty()) {
        std::vector<std::string> given;  // the model and engine flags given: the server has its own
        for (const CLI::Option* option : f.setup_options)
            if (option->count() > 0) given.push_back(option->get_name());
        if (!given.empty()) {
            return invalid_argument(fmt::format("bench: --url drives a running server: {} {} not apply",
                                                fmt::join(given, ", "), given.size() == 1 ? "does" : "do"));
        }
        EPI_ASSIGN_OR_RETURN(v.url, parse_server_url(f.url));
    } else {
        if (f.setup.model_dir.empty() && !f.setup.random_weights) {
            return invalid_argument(
                "bench needs --model DIR, --config FILE.json --random-weights, or --url http://HOST:PORT");
        }
        if (f.setup.random_weights && f.setup.config_file.empty() && f.setup.model_dir.empty())
            return invalid_argument(
                "--random-weights needs --config FILE.json (or --model DIR for its config.json)");
        if (v.vocab_size != 0) return invalid_argument("--vocab-size is used only with --url");
    }
    if (!f.json_path.empty()) EPI_RETURN_IF_ERROR(check_output_file("--json", f.json_path));
    return v;
}

int64_t level_num_prompts(const BenchServingValues& v, size_t level_idx) {
    const int64_t n = v.num_prompts[level_idx];
    return n > 0 ? n : bench_default_num_prompts(v.levels[level_idx]);
}

// The prompts of level `level_idx` (the warm-up uses its own stream).
std::vector<std::vector<int32_t>> level_prompts(const BenchServingValues& v, size_t level_idx,
                                                int64_t count) {
    const uint64_t seed = v.seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(level_idx) + 1);
    return bench_random_prompts(seed, count, v.input_len, v.vocab_size);
}

std::string command_line() {
    std::string line = "epinfer";
    const Result<std::vector<std::string>> args = own_arguments();
    if (args.is_ok())
        for (const std::string& a : *args) line += " " + a;
    return line;
}

void print_preamble(const BenchRunInfo& info, const BenchServingValues& v) {
    const std::string weights =
        info.random_weights
            ? fmt::format(" (random weights, {} layer{})", info.num_layers, info.num_layers == 1 ? "" : "s")
            : "";
    const std::string where =
        info.mode == "client" ? "client of " + info.url
                              : fmt::format("{} on {}, kv_cache_dtype {}, kv_cache_tokens {}", info.layout,
                                            info.device, info.kv_cache_dtype, info.kv_cache_tokens);
    const std::string sampling = v.temperature == 0.0 ? "greedy"
                                                      : fmt::format("temperature {:g}, top_p {:g}, top_k {}",
                                                                    v.temperature, v.top_p, v.top_k);
    std::printf("# epinfer bench: %s%s, %s, input_len %lld, output_len %lld, seed %llu, %s\n",
                info.model.c_str(), weights.c_str(), where.c_str(), static_cast<long long>(v.input_len),
                static_cast<long long>(v.output_len), static_cast<unsigned long long>(v.seed),
                sampling.c_str());
    std::printf("# latencies in ms; tpot = (finish - first token) / (output tokens - 1)\n%s\n",
                bench_table_header().c_str());
    std::fflush(stdout);
}

Status finish_run(const BenchRunInfo& info, const std::vector<BenchLevelStats>& levels,
                  const std::string& json_path) {
    if (!json_path.empty()) {
        std::ofstream out(json_path);
        out << bench_json(info, levels) << "\n";
        if (!out) return invalid_argument(fmt::format("--json {}: cannot write the file", json_path));
    }
    for (const BenchLevelStats& l : levels) {
        if (l.failed > 0) {
            return internal_error(fmt::format("bench: {} of {} requests failed at concurrency {}: {}",
                                              l.failed, l.num_requests, l.concurrency, l.first_error));
        }
    }
    return Status::ok();
}

// ---- offline ------------------------------------------------------------------------------------------

// The model's config as start_model will read it, or an error (then start_model reports it).
Result<ModelConfig> peek_config(const ModelSetupFlags& f) {
    if (!f.random_weights || f.config_file.empty()) return load_hf_config(f.model_dir);
    std::ifstream in(f.config_file);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return not_found(f.config_file + ": cannot read");
    return parse_hf_config(text.str(), f.config_file);
}

Status check_context(const BenchServingValues& v, int64_t max_position_embeddings) {
    if (v.input_len + v.output_len <= max_position_embeddings) return Status::ok();
    return invalid_argument(
        fmt::format("--input-len {} + --output-len {} exceeds the model's context of {} tokens", v.input_len,
                    v.output_len, max_position_embeddings));
}

Status run_offline(const BenchServingFlags& flags, BenchServingValues v) {
    // Before the weights are read: the lengths must fit the context.
    if (const Result<ModelConfig> peeked = peek_config(flags.setup); peeked.is_ok())
        EPI_RETURN_IF_ERROR(check_context(v, peeked->max_position_embeddings));
    EPI_ASSIGN_OR_RETURN(ModelSetup setup, start_model(flags.setup));
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(*setup.model, setup.engine_options));
    if (!setup.is_driver()) return engine->run_follower();

    const ModelConfig& config = setup.model->config();
    v.vocab_size = config.vocab_size;
    Status check = check_context(v, config.max_position_embeddings);
    for (int64_t c : v.levels) {
        if (check.is_ok() && c > setup.engine_options.max_waiting) {
            check = invalid_argument(fmt::format("--concurrency {} exceeds --max-waiting {}", c,
                                                 setup.engine_options.max_waiting));
        }
    }
    if (!check.is_ok()) {
        (void)engine->shutdown();  // release the followers
        return check;
    }

    BenchRunInfo info;
    info.command_line = command_line();
    info.date_utc = bench_utc_now();
    info.mode = "offline";
    info.model = !flags.setup.model_dir.empty() ? flags.setup.model_dir : flags.setup.config_file;
    info.random_weights = flags.setup.random_weights;
    info.num_layers = config.num_hidden_layers;
    const ParallelLayout& l = setup.layout;
    info.layout = fmt::format("tp{} ep{} pp{} dp{}", l.stage_size(), l.moe_ep, l.pp, l.attn_dp);
    info.device = flags.setup.device;
    info.kv_cache_dtype = kv_cache_dtype_name(setup.engine_options.kv_cache_dtype);
    info.kv_cache_tokens = setup.kv_cache_tokens;
    info.input_len = v.input_len;
    info.output_len = v.output_len;
    info.seed = v.seed;
    info.temperature = v.temperature;
    info.top_p = v.top_p;
    info.top_k = v.top_k;
    print_preamble(info, v);

    EngineLoop loop(*engine);
    loop.start();
    std::vector<BenchLevelStats> levels;
    const auto run_level = [&](int64_t concurrency, const std::vector<std::vector<int32_t>>& prompts,
                               uint64_t seed) -> Result<BenchLevelRun> {
        BenchLevelArgs args;
        args.concurrency = concurrency;
        args.prompts = prompts;
        args.output_len = v.output_len;
        args.sampling.temperature = v.temperature;
        args.sampling.top_p = v.top_p;
        args.sampling.seed = seed;
        args.timeout_s = v.timeout_s;
        return run_bench_level(loop, args);
    };
    Status status = Status::ok();
    if (v.warmup > 0) {
        const auto prompts =
            bench_random_prompts(v.seed ^ 0x5bd1e995ull, v.warmup, v.input_len, v.vocab_size);
        status = run_level(std::min<int64_t>(v.warmup, v.levels.front()), prompts, v.seed)
                     .status()
                     .with_context("warm-up");
    }
    for (size_t i = 0; i < v.levels.size() && status.is_ok(); ++i) {
        const int64_t c = v.levels[i];
        const auto prompts = level_prompts(v, i, level_num_prompts(v, i));
        Result<BenchLevelRun> run = run_level(c, prompts, v.seed + 1000003ull * (i + 1));
        if (!run.is_ok()) {
            status = run.status();
            break;
        }
        levels.push_back(summarize_bench_level(c, run->requests, run->duration_s));
        std::printf("%s\n", bench_table_row(levels.back()).c_str());
        std::fflush(stdout);
    }
    loop.drain_and_stop(status.is_ok() ? v.timeout_s : 0.0);  // also releases the followers
    EPI_RETURN_IF_ERROR(status);
    EPI_RETURN_IF_ERROR_CTX(loop.error(), "engine");
    return finish_run(info, levels, flags.json_path);
}

// ---- client -------------------------------------------------------------------------------------------

std::unique_ptr<httplib::Client> make_client(const std::string& url, double timeout_s) {
    auto client = std::make_unique<httplib::Client>(url);
    const time_t sec = static_cast<time_t>(std::ceil(timeout_s));
    client->set_connection_timeout(std::min<time_t>(sec, 30), 0);
    client->set_read_timeout(sec, 0);
    client->set_write_timeout(std::min<time_t>(sec, 60), 0);
    client->set_keep_alive(true);
    client->set_tcp_nodelay(true);  // requests leave at once; without it TTFT picks up Nagle/delayed-ACK waits
    return client;
}

// The served model's id, and its vocab_size / max_model_len when /v1/models reports them (else 0).
struct ServedModel {
    std::string id;
    int64_t vocab_size = 0;
    int64_t max_model_len = 0;
};

// cpp-httplib's error, in words a user can act on ("Connection" alone says little). cpp-httplib reports a
// read that timed out as a failed read, so one that took the whole read timeout (`read_timeout_s`, as
// make_client sets it) is said to be that.
std::string http_error_text(httplib::Error error, double elapsed_s, double read_timeout_s) {
    if (error == httplib::Error::Read && elapsed_s >= std::ceil(read_timeout_s) - 0.05)
        return fmt::format("no answer within {:g} s", std::ceil(read_timeout_s));
    switch (error) {
        case httplib::Error::Connection:
            return "cannot connect (nothing listens there, or the host is unreachable)";
        case httplib::Error::ConnectionTimeout:
            return "the connection timed out";
        case httplib::Error::Read:
            return "the server closed the connection without an answer";
        case httplib::Error::Write:
            return "the request could not be sent (the connection closed)";
        case httplib::Error::SSLConnection:
            return "the TLS handshake failed (is the server plain http://?)";
        case httplib::Error::SSLServerVerification:
            return "the server's TLS certificate did not verify";
        default:
            return httplib::to_string(error);
    }
}

Result<ServedModel> get_served_model(const std::string& url, double timeout_s) {
    const double read_timeout_s = std::min(timeout_s, 30.0);
    auto client = make_client(url, read_timeout_s);
    const Clock::time_point sent = Clock::now();
    const httplib::Result r = client->Get("/v1/models");
    if (!r) {
        const double elapsed_s = std::chrono::duration<double>(Clock::now() - sent).count();
        return Status(StatusCode::kUnavailable,
                      fmt::format("--url {}: GET /v1/models failed: {}", url,
                                  http_error_text(r.error(), elapsed_s, read_timeout_s)));
    }
    if (r->status != 200)
        return Status(StatusCode::kUnavailable,
                      fmt::format("--url {}: GET /v1/models answered HTTP {}", url, r->status));
    const json j = json::parse(r->body, nullptr, false);
    if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].is_object() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
        return invalid_argument(fmt::format("--url {}: GET /v1/models: not an OpenAI model list", url));
    }
    const json& m = j["data"][0];
    ServedModel s;
    s.id = m["id"].get<std::string>();
    if (m.contains("vocab_size") && m["vocab_size"].is_number_integer())
        s.vocab_size = m["vocab_size"].get<int64_t>();
    if (m.contains("max_model_len") && m["max_model_len"].is_number_integer())
        s.max_model_len = m["max_model_len"].get<int64_t>();
    return s;
}

// The sampling of a level's requests: the flags' temperature, top_p and top_k; request i gets seed + i.
SamplingParams level_sampling(const BenchServingValues& v, uint64_t seed) {
    SamplingParams s;
    s.temperature = v.temperature;
    s.top_p = v.top_p;
    s.top_k = v.top_k;
    s.seed = seed;
    return s;
}

// One streaming completion on `client` (made by make_client(·, read_timeout_s)); times relative to `start`.
BenchRequestTiming run_http_request(httplib::Client& client, const std::string& model,
                                    const std::vector<int32_t>& prompt, int64_t output_len,
                                    const SamplingParams& sampling, Clock::time_point start,
                                    double read_timeout_s) {
    const auto now_s = [start] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    BenchRequestTiming t;
    t.prompt_tokens = static_cast<int64_t>(prompt.size());
    const json body = {
        {"model", model},          {"prompt", prompt},        {"max_tokens", output_len},
        {"stream", true},          {"ignore_eos", true},      {"temperature", sampling.temperature},
        {"top_p", sampling.top_p}, {"top_k", sampling.top_k}, {"seed", sampling.seed}};
    int status = -1;
    std::string buffer, error_body, finish_reason;
    bool done = false, malformed = false;
    int64_t tokens = 0, usage_tokens = -1;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    double last_read_s = 0.0;  // when the server last sent something (the read timeout runs from there)
    req.response_handler = [&](const httplib::Response& res) {
        last_read_s = now_s();
        status = res.status;
        return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        last_read_s = now_s();
        if (status != 200) {
            error_body.append(data, std::min<size_t>(n, 4096));
            return true;
        }
        buffer.append(data, n);
        for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
            const std::string event = buffer.substr(0, end);
            buffer.erase(0, end + 2);
            if (event.rfind("data: ", 0) != 0) continue;  // a comment
            const std::string payload = event.substr(6);
            if (payload == "[DONE]") {
                done = true;
                continue;
            }
            const json chunk = json::parse(payload, nullptr, false);
            if (chunk.is_discarded() || !chunk.contains("choices") || !chunk["choices"].is_array()) {
                malformed = true;
                continue;
            }
            for (const json& choice : chunk["choices"]) {
                int64_t got = 0;
                if (choice.contains("token_ids") && choice["token_ids"].is_array()) {
                    got = static_cast<int64_t>(choice["token_ids"].size());
                } else if (choice.contains("text") && choice["text"].is_string() &&
                           !choice["text"].get<std::string>().empty()) {
                    got = 1;  // a server without token ids: one chunk per token
                }
                if (got > 0 && t.first_token_s < 0.0) t.first_token_s = now_s();
                tokens += got;
                if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
                    finish_reason = choice["finish_reason"].get<std::string>();
            }
            if (chunk.contains("usage") && chunk["usage"].is_object() &&
                chunk["usage"].contains("completion_tokens") &&
                chunk["usage"]["completion_tokens"].is_number_integer()) {
                usage_tokens = chunk["usage"]["completion_tokens"].get<int64_t>();
            }
        }
        return true;
    };
    t.submit_s = now_s();
    last_read_s = t.submit_s;
    const httplib::Result r = client.send(req);
    t.finish_s = now_s();
    t.output_tokens = usage_tokens >= 0 ? usage_tokens : tokens;
    if (!r) {
        t.error =
            "HTTP request failed: " + http_error_text(r.error(), t.finish_s - last_read_s, read_timeout_s);
    } else if (status != 200) {
        const json j = json::parse(error_body, nullptr, false);
        const std::string message = !j.is_discarded() && j.contains("error") && j["error"].is_object() &&
                                            j["error"].contains("message") &&
                                            j["error"]["message"].is_string()
                                        ? j["error"]["message"].get<std::string>()
                                        : error_body.substr(0, 200);
        t.error = fmt::format("HTTP {}: {}", status, message);
    } else if (malformed || !done) {
        t.error = malformed ? "malformed stream chunk" : "the stream ended without data: [DONE]";
    } else if (finish_reason != "length" || t.output_tokens != output_len) {
        t.error =
            fmt::format("finished '{}' after {} of {} tokens", finish_reason, t.output_tokens, output_len);
    } else {
        t.ok = true;
    }
    return t;
}

// One level: `concurrency` threads, each with its own connection, take the next prompt until none is
// left or the level's deadline passed.
BenchLevelRun run_http_level(const std::string& url, const std::string& model, int64_t concurrency,
                             const std::vector<std::vector<int32_t>>& prompts, int64_t output_len,
                             const SamplingParams& sampling, double timeout_s) {
    BenchLevelRun run;
    run.requests.resize(prompts.size());
    std::atomic<size_t> next{0};
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    const int64_t num_threads = std::min<int64_t>(concurrency, static_cast<int64_t>(prompts.size()));
    std::vector<std::thread> threads;
    for (int64_t w = 0; w < num_threads; ++w) {
        threads.emplace_back([&] {
            auto client = make_client(url, timeout_s);
            for (size_t i; (i = next.fetch_add(1)) < prompts.size();) {
                if (Clock::now() >= deadline) {
                    run.requests[i].error =
                        fmt::format("not sent: the level passed --timeout-s {}", timeout_s);
                    continue;
                }
                SamplingParams params = sampling;
                params.seed = sampling.seed + i;
                run.requests[i] =
                    run_http_request(*client, model, prompts[i], output_len, params, start, timeout_s);
            }
        });
    }
    for (std::thread& t : threads) t.join();
    double first = -1.0, last = 0.0;
    for (const BenchRequestTiming& r : run.requests) {
        if (r.finish_s < 0.0) continue;
        first = first < 0.0 ? r.submit_s : std::min(first, r.submit_s);
        last = std::max(last, r.finish_s);
    }
    run.duration_s = first < 0.0 ? 0.0 : last - first;
    return run;
}

Status run_client(const BenchServingFlags& flags, BenchServingValues v) {
    EPI_ASSIGN_OR_RETURN(const ServedModel served, get_served_model(v.url, v.timeout_s));
    if (served.vocab_size > 0) {
        if (v.vocab_size != 0 && v.vocab_size != served.vocab_size) {
            return invalid_argument(fmt::format(
                "--vocab-size {}, but the server at {} reports vocab_size {} (drop --vocab-size: it is only "
                "for servers whose /v1/models does not report one)",
                v.vocab_size, v.url, served.vocab_size));
        }
        v.vocab_size = served.vocab_size;
    } else if (v.vocab_size == 0) {
        return invalid_argument(
            fmt::format("--url {}: /v1/models does not report vocab_size; pass --vocab-size", v.url));
    }
    if (served.max_model_len > 0 && v.input_len + v.output_len > served.max_model_len) {
        return invalid_argument(
            fmt::format("--input-len {} + --output-len {} exceeds the server's max_model_len {}", v.input_len,
                        v.output_len, served.max_model_len));
    }
    BenchRunInfo info;
    info.command_line = command_line();
    info.date_utc = bench_utc_now();
    info.mode = "client";
    info.model = served.id;
    info.url = v.url;
    info.input_len = v.input_len;
    info.output_len = v.output_len;
    info.seed = v.seed;
    info.temperature = v.temperature;
    info.top_p = v.top_p;
    info.top_k = v.top_k;
    print_preamble(info, v);
    if (v.warmup > 0) {
        const auto prompts =
            bench_random_prompts(v.seed ^ 0x5bd1e995ull, v.warmup, v.input_len, v.vocab_size);
        const BenchLevelRun warm =
            run_http_level(v.url, served.id, std::min<int64_t>(v.warmup, v.levels.front()), prompts,
                           v.output_len, level_sampling(v, v.seed), v.timeout_s);
        for (const BenchRequestTiming& r : warm.requests)
            if (!r.ok) return Status(StatusCode::kUnavailable, "warm-up: " + r.error);
    }
    std::vector<BenchLevelStats> levels;
    for (size_t i = 0; i < v.levels.size(); ++i) {
        const int64_t c = v.levels[i];
        const auto prompts = level_prompts(v, i, level_num_prompts(v, i));
        const BenchLevelRun run =
            run_http_level(v.url, served.id, c, prompts, v.output_len,
                           level_sampling(v, v.seed + 1000003ull * (i + 1)), v.timeout_s);
        levels.push_back(summarize_bench_level(c, run.requests, run.duration_s));
        std::printf("%s\n", bench_table_row(levels.back()).c_str());
        std::fflush(stdout);
    }
    return finish_run(info, levels, flags.json_path);
}

Status run_bench_serving(const BenchServingFlags& flags) {
    EPI_ASSIGN_OR_RETURN(BenchServingValues values, parse_values(flags));
    return values.url.empty() ? run_offline(flags, values) : run_client(flags, values);
}

}  // namespace

void add_bench_serving(CLI::App& bench) {
    auto flags = std::make_shared<BenchServingFlags>();
    flags->setup_options = add_model_setup_flags(bench, flags->setup, /*allow_random_weights=*/true);
    bench.add_option("--concurrency", flags->concurrency,
                     "Requests in flight, one level per comma-separated value (default 1,8,32,64,256,1024)");
    bench.add_option("--input-len", flags->input_len, "Prompt tokens per request (default 128)");
    bench.add_option("--output-len", flags->output_len,
                     "Tokens produced per request (ignore_eos; default 128)");
    bench.add_option(
        "--num-prompts", flags->num_prompts,
        "Requests per level, one value or one per --concurrency level (comma-separated); 0 = max(4 x "
        "concurrency, 32), at most max(concurrency, 4096) (default 0)");
    bench.add_option("--seed", flags->seed, "Seed of the random prompts and the sampling (default 0)");
    bench.add_option("--temperature", flags->temperature,
                     "Sampling temperature of every request; 0 = greedy (default 0, as vLLM's and SGLang's "
                     "serving benchmarks)");
    bench.add_option("--top-p", flags->top_p, "Nucleus of every sampled request, in (0, 1] (default 1)");
    bench.add_option("--top-k", flags->top_k, "Top-k of every sampled request; 0 = no top-k (default 0)");
    bench.add_option("--json", flags->json_path, "Also write the results to this JSON file");
    bench.add_option("--url", flags->url,
                     "Drive a running `epinfer serve` at http://HOST:PORT instead (no model flags)");
    bench.add_option(
        "--vocab-size", flags->vocab_size,
        "With --url: token ids of the random prompts are below this, when /v1/models does not say (if it "
        "does, the two must agree)");
    bench.add_option("--timeout-s", flags->timeout_s, "Each level must finish within this (default 3600)");
    bench.add_option("--warmup", flags->warmup,
                     "Requests run (not measured) before the first level (default 1)");
    CLI::App* app = &bench;
    bench.callback([flags, app] {
        if (!app->get_subcommands().empty()) return;  // `bench comm`, `bench moe` ran instead
        exit_on_error(run_bench_serving(*flags));
    });
}

}  // namespace epinfer::cli
