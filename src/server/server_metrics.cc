#include "server/server_metrics.h"

#include <algorithm>
#include <cstdio>

namespace epinfer::server {

namespace {

std::string format_value(double value) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.9g", value);
    return buf;
}

void add_metric(std::string* out, const std::string& name, const char* type, const std::string& help,
                double value) {
    *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    *out += name + " " + format_value(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
    const auto it = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value);  // first bound ≥ value
    ++counts_[static_cast<size_t>(it - upper_bounds_.begin())];
    sum_ += value;
    ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string* out) const {
    *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    int64_t cumulative = 0;
    for (size_t i = 0; i < upper_bounds_.size(); ++i) {
        cumulative += counts_[i];
        *out += name + "_bucket{le=\"" + format_value(upper_bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
    }
    *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
    *out += name + "_sum " + format_value(sum_) + "\n";
    *out += name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0}),
      tpot_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5}) {
    for (const FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kAborted})
        finished_by_reason_[finish_reason_name(r)] = 0;
}

void ServerMetrics::observe_finished(FinishReason finish, double ttft_s, double tpot_s) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++finished_by_reason_[finish_reason_name(finish)];
    if (ttft_s >= 0.0) ttft_.observe(ttft_s);
    if (tpot_s >= 0.0) tpot_.observe(tpot_s);
}

void ServerMetrics::count_response(int http_status) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++responses_by_status_[http_status];
}

std::string ServerMetrics::render(const EngineStats& stats) const {
    std::string out;
    add_metric(&out, "epinfer_requests_running", "gauge", "Requests holding KV blocks.",
               static_cast<double>(stats.running));
    add_metric(&out, "epinfer_requests_waiting", "gauge", "Requests queued, not yet admitted.",
               static_cast<double>(stats.waiting));
    add_metric(&out, "epinfer_kv_blocks_used", "gauge", "KV cache blocks in use.",
               static_cast<double>(stats.kv_blocks_used));
    add_metric(&out, "epinfer_kv_blocks_total", "gauge", "KV cache blocks in the pool.",
               static_cast<double>(stats.kv_blocks_total));
    add_metric(&out, "epinfer_generated_tokens_total", "counter", "Tokens generated since start.",
               static_cast<double>(stats.tokens_generated));
    add_metric(&out, "epinfer_preemptions_total", "counter", "Sequences preempted for KV blocks since start.",
               static_cast<double>(stats.preemptions));
    add_metric(&out, "epinfer_engine_steps_total", "counter", "Engine steps since start.",
               static_cast<double>(stats.steps));

    std::lock_guard<std::mutex> lock(mutex_);
    ttft_.render("epinfer_ttft_seconds", "Time from request arrival to its first token.", &out);
    tpot_.render("epinfer_tpot_seconds", "Time per output token after the first, per request.", &out);
    out +=
        "# HELP epinfer_requests_total HTTP responses on every path by status.\n"
        "# TYPE epinfer_requests_total counter\n";
    for (const auto& [status, count] : responses_by_status_)
        out += "epinfer_requests_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(count) + "\n";
    out += "# HELP epinfer_requests_finished_total Requests that finished in the engine, by finish reason.\n"
           "# TYPE epinfer_requests_finished_total counter\n";
    for (const auto& [reason, count] : finished_by_reason_)
        out += "epinfer_requests_finished_total{finish_reason=\"" + reason + "\"} " + std::to_string(count) + "\n";
    return out;
}

}  // namespace epinfer::server
