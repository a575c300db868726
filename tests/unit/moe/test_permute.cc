// MoE permutation plan, permute and combine: exact bookkeeping, rank-coded round trips.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "layers/moe/permute.h"

namespace epinfer {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;

// Every invariant of a plan, checked against the ids it was built from.
void expect_plan_consistent(const MoeRoutePlan& plan, const std::vector<int32_t>& ids) {
    const int64_t t_count = plan.num_tokens, k_count = plan.top_k, e_count = plan.num_experts;
    ASSERT_EQ(static_cast<int64_t>(ids.size()), t_count * k_count);
    ASSERT_EQ(static_cast<int64_t>(plan.expert_counts.size()), e_count);
    ASSERT_EQ(static_cast<int64_t>(plan.expert_offsets.size()), e_count + 1);
    ASSERT_EQ(static_cast<int64_t>(plan.slot_of_token_k.size()), t_count * k_count);
    ASSERT_EQ(plan.k_of_slot.size(), plan.token_of_slot.size());

    int64_t num_valid = 0;
    for (int32_t id : ids) num_valid += (id >= 0 && id < e_count);
    EXPECT_EQ(plan.num_slots(), num_valid);
    EXPECT_EQ(plan.expert_offsets.front(), 0);
    EXPECT_EQ(plan.expert_offsets.back(), num_valid);
    for (int64_t e = 0; e < e_count; ++e) {
        EXPECT_EQ(plan.expert_offsets[e + 1] - plan.expert_offsets[e], plan.expert_counts[e]);
        for (int32_t s = plan.expert_offsets[e]; s < plan.expert_offsets[e + 1]; ++s) {
            EXPECT_EQ(ids[plan.token_of_slot[s] * k_count + plan.k_of_slot[s]], e) << "slot " << s;
        }
    }
    // Slots in strictly increasing (expert, token, k) order, and the two maps inverse to each other.
    for (int64_t s = 0; s < plan.num_slots(); ++s) {
        const int32_t t = plan.token_of_slot[s], k = plan.k_of_slot[s];
        ASSERT_EQ(plan.slot_of_token_k[t * k_count + k], s);
        if (s > 0) {
            const int32_t pt = plan.token_of_slot[s - 1], pk = plan.k_of_slot[s - 1];
            const int32_t e = ids[t * k_count + k], pe = ids[pt * k_count + pk];
            EXPECT_TRUE(pe < e || (pe == e && (pt < t || (pt == t && pk < k)))) << "slot " << s;
        }
    }
    for (int64_t i = 0; i < t_count * k_count; ++i) {
        const int32_t s = plan.slot_of_token_k[i];
        if (ids[i] < 0 || ids[i] >= e_count) {
            EXPECT_EQ(s, -1) << "pick " << i;
        } else {
            ASSERT_GE(s, 0);
            EXPECT_EQ(plan.token_of_slot[s] * k_count + plan.k_of_slot[s], i);
        }
    }
}

// Deterministic pseudo-random picks: K distinct experts per token, about 1 in 8 dropped (−1).
std::vector<int32_t> pseudo_random_ids(int64_t t_count, int64_t k_count, int64_t e_count) {
    std::vector<int32_t> ids;
    uint32_t state = 12345u;
    auto next = [&] { return state = state * 1664525u + 1013904223u; };
    for (int64_t t = 0; t < t_count; ++t) {
        std::vector<bool> used(e_count, false);
        for (int64_t k = 0; k < k_count; ++k) {
            int32_t e;
            do e = static_cast<int32_t>((next() >> 8) % e_count);
            while (used[e]);
            used[e] = true;
            ids.push_back((next() >> 8) % 8 == 0 ? -1 : e);
        }
    }
    return ids;
}

// ids = [[2, 0], [0, 2], [3, −1]], E = 4: expert 1 gets nothing, token 2's second pick is dropped.
TEST(MoePermutePlan, HandExample) {
    const std::vector<int32_t> ids = {2, 0, 0, 2, 3, -1};
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), 3, 2, 4);
    EXPECT_THAT(plan.expert_counts, ElementsAre(2, 0, 2, 1));
    EXPECT_THAT(plan.expert_offsets, ElementsAre(0, 2, 2, 4, 5));
    EXPECT_THAT(plan.token_of_slot, ElementsAre(0, 1, 0, 1, 2));
    EXPECT_THAT(plan.k_of_slot, ElementsAre(1, 0, 0, 1, 0));
    EXPECT_THAT(plan.slot_of_token_k, ElementsAre(2, 0, 1, 3, 4, -1));
    expect_plan_consistent(plan, ids);
}

