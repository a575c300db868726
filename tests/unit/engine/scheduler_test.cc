// The continuous-batching scheduler (engine/scheduler.h) without a model: hand-checked plans for the
// basic cases, and a simulated paged KV cache (token ids written to the scheduled block rows, the next
// token a hash of the history read back through the block table) under random workloads with
// preemption, chunked prefill and attention-DP groups, which must give every request the tokens it
// gets alone.
#include "engine/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <vector>

namespace epinfer {

void PrintTo(const ScheduledChunk& c, std::ostream* os) {
    *os << "{id " << c.id << ", group " << c.group << ", cached " << c.num_cached << ", new " << c.num_new
        << (c.sample ? ", sample}" : "}");
}

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

SchedulerOptions options(int64_t block_size, int64_t num_blocks, int64_t max_running, int64_t max_step_tokens,
                         int num_groups = 1) {
    SchedulerOptions o;
    o.block_size = block_size;
    o.num_blocks = num_blocks;
    o.max_running = max_running;
    o.max_step_tokens = max_step_tokens;
    o.num_groups = num_groups;
    return o;
}

Scheduler make(const SchedulerOptions& o) {
    Result<Scheduler> s = Scheduler::create(o);
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return std::move(s).value();
}

// Commits every chunk of the step and appends `token` after each sampled one.
void run_step(Scheduler& s, const SchedulerStep& step, int32_t token = 7) {
    for (const ScheduledChunk& c : step.chunks) {
        s.commit(c);
        if (c.sample) s.append_token(c.id, token);
    }
}

TEST(BlockAllocator, TakesLowestIdsAndRefusesWhenShort) {
    BlockAllocator a(4);
    std::vector<int32_t> t1, t2;
    EXPECT_TRUE(a.allocate(3, &t1));
    EXPECT_THAT(t1, ElementsAre(0, 1, 2));
    EXPECT_FALSE(a.allocate(2, &t2));
    EXPECT_TRUE(t2.empty());
    EXPECT_EQ(a.num_free(), 1);
    a.release(&t1);
    EXPECT_TRUE(t1.empty());
    EXPECT_EQ(a.num_free(), 4);
    EXPECT_TRUE(a.allocate(2, &t2));
    EXPECT_THAT(t2, ElementsAre(0, 1));
}

TEST(BlockAllocator, TakesLowestIdsAfterReleasesInAnyOrder) {
    BlockAllocator a(10);
    std::vector<int32_t> t1, t2, t3;
    ASSERT_TRUE(a.allocate(4, &t1));  // 0 1 2 3
    ASSERT_TRUE(a.allocate(3, &t2));  // 4 5 6
    ASSERT_TRUE(a.allocate(2, &t3));  // 7 8
    std::vector<int32_t> scrambled = {6, 4, 5};
    a.release(&scrambled);
    t1 = {3, 1};  // a table released out of order (its other ids stay held)
    a.release(&t1);
    EXPECT_EQ(a.num_free(), 6);  // 1 3 4 5 6 9
    std::vector<int32_t> got;
    ASSERT_TRUE(a.allocate(6, &got));
    EXPECT_THAT(got, ElementsAre(1, 3, 4, 5, 6, 9));
    EXPECT_FALSE(a.allocate(1, &got));
}

TEST(Scheduler, RejectsBadOptionsNamingThem) {
    Result<Scheduler> s = Scheduler::create(options(0, 8, 4, 16));
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr("block_size must be ≥ 1, got 0"));
    s = Scheduler::create(options(4, 0, 4, 16));
    EXPECT_THAT(s.status().message(), HasSubstr("num_kv_blocks must be ≥ 1, got 0"));
    s = Scheduler::create(options(4, 8, 0, 16));
    EXPECT_THAT(s.status().message(), HasSubstr("max_running must be ≥ 1, got 0"));
    s = Scheduler::create(options(4, 8, 4, -1));
    EXPECT_THAT(s.status().message(), HasSubstr("max_step_tokens must be ≥ 1, got -1"));
}

