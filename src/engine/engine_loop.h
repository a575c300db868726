// The engine on its own thread, for the HTTP server and the benchmark: any thread submits requests and
// cancels them; the loop thread runs Engine::step() while there is work, and a delivery thread calls each
// request's callback with its outputs, in step order, while the next step runs. (Made on the loop thread,
// the callbacks of 1024 HTTP streams held every step ~6 ms: 12.6–12.8k output tok/s against 14.1k offline
// on the H200; now 13.9–14.0k, docs/benchmarks/serving.md.) At most kMaxStepsUndelivered steps' outputs
// wait for delivery; past that the loop waits. Driver rank only (followers run Engine::run_follower()).
// While idle the loop thread still steps the engine every 0.5 s (a no-op on one rank; the followers'
// keep-alive under a layout). Every wait of the loop is bounded.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace epinfer {

// Called on the loop's delivery thread with each step's output of one request, in step order; the last call
// has finish != kNone. Must not block and must not call back into the loop. After a fatal engine error
// every unfinished request gets one call with finish = kAborted. Every call is made before drain_and_stop
// returns.
using OutputCallback = std::function<void(const RequestOutput& output)>;

class EngineLoop {
public:
    explicit EngineLoop(Engine& engine);
    ~EngineLoop();  // stop()
    EngineLoop(const EngineLoop&) = delete;
    EngineLoop& operator=(const EngineLoop&) = delete;

    // Starts the loop thread (once; a no-op after that or after drain_and_stop).
    void start();
    // Queues a request; `on_output` is called from the loop's delivery thread. May be called before start().
    // Errors: as Engine::add_request (kUnavailable when the queue is full, the loop is draining or
    // stopped, or stopped after an engine error).
    Result<RequestId> submit(const RequestParams& params, OutputCallback on_output);
    // Aborts a request (its callback gets finish = kAborted); unknown ids are ignored.
    void cancel(RequestId id);
    // A consistent snapshot (taken between steps).
    EngineStats stats() const;
    // The first fatal engine error, or OK.
    Status error() const;
    // Seconds the loop thread has been in its current engine step while requests are pending (running or
    // queued); 0 between steps and while none is pending. A step that does not end (e.g. a rank of the
    // layout stopped, so a collective waits up to the communicator's timeout) makes it grow. Any thread;
    // takes the loop's lock briefly (never held across a step).
    double seconds_in_step() const;
    // Stops accepting, lets running and queued requests finish (bounded by timeout_s, after which the
    // rest are aborted), then Engine::shutdown() and joins the thread. Idempotent. Without start(), the
    // caller's thread runs the loop until it is drained.
    void drain_and_stop(double timeout_s);
    // drain_and_stop(0): aborts everything at once.
    void stop() { drain_and_stop(0.0); }
    // Cuts a drain short from any thread and returns at once: the requests left are aborted before the
    // loop's next step, so a drain_and_stop in progress returns after that step. Called before
    // drain_and_stop, that drain aborts at once. (epinfer serve: a second SIGTERM/SIGINT.)
    void cut_drain();

private:
    struct Pending {
        std::shared_ptr<const OutputCallback> on_output;  // shared: called outside the lock
        int64_t prompt_tokens = 0;
        int64_t completion_tokens = 0;
    };
    using Calls = std::vector<std::pair<std::shared_ptr<const OutputCallback>, RequestOutput>>;
    static constexpr size_t kMaxStepsUndelivered = 4;
    void run();
    // Loop thread: queues one step's calls for the delivery thread (waits while kMaxStepsUndelivered are).
    void deliver_later(Calls calls);
    // Delivery thread: makes the queued calls in order until finish_delivery() and the queue is empty.
    void deliver();
    void finish_delivery();

    Engine& engine_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::mutex stop_mu_;  // serialises drain_and_stop
    std::thread thread_;
    std::unordered_map<RequestId, Pending> pending_;  // submitted, not finished
    bool started_ = false;
    bool stopping_ = false;     // drain_and_stop called: no new request
    bool stopped_ = false;      // the loop has returned
    bool wake_ = false;         // work arrived
    bool aborted_all_ = false;  // the drain deadline passed
    bool drain_cut_ = false;    // cut_drain called: the drain deadline is now
    bool in_step_ = false;      // the loop thread is in engine_.step()
    std::chrono::steady_clock::time_point step_start_;  // of the step in progress (when in_step_)
    std::chrono::steady_clock::time_point drain_deadline_;
    EngineStats stats_;
    Status error_;

    std::mutex deliver_mu_;
    std::condition_variable deliver_cv_;
    std::deque<Calls> undelivered_;  // steps' calls, oldest first
    bool delivery_done_ = false;     // the loop has queued its last calls
};

}  // namespace epinfer
