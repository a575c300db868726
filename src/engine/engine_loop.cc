#include "engine/engine_loop.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

namespace epinfer {

namespace {

// The idle loop steps the engine this often (the followers' keep-alive: Engine::run_follower).
constexpr std::chrono::milliseconds kIdleStep(500);
// drain_and_stop timeouts are clamped to [0, this] seconds.
constexpr double kMaxDrainSeconds = 1e7;
// Either side of the delivery queue, waiting on the other, re-checks this often.
constexpr std::chrono::milliseconds kDeliveryPoll(100);

}  // namespace

EngineLoop::EngineLoop(Engine& engine) : engine_(engine) {}

EngineLoop::~EngineLoop() {
    stop();
}

void EngineLoop::start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return;
    started_ = true;
    thread_ = std::thread([this] { run(); });
}

Result<RequestId> EngineLoop::submit(const RequestParams& params, OutputCallback on_output) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_.is_ok()) {
            return Status(StatusCode::kUnavailable,
                          "the engine loop stopped after an error: " + error_.message());
        }
        if (stopping_) return Status(StatusCode::kUnavailable, "the engine loop is draining or stopped");
        // Registered before the lock is released, so the loop thread sees the callback before any output.
        EPI_ASSIGN_OR_RETURN(const RequestId id, engine_.add_request(params));
        Pending& p = pending_[id];
        p.on_output = std::make_shared<const OutputCallback>(std::move(on_output));
        p.prompt_tokens = static_cast<int64_t>(params.prompt_ids.size());
        wake_ = true;
        cv_.notify_all();
        return id;
    }
}

void EngineLoop::cancel(RequestId id) {
    engine_.abort(id);
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
    cv_.notify_all();
}

EngineStats EngineLoop::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

Status EngineLoop::error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
}

double EngineLoop::seconds_in_step() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!in_step_ || pending_.empty()) return 0.0;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
}

void EngineLoop::drain_and_stop(double timeout_s) {
    std::lock_guard<std::mutex> stop_lock(stop_mu_);
    bool run_here = false;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!stopping_) {
            stopping_ = true;
            // NaN → 0 below; after cut_drain() the drain aborts at once.
            const double s = drain_cut_ ? 0.0 : std::clamp(timeout_s, 0.0, kMaxDrainSeconds);
            drain_deadline_ = std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(s == s ? s : 0.0));
        }
        if (!started_) {
            started_ = true;
            run_here = !stopped_;
        }
        cv_.notify_all();
    }
    if (run_here) run();
    if (thread_.joinable()) thread_.join();
}

void EngineLoop::cut_drain() {
    std::lock_guard<std::mutex> lock(mu_);
    drain_cut_ = true;
    drain_deadline_ = std::chrono::steady_clock::now();  // read only once stopping_
    wake_ = true;
    cv_.notify_all();
}

void EngineLoop::deliver_later(Calls calls) {
    if (calls.empty()) return;
    std::unique_lock<std::mutex> lock(deliver_mu_);
    // Callbacks do not block (OutputCallback), so the delivery thread frees a slot; poll, never hang.
    while (undelivered_.size() >= kMaxStepsUndelivered) deliver_cv_.wait_for(lock, kDeliveryPoll);
    undelivered_.push_back(std::move(calls));
    deliver_cv_.notify_all();
}

void EngineLoop::deliver() {
    for (;;) {
        Calls calls;
        {
            std::unique_lock<std::mutex> lock(deliver_mu_);
            while (undelivered_.empty() && !delivery_done_) deliver_cv_.wait_for(lock, kDeliveryPoll);
            if (undelivered_.empty()) return;  // done, all delivered
            calls = std::move(undelivered_.front());
            undelivered_.pop_front();
        }
        deliver_cv_.notify_all();  // a slot is free
        for (const auto& [on_output, out] : calls)
            if (*on_output) (*on_output)(out);
    }
}

void EngineLoop::finish_delivery() {
    {
        std::lock_guard<std::mutex> lock(deliver_mu_);
        delivery_done_ = true;
    }
    deliver_cv_.notify_all();
}

void EngineLoop::run() {
    std::thread delivery([this] { deliver(); });
    for (;;) {
        std::vector<RequestId> to_abort;
        {
            std::unique_lock<std::mutex> lock(mu_);
            if (pending_.empty() && !stopping_)
                cv_.wait_for(lock, kIdleStep, [&] { return wake_ || stopping_; });
            wake_ = false;
            if (stopping_) {
                if (pending_.empty()) break;
                if (!aborted_all_ && std::chrono::steady_clock::now() >= drain_deadline_) {
                    aborted_all_ = true;
                    for (const auto& entry : pending_) to_abort.push_back(entry.first);
                }
            }
            in_step_ = true;
            step_start_ = std::chrono::steady_clock::now();
        }
        for (const RequestId id : to_abort) engine_.abort(id);
        Result<std::vector<RequestOutput>> outputs = engine_.step();
        Calls calls;
        bool failed = false;
        {
            std::lock_guard<std::mutex> lock(mu_);
            in_step_ = false;
            if (!outputs.is_ok()) {
                // Fatal: every unfinished request ends with kAborted; the loop stops.
                failed = true;
                error_ = outputs.status();
                stopping_ = true;
                for (auto& [id, p] : pending_) {
                    RequestOutput out;
                    out.id = id;
                    out.finish = FinishReason::kAborted;
                    out.prompt_tokens = p.prompt_tokens;
                    out.completion_tokens = p.completion_tokens;
                    calls.emplace_back(std::move(p.on_output), std::move(out));
                }
                pending_.clear();
            } else {
                for (RequestOutput& out : *outputs) {
                    const auto it = pending_.find(out.id);
                    if (it == pending_.end()) continue;
                    it->second.completion_tokens = out.completion_tokens;
                    calls.emplace_back(it->second.on_output, std::move(out));
                    if (calls.back().second.finish != FinishReason::kNone) pending_.erase(it);
                }
            }
            stats_ = engine_.stats();
        }
        deliver_later(std::move(calls));
        if (failed) break;
    }
    finish_delivery();
    delivery.join();  // every call made before the loop reports stopped
    bool failed = false;
    {
        std::lock_guard<std::mutex> lock(mu_);
        failed = !error_.is_ok();
    }
    const Status shutdown = failed ? Status::ok() : engine_.shutdown();
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutdown.is_ok()) error_ = shutdown;
    stopped_ = true;
}

}  // namespace epinfer