TEST(Scheduler, RejectsRequestsLargerThanThePool) {
    const Scheduler s = make(options(4, 3, 4, 16));
    EXPECT_TRUE(s.check_request(8, 4).is_ok());  // 12 tokens = 3 blocks
    const Status st = s.check_request(8, 5);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(
        st.message(),
        "prompt of 8 tokens + max_tokens 5 = 13 tokens need 4 KV blocks of 4 tokens, but the pool has 3");
}

TEST(Scheduler, PrefillThenDecodeGrowingTheBlockTable) {
    Scheduler s = make(options(4, 8, 4, 16));
    EXPECT_EQ(s.add(1, {10, 11, 12, 13, 14}), 0);
    EXPECT_EQ(s.num_waiting(), 1);
    SchedulerStep step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, 0, 5, true}));
    EXPECT_THAT(s.block_table(1), ElementsAre(0, 1));
    EXPECT_EQ(s.num_running(), 1);
    EXPECT_EQ(s.num_waiting(), 0);
    run_step(s, step);
    EXPECT_EQ(s.num_cached(1), 5);
    EXPECT_THAT(s.tokens(1), ElementsAre(10, 11, 12, 13, 14, 7));
    for (int64_t pos = 5; pos < 9; ++pos) {  // decodes at positions 5..8; position 8 needs block 3
        step = s.schedule();
        EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, pos, 1, true}));
        run_step(s, step);
    }
    EXPECT_THAT(s.block_table(1), ElementsAre(0, 1, 2));
    EXPECT_EQ(s.num_blocks_used(), 3);
    EXPECT_TRUE(s.remove(1));
    EXPECT_FALSE(s.remove(1));
    EXPECT_EQ(s.num_blocks_used(), 0);
    EXPECT_EQ(s.num_running(), 0);
    EXPECT_TRUE(s.schedule().chunks.empty());
}

TEST(Scheduler, ChunkedPrefillSplitsALongPromptAcrossSteps) {
    Scheduler s = make(options(4, 8, 4, 4));
    s.add(1, std::vector<int32_t>(10, 3));
    std::vector<ScheduledChunk> chunks;
    for (int i = 0; i < 4; ++i) {
        const SchedulerStep step = s.schedule();
        ASSERT_EQ(step.chunks.size(), 1u);
        chunks.push_back(step.chunks[0]);
        run_step(s, step);
    }
    EXPECT_THAT(chunks, ElementsAre(ScheduledChunk{1, 0, 0, 4, false}, ScheduledChunk{1, 0, 4, 4, false},
                                    ScheduledChunk{1, 0, 8, 2, true}, ScheduledChunk{1, 0, 10, 1, true}));
}

// Decodes come first; the rest of the budget goes to prefill chunks, so a request added later joins the
// running batch while the first one keeps decoding.
TEST(Scheduler, NewRequestJoinsTheRunningBatchUnderTheBudget) {
    Scheduler s = make(options(4, 16, 4, 6));
    s.add(1, {1, 2, 3});
    SchedulerStep step = s.schedule();
    run_step(s, step);
    step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, 3, 1, true}));
    run_step(s, step);
    s.add(2, std::vector<int32_t>(8, 5));
    step = s.schedule();
    EXPECT_THAT(step.chunks,
                ElementsAre(ScheduledChunk{1, 0, 4, 1, true}, ScheduledChunk{2, 0, 0, 5, false}));
    run_step(s, step);
    step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, 5, 1, true}, ScheduledChunk{2, 0, 5, 3, true}));
    run_step(s, step);
    step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, 6, 1, true}, ScheduledChunk{2, 0, 8, 1, true}));
}

TEST(Scheduler, MaxRunningHoldsTheRestInTheQueueInOrder) {
    Scheduler s = make(options(4, 16, 2, 64));
    for (RequestId id = 1; id <= 4; ++id) s.add(id, {1, 2});
    SchedulerStep step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, 0, 2, true}, ScheduledChunk{2, 0, 0, 2, true}));
    EXPECT_EQ(s.num_waiting(), 2);
    run_step(s, step);
    s.remove(2);
    step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, 2, 1, true}, ScheduledChunk{3, 0, 0, 2, true}));
    EXPECT_FALSE(s.is_running(4));
}