TEST(MoePermutePlan, PseudoRandomPicks) {
    const std::vector<int32_t> ids = pseudo_random_ids(37, 6, 64);
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), 37, 6, 64);
    expect_plan_consistent(plan, ids);
    EXPECT_LT(plan.num_slots(), 37 * 6);  // some picks were dropped
    EXPECT_GT(plan.num_slots(), 37 * 6 / 2);
}

TEST(MoePermutePlan, AllTokensOnOneExpert) {
    const std::vector<int32_t> ids(5, 3);
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), 5, 1, 8);
    EXPECT_THAT(plan.expert_counts, ElementsAre(0, 0, 0, 5, 0, 0, 0, 0));
    EXPECT_THAT(plan.expert_offsets, ElementsAre(0, 0, 0, 0, 5, 5, 5, 5, 5));
    EXPECT_THAT(plan.token_of_slot, ElementsAre(0, 1, 2, 3, 4));
    EXPECT_THAT(plan.k_of_slot, Each(0));
    expect_plan_consistent(plan, ids);
}

TEST(MoePermutePlan, KEqualToE) {
    const std::vector<int32_t> ids = {0, 1, 2, 2, 1, 0, 1, 2, 0, 2, 0, 1};  // 4 tokens, each a permutation
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), 4, 3, 3);
    EXPECT_THAT(plan.expert_counts, ElementsAre(4, 4, 4));
    EXPECT_THAT(plan.token_of_slot, ElementsAre(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3));
    EXPECT_THAT(plan.k_of_slot, ElementsAre(0, 2, 2, 1, 1, 1, 0, 2, 2, 0, 1, 0));
    expect_plan_consistent(plan, ids);
}

TEST(MoePermutePlan, ZeroTokens) {
    const MoeRoutePlan plan = moe_permute_plan(nullptr, 0, 8, 4);
    EXPECT_EQ(plan.num_slots(), 0);
    EXPECT_THAT(plan.expert_counts, ElementsAre(0, 0, 0, 0));
    EXPECT_THAT(plan.expert_offsets, ElementsAre(0, 0, 0, 0, 0));
    EXPECT_TRUE(plan.slot_of_token_k.empty());
    moe_permute_rows(plan, nullptr, 16, nullptr);           // nothing to copy
    moe_combine_rows(plan, nullptr, nullptr, 16, nullptr);  // nothing to write
}

TEST(MoePermutePlan, IdsOutsideRangeAreDropped) {
    const std::vector<int32_t> ids = {4, -1, -3, 1};
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), 2, 2, 4);
    EXPECT_THAT(plan.expert_counts, ElementsAre(0, 1, 0, 0));
    EXPECT_THAT(plan.slot_of_token_k, ElementsAre(-1, -1, -1, 0));
    expect_plan_consistent(plan, ids);
}

// Rows carry their token index: x[t, h] = 1000·t + h. Permuted rows must be exactly their token's row;
// combining identity experts with weights 1/2, 1/4, 1/4 (exact in fp32 on these integers) restores x.
TEST(MoePermuteRows, RankCodedRoundTripIsBitExact) {
    constexpr int64_t kT = 29, kK = 3, kE = 16, kH = 24;
    std::vector<int32_t> ids = pseudo_random_ids(kT, kK, kE);
    for (int32_t& id : ids) id = id < 0 ? 5 : id;  // no drops here: every weight must land
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), kT, kK, kE);
    ASSERT_EQ(plan.num_slots(), kT * kK);

    std::vector<float> x(kT * kH);  // [T, H]
    for (int64_t t = 0; t < kT; ++t) {
        for (int64_t h = 0; h < kH; ++h) x[t * kH + h] = static_cast<float>(1000 * t + h);
    }
    std::vector<float> x_perm(plan.num_slots() * kH, -1.0f);  // [S, H]
    moe_permute_rows(plan, x.data(), kH * sizeof(float), x_perm.data());
    for (int64_t s = 0; s < plan.num_slots(); ++s) {
        EXPECT_EQ(std::memcmp(&x_perm[s * kH], &x[plan.token_of_slot[s] * kH], kH * sizeof(float)), 0);
        EXPECT_EQ(x_perm[s * kH], 1000.0f * plan.token_of_slot[s]);
    }

    std::vector<float> weights(kT * kK);  // [T, K]
    for (int64_t t = 0; t < kT; ++t) {
        weights[t * kK + 0] = 0.5f;
        weights[t * kK + 1] = 0.25f;
        weights[t * kK + 2] = 0.25f;
    }
    std::vector<float> out(kT * kH, -1.0f);  // [T, H]
    moe_combine_rows(plan, x_perm.data(), weights.data(), kH, out.data());
    EXPECT_EQ(std::memcmp(out.data(), x.data(), x.size() * sizeof(float)), 0);
}

