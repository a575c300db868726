// ep_dispatch / ep_combine on a one-rank EP group: every token goes to rank 0 once, and the combined
// output equals the single-rank moe_combine_rows bit for bit (the contract of ep_combine.h).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/single_rank_communicator.h"
#include "layers/moe/ep_combine.h"
#include "layers/moe/ep_dispatch.h"
#include "layers/moe/permute.h"

namespace epinfer {
namespace {

TEST(EpSingleRank, CombineEqualsTheSingleRankCombine) {
    std::unique_ptr<Communicator> comm = create_single_rank_communicator(5.0);
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(4, 1);
    ASSERT_TRUE(placement.is_ok());
    const int64_t T = 3, K = 2, H = 2;
    const std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};      // [T, H]
    const std::vector<int32_t> ids = {2, 0, -1, 3, 1, 2};                   // [T, K]
    const std::vector<float> w = {0.3f, 0.7f, 0.0f, 0.9f, 0.123f, 0.877f};  // [T, K]
    Result<EpDispatchOutput> d =
        ep_dispatch(*comm, *placement, {x.data(), T, H * sizeof(float), ids.data(), w.data(), K});
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    ASSERT_EQ(d->num_rows, 3);
    EXPECT_EQ(std::memcmp(d->rows.data(), x.data(), x.size() * sizeof(float)), 0);
    EXPECT_EQ(d->local_slots,
              (std::vector<int32_t>{2, 0, 3, -1, 1, 2}));  // token 1's pick packed to the front
    EXPECT_EQ(d->weights, (std::vector<float>{0.3f, 0.7f, 0.9f, 0.0f, 0.123f, 0.877f}));

    // Expert e: y = x·(e + 1.5).
    const MoeRoutePlan plan = moe_permute_plan(d->local_slots.data(), d->num_rows, K, 4);
    std::vector<float> x_perm(static_cast<size_t>(plan.num_slots() * H)), y_perm(x_perm.size());
    moe_permute_rows(plan, d->rows.data(), H * sizeof(float), x_perm.data());
    for (int e = 0; e < 4; ++e) {
        for (int32_t s = plan.expert_offsets[e]; s < plan.expert_offsets[e + 1]; ++s) {
            for (int64_t h = 0; h < H; ++h)
                y_perm[s * H + h] = x_perm[s * H + h] * (static_cast<float>(e) + 1.5f);
        }
    }
    std::vector<float> partial(static_cast<size_t>(d->num_rows * H));
    moe_combine_rows(plan, y_perm.data(), d->weights.data(), H, partial.data());
    std::vector<float> out(static_cast<size_t>(T * H), -1.0f);
    ASSERT_TRUE(ep_combine(*comm, {&d->handle, partial.data(), H, out.data()}).is_ok());

    // Reference: the single-rank block on the original routing.
    const MoeRoutePlan ref_plan = moe_permute_plan(ids.data(), T, K, 4);
    std::vector<float> ref_perm(static_cast<size_t>(ref_plan.num_slots() * H)), ref_y(ref_perm.size());
    moe_permute_rows(ref_plan, x.data(), H * sizeof(float), ref_perm.data());
    for (int e = 0; e < 4; ++e) {
        for (int32_t s = ref_plan.expert_offsets[e]; s < ref_plan.expert_offsets[e + 1]; ++s) {
            for (int64_t h = 0; h < H; ++h)
                ref_y[s * H + h] = ref_perm[s * H + h] * (static_cast<float>(e) + 1.5f);
        }
    }
    std::vector<float> ref(static_cast<size_t>(T * H));
    moe_combine_rows(ref_plan, ref_y.data(), w.data(), H, ref.data());
    EXPECT_EQ(std::memcmp(out.data(), ref.data(), ref.size() * sizeof(float)), 0);
    EXPECT_FLOAT_EQ(out[0], 0.3f * 1.0f * 3.5f + 0.7f * 1.0f * 1.5f);
}

TEST(EpSingleRank, TokensWithoutExpertsGetZeroRows) {
    std::unique_ptr<Communicator> comm = create_single_rank_communicator(5.0);
    Result<ExpertPlacement> placement = ExpertPlacement::contiguous(2, 1);
    const std::vector<float> x = {7.0f, 8.0f};
    const std::vector<int32_t> ids = {-1, -1};
    const std::vector<float> w = {0.0f, 0.0f};
    Result<EpDispatchOutput> d =
        ep_dispatch(*comm, *placement, {x.data(), 2, sizeof(float), ids.data(), w.data(), 1});
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(d->num_rows, 0);
    std::vector<float> out(2, -1.0f);
    ASSERT_TRUE(ep_combine(*comm, {&d->handle, nullptr, 1, out.data()}).is_ok());
    EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f}));
    EXPECT_FALSE(ep_combine(*comm, {nullptr, nullptr, 1, out.data()}).is_ok());
}

}  // namespace
}  // namespace epinfer