TEST(Scheduler, AdmissionWaitsForFreeBlocks) {
    Scheduler s = make(options(2, 4, 8, 64));
    s.add(1, {1, 2, 3, 4, 5, 6});  // 3 blocks
    s.add(2, {1, 2, 3, 4});        // 2 blocks: only 1 free → admitted with a 2-token chunk
    s.add(3, {1});
    SchedulerStep step = s.schedule();
    EXPECT_THAT(step.chunks,
                ElementsAre(ScheduledChunk{1, 0, 0, 6, true}, ScheduledChunk{2, 0, 0, 2, false}));
    EXPECT_EQ(s.num_free_blocks(0), 0);
    EXPECT_FALSE(s.is_running(3));
    // Removing 1 frees its blocks: 2 finishes its prefill and 3 is admitted.
    run_step(s, step);
    s.remove(1);
    step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{2, 0, 2, 2, true}, ScheduledChunk{3, 0, 0, 1, true}));
}

// A decode that finds no free block preempts the most recently admitted running sequence, which goes
// back to the front of the queue with its produced tokens and no blocks; it is re-admitted (whole
// history as the prefill) once blocks are free.
TEST(Scheduler, DecodeWithoutBlocksPreemptsTheNewestSequence) {
    Scheduler s = make(options(2, 3, 8, 64));
    s.add(1, {1, 2});
    s.add(2, {3, 4});
    s.add(3, {5});
    SchedulerStep step = s.schedule();  // 1: block 0, 2: block 1, 3: block 2
    EXPECT_EQ(step.chunks.size(), 3u);
    run_step(s, step, 9);
    // Positions 2 of 1 and 2 need a block each and none is free: 1 preempts 3 (the newest) and takes its
    // block, then 2 (now the newest) preempts itself.
    step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, 2, 1, true}));
    EXPECT_THAT(step.preempted, ElementsAre(3, 2));
    EXPECT_EQ(s.num_preemptions(), 2);
    EXPECT_FALSE(s.is_running(2));
    EXPECT_FALSE(s.is_running(3));
    EXPECT_TRUE(s.block_table(2).empty());
    EXPECT_EQ(s.num_cached(2), 0);
    EXPECT_THAT(s.tokens(2), ElementsAre(3, 4, 9));  // the produced token is kept
    EXPECT_THAT(s.block_table(1), ElementsAre(0, 2));
    run_step(s, step, 8);
    s.remove(1);
    // 2 (front of the queue: preempted last but older) is re-admitted first with its whole history.
    step = s.schedule();
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{2, 0, 0, 3, true}, ScheduledChunk{3, 0, 0, 2, true}));
}

TEST(Scheduler, PreemptedGroupAdmitsNothingInThatStep) {
    Scheduler s = make(options(1, 2, 8, 64));
    s.add(1, {1});
    s.add(2, {2});
    run_step(s, s.schedule());
    s.add(3, {3});
    const SchedulerStep step = s.schedule();  // 1 needs a block: 2 is preempted, 3 must wait
    EXPECT_THAT(step.preempted, ElementsAre(2));
    EXPECT_THAT(step.chunks, ElementsAre(ScheduledChunk{1, 0, 1, 1, true}));
    EXPECT_FALSE(s.is_running(3));
}

TEST(Scheduler, AttentionDpGroupsHaveTheirOwnBlocksAndBudgets) {
    Scheduler s = make(options(4, 2, 8, 5, 2));
    EXPECT_EQ(s.add(1, std::vector<int32_t>(6, 1)), 0);
    EXPECT_EQ(s.add(2, std::vector<int32_t>(6, 2)), 1);
    EXPECT_EQ(s.add(3, {3}), 0);
    EXPECT_EQ(s.num_blocks_total(), 4);
    const SchedulerStep step = s.schedule();  // budget 5 per group
    EXPECT_THAT(step.chunks,
                ElementsAre(ScheduledChunk{1, 0, 0, 5, false}, ScheduledChunk{2, 1, 0, 5, false}));
    EXPECT_THAT(s.block_table(1), ElementsAre(0, 1));
    EXPECT_THAT(s.block_table(2), ElementsAre(0, 1));
    EXPECT_EQ(s.num_blocks_used(), 4);
    s.remove(1);
    EXPECT_EQ(s.add(4, {4}), 0);  // group 0: 3 (waiting) · group 1: 2 → tie → group 0
    EXPECT_EQ(s.add(5, {5}), 1);
}

