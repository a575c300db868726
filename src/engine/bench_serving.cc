#include "engine/bench_serving.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "core/splitmix64.h"
#include "core/timeout.h"

namespace epinfer {

namespace {

using Clock = std::chrono::steady_clock;

double mean(const std::vector<double>& values) {
    if (values.empty()) return std::nan("");
    double sum = 0.0;
    for (double v : values) sum += v;
    return sum / static_cast<double>(values.size());
}

// A number for the JSON: null when not finite.
nlohmann::json finite_or_null(double v) {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// "12.3", or "-" when not finite.
std::string cell(double v, int decimals) {
    return std::isfinite(v) ? fmt::format("{:.{}f}", v, decimals) : "-";
}

}  // namespace

std::vector<std::vector<int32_t>> bench_random_prompts(uint64_t seed, int64_t count, int64_t length,
                                                       int64_t vocab_size) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(std::max<int64_t>(0, count)));
    uint64_t state = seed;
    for (std::vector<int32_t>& p : prompts) {
        p.resize(static_cast<size_t>(std::max<int64_t>(0, length)));
        for (int32_t& id : p)
            id = static_cast<int32_t>(splitmix64(state) %
                                      static_cast<uint64_t>(std::max<int64_t>(1, vocab_size)));
    }
    return prompts;
}

int64_t bench_default_num_prompts(int64_t concurrency) {
    return std::min(std::max<int64_t>(4 * concurrency, 32), std::max(concurrency, kBenchMaxDefaultPrompts));
}

Result<std::vector<int64_t>> parse_concurrency_list(const std::string& text, const std::string& flag,
                                                    int64_t max_concurrency) {
    std::vector<int64_t> levels;
    std::set<int64_t> seen;
    size_t begin = 0;
    while (true) {
        const size_t end = std::min(text.find(',', begin), text.size());
        const std::string item = text.substr(begin, end - begin);
        int64_t value = 0;
        const char* last = item.data() + item.size();
        const auto [ptr, ec] = std::from_chars(item.data(), last, value);
        if (item.empty() || ec != std::errc() || ptr != last) {
            return invalid_argument(fmt::format("{} '{}': '{}' is not an integer", flag, text, item));
        }
        if (value < 1 || value > max_concurrency) {
            return invalid_argument(
                fmt::format("{} '{}': {} is outside [1, {}]", flag, text, value, max_concurrency));
        }
        if (!seen.insert(value).second)
            return invalid_argument(fmt::format("{} '{}': {} is repeated", flag, text, value));
        levels.push_back(value);
        if (end == text.size()) break;
        begin = end + 1;
    }
    return levels;
}

double bench_percentile(std::vector<double> values, double p) {
    if (values.empty()) return std::nan("");
    std::sort(values.begin(), values.end());
    const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(rank));
    const size_t hi = std::min(lo + 1, values.size() - 1);
    const double frac = rank - static_cast<double>(lo);
    return values[lo] + (values[hi] - values[lo]) * frac;
}

BenchLevelStats summarize_bench_level(int64_t concurrency, std::span<const BenchRequestTiming> requests,
                                      double duration_s) {
    BenchLevelStats s;
    s.concurrency = concurrency;
    s.num_requests = static_cast<int64_t>(requests.size());
    s.duration_s = duration_s;
    std::vector<double> ttft_ms, tpot_ms;
    for (const BenchRequestTiming& r : requests) {
        if (!r.ok) {
            ++s.failed;
            if (s.first_error.empty()) s.first_error = r.error.empty() ? "failed" : r.error;
            continue;
        }
        ++s.completed;
        s.input_tokens += r.prompt_tokens;
        s.output_tokens += r.output_tokens;
        if (r.first_token_s >= 0.0) ttft_ms.push_back((r.first_token_s - r.submit_s) * 1e3);
        if (r.output_tokens >= 2 && r.first_token_s >= 0.0) {
            tpot_ms.push_back((r.finish_s - r.first_token_s) * 1e3 /
                              static_cast<double>(r.output_tokens - 1));
        }
    }
    if (duration_s > 0.0) {
        s.request_per_s = static_cast<double>(s.completed) / duration_s;
        s.output_tok_per_s = static_cast<double>(s.output_tokens) / duration_s;
        s.total_tok_per_s = static_cast<double>(s.input_tokens + s.output_tokens) / duration_s;
    }
    s.ttft_mean_ms = mean(ttft_ms);
    s.ttft_p50_ms = bench_percentile(ttft_ms, 50.0);
    s.ttft_p99_ms = bench_percentile(ttft_ms, 99.0);
    s.tpot_mean_ms = mean(tpot_ms);
    s.tpot_p50_ms = bench_percentile(tpot_ms, 50.0);
    s.tpot_p99_ms = bench_percentile(tpot_ms, 99.0);
    return s;
}

