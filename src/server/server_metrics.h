// What GET /metrics reports, in the Prometheus text format (version 0.0.4):
//   epinfer_requests_running, epinfer_requests_waiting, epinfer_kv_blocks_used, epinfer_kv_blocks_total
//       gauges, from EngineStats
//   epinfer_generated_tokens_total, epinfer_preemptions_total, epinfer_engine_steps_total
//       counters, from EngineStats
//   epinfer_ttft_seconds   histogram: request arrival → its first token
//   epinfer_tpot_seconds   histogram: per request with ≥ 2 tokens, (last token − first token) / (tokens − 1)
//   epinfer_requests_total{status="<HTTP status>"}                 HTTP responses on every path (404s and
//                                                                   405s included), each once written
//   epinfer_requests_finished_total{finish_reason="stop|length|abort"}  engine requests that finished
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/request.h"

namespace epinfer::server {

// A cumulative Prometheus histogram over fixed upper bounds (seconds).
class Histogram {
public:
    explicit Histogram(std::vector<double> upper_bounds);
    void observe(double value);
    // The _bucket{le=...} (cumulative, then +Inf), _sum and _count lines of `name`.
    void render(const std::string& name, const std::string& help, std::string* out) const;

private:
    std::vector<double> upper_bounds_;
    std::vector<int64_t> counts_;  // [bounds + 1] per bucket, not cumulative; the last is +Inf
    double sum_ = 0.0;
    int64_t count_ = 0;
};

class ServerMetrics {
public:
    ServerMetrics();
    // A request finished in the engine: its first-token and per-output-token times (negative: none).
    void observe_finished(FinishReason finish, double ttft_s, double tpot_s);
    // A response (to any request) was sent with this HTTP status.
    void count_response(int http_status);
    // The whole /metrics page with `stats` as the engine's gauges.
    std::string render(const EngineStats& stats) const;

private:
    mutable std::mutex mutex_;
    Histogram ttft_;
    Histogram tpot_;
    std::map<int, int64_t> responses_by_status_;
    std::map<std::string, int64_t> finished_by_reason_;
};

}  // namespace epinfer::server