// ---- Simulation: a paged "KV cache" that stores token ids, and a model whose next token is a hash of
// the history it reads back through the block table.

int32_t next_token(const std::vector<int32_t>& history) {
    uint64_t h = 1469598103934665603ull;
    for (const int32_t t : history) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    return static_cast<int32_t>(h % 1000);
}

std::vector<int32_t> alone(std::vector<int32_t> tokens, int64_t max_tokens) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < max_tokens; ++i) {
        out.push_back(next_token(tokens));
        tokens.push_back(out.back());
    }
    return out;
}

struct SimRequest {
    std::vector<int32_t> prompt;
    int64_t max_tokens = 0;
    int64_t add_at_step = 0;
    std::vector<int32_t> produced;
    bool done = false;
};

struct SimResult {
    int64_t steps = 0, preemptions = 0, max_batch = 0;
};

// Runs the requests to completion, checking the scheduler's invariants at every step.
SimResult simulate(const SchedulerOptions& o, std::vector<SimRequest>& requests) {
    Scheduler s = make(o);
    const int64_t bs = o.block_size;
    // [group][block · bs + row] = token id at that KV row (−1: never written).
    std::vector<std::vector<int32_t>> kv(static_cast<size_t>(o.num_groups),
                                         std::vector<int32_t>(static_cast<size_t>(o.num_blocks * bs), -1));
    SimResult r;
    size_t num_done = 0;
    for (int64_t step_idx = 0; num_done < requests.size(); ++step_idx) {
        if (step_idx > 10000) {
            ADD_FAILURE() << "no progress after 10000 steps";
            return r;
        }
        for (size_t i = 0; i < requests.size(); ++i)
            if (requests[i].add_at_step == step_idx) s.add(i, requests[i].prompt);
        const SchedulerStep step = s.schedule();
        r.preemptions += static_cast<int64_t>(step.preempted.size());
        r.max_batch = std::max<int64_t>(r.max_batch, static_cast<int64_t>(step.chunks.size()));
        ++r.steps;
        std::vector<int64_t> tokens_of_group(static_cast<size_t>(o.num_groups), 0);
        std::vector<int64_t> seqs_of_group(static_cast<size_t>(o.num_groups), 0);
        std::set<RequestId> ids;
        for (const ScheduledChunk& c : step.chunks) {
            EXPECT_TRUE(ids.insert(c.id).second) << "two chunks of request " << c.id;
            EXPECT_TRUE(s.is_running(c.id));
            EXPECT_EQ(c.group, s.group_of(c.id));
            EXPECT_EQ(c.num_cached, s.num_cached(c.id));
            EXPECT_GE(c.num_new, 1);
            const auto known = static_cast<int64_t>(s.tokens(c.id).size());
            EXPECT_LE(c.num_cached + c.num_new, known);
            EXPECT_EQ(c.sample, c.num_cached + c.num_new == known);
            EXPECT_GE(static_cast<int64_t>(s.block_table(c.id).size()) * bs, c.num_cached + c.num_new);
            tokens_of_group[static_cast<size_t>(c.group)] += c.num_new;
            ++seqs_of_group[static_cast<size_t>(c.group)];
        }
        for (int g = 0; g < o.num_groups; ++g) {
            EXPECT_LE(tokens_of_group[static_cast<size_t>(g)], o.max_step_tokens);
            EXPECT_LE(seqs_of_group[static_cast<size_t>(g)], o.max_running);
        }
        // No block is held by two running sequences; the count matches the allocators.
        std::set<std::pair<int, int32_t>> held;
        int64_t num_held = 0;
        for (size_t i = 0; i < requests.size(); ++i) {
            if (!s.contains(i) || !s.is_running(i)) continue;
            for (const int32_t b : s.block_table(i)) {
                EXPECT_GE(b, 0);
                EXPECT_LT(b, o.num_blocks);
                EXPECT_TRUE(held.insert({s.group_of(i), b}).second) << "block " << b << " shared";
                ++num_held;
            }
        }
        EXPECT_EQ(num_held, s.num_blocks_used());
        if (::testing::Test::HasFailure()) return r;

        // The "forward": write the chunk's tokens to their KV rows, then read the history back.
        for (const ScheduledChunk& c : step.chunks) {
            std::vector<int32_t>& rows = kv[static_cast<size_t>(c.group)];
            const std::vector<int32_t>& table = s.block_table(c.id);
            const auto row_of = [&](int64_t pos) {
                return static_cast<size_t>(table[static_cast<size_t>(pos / bs)] * bs + pos % bs);
            };
            for (int64_t p = c.num_cached; p < c.num_cached + c.num_new; ++p)
                rows[row_of(p)] = s.tokens(c.id)[static_cast<size_t>(p)];
            std::vector<int32_t> history;
            for (int64_t p = 0; p < c.num_cached + c.num_new; ++p) history.push_back(rows[row_of(p)]);
            s.commit(c);
            if (!c.sample) continue;
            SimRequest& req = requests[c.id];
            req.produced.push_back(next_token(history));
            s.append_token(c.id, req.produced.back());
            if (static_cast<int64_t>(req.produced.size()) == req.max_tokens) {
                EXPECT_TRUE(s.remove(c.id));
                req.done = true;
                ++num_done;
            }
        }
    }
    EXPECT_EQ(s.num_blocks_used(), 0);
    EXPECT_EQ(s.num_running() + s.num_waiting(), 0);
    EXPECT_EQ(s.num_preemptions(), r.preemptions);
    return r;
}

