#include "engine/scheduler.h"

#include <algorithm>
#include <functional>
#include <string>

namespace epinfer {

BlockAllocator::BlockAllocator(int64_t num_blocks) : num_blocks_(num_blocks) {
    free_.reserve(static_cast<size_t>(num_blocks));
    for (int64_t b = 0; b < num_blocks; ++b)
        free_.push_back(static_cast<int32_t>(b));  // ascending: a min-heap
}

bool BlockAllocator::allocate(int64_t count, std::vector<int32_t>* table) {
    if (count > num_free()) return false;
    for (int64_t i = 0; i < count; ++i) {
        std::pop_heap(free_.begin(), free_.end(), std::greater<>());
        table->push_back(free_.back());
        free_.pop_back();
    }
    return true;
}

void BlockAllocator::release(std::vector<int32_t>* table) {
    for (const int32_t id : *table) {
        free_.push_back(id);
        std::push_heap(free_.begin(), free_.end(), std::greater<>());
    }
    table->clear();
}

Result<Scheduler> Scheduler::create(const SchedulerOptions& o) {
    const auto at_least_one = [](int64_t value, const char* name) -> Status {
        if (value >= 1) return Status::ok();
        return invalid_argument(std::string(name) + " must be ≥ 1, got " + std::to_string(value));
    };
    EPI_RETURN_IF_ERROR(at_least_one(o.block_size, "block_size"));
    EPI_RETURN_IF_ERROR(at_least_one(o.num_blocks, "num_kv_blocks"));
    EPI_RETURN_IF_ERROR(at_least_one(o.max_running, "max_running"));
    EPI_RETURN_IF_ERROR(at_least_one(o.max_step_tokens, "max_step_tokens"));
    EPI_RETURN_IF_ERROR(at_least_one(o.num_groups, "the number of attention-DP groups"));
    if (o.num_blocks > INT32_MAX) {
        return invalid_argument("num_kv_blocks " + std::to_string(o.num_blocks) +
                                " exceeds the int32 block ids (at most " + std::to_string(INT32_MAX) + ")");
    }
    return Scheduler(o);
}

Scheduler::Scheduler(const SchedulerOptions& options)
    : options_(options), group_size_(static_cast<size_t>(options.num_groups), 0) {
    for (int g = 0; g < options.num_groups; ++g) allocators_.emplace_back(options.num_blocks);
}

Status Scheduler::check_request(int64_t prompt_len, int64_t max_tokens) const {
    const int64_t total = prompt_len + max_tokens;
    const int64_t need = blocks_for(total);
    if (need <= options_.num_blocks) return Status::ok();
    return invalid_argument("prompt of " + std::to_string(prompt_len) + " tokens + max_tokens " +
                            std::to_string(max_tokens) + " = " + std::to_string(total) + " tokens need " +
                            std::to_string(need) + " KV blocks of " + std::to_string(options_.block_size) +
                            " tokens, but the pool has " + std::to_string(options_.num_blocks));
}

int Scheduler::add(RequestId id, std::vector<int32_t> prompt) {
    const auto fewest = std::min_element(group_size_.begin(), group_size_.end());  // first of equals
    const int group = static_cast<int>(fewest - group_size_.begin());
    ++*fewest;
    Sequence seq;
    seq.id = id;
    seq.group = group;
    seq.tokens = std::move(prompt);
    sequences_.emplace(id, std::move(seq));
    waiting_.push_back(id);
    return group;
}

bool Scheduler::remove(RequestId id) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) return false;
    Sequence& seq = it->second;
    if (seq.running) {
        allocators_[static_cast<size_t>(seq.group)].release(&seq.block_table);
        running_.erase(std::find(running_.begin(), running_.end(), id));
    } else {
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    }
    --group_size_[static_cast<size_t>(seq.group)];
    sequences_.erase(it);
    return true;
}

int64_t Scheduler::tokens_that_fit(const Sequence& seq, int64_t n) const {
    const BlockAllocator& alloc = allocators_[static_cast<size_t>(seq.group)];
    const int64_t room =
        (static_cast<int64_t>(seq.block_table.size()) + alloc.num_free()) * options_.block_size -
        seq.num_cached;
    return std::clamp<int64_t>(room, 0, n);
}

bool Scheduler::grow(Sequence& seq, int64_t n) {
    const int64_t need = blocks_for(seq.num_cached + n) - static_cast<int64_t>(seq.block_table.size());
    if (need <= 0) return true;
    return allocators_[static_cast<size_t>(seq.group)].allocate(need, &seq.block_table);
}

