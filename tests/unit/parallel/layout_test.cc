// ParallelLayout: flag mapping, rank ↔ coordinates, groups, and every validation error.
#include "parallel/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace epinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

ParallelLayout from_flags(LayoutFlags flags) {
    Result<ParallelLayout> layout = layout_from_flags(flags);
    EXPECT_TRUE(layout.is_ok()) << layout.status().message();
    return layout.is_ok() ? *layout : ParallelLayout{};
}

ParallelLayout make(int pp, int attn_tp, int attn_dp, int moe_tp, int moe_ep) {
    ParallelLayout l;
    l.pp = pp;
    l.attn_tp = attn_tp;
    l.attn_dp = attn_dp;
    l.moe_tp = moe_tp;
    l.moe_ep = moe_ep;
    return l;
}

TEST(LayoutFromFlags, TableOfTheHeaderComment) {
    EXPECT_EQ(from_flags({}), make(1, 1, 1, 1, 1));
    EXPECT_EQ(from_flags({.tp = 4}), make(1, 4, 1, 4, 1));
    EXPECT_EQ(from_flags({.ep = 4}), make(1, 4, 1, 1, 4));
    EXPECT_EQ(from_flags({.ep = 4, .dp = 4}), make(1, 1, 4, 1, 4));
    EXPECT_EQ(from_flags({.tp = 4, .ep = 2}), make(1, 4, 1, 2, 2));
    EXPECT_EQ(from_flags({.tp = 4, .ep = 4, .dp = 2}), make(1, 2, 2, 1, 4));
    EXPECT_EQ(from_flags({.ep = 2, .pp = 2}), make(2, 2, 1, 1, 2));
    EXPECT_EQ(from_flags({.ep = 2, .dp = 4}), make(1, 1, 4, 2, 2));
    EXPECT_EQ(from_flags({.pp = 3}), make(3, 1, 1, 1, 1));
    EXPECT_EQ(from_flags({.ep = 3}).world_size(), 3);
    EXPECT_EQ(from_flags({.tp = 4, .ep = 2, .pp = 2}).world_size(), 8);
}

TEST(LayoutFromFlags, Errors) {
    Result<ParallelLayout> r = layout_from_flags({.tp = 4, .ep = 3});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("--ep 3 does not divide the 4 ranks per stage (--tp 4)"));

    r = layout_from_flags({.tp = 2, .dp = 4});
    ASSERT_FALSE(r.is_ok());
    EXPECT_THAT(r.status().message(), HasSubstr("--dp 4 does not divide the 2 ranks per stage (--tp 2)"));

    r = layout_from_flags({.ep = 2, .dp = 3});
    ASSERT_FALSE(r.is_ok());
    EXPECT_THAT(r.status().message(),
                HasSubstr("--ep 2 does not divide the 3 ranks per stage (the larger of --ep"));

    r = layout_from_flags({.pp = -1});
    ASSERT_FALSE(r.is_ok());
    EXPECT_THAT(r.status().message(), HasSubstr("--pp must be ≥ 1, got -1"));
}

TEST(ParallelLayout, CoordsFollowSglangOrder) {
    // 8 ranks: pp 2 × (attn_tp 2 × attn_dp 2 | moe_tp 1 × moe_ep 4).
    const ParallelLayout l = make(2, 2, 2, 1, 4);
    EXPECT_EQ(l.coords(0), (RankCoords{0, 0, 0, 0, 0, 0}));
    EXPECT_EQ(l.coords(1), (RankCoords{0, 1, 1, 0, 0, 1}));
    EXPECT_EQ(l.coords(2), (RankCoords{0, 2, 0, 1, 0, 2}));
    EXPECT_EQ(l.coords(7), (RankCoords{1, 3, 1, 1, 0, 3}));
    // moe_tp 2 × moe_ep 2: consecutive ranks share an EP rank.
    const ParallelLayout h = make(1, 4, 1, 2, 2);
    EXPECT_EQ(h.coords(1).moe_tp_rank, 1);
    EXPECT_EQ(h.coords(1).moe_ep_rank, 0);
    EXPECT_EQ(h.coords(2).moe_tp_rank, 0);
    EXPECT_EQ(h.coords(2).moe_ep_rank, 1);
    for (int r = 0; r < l.world_size(); ++r)
        EXPECT_EQ(l.rank_of(l.coords(r).pp_rank, l.coords(r).local_rank), r);
}