std::string bench_table_header() {
    return fmt::format("{:>11} {:>9} {:>6} {:>10} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}", "concurrency",
                       "requests", "failed", "duration_s", "output_tok/s", "total_tok/s", "ttft_p50",
                       "ttft_p99", "tpot_p50", "tpot_p99");
}

std::string bench_table_row(const BenchLevelStats& l) {
    return fmt::format("{:>11} {:>9} {:>6} {:>10} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}", l.concurrency,
                       l.completed, l.failed, cell(l.duration_s, 2), cell(l.output_tok_per_s, 1),
                       cell(l.total_tok_per_s, 1), cell(l.ttft_p50_ms, 1), cell(l.ttft_p99_ms, 1),
                       cell(l.tpot_p50_ms, 2), cell(l.tpot_p99_ms, 2));
}

std::string bench_json(const BenchRunInfo& info, std::span<const BenchLevelStats> levels) {
    nlohmann::json doc = {{"bench", "serving"},
                          {"command_line", info.command_line},
                          {"date", info.date_utc},
                          {"mode", info.mode},
                          {"model", info.model},
                          {"random_weights", info.random_weights},
                          {"num_layers", info.num_layers},
                          {"layout", info.layout},
                          {"device", info.device},
                          {"input_len", info.input_len},
                          {"output_len", info.output_len},
                          {"seed", info.seed},
                          {"temperature", info.temperature},
                          {"top_p", info.top_p},
                          {"top_k", info.top_k},
                          {"results", nlohmann::json::array()}};
    if (!info.kv_cache_dtype.empty()) {
        doc["kv_cache_dtype"] = info.kv_cache_dtype;
        doc["kv_cache_tokens"] = info.kv_cache_tokens;
    }
    if (!info.url.empty()) doc["url"] = info.url;
    for (const BenchLevelStats& l : levels) {
        nlohmann::json row = {{"concurrency", l.concurrency},
                              {"num_requests", l.num_requests},
                              {"completed", l.completed},
                              {"failed", l.failed},
                              {"duration_s", finite_or_null(l.duration_s)},
                              {"input_tokens", l.input_tokens},
                              {"output_tokens", l.output_tokens},
                              {"request_per_s", finite_or_null(l.request_per_s)},
                              {"output_tok_per_s", finite_or_null(l.output_tok_per_s)},
                              {"total_tok_per_s", finite_or_null(l.total_tok_per_s)},
                              {"ttft_mean_ms", finite_or_null(l.ttft_mean_ms)},
                              {"ttft_p50_ms", finite_or_null(l.ttft_p50_ms)},
                              {"ttft_p99_ms", finite_or_null(l.ttft_p99_ms)},
                              {"tpot_mean_ms", finite_or_null(l.tpot_mean_ms)},
                              {"tpot_p50_ms", finite_or_null(l.tpot_p50_ms)},
                              {"tpot_p99_ms", finite_or_null(l.tpot_p99_ms)}};
        if (!l.first_error.empty()) row["first_error"] = l.first_error;
        doc["results"].push_back(std::move(row));
    }
    return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string bench_utc_now() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char text[32];
    std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return text;
}

