// The serving benchmark of `epinfer bench` (tools/epinfer/cmd_bench_serving.cc): random prompts, the
// offline driver over an EngineLoop, per-request token times → per-concurrency-level statistics, the
// table and the JSON.
//
// Definitions (as vLLM's benchmark_serving): TTFT = first token − submit; TPOT = (finish − first token) /
// (output tokens − 1), over requests with ≥ 2 output tokens; duration = level start (first submit) → last
// finish; output tok/s = output tokens of the completed requests / duration; total tok/s adds their
// prompt tokens. Percentiles interpolate linearly between the closest ranks (numpy's default).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine_loop.h"

namespace epinfer {

// `count` prompts of `length` token ids uniform in [0, vocab_size), from `seed` (splitmix64): the same
// arguments give the same prompts on every machine. Requires length ≥ 1, vocab_size ≥ 1.
std::vector<std::vector<int32_t>> bench_random_prompts(uint64_t seed, int64_t count, int64_t length,
                                                       int64_t vocab_size);

// Requests of a level when --num-prompts is not given: max(4 × concurrency, 32), at most
// max(concurrency, kBenchMaxDefaultPrompts).
inline constexpr int64_t kBenchMaxDefaultPrompts = 4096;
int64_t bench_default_num_prompts(int64_t concurrency);

// "1,8,32" → {1, 8, 32}, in the given order. Errors: kInvalidArgument naming `flag` and the bad item (empty,
// not an integer, < 1, > max_concurrency, repeated).
Result<std::vector<int64_t>> parse_concurrency_list(const std::string& text, const std::string& flag,
                                                    int64_t max_concurrency);

// One request as the benchmark saw it; times in seconds since the level's start (steady clock).
struct BenchRequestTiming {
    double submit_s = 0.0;
    double first_token_s = -1.0;  // < 0: no token came
    double finish_s = -1.0;       // < 0: not finished
    int64_t prompt_tokens = 0;
    int64_t output_tokens = 0;
    bool ok = false;    // finished with the requested number of tokens
    std::string error;  // why not ok (empty when ok)
};

// Linear-interpolated percentile p ∈ [0, 100] of `values` (any order); NaN when empty.
double bench_percentile(std::vector<double> values, double p);

// One row of the table: one concurrency level. Latencies in milliseconds, NaN when no request had one.
struct BenchLevelStats {
    int64_t concurrency = 0;
    int64_t num_requests = 0;  // submitted
    int64_t completed = 0;     // ok
    int64_t failed = 0;
    double duration_s = 0.0;
    int64_t input_tokens = 0;   // prompt tokens of the completed requests
    int64_t output_tokens = 0;  // output tokens of the completed requests
    double request_per_s = 0.0;
    double output_tok_per_s = 0.0;
    double total_tok_per_s = 0.0;
    double ttft_mean_ms = 0.0, ttft_p50_ms = 0.0, ttft_p99_ms = 0.0;
    double tpot_mean_ms = 0.0, tpot_p50_ms = 0.0, tpot_p99_ms = 0.0;
    std::string first_error;  // of the first failed request, if any
};

// Statistics of a level over the completed requests (failed ones are counted only).
BenchLevelStats summarize_bench_level(int64_t concurrency, std::span<const BenchRequestTiming> requests,
                                      double duration_s);

// The table: a header line and one line per level (fixed-width columns, no trailing newline).
std::string bench_table_header();
std::string bench_table_row(const BenchLevelStats& level);

// What the JSON says about the run besides the levels.
struct BenchRunInfo {
    std::string command_line;  // as typed (argv joined by spaces)
    std::string date_utc;      // ISO 8601, e.g. "2026-11-29T11:05:44Z"
    std::string mode;          // "offline" or "client"
    std::string model;         // --model DIR, --config FILE (random weights), or the served model's id
    std::string layout;        // e.g. "tp1 ep1 pp1 dp1"; "" in client mode
    std::string device;        // e.g. "cpu"; "" in client mode
    std::string kv_cache_dtype;  // the KV pool's element, "bf16" or "fp32" (auto resolved); "" in client mode
    int64_t kv_cache_tokens = 0;  // the KV pool per rank, as the engine got it; 0 in client mode
    std::string url;           // client mode
    bool random_weights = false;
    int64_t num_layers = 0;  // model layers run
    int64_t input_len = 0, output_len = 0;
    uint64_t seed = 0;
    double temperature = 0.0;  // of every request; 0 = greedy
    double top_p = 1.0;
    int64_t top_k = 0;
};

// {"bench": "serving", <the run info (temperature, top_p and top_k included); kv_cache_dtype and
// kv_cache_tokens when kv_cache_dtype is set, url when set>, "results": [{concurrency, num_requests,
// completed, failed, duration_s, input_tokens, output_tokens, request_per_s, output_tok_per_s,
// total_tok_per_s, ttft_{mean,p50,p99}_ms, tpot_{mean,p50,p99}_ms}, ...]} as text (NaN → null), 2-space
// indented.
std::string bench_json(const BenchRunInfo& info, std::span<const BenchLevelStats> levels);

// Current UTC time in ISO 8601 ("2026-11-29T11:05:44Z").
std::string bench_utc_now();

struct BenchLevelArgs {
    int64_t concurrency = 1;                        // requests in flight at most, ≥ 1
    std::span<const std::vector<int32_t>> prompts;  // one request each, submitted in order
    int64_t output_len = 1;                         // max_tokens with ignore_eos, ≥ 1
    SamplingParams sampling;                        // seed: + the prompt's index per request
    double timeout_s = 3600.0;                      // the whole level, in (0, kMaxTimeoutSeconds]
};

struct BenchLevelRun {
    std::vector<BenchRequestTiming> requests;  // [prompts.size()], in prompt order
    double duration_s = 0.0;                   // first submit → last finish
};

// Runs one level through `loop` (started): keeps `concurrency` requests in flight until every prompt has
// finished. Errors: kTimeout when the level takes longer than timeout_s (the requests in flight are
// cancelled); the loop's fatal error; a submit error (kUnavailable, kInvalidArgument) naming the prompt.
Result<BenchLevelRun> run_bench_level(EngineLoop& loop, const BenchLevelArgs& args);

}  // namespace epinfer
