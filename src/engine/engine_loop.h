// The engine on its own thread, for the HTTP server and the benchmark: any thread submits requests and
// cancels them; the loop thread runs Engine::step() while there is work and calls each request's
// callback with its outputs. Driver rank only (followers run Engine::run_follower()). While idle the loop
// thread still steps the engine every 0.5 s (a no-op on one rank; the followers' keep-alive under a
// layout). Every wait of the loop is bounded.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace epinfer {

// Called on the loop thread with each step's output of one request; the last call has finish != kNone.
// Must not block and must not call back into the loop. After a fatal engine error every unfinished
// request gets one call with finish = kAborted.
using OutputCallback = std::function<void(const RequestOutput& output)>;

class EngineLoop {
public:
    explicit EngineLoop(Engine& engine);
    ~EngineLoop();  // stop()
    EngineLoop(const EngineLoop&) = delete;
    EngineLoop& operator=(const EngineLoop&) = delete;

    // Starts the loop thread (once; a no-op after that or after drain_and_stop).
    void start();
    // Queues a request; `on_output` is called from the loop thread. May be called before start().
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
    void run();

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
};

}  // namespace epinfer