Result<BenchLevelRun> run_bench_level(EngineLoop& loop, const BenchLevelArgs& args) {
    if (args.concurrency < 1 || args.output_len < 1 || !(args.timeout_s > 0.0) ||
        !(args.timeout_s <= kMaxTimeoutSeconds)) {
        return invalid_argument(
            fmt::format("bench level: concurrency {}, output_len {}, timeout {} s: need ≥ 1, "
                        "≥ 1, in (0, {:g}]",
                        args.concurrency, args.output_len, args.timeout_s, kMaxTimeoutSeconds));
    }
    // Shared with the callbacks, which may run after this function returns (cancelled requests).
    struct Shared {
        std::mutex mu;
        std::condition_variable cv;
        std::vector<BenchRequestTiming> requests;
        int64_t in_flight = 0;
        int64_t finished = 0;
        double last_finish_s = 0.0;
    };
    const int64_t n = static_cast<int64_t>(args.prompts.size());
    auto shared = std::make_shared<Shared>();
    shared->requests.resize(static_cast<size_t>(n));
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(args.timeout_s));
    const int64_t output_len = args.output_len;
    std::vector<RequestId> ids(static_cast<size_t>(n), 0);
    int64_t next = 0;
    std::unique_lock<std::mutex> lock(shared->mu);
    while (shared->finished < n) {
        while (shared->in_flight < args.concurrency && next < n) {
            const int64_t i = next++;
            BenchRequestTiming& r = shared->requests[static_cast<size_t>(i)];
            r.prompt_tokens = static_cast<int64_t>(args.prompts[static_cast<size_t>(i)].size());
            r.submit_s = std::chrono::duration<double>(Clock::now() - start).count();
            ++shared->in_flight;
            RequestParams params;
            params.prompt_ids = args.prompts[static_cast<size_t>(i)];
            params.max_tokens = output_len;
            params.sampling = args.sampling;
            params.sampling.seed = args.sampling.seed + static_cast<uint64_t>(i);
            params.ignore_eos = true;
            OutputCallback on_output = [shared, i, start, output_len](const RequestOutput& out) {
                const double now_s = std::chrono::duration<double>(Clock::now() - start).count();
                std::lock_guard<std::mutex> guard(shared->mu);
                BenchRequestTiming& t = shared->requests[static_cast<size_t>(i)];
                if (t.first_token_s < 0.0 && !out.new_token_ids.empty()) t.first_token_s = now_s;
                t.output_tokens = out.completion_tokens;
                if (out.finish == FinishReason::kNone) return;
                t.finish_s = now_s;
                t.ok = out.finish == FinishReason::kLength && out.completion_tokens == output_len;
                if (!t.ok) {
                    t.error = fmt::format("finished '{}' after {} of {} tokens",
                                          finish_reason_name(out.finish), out.completion_tokens, output_len);
                }
                --shared->in_flight;
                ++shared->finished;
                shared->last_finish_s = std::max(shared->last_finish_s, now_s);
                shared->cv.notify_all();
            };
            lock.unlock();  // the callback may run on the loop thread before submit returns
            Result<RequestId> id = loop.submit(params, std::move(on_output));
            lock.lock();
            if (!id.is_ok()) {
                --shared->in_flight;
                lock.unlock();
                for (int64_t j = 0; j < i; ++j) loop.cancel(ids[static_cast<size_t>(j)]);
                return id.status().with_context(fmt::format("bench: submitting prompt {}", i));
            }
            ids[static_cast<size_t>(i)] = *id;
        }
        if (shared->finished >= n) break;
        if (shared->cv.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
            const int64_t finished = shared->finished;
            lock.unlock();
            for (int64_t j = 0; j < next; ++j) loop.cancel(ids[static_cast<size_t>(j)]);
            return Status(
                StatusCode::kTimeout,
                fmt::format("bench: concurrency {}: {} of {} requests finished within --timeout-s {}",
                            args.concurrency, finished, n, args.timeout_s));
        }
    }
    BenchLevelRun run;
    run.requests = shared->requests;
    double first_submit_s = run.requests.empty() ? 0.0 : run.requests.front().submit_s;
    run.duration_s = std::max(0.0, shared->last_finish_s - first_submit_s);
    lock.unlock();
    const Status error = loop.error();
    if (!error.is_ok()) return error.with_context("bench: engine");
    return run;
}

}  // namespace epinfer