// Byte rows of any dtype (here bf16 bit patterns) travel untouched.
TEST(MoePermuteRows, CopiesBytesOfAnyDtype) {
    const std::vector<int32_t> ids = {1, 0, 1, 0};  // T = 2, K = 2, E = 2
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), 2, 2, 2);
    // [T, 2] bf16 bit patterns: NaN, denormal, −inf, −0.
    const std::vector<uint16_t> x = {0x7fc1, 0x0001, 0xff80, 0x8000};
    std::vector<uint16_t> x_perm(plan.num_slots() * 2, 0);
    moe_permute_rows(plan, x.data(), 2 * sizeof(uint16_t), x_perm.data());
    // Slots: expert 0 ← (t0, k1), (t1, k1); expert 1 ← (t0, k0), (t1, k0).
    EXPECT_THAT(x_perm, ElementsAre(0x7fc1, 0x0001, 0xff80, 0x8000, 0x7fc1, 0x0001, 0xff80, 0x8000));
}

// General values: identity experts and weights summing to 1 return the input up to rounding.
TEST(MoeCombineRows, IdentityExpertsReturnInput) {
    constexpr int64_t kT = 11, kK = 4, kE = 9, kH = 7;
    const std::vector<int32_t> ids = pseudo_random_ids(kT, kK, kE);
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), kT, kK, kE);
    std::vector<float> x(kT * kH);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37 % 101) - 50) / 7.0f;
    std::vector<float> weights(kT * kK, 0.0f);
    for (int64_t t = 0; t < kT; ++t) {
        int64_t num_valid = 0;
        for (int64_t k = 0; k < kK; ++k) num_valid += ids[t * kK + k] >= 0;
        for (int64_t k = 0; k < kK; ++k) {
            // Dropped picks carry a large weight that must be ignored.
            weights[t * kK + k] = ids[t * kK + k] >= 0 ? 1.0f / static_cast<float>(num_valid) : 100.0f;
        }
        ASSERT_GT(num_valid, 0);
    }
    std::vector<float> x_perm(plan.num_slots() * kH);
    moe_permute_rows(plan, x.data(), kH * sizeof(float), x_perm.data());
    std::vector<float> out(kT * kH);
    moe_combine_rows(plan, x_perm.data(), weights.data(), kH, out.data());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], x[i], 1e-6 * (1.0 + std::fabs(x[i]))) << i;
}

// The sum runs in k order, not slot order. ids [2, 1, 0] put k = 2 in slot 0; with y = 1e8, −1e8, 1 for
// k = 0, 1, 2, k order gives (1e8 − 1e8) + 1 = 1, slot order would give (1 − 1e8) + 1e8 = 0 in fp32.
TEST(MoeCombineRows, SumsInFixedKOrder) {
    const std::vector<int32_t> ids = {2, 1, 0};
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), 1, 3, 3);
    ASSERT_THAT(plan.k_of_slot, ElementsAre(2, 1, 0));
    const std::vector<float> y = {1.0f, -1e8f, 1e8f};  // [S, 1] in slot order
    const std::vector<float> weights = {1.0f, 1.0f, 1.0f};
    float out = -7.0f;
    moe_combine_rows(plan, y.data(), weights.data(), 1, &out);
    EXPECT_EQ(out, 1.0f);
}

// A token whose picks are all dropped gets a zero row.
TEST(MoeCombineRows, TokenWithoutPicksIsZero) {
    const std::vector<int32_t> ids = {-1, -1, 0, -1};  // T = 2, K = 2
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), 2, 2, 1);
    const std::vector<float> y = {3.0f, 4.0f};  // [1, 2]
    const std::vector<float> weights = {5.0f, 5.0f, 0.5f, 5.0f};
    std::vector<float> out(4, -7.0f);
    moe_combine_rows(plan, y.data(), weights.data(), 2, out.data());
    EXPECT_THAT(out, ElementsAre(0.0f, 0.0f, 1.5f, 2.0f));
}

}  // namespace
}  // namespace epinfer