TEST(ParallelLayout, Groups) {
    const ParallelLayout l = make(2, 2, 2, 1, 4);
    EXPECT_THAT(l.group(GroupKind::kStage, 5), ElementsAre(4, 5, 6, 7));
    EXPECT_THAT(l.group(GroupKind::kAttnTp, 6), ElementsAre(6, 7));
    EXPECT_THAT(l.group(GroupKind::kAttnDp, 5), ElementsAre(5, 7));
    EXPECT_THAT(l.group(GroupKind::kMoeTp, 6), ElementsAre(6));
    EXPECT_THAT(l.group(GroupKind::kMoeEp, 2), ElementsAre(0, 1, 2, 3));
    EXPECT_THAT(l.group(GroupKind::kPipeline, 6), ElementsAre(2, 6));
    EXPECT_EQ(l.group_rank(GroupKind::kAttnDp, 7), 1);
    EXPECT_EQ(l.group_rank(GroupKind::kPipeline, 6), 1);

    const ParallelLayout h = make(1, 4, 1, 2, 2);
    EXPECT_THAT(h.group(GroupKind::kMoeTp, 3), ElementsAre(2, 3));
    EXPECT_THAT(h.group(GroupKind::kMoeEp, 3), ElementsAre(1, 3));
    EXPECT_THAT(h.group(GroupKind::kAttnTp, 3), ElementsAre(0, 1, 2, 3));
    EXPECT_THAT(h.group(GroupKind::kAttnDp, 3), ElementsAre(3));
}

TEST(ParallelLayout, SplitKeysAreUniquePerGroup) {
    const ParallelLayout l = make(3, 2, 2, 2, 2);
    for (GroupKind kind : {GroupKind::kStage, GroupKind::kAttnTp, GroupKind::kAttnDp, GroupKind::kMoeTp,
                           GroupKind::kMoeEp, GroupKind::kPipeline}) {
        for (int a = 0; a < l.world_size(); ++a) {
            for (int b = 0; b < l.world_size(); ++b) {
                const SplitKey ka = l.split_key(kind, a), kb = l.split_key(kind, b);
                const bool same_group = ka.color == kb.color;
                const std::vector<int> ga = l.group(kind, a);
                EXPECT_EQ(same_group, std::find(ga.begin(), ga.end(), b) != ga.end())
                    << group_kind_name(kind);
                if (same_group && a != b) {
                    EXPECT_NE(ka.key, kb.key) << group_kind_name(kind);
                }
            }
        }
    }
}

TEST(ParallelLayout, StageNeighbours) {
    const ParallelLayout l = make(3, 2, 1, 1, 2);
    EXPECT_EQ(l.prev_stage_rank(1), -1);
    EXPECT_EQ(l.next_stage_rank(1), 3);
    EXPECT_EQ(l.prev_stage_rank(3), 1);
    EXPECT_EQ(l.next_stage_rank(4), -1);
    EXPECT_EQ(l.prev_stage_rank(4), 2);
}

TEST(ParallelLayout, ToString) {
    EXPECT_EQ(make(2, 2, 2, 1, 4).to_string(),
              "8 ranks = pp 2 × 4 per stage (attn_tp 2 × attn_dp 2, moe_tp 1 × moe_ep 4)");
}

// A Qwen3-30B-A3B-like model: 48 layers, 32 heads, 4 KV heads, 128 experts, I 768.
LayoutModelDims qwen_like() {
    LayoutModelDims d;
    d.num_hidden_layers = 48;
    d.num_attention_heads = 32;
    d.num_key_value_heads = 4;
    d.n_routed_experts = 128;
    d.moe_intermediate_size = 768;
    return d;
}

TEST(ValidateLayout, AcceptsValidLayouts) {
    EXPECT_TRUE(validate_layout(make(1, 8, 1, 8, 1), qwen_like(), 8).is_ok());  // KV heads replicated ×2
    EXPECT_TRUE(validate_layout(make(1, 1, 8, 1, 8), qwen_like(), 8).is_ok());
    EXPECT_TRUE(validate_layout(make(2, 4, 1, 2, 2), qwen_like(), 8).is_ok());
    LayoutModelDims tiny = qwen_like();
    tiny.n_routed_experts = 16;
    tiny.num_hidden_layers = 2;
    EXPECT_TRUE(validate_layout(make(1, 3, 1, 1, 3), {2, 12, 0, 16, 32, 0, 0}, 3).is_ok());  // MLA, ep3
    EXPECT_TRUE(validate_layout(make(2, 1, 1, 1, 1), tiny, 2).is_ok());
}

Status check(const ParallelLayout& l, const LayoutModelDims& d, int world) {
    return validate_layout(l, d, world);
}

