// The serving engine: requests in, tokens out, one model step at a time (continuous batching).
//
// Each step() the scheduler (engine/scheduler.h) picks, under a token budget, one decode token for every
// running sequence and chunks of prefill for waiting ones (new requests join between steps), gives each
// the KV blocks it needs (engine/kv_block_pool.h), and preempts the newest running sequence when blocks
// run out (its blocks are freed and its prompt + produced tokens are recomputed later; nothing is lost).
// One Model::forward runs the whole step; each sequence whose prompt is complete samples one token with
// its own Sampler (created when the sequence is first scheduled, kept across preemption).
//
// Parallel layouts: world rank 0 is the driver. It owns the queue and the scheduler, and before each
// forward broadcasts the step (sequences, their tokens, block tables, sampling parameters) to every rank;
// with DP attention it assigns each request to one attention-DP group (fewest running + waiting, ties to
// the lowest group), and each group's ranks hold that request's KV and sample its tokens; the sampled
// tokens reach the driver by an all-reduce (max) over the world. Under pp > 1 every stage runs the same
// sequences. The other ranks call run_follower(), which executes the driver's steps until the driver's
// shutdown(). A model loaded without a ParallelContext is one rank on its own (its own driver), also
// inside an MPI job.
//
// Threads: add_request() and abort() may be called from any thread, also while step() runs (they queue
// for the next step); everything else belongs to the one thread that steps the engine. See
// engine/engine_loop.h for the threaded front.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "models/model.h"

namespace epinfer {

// Every rank of a layout must create its Engine with the same options.
struct EngineOptions {
    int64_t block_size = 16;         // tokens per KV block, ≥ 1
    int64_t num_kv_blocks = 0;       // KV blocks per rank (per attention-DP group), ≥ 1
    int64_t max_running = 256;       // running sequences at most (per attention-DP group), ≥ 1
    int64_t max_step_tokens = 2048;  // tokens in one step at most (per attention-DP group: decode tokens
                                     // + prefill chunks; a longer prompt is prefilled in chunks), ≥ 1
    int64_t max_waiting = 4096;      // queued requests at most; add_request beyond → kUnavailable, ≥ 1
    DType kv_cache_dtype = DType::kF32;  // element of the KV block pool: kF32 or kBF16
};

struct EngineStats {
    int64_t running = 0;         // sequences holding KV blocks
    int64_t waiting = 0;         // queued, not yet admitted (preempted ones included)
    int64_t kv_blocks_used = 0;  // driver's view, summed over attention-DP groups
    int64_t kv_blocks_total = 0;
    int64_t tokens_generated = 0;  // since create
    int64_t preemptions = 0;       // since create
    int64_t steps = 0;             // steps that ran a forward
};

class Engine {
public:
    // Every rank of the model's layout calls it (it allocates this rank's KV block pool). The model must
    // outlive the engine. Errors: kInvalidArgument naming a bad option; those of KvBlockPool::create.
    static Result<std::unique_ptr<Engine>> create(Model& model, const EngineOptions& options);
    ~Engine();

    // Driver only, any thread. Queues a request and returns its id (1, 2, ... in call order). Errors:
    // kInvalidArgument naming the field (as generate_request_check: empty prompt, id outside the
    // vocabulary, max_tokens < 1, longer than the context, bad sampling parameters, a stop token id
    // outside the vocabulary, or a request whose prompt + max_tokens needs more KV blocks than one pool
    // has); kUnavailable when max_waiting requests are queued or after shutdown(); kInternal on a follower.
    Result<RequestId> add_request(const RequestParams& params);
    // Driver only, any thread. Finishes the request with kAborted at the next step and frees its KV
    // blocks; unknown or finished ids are ignored.
    void abort(RequestId id);
    // Driver only. True while a request is queued or running.
    bool has_unfinished() const;
    // Driver only. Runs one step and returns an output for every request that produced a token or
    // finished in it (at most one per request). Nothing queued or running: returns {} at once (under a
    // layout it then sends the followers an empty step, at most every 0.1 s). Stops: max_tokens
    // (kLength), a token of stop_token_ids or, unless ignore_eos, of ModelConfig::eos_token_ids (kStop;
    // the token is returned). Errors: those of Model::forward and of the communicator; kDataLoss naming
    // the request when a logit it samples from is not finite; the engine is then unusable (every later
    // step returns the same error).
    Result<std::vector<RequestOutput>> step();
    // Driver only: refuses new requests; under a layout with more than one rank, tells the followers to
    // return (not after a failed step: they have stopped or will time out). Idempotent.
    Status shutdown();
    // Ranks other than the driver: executes the driver's steps until its shutdown(). The driver must call
    // step() at least every second while idle (EngineLoop does), so that a follower's bounded wait
    // (Communicator::timeout_s) never expires. Errors: as step() (the same on every rank for non-finite
    // logits), a malformed step message (kInternal).
    Status run_follower();

    // Driver (the stepping thread): the scheduler's counts; zeros on a follower.
    EngineStats stats() const;
    const Model& model() const;

private:
    Engine() = default;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace epinfer
