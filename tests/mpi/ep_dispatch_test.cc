// ep_dispatch / ep_combine across MPI ranks against a single-rank reference computed from the same
// routing on every rank: rank-coded rows (each row carries its source rank and token index) must arrive
// bit-exactly where the reference permutation says, and combine must give the reference sums bit for bit.
// Covers the fault kinds engines have shipped bugs in: a rank with zero tokens, an empty batch on every
// rank, all tokens to one expert, experts (and a whole rank) with no tokens, a token whose K experts all
// live on one rank, arrival order, disagreeing ranks, and 1000 random routings with uneven counts.
#include "layers/moe/ep_dispatch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "layers/moe/ep_combine.h"
#include "layers/moe/permute.h"
#include "mpi_test_world.h"

namespace epinfer::mpi_test {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHidden = 4;  // H

// One rank's batch: rank-coded rows x[t] = {rank, t, 1000·rank + t, 0.5}, and its routing.
struct RankBatch {
    int64_t num_tokens = 0;
    std::vector<int32_t> ids;    // [T, K]
    std::vector<float> weights;  // [T, K]
    std::vector<float> x;        // [T, H]
};

// The routing of every rank, known to every rank (built from the same seed everywhere).
struct Scenario {
    int64_t num_experts = 0;       // E
    int64_t top_k = 0;             // K
    std::vector<RankBatch> ranks;  // [ep]
};

RankBatch make_batch(int rank, int64_t num_tokens, int64_t top_k) {
    RankBatch b;
    b.num_tokens = num_tokens;
    b.ids.assign(static_cast<size_t>(num_tokens * top_k), -1);
    b.weights.assign(static_cast<size_t>(num_tokens * top_k), 0.0f);
    for (int64_t t = 0; t < num_tokens; ++t) {
        const float row[kHidden] = {static_cast<float>(rank), static_cast<float>(t), 1000.0f * rank + t,
                                    0.5f};
        b.x.insert(b.x.end(), row, row + kHidden);
    }
    return b;
}

// Random distinct experts per token (some picks −1 when `holes`), random weights in (0, 1).
Scenario random_scenario(uint32_t seed, int ep, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                         bool holes) {
    std::mt19937 rng(seed);
    Scenario sc{num_experts, top_k, {}};
    for (int r = 0; r < ep; ++r) {
        const int64_t num_tokens = std::uniform_int_distribution<int64_t>(0, max_tokens)(rng);
        RankBatch b = make_batch(r, num_tokens, top_k);
        std::vector<int32_t> experts(static_cast<size_t>(num_experts));
        std::iota(experts.begin(), experts.end(), 0);
        for (int64_t t = 0; t < num_tokens; ++t) {
            std::shuffle(experts.begin(), experts.end(), rng);
            for (int64_t k = 0; k < top_k; ++k) {
                const size_t i = static_cast<size_t>(t * top_k + k);
                if (holes && std::uniform_int_distribution<int>(0, 9)(rng) == 0) continue;
                b.ids[i] = experts[static_cast<size_t>(k)];
                b.weights[i] = std::uniform_real_distribution<float>(0.01f, 1.0f)(rng);
            }
        }
        sc.ranks.push_back(std::move(b));
    }
    return sc;
}

// The fake expert e: y = x·(e + 1) + e/4, per element.
float expert_fn(int32_t e, float x) {
    return x * static_cast<float>(e + 1) + 0.25f * static_cast<float>(e);
}

// What rank `me` must receive, in order: (source, token) rows with their local picks in k order.
struct ExpectedRow {
    int source;
    int64_t token;
    std::vector<int32_t> slots;  // [K], −1 padded
    std::vector<float> weights;  // [K], 0 padded
};

std::vector<ExpectedRow> expected_rows(const Scenario& sc, const ExpertPlacement& placement, int me) {
    std::vector<ExpectedRow> rows;
    for (int s = 0; s < static_cast<int>(sc.ranks.size()); ++s) {
        const RankBatch& b = sc.ranks[static_cast<size_t>(s)];
        for (int64_t t = 0; t < b.num_tokens; ++t) {
            ExpectedRow row{s, t, std::vector<int32_t>(static_cast<size_t>(sc.top_k), -1),
                            std::vector<float>(static_cast<size_t>(sc.top_k), 0.0f)};
            size_t j = 0;
            for (int64_t k = 0; k < sc.top_k; ++k) {
                const int32_t id = b.ids[static_cast<size_t>(t * sc.top_k + k)];
                if (id < 0 || placement.primary(id).ep_rank != me) continue;
                row.slots[j] = placement.primary(id).local_slot;
                row.weights[j++] = b.weights[static_cast<size_t>(t * sc.top_k + k)];
            }
            if (j > 0) rows.push_back(std::move(row));
        }
    }
    return rows;
}

// Partial sum that owner rank d computes for token t of rank s: Σ over d's picks in k order, from 0.
std::vector<float> reference_partial(const Scenario& sc, const ExpertPlacement& placement, int s, int64_t t,
                                     int d) {
    const RankBatch& b = sc.ranks[static_cast<size_t>(s)];
    std::vector<float> partial(kHidden, 0.0f);
    for (int64_t k = 0; k < sc.top_k; ++k) {
        const int32_t id = b.ids[static_cast<size_t>(t * sc.top_k + k)];
        if (id < 0 || placement.primary(id).ep_rank != d) continue;
        const float w = b.weights[static_cast<size_t>(t * sc.top_k + k)];
        for (int64_t h = 0; h < kHidden; ++h) {
            partial[static_cast<size_t>(h)] += w * expert_fn(id, b.x[static_cast<size_t>(t * kHidden + h)]);
        }
    }
    return partial;
}

// ep_combine's contract for rank s: Σ over owner ranks ascending of their partials, from 0.
std::vector<float> reference_out(const Scenario& sc, const ExpertPlacement& placement, int s) {
    const RankBatch& b = sc.ranks[static_cast<size_t>(s)];
    std::vector<float> out(static_cast<size_t>(b.num_tokens * kHidden), 0.0f);
    for (int64_t t = 0; t < b.num_tokens; ++t) {
        for (int d = 0; d < placement.ep_size(); ++d) {
            bool owns = false;
            for (int64_t k = 0; k < sc.top_k; ++k) {
                const int32_t id = b.ids[static_cast<size_t>(t * sc.top_k + k)];
                owns = owns || (id >= 0 && placement.primary(id).ep_rank == d);
            }
            if (!owns) continue;
            const std::vector<float> p = reference_partial(sc, placement, s, t, d);
            for (int64_t h = 0; h < kHidden; ++h)
                out[static_cast<size_t>(t * kHidden + h)] += p[static_cast<size_t>(h)];
        }
    }
    return out;
}

// The owner rank's work between dispatch and combine: permute by local slot, run each local expert,
// weighted sum per received row (layers/moe/permute.h).
std::vector<float> local_partials(const EpDispatchOutput& d, const ExpertPlacement& placement, int me) {
    const int num_slots = placement.num_local_slots(me);
    const MoeRoutePlan plan = moe_permute_plan(d.local_slots.data(), d.num_rows, d.top_k, num_slots);
    std::vector<float> x_perm(static_cast<size_t>(plan.num_slots() * kHidden));
    moe_permute_rows(plan, d.rows.data(), kHidden * sizeof(float), x_perm.data());
    std::vector<float> y_perm(x_perm.size());
    for (int slot = 0; slot < num_slots; ++slot) {
        const int32_t e = placement.local_experts(me)[static_cast<size_t>(slot)];
        for (int32_t s = plan.expert_offsets[static_cast<size_t>(slot)];
             s < plan.expert_offsets[static_cast<size_t>(slot) + 1]; ++s) {
            for (int64_t h = 0; h < kHidden; ++h) {
                const size_t i = static_cast<size_t>(s * kHidden + h);
                y_perm[i] = expert_fn(e, x_perm[i]);
            }
        }
    }
    std::vector<float> partial(static_cast<size_t>(d.num_rows * kHidden));
    moe_combine_rows(plan, y_perm.data(), d.weights.data(), kHidden, partial.data());
    return partial;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct RunResult {
    EpDispatchOutput dispatched;
    std::vector<float> out;  // [T, H]
};

// Dispatch, check against the reference, local experts, combine, check against the reference.
RunResult run_and_check(const Scenario& sc, const char* label) {
    Communicator& w = world();
    const int me = w.rank();
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(sc.num_experts, w.size());
    EXPECT_TRUE(placement.is_ok()) << placement.status().message();
    const RankBatch& mine = sc.ranks[static_cast<size_t>(me)];
    EpDispatchArgs args{mine.x.data(),   mine.num_tokens,     kHidden * sizeof(float),
                        mine.ids.data(), mine.weights.data(), sc.top_k};
    Result<EpDispatchOutput> d = ep_dispatch(w, *placement, args);
    EXPECT_TRUE(d.is_ok()) << label << ": " << d.status().message();
    if (!d.is_ok()) return {};

    const std::vector<ExpectedRow> expected = expected_rows(sc, *placement, me);
    EXPECT_EQ(d->num_rows, static_cast<int64_t>(expected.size())) << label;
    if (d->num_rows == static_cast<int64_t>(expected.size())) {
        for (size_t r = 0; r < expected.size(); ++r) {
            const ExpectedRow& e = expected[r];
            const float* got = reinterpret_cast<const float*>(d->rows.data()) + r * kHidden;
            const float* want = sc.ranks[static_cast<size_t>(e.source)].x.data() + e.token * kHidden;
            EXPECT_EQ(std::memcmp(got, want, kHidden * sizeof(float)), 0)
                << label << ": row " << r << " carries rank " << got[0] << " token " << got[1]
                << ", expected rank " << e.source << " token " << e.token;
            EXPECT_EQ(d->source_rank[r], e.source) << label;
            const std::vector<int32_t> slots(d->local_slots.begin() + static_cast<int64_t>(r) * sc.top_k,
                                             d->local_slots.begin() + static_cast<int64_t>(r + 1) * sc.top_k);
            const std::vector<float> weights(d->weights.begin() + static_cast<int64_t>(r) * sc.top_k,
                                             d->weights.begin() + static_cast<int64_t>(r + 1) * sc.top_k);
            EXPECT_EQ(slots, e.slots) << label << ": row " << r;
            EXPECT_TRUE(same_bits(weights, e.weights)) << label << ": row " << r;
        }
    }

    const std::vector<float> partial = local_partials(*d, *placement, me);
    std::vector<float> out(static_cast<size_t>(mine.num_tokens * kHidden), -1.0f);
    Status s = ep_combine(w, {&d->handle, partial.data(), kHidden, out.data()});
    EXPECT_TRUE(s.is_ok()) << label << ": " << s.message();
    EXPECT_TRUE(same_bits(out, reference_out(sc, *placement, me))) << label;
    return {std::move(d).value(), std::move(out)};
}

TEST(EpDispatch, RankCodedRowsAreBitExact) {
    const int n = world().size();
    const Scenario sc = random_scenario(11, n, 16, 4, 9, false);
    run_and_check(sc, "random 16 experts top-4");
    // Uneven placement and holes (−1 picks).
    run_and_check(random_scenario(12, n, 2 * n + 1, 2, 7, true), "2n+1 experts with holes");
}

TEST(EpDispatch, OneRankHasZeroTokens) {
    const int n = world().size();
    Scenario sc = random_scenario(21, n, 16, 3, 8, false);
    sc.ranks[1] = make_batch(1, 0, sc.top_k);
    run_and_check(sc, "rank 1 empty");
}

TEST(EpDispatch, EmptyBatchOnEveryRank) {
    const int n = world().size();
    Scenario sc{16, 2, {}};
    for (int r = 0; r < n; ++r) sc.ranks.push_back(make_batch(r, 0, 2));
    const RunResult res = run_and_check(sc, "all empty");
    EXPECT_EQ(res.dispatched.num_rows, 0);
    EXPECT_TRUE(res.out.empty());
}

TEST(EpDispatch, AllTokensToOneExpert) {
    const int n = world().size();
    Scenario sc{16, 1, {}};
    for (int r = 0; r < n; ++r) {
        RankBatch b = make_batch(r, 6 + r, 1);
        std::fill(b.ids.begin(), b.ids.end(), 9);
        std::fill(b.weights.begin(), b.weights.end(), 0.75f);
        sc.ranks.push_back(std::move(b));
    }
    const RunResult res = run_and_check(sc, "all to expert 9");
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(16, n);
    const int owner = placement->primary(9).ep_rank;
    int64_t total = 0;
    for (int r = 0; r < n; ++r) total += 6 + r;
    EXPECT_EQ(res.dispatched.num_rows, world().rank() == owner ? total : 0);
}

TEST(EpDispatch, ExpertsAndARankWithNoTokens) {
    // Tokens pick 2 distinct experts from [1, first expert of the last rank): expert 0 and every expert
    // of the last rank get no token, and the last rank receives nothing.
    const int n = world().size();
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(16, n);
    std::vector<int32_t> allowed;
    for (int32_t e = 1; e < placement->local_experts(n - 1)[0]; ++e) allowed.push_back(e);
    Scenario sc{16, 2, {}};
    std::mt19937 rng(31);
    for (int r = 0; r < n; ++r) {
        RankBatch b = make_batch(r, 3 + 2 * r, 2);
        for (int64_t t = 0; t < b.num_tokens; ++t) {
            std::shuffle(allowed.begin(), allowed.end(), rng);
            for (int64_t k = 0; k < 2; ++k) {
                b.ids[static_cast<size_t>(t * 2 + k)] = allowed[static_cast<size_t>(k)];
                b.weights[static_cast<size_t>(t * 2 + k)] = 0.3f + 0.1f * static_cast<float>(k);
            }
        }
        sc.ranks.push_back(std::move(b));
    }
    const RunResult res = run_and_check(sc, "experts without tokens");
    if (world().rank() == n - 1) {
        EXPECT_EQ(res.dispatched.num_rows, 0);
    }
}

TEST(EpDispatch, TokenWithAllKExpertsOnOneRankIsSentOnce) {
    const int n = world().size();
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(16, n);
    Scenario sc{16, 3, {}};
    for (int r = 0; r < n; ++r) {
        RankBatch b = make_batch(r, 5, 3);
        for (int64_t t = 0; t < 5; ++t) {
            const int d = static_cast<int>((t + r) % n);
            const auto experts = placement->local_experts(d);
            for (int64_t k = 0; k < 3; ++k) {
                b.ids[static_cast<size_t>(t * 3 + k)] =
                    experts[static_cast<size_t>(2 - k)];  // descending slots
                b.weights[static_cast<size_t>(t * 3 + k)] =
                    0.125f * static_cast<float>(k + 1) + 0.01f * static_cast<float>(t);
            }
        }
        sc.ranks.push_back(std::move(b));
    }
    const RunResult res = run_and_check(sc, "all K on one rank");
    // Sent once: five rows leave this rank in total, one per token.
    int64_t sent = 0;
    for (int64_t c : res.dispatched.handle.send_counts) sent += c;
    EXPECT_EQ(sent, 5);
    // Every received row carries its token's three weights in k order and three slots 2, 1, 0.
    for (int64_t r = 0; r < res.dispatched.num_rows; ++r) {
        EXPECT_EQ(res.dispatched.local_slots[static_cast<size_t>(r * 3)], 2);
        EXPECT_EQ(res.dispatched.local_slots[static_cast<size_t>(r * 3 + 1)], 1);
        EXPECT_EQ(res.dispatched.local_slots[static_cast<size_t>(r * 3 + 2)], 0);
    }
}

TEST(EpCombine, ArrivalOrderDoesNotChangeTheBits) {
    Communicator& w = world();
    const int n = w.size(), me = w.rank();
    const Scenario sc = random_scenario(41, n, 16, 4, 12, true);
    const RunResult first = run_and_check(sc, "first run");
    // The same step again with every rank delayed by a different random time before combining.
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(16, n);
    const RankBatch& mine = sc.ranks[static_cast<size_t>(me)];
    Result<EpDispatchOutput> d = ep_dispatch(
        w, *placement,
        {mine.x.data(), mine.num_tokens, kHidden * sizeof(float), mine.ids.data(), mine.weights.data(), 4});
    ASSERT_TRUE(d.is_ok());
    const std::vector<float> partial = local_partials(*d, *placement, me);
    std::this_thread::sleep_for(std::chrono::milliseconds((me * 7 + 3) % 11 * 3));
    std::vector<float> out(static_cast<size_t>(mine.num_tokens * kHidden), -1.0f);
    ASSERT_TRUE(ep_combine(w, {&d->handle, partial.data(), kHidden, out.data()}).is_ok());
    EXPECT_TRUE(same_bits(out, first.out));

    // The home-rank sum with the returned blocks laid out in every shuffled order gives the same bits.
    const EpDispatchHandle& h = d->handle;
    std::vector<float> returned;  // what the owners send back, blocks in rank order
    for (int dst = 0; dst < n; ++dst) {
        for (int64_t i = 0; i < h.send_counts[static_cast<size_t>(dst)]; ++i) {
            const int64_t t =
                h.token_of_send[static_cast<size_t>(h.send_displs[static_cast<size_t>(dst)] + i)];
            const std::vector<float> p = reference_partial(sc, *placement, me, t, dst);
            returned.insert(returned.end(), p.begin(), p.end());
        }
    }
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(static_cast<uint32_t>(me) + 5);
    for (int trial = 0; trial < 6; ++trial) {
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<float> shuffled;
        std::vector<int64_t> first_row(static_cast<size_t>(n));
        for (int dst : order) {
            first_row[static_cast<size_t>(dst)] = static_cast<int64_t>(shuffled.size()) / kHidden;
            const auto begin = returned.begin() + h.send_displs[static_cast<size_t>(dst)] * kHidden;
            shuffled.insert(shuffled.end(), begin, begin + h.send_counts[static_cast<size_t>(dst)] * kHidden);
        }
        std::vector<float> again(out.size(), -1.0f);
        ep_combine_sum(h, shuffled.empty() ? nullptr : shuffled.data(), first_row, kHidden, again.data());
        EXPECT_TRUE(same_bits(again, first.out)) << "trial " << trial;
    }
}

TEST(EpDispatch, RanksDisagreeingOnKAreNamed) {
    Communicator& w = world();
    const int me = w.rank();
    const int64_t k = me == 0 ? 2 : 1;
    RankBatch b = make_batch(me, 1, k);
    b.ids[0] = 0;
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(16, w.size());
    Result<EpDispatchOutput> d = ep_dispatch(
        w, *placement, {b.x.data(), 1, kHidden * sizeof(float), b.ids.data(), b.weights.data(), k});
    ASSERT_FALSE(d.is_ok());
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(d.status().message(),
                HasSubstr(me == 0 ? "EP rank 1 dispatches K 1 with rows of 16 bytes, EP rank 0 "
                                    "K 2 with rows of 16 bytes"
                                  : "EP rank 0 dispatches K 2 with rows of 16 bytes"));
    ASSERT_TRUE(w.barrier().is_ok());  // still usable
}

TEST(EpDispatch, BadIdsAndMismatchedGroupFailBeforeAnyCommunication) {
    Communicator& w = world();
    RankBatch b = make_batch(w.rank(), 2, 2);
    b.ids = {0, 1, 16, 2};
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(16, w.size());
    Result<EpDispatchOutput> d = ep_dispatch(
        w, *placement, {b.x.data(), 2, kHidden * sizeof(float), b.ids.data(), b.weights.data(), 2});
    ASSERT_FALSE(d.is_ok());
    EXPECT_THAT(d.status().message(), HasSubstr("token 1 pick 0: expert id 16 is outside [−1, 16)"));
    Result<ExpertPlacement> wrong = ExpertPlacement::contiguous(16, w.size() + 1);
    b.ids = {0, 1, 2, 3};
    d = ep_dispatch(w, *wrong, {b.x.data(), 2, kHidden * sizeof(float), b.ids.data(), b.weights.data(), 2});
    ASSERT_FALSE(d.is_ok());
    EXPECT_THAT(d.status().message(), HasSubstr("the EP group has"));
}

TEST(EpDispatch, ThousandRandomRoutings) {
    const int n = world().size();
    for (uint32_t iter = 0; iter < 1000; ++iter) {
        std::mt19937 shape_rng(1000003u * iter + 17u);  // the same on every rank
        const int64_t num_experts = std::uniform_int_distribution<int64_t>(n, 20)(shape_rng);
        const int64_t top_k =
            std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(4, num_experts))(shape_rng);
        const int64_t max_tokens = std::uniform_int_distribution<int64_t>(0, 12)(shape_rng);
        const Scenario sc = random_scenario(iter + 100u, n, num_experts, top_k, max_tokens, iter % 3 == 0);
        run_and_check(sc, "random routing");
        if (::testing::Test::HasFailure()) {
            ADD_FAILURE() << "first failure at iteration " << iter << " (E " << num_experts << ", K " << top_k
                          << ")";
            break;  // every rank stops here: the failure shows on every rank that checks the same routing
        }
    }
}

}  // namespace
}  // namespace epinfer::mpi_test