TEST(ValidateLayout, EachViolationHasItsNumbers) {
    const LayoutModelDims d = qwen_like();
    struct Case {
        ParallelLayout layout;
        LayoutModelDims dims;
        int world;
        const char* message;
    };
    LayoutModelDims odd_heads = d;
    odd_heads.num_attention_heads = 12;
    LayoutModelDims odd_kv = d;
    odd_kv.num_key_value_heads = 3;
    odd_kv.num_attention_heads = 24;
    LayoutModelDims few_experts = d;
    few_experts.n_routed_experts = 4;
    few_experts.num_attention_heads = 8;
    LayoutModelDims odd_i = d;
    odd_i.moe_intermediate_size = 1408;
    LayoutModelDims dense = d;
    dense.dense_intermediate_size = 1000;
    LayoutModelDims shared = d;
    shared.shared_intermediate_size = 1400;
    LayoutModelDims shallow = d;
    shallow.num_hidden_layers = 4;
    const Case cases[] = {
        {make(2, 4, 1, 4, 1), d, 6,
         "the layout needs pp 2 × 4 ranks per stage = 8 ranks, but the world has 6"},
        {make(1, 8, 1, 8, 1), odd_heads, 8, "num_attention_heads 12 is not divisible by attn_tp 8"},
        {make(1, 2, 1, 2, 1), odd_kv, 2, "num_key_value_heads 3 and attn_tp 2: one must divide the other"},
        {make(1, 4, 1, 2, 1), d, 4,
         "moe_tp 2 × moe_ep 1 = 2 differs from attn_tp 4 × attn_dp 1 = 4 ranks per stage"},
        {make(1, 8, 1, 1, 8), few_experts, 8, "ep 8 exceeds the 4 routed experts"},
        {make(1, 3, 1, 3, 1), odd_i, 3, "moe_intermediate_size 1408 is not divisible by moe_tp 3"},
        {make(1, 16, 1, 16, 1), dense, 16, "dense intermediate_size 1000 is not divisible by attn_tp 16"},
        {make(1, 16, 1, 16, 1), shared, 16,
         "shared expert intermediate size 1400 is not divisible by attn_tp 16"},
        {make(5, 1, 1, 1, 1), shallow, 5, "pp 5 exceeds num_hidden_layers 4"},
        {make(0, 1, 1, 1, 1), d, 1, "pp 0 must be at least 1"},
    };
    for (const Case& c : cases) {
        Status s = check(c.layout, c.dims, c.world);
        ASSERT_FALSE(s.is_ok()) << c.message;
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
        EXPECT_THAT(s.message(), HasSubstr(c.message));
    }
}

// --ep 3 alone leaves attention tensor-parallel over the 3 ranks: an attn_tp error then says how to keep
// attention whole (--dp 3); with --dp given, or without EP, it does not.
TEST(ValidateLayout, EpWithoutDpNamesTheDpFlag) {
    LayoutModelDims d = qwen_like();
    d.num_attention_heads = 8;
    d.num_key_value_heads = 1;
    d.dense_intermediate_size = 0;
    d.shared_intermediate_size = 0;
    d.moe_intermediate_size = 768;
    const std::string hint =
        "with --ep and no --dp, attention and dense MLPs are split over the 3 ranks per stage (attn_tp); "
        "--dp 3 "
        "runs them data-parallel instead";
    Status s = validate_layout(make(1, 3, 1, 1, 3), d, 3);
    ASSERT_FALSE(s.is_ok());
    EXPECT_THAT(s.message(), HasSubstr("num_attention_heads 8 is not divisible by attn_tp 3; " + hint));
    s = validate_layout(make(1, 3, 1, 3, 1), d, 3);  // --tp 3: asked for
    ASSERT_FALSE(s.is_ok());
    EXPECT_THAT(s.message(), Not(HasSubstr("--dp 3")));
    EXPECT_TRUE(validate_layout(make(1, 1, 3, 1, 3), d, 3).is_ok());  // --ep 3 --dp 3
}

TEST(ValidateLayout, ReportsEveryViolationInOneLine) {
    LayoutModelDims d = qwen_like();
    d.num_attention_heads = 6;
    d.num_hidden_layers = 1;
    Status s = validate_layout(make(2, 4, 1, 4, 1), d, 4);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.message(),
              "parallel layout 8 ranks = pp 2 × 4 per stage (attn_tp 4 × attn_dp 1, moe_tp 4 × moe_ep 1): "
              "the layout "
              "needs pp 2 × 4 ranks per stage = 8 ranks, but the world has 4; num_attention_heads 6 is not "
              "divisible "
              "by attn_tp 4; pp 2 exceeds num_hidden_layers 1");
}

}  // namespace
}  // namespace epinfer