std::vector<SimRequest> random_requests(uint64_t seed, int n, int64_t max_prompt, int64_t max_new,
                                        int64_t max_add_step) {
    std::mt19937_64 rng(seed);
    std::vector<SimRequest> requests(static_cast<size_t>(n));
    for (SimRequest& r : requests) {
        const int64_t p = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_prompt));
        for (int64_t i = 0; i < p; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 1000));
        r.max_tokens = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_new));
        r.add_at_step = static_cast<int64_t>(rng() % static_cast<uint64_t>(max_add_step + 1));
    }
    return requests;
}

void expect_alone_tokens(const std::vector<SimRequest>& requests) {
    for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_TRUE(requests[i].done) << i;
        EXPECT_EQ(requests[i].produced, alone(requests[i].prompt, requests[i].max_tokens)) << "request " << i;
    }
}

TEST(SchedulerSimulation, AmpleBlocksNoPreemption) {
    std::vector<SimRequest> requests = random_requests(1, 16, 20, 10, 12);
    const SimResult r = simulate(options(4, 256, 64, 512), requests);
    expect_alone_tokens(requests);
    EXPECT_EQ(r.preemptions, 0);
    EXPECT_GT(r.max_batch, 1);
}

TEST(SchedulerSimulation, TinyPoolPreemptsAndEveryRequestStillGetsItsTokens) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
        std::vector<SimRequest> requests = random_requests(seed, 12, 14, 12, 6);
        const SimResult r = simulate(options(2, 13, 8, 64), requests);  // 26 tokens: one request at most
        expect_alone_tokens(requests);
        EXPECT_GT(r.preemptions, 0) << "seed " << seed;
        if (::testing::Test::HasFailure()) FAIL() << "seed " << seed;
    }
}

TEST(SchedulerSimulation, ChunkedPrefillAndSmallBudgets) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
        std::vector<SimRequest> requests = random_requests(100 + seed, 10, 30, 6, 8);
        simulate(options(3, 40, 3, 5), requests);
        expect_alone_tokens(requests);
        if (::testing::Test::HasFailure()) FAIL() << "seed " << seed;
    }
}

TEST(SchedulerSimulation, BudgetOfOneToken) {
    std::vector<SimRequest> requests = random_requests(7, 5, 6, 4, 3);
    simulate(options(2, 8, 4, 1), requests);
    expect_alone_tokens(requests);
}

TEST(SchedulerSimulation, AttentionDpGroupsWithPreemption) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
        std::vector<SimRequest> requests = random_requests(200 + seed, 16, 12, 10, 6);
        simulate(options(2, 11, 4, 16, 3), requests);
        expect_alone_tokens(requests);
        if (::testing::Test::HasFailure()) FAIL() << "seed " << seed;
    }
}

}  // namespace
}  // namespace epinfer
