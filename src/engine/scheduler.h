// The continuous-batching scheduler: which tokens of which sequences run in the next engine step, and
// which KV blocks hold them. Pure bookkeeping (no model, no storage): the block ids it hands out index
// the KvBlockPool of every rank of the sequence's attention-DP group (engine/kv_block_pool.h).
//
// A sequence is its known tokens (prompt, then every token produced so far) and `num_cached`, how many of
// them already have KV rows. Each step feeds a sequence the tokens [num_cached, num_cached + n):
//   decode   n = 1: the last produced token (num_cached = tokens − 1)
//   prefill  the rest of the known tokens, split into chunks under the token budget (chunked prefill);
//            the step whose chunk reaches the last known token samples the next one.
// schedule(), per attention-DP group (each group has its own block allocator and budgets):
//   1. one decode token per running sequence whose prefill is complete, oldest admission first; when its
//      block cannot be allocated, the most recently admitted running sequence of the group is preempted
//      (possibly itself) until it can;
//   2. a prefill chunk for each running sequence still in prefill, as many tokens as the budget and the
//      free blocks allow (when none fit, newer running sequences of the group are preempted);
//   3. new sequences from the front of the waiting queue (FIFO), while the group has fewer than
//      max_running running, budget left and a free block for their first chunk; none in a group that
//      preempted in this step.
// Preemption is by recompute: the sequence's blocks are freed and it goes to the FRONT of the waiting
// queue with all its known tokens as the prefix to prefill again (num_cached = 0).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/request.h"

namespace epinfer {

struct SchedulerOptions {
    int64_t block_size = 16;         // tokens per KV block, ≥ 1
    int64_t num_blocks = 0;          // KV blocks per attention-DP group, ≥ 1
    int64_t max_running = 256;       // running sequences per group, ≥ 1
    int64_t max_step_tokens = 2048;  // tokens fed per group per step (decodes + prefill chunks), ≥ 1
    int num_groups = 1;              // attention-DP groups (attn_dp), ≥ 1
};

// The free list of the block ids [0, num_blocks) of one group. Allocation takes the lowest free ids; each id
// allocated or released costs O(log num_blocks) (a min-heap). The sorted list it replaced sorted every free
// id at each release: with 655360 blocks, requests finishing in a step stalled it so long that a
// DeepSeek-V3-shape decode at 64 requests measured 9.7–10.4 instead of 7.2–7.3 ms per output token on the
// H200 machine (docs/benchmarks/serving.md).
class BlockAllocator {
public:
    explicit BlockAllocator(int64_t num_blocks);
    int64_t num_blocks() const { return num_blocks_; }
    int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
    // Appends `count` ids to *table; false (and *table unchanged) when fewer are free.
    bool allocate(int64_t count, std::vector<int32_t>* table);
    // Returns every id of *table to the free list and clears it.
    void release(std::vector<int32_t>* table);

private:
    int64_t num_blocks_ = 0;
    std::vector<int32_t> free_;  // a min-heap (std::greater): front() is the lowest free id
};

// Feed tokens [num_cached, num_cached + num_new) of sequence `id` this step.
struct ScheduledChunk {
    RequestId id = 0;
    int group = 0;           // attention-DP group
    int64_t num_cached = 0;  // KV rows already filled (the position of the first new token)
    int64_t num_new = 0;     // ≥ 1
    bool sample = false;     // the chunk ends at the last known token: sample the next one
    bool operator==(const ScheduledChunk&) const = default;
};

struct SchedulerStep {
    std::vector<ScheduledChunk> chunks;  // per group: decodes, then prefill chunks (admission order)
    std::vector<RequestId> preempted;    // sent back to the front of the waiting queue in this step
};

class Scheduler {
public:
    // Errors: kInvalidArgument naming an option below its minimum.
    static Result<Scheduler> create(const SchedulerOptions& options);

    const SchedulerOptions& options() const { return options_; }
    // Blocks needed for num_tokens tokens: ceil(num_tokens / block_size).
    int64_t blocks_for(int64_t num_tokens) const {
        return (num_tokens + options_.block_size - 1) / options_.block_size;
    }
    // kInvalidArgument naming the numbers when prompt_len + max_tokens tokens need more blocks than one
    // group has (such a request could never finish). Thread-safe (reads the options only).
    Status check_request(int64_t prompt_len, int64_t max_tokens) const;

    // Queues a new sequence at the back of the waiting queue, in the group with the fewest running +
    // waiting sequences (ties: the lowest group), and returns that group. `id` must be new; prompt
    // non-empty.
    int add(RequestId id, std::vector<int32_t> prompt);
    // Forgets a sequence wherever it is (finished or aborted), freeing its blocks; false when unknown.
    bool remove(RequestId id);
    // Plans the next step (see the header comment) and allocates its blocks.
    SchedulerStep schedule();
    // After the step ran: the chunk's tokens now have KV rows (num_cached += num_new).
    void commit(const ScheduledChunk& chunk);
    // Appends a produced token to the known tokens of `id` (after its chunk with sample = true).
    void append_token(RequestId id, int32_t token);

    bool contains(RequestId id) const { return sequences_.count(id) != 0; }
    // The known tokens (prompt + produced) and the block table of `id`, which must exist.
    const std::vector<int32_t>& tokens(RequestId id) const { return sequences_.at(id).tokens; }
    const std::vector<int32_t>& block_table(RequestId id) const { return sequences_.at(id).block_table; }
    int64_t num_cached(RequestId id) const { return sequences_.at(id).num_cached; }
    int group_of(RequestId id) const { return sequences_.at(id).group; }
    bool is_running(RequestId id) const { return sequences_.at(id).running; }

    int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
    int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
    int64_t num_blocks_used() const;   // over every group
    int64_t num_blocks_total() const;  // num_blocks · num_groups
    int64_t num_free_blocks(int group) const { return allocators_.at(static_cast<size_t>(group)).num_free(); }
    int64_t num_preemptions() const { return num_preemptions_; }  // since create

private:
    struct Sequence {
        RequestId id = 0;
        int group = 0;
        std::vector<int32_t> tokens;       // prompt + produced
        int64_t num_cached = 0;            // tokens with KV rows
        std::vector<int32_t> block_table;  // block ids in position order
        bool running = false;
    };

    explicit Scheduler(const SchedulerOptions& options);
    // The tokens of `seq`'s next n that its table plus the group's free blocks can hold (≤ n).
    int64_t tokens_that_fit(const Sequence& seq, int64_t n) const;
    // Grows seq's table to hold num_cached + n tokens; false when the group lacks the blocks.
    bool grow(Sequence& seq, int64_t n);
    // The most recently admitted running sequence of `group`.
    Sequence* newest_running(int group);
    // Frees the blocks of a running sequence and puts it at the front of the waiting queue; drops its
    // chunk from *step if it had one.
    void preempt(Sequence& seq, SchedulerStep* step, std::vector<int64_t>* budget);

    SchedulerOptions options_;
    std::vector<BlockAllocator> allocators_;             // [num_groups]
    std::unordered_map<RequestId, Sequence> sequences_;  // running and waiting
    std::vector<RequestId> running_;                     // admission order (newest last)
    std::deque<RequestId> waiting_;                      // FIFO; preempted ones go to the front
    std::vector<int64_t> group_size_;                    // [num_groups] running + waiting
    int64_t num_preemptions_ = 0;
};

}  // namespace epinfer