Scheduler::Sequence* Scheduler::newest_running(int group) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        Sequence& seq = sequences_.at(*it);
        if (seq.group == group) return &seq;
    }
    return nullptr;
}

void Scheduler::preempt(Sequence& seq, SchedulerStep* step, std::vector<int64_t>* budget) {
    allocators_[static_cast<size_t>(seq.group)].release(&seq.block_table);
    seq.num_cached = 0;
    seq.running = false;
    running_.erase(std::find(running_.begin(), running_.end(), seq.id));
    waiting_.push_front(seq.id);
    step->preempted.push_back(seq.id);
    ++num_preemptions_;
    const auto chunk = std::find_if(step->chunks.begin(), step->chunks.end(),
                                    [&](const ScheduledChunk& c) { return c.id == seq.id; });
    if (chunk != step->chunks.end()) {
        (*budget)[static_cast<size_t>(seq.group)] += chunk->num_new;
        step->chunks.erase(chunk);
    }
}

SchedulerStep Scheduler::schedule() {
    SchedulerStep step;
    const auto G = static_cast<size_t>(options_.num_groups);
    std::vector<int64_t> budget(G, options_.max_step_tokens);  // tokens left per group
    std::vector<bool> blocked(G, false);                       // no admission (preempted, or full)
    const auto remaining = [](const Sequence& seq) {
        return static_cast<int64_t>(seq.tokens.size()) - seq.num_cached;
    };

    // 1. Decodes, oldest first; a missing block preempts the newest running sequence of the group.
    std::vector<RequestId> order = running_;
    for (const RequestId id : order) {
        Sequence& seq = sequences_.at(id);
        const auto g = static_cast<size_t>(seq.group);
        if (!seq.running || remaining(seq) != 1 || budget[g] < 1) continue;
        while (!grow(seq, 1)) {
            Sequence* victim = newest_running(seq.group);
            preempt(*victim, &step, &budget);
            blocked[g] = true;
            if (victim == &seq) break;
        }
        if (!seq.running) continue;
        step.chunks.push_back({id, seq.group, seq.num_cached, 1, true});
        budget[g] -= 1;
    }

    // 2. Prefill chunks of running sequences, oldest first; when no token fits, newer sequences of the
    // group are preempted.
    order = running_;
    for (const RequestId id : order) {
        Sequence& seq = sequences_.at(id);
        const auto g = static_cast<size_t>(seq.group);
        if (!seq.running || remaining(seq) <= 1 || budget[g] < 1) continue;
        const int64_t want = std::min(remaining(seq), budget[g]);
        int64_t n = tokens_that_fit(seq, want);
        while (n == 0) {
            Sequence* victim = newest_running(seq.group);
            if (victim == &seq) break;
            preempt(*victim, &step, &budget);
            blocked[g] = true;
            n = tokens_that_fit(seq, std::min(remaining(seq), budget[g]));
        }
        if (n == 0) continue;
        grow(seq, n);
        step.chunks.push_back({id, seq.group, seq.num_cached, n, n == remaining(seq)});
        budget[g] -= n;
    }

    // 3. Admission from the front of the waiting queue (FIFO per group).
    std::vector<int64_t> num_running(G, 0);
    for (const RequestId id : running_) ++num_running[static_cast<size_t>(sequences_.at(id).group)];
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        Sequence& seq = sequences_.at(*it);
        const auto g = static_cast<size_t>(seq.group);
        if (blocked[g] || num_running[g] >= options_.max_running || budget[g] < 1) {
            blocked[g] = true;
            ++it;
            continue;
        }
        const int64_t n = tokens_that_fit(seq, std::min(remaining(seq), budget[g]));
        if (n == 0) {
            blocked[g] = true;
            ++it;
            continue;
        }
        grow(seq, n);
        seq.running = true;
        running_.push_back(seq.id);
        ++num_running[g];
        step.chunks.push_back({seq.id, seq.group, seq.num_cached, n, n == remaining(seq)});
        budget[g] -= n;
        it = waiting_.erase(it);
    }
    return step;
}

void Scheduler::commit(const ScheduledChunk& chunk) {
    sequences_.at(chunk.id).num_cached += chunk.num_new;
}

void Scheduler::append_token(RequestId id, int32_t token) {
    sequences_.at(id).tokens.push_back(token);
}

int64_t Scheduler::num_blocks_used() const {
    int64_t used = 0;
    for (const BlockAllocator& a : allocators_) used += a.num_blocks() - a.num_free();
    return used;
}

int64_t Scheduler::num_blocks_total() const {
    return options_.num_blocks * options_.num_groups;
}

}  // namespace epinfer
