// Router top-k CPU reference: hand-computed cases for every rule of backend/moe_router_args.h.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/moe_router.h"

namespace epinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kTol = 1e-6;

struct Routed {
    std::vector<int32_t> ids;    // [T, K]
    std::vector<float> weights;  // [T, K]
};

// Runs the CPU router on `logits` ([T, E], T = logits.size() / E) with `bias` ([E], or empty for none).
Routed route(MoeRouterTopkArgs args, const std::vector<float>& logits, const std::vector<float>& bias = {}) {
    args.num_tokens = static_cast<int64_t>(logits.size()) / args.num_experts;
    Routed out;
    out.ids.assign(args.num_tokens * args.top_k, -7);
    out.weights.assign(args.num_tokens * args.top_k, -7.0f);
    args.router_logits = logits.data();
    args.e_score_correction_bias = bias.empty() ? nullptr : bias.data();
    args.topk_ids = out.ids.data();
    args.topk_weights = out.weights.data();
    const Status status = cpu_moe_router_topk(args);
    EXPECT_TRUE(status.is_ok()) << status.to_string();
    return out;
}

MoeRouterTopkArgs softmax_args(int64_t num_experts, int64_t top_k) {
    MoeRouterTopkArgs args;
    args.num_experts = num_experts;
    args.top_k = top_k;
    args.scoring_func = ScoringFunc::kSoftmax;
    args.topk_method = TopkMethod::kGreedy;
    return args;
}

MoeRouterTopkArgs sigmoid_args(int64_t num_experts, int64_t top_k, int64_t n_group, int64_t topk_group) {
    MoeRouterTopkArgs args;
    args.num_experts = num_experts;
    args.top_k = top_k;
    args.scoring_func = ScoringFunc::kSigmoid;
    args.topk_method = TopkMethod::kNoauxTc;
    args.n_group = n_group;
    args.topk_group = topk_group;
    return args;
}

void expect_weights_near(const std::vector<float>& actual, const std::vector<double>& expected) {
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], kTol) << "index " << i;
}

double sigmoid(double x) {
    return 1.0 / (1.0 + std::exp(-x));
}

// s = sigmoid([2, 0, 1, −1]) = [0.8808, 0.5, 0.7311, 0.2689]; c = s + [0, 0.5, 0, 0.6] = [0.8808, 1.0,
// 0.7311, 0.8689]. The bias makes 1 and 0 win (not 0 and 2), ordered by c; the weights are s, not c.
TEST(MoeRouterTopk, BiasChoosesButNeverWeighs) {
    const std::vector<float> logits = {2.0f, 0.0f, 1.0f, -1.0f};
    const Routed with_bias = route(sigmoid_args(4, 2, 1, 1), logits, {0.0f, 0.5f, 0.0f, 0.6f});
    EXPECT_THAT(with_bias.ids, ElementsAre(1, 0));
    expect_weights_near(with_bias.weights, {0.5, sigmoid(2.0)});

    const Routed without_bias = route(sigmoid_args(4, 2, 1, 1), logits);
    EXPECT_THAT(without_bias.ids, ElementsAre(0, 2));
    expect_weights_near(without_bias.weights, {sigmoid(2.0), sigmoid(1.0)});
}

// Logits 0 → s = 0.5 exactly, so c = 0.5 + bias. Three groups of four:
//   A = [1.4, 0.5, 0.5, 0.5]: max 1.4 (best max),   top-2 sum 1.9, sum of all 2.9
//   B = [1.0, 1.0, 0.5, 0.5]: max 1.0,              top-2 sum 2.0 (best), sum of all 3.0
//   C = [0.9, 0.9, 0.9, 0.9]: max 0.9,              top-2 sum 1.8, sum of all 3.6 (best)
// noaux_tc keeps B only; max would keep A, a sum of all C.
TEST(MoeRouterTopk, GroupScoreIsSumOfTopTwo) {
    const std::vector<float> logits(12, 0.0f);
    const std::vector<float> bias = {0.9f, 0.0f, 0.0f, 0.0f, 0.5f, 0.5f, 0.0f, 0.0f, 0.4f, 0.4f, 0.4f, 0.4f};
    const Routed routed = route(sigmoid_args(12, 2, 3, 1), logits, bias);
    EXPECT_THAT(routed.ids, ElementsAre(4, 5));
    expect_weights_near(routed.weights, {0.5, 0.5});

    MoeRouterTopkArgs max_args = sigmoid_args(12, 2, 3, 1);
    max_args.topk_method = TopkMethod::kGroupLimitedGreedy;
    EXPECT_THAT(route(max_args, logits, bias).ids, ElementsAre(0, 1));  // group A; 1 beats 2, 3 by id
}

// s ≈ 9.36e-14 everywhere, c ≈ bias < 0. Groups of two, top-2 sums: g0 −2.1, g1 −6, g2 −4.5, g3 −4.
// Keep g0, g3 → experts 0 (−1), 1 (−1.1), 6 (−2), 7 (−2). Expert 4 (c = −0.5, the best overall) sits in a
// dropped group, and every dropped expert would beat the kept ones if masked with 0 instead of −inf.
TEST(MoeRouterTopk, AllNegativeScoresChooseInsideKeptGroups) {
    const std::vector<float> logits(8, -30.0f);
    const std::vector<float> bias = {-1.0f, -1.1f, -3.0f, -3.0f, -0.5f, -4.0f, -2.0f, -2.0f};
    MoeRouterTopkArgs args = sigmoid_args(8, 3, 4, 2);
    args.norm_topk_prob = true;
    args.routed_scaling_factor = 2.5f;
    const Routed routed = route(args, logits, bias);
    EXPECT_THAT(routed.ids, ElementsAre(0, 1, 6));
    expect_weights_near(routed.weights, {2.5 / 3, 2.5 / 3, 2.5 / 3});
}

TEST(MoeRouterTopk, TiesGoToLowerExpertId) {
    EXPECT_THAT(route(softmax_args(6, 3), std::vector<float>(6, 0.0f)).ids, ElementsAre(0, 1, 2));
    const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 1.0f};
    EXPECT_THAT(route(softmax_args(6, 2), logits).ids, ElementsAre(1, 2));
    EXPECT_THAT(route(softmax_args(6, 5), logits).ids, ElementsAre(1, 2, 4, 0, 5));
    // Sigmoid: equal c from different (logit, bias) pairs still ties exactly: 0.5 + 0.25 at 1 and 3.
    EXPECT_THAT(route(sigmoid_args(4, 2, 1, 1), {0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.25f, 0.0f, 0.25f}).ids,
                ElementsAre(1, 3));
}

TEST(MoeRouterTopk, TiesGoToLowerGroupId) {
    // All groups equal: groups 0 and 1 are kept.
    EXPECT_THAT(route(sigmoid_args(8, 4, 4, 2), std::vector<float>(8, 0.0f)).ids, ElementsAre(0, 1, 2, 3));
    // Groups 1 and 3 tie above 0 and 2 (bias 0.25 on both of their experts): 1 and 3 are kept.
    const std::vector<float> bias = {0.0f, 0.0f, 0.25f, 0.25f, 0.0f, 0.0f, 0.25f, 0.25f};
    EXPECT_THAT(route(sigmoid_args(8, 4, 4, 2), std::vector<float>(8, 0.0f), bias).ids,
                ElementsAre(2, 3, 6, 7));
    // topk_group 1 with groups 1 and 3 tied: group 1 alone.
    EXPECT_THAT(route(sigmoid_args(8, 2, 4, 1), std::vector<float>(8, 0.0f), bias).ids, ElementsAre(2, 3));
}

// Softmax without the NaN: softmax([1, 0, −1]) = [0.66524, 0.24473, 0.09003].
TEST(MoeRouterTopk, NaNLogitNeverSelects) {
    const std::vector<float> logits = {kNaN, 1.0f, 0.0f, -1.0f};
    const Routed two = route(softmax_args(4, 2), logits);
    EXPECT_THAT(two.ids, ElementsAre(1, 2));
    expect_weights_near(two.weights, {0.6652409557748218, 0.24472847105479764});

    // K = E: the NaN expert is never taken; its place is −1 with weight 0, also after renormalisation.
    MoeRouterTopkArgs all = softmax_args(4, 4);
    all.norm_topk_prob = true;
    const Routed four = route(all, logits);
    EXPECT_THAT(four.ids, ElementsAre(1, 2, 3, -1));
    expect_weights_near(four.weights, {0.6652409557748218, 0.24472847105479764, 0.09003057317038046, 0.0});

    // Sigmoid: a NaN logit with a large bias still loses to everything.
    EXPECT_THAT(route(sigmoid_args(4, 2, 1, 1), logits, {100.0f, 0.0f, 0.0f, 0.0f}).ids, ElementsAre(1, 2));

    // A row of NaN: nothing to choose, all −1 / 0 and no NaN weight.
    MoeRouterTopkArgs norm = sigmoid_args(4, 2, 2, 1);
    norm.norm_topk_prob = true;
    const Routed nan_row = route(norm, {kNaN, kNaN, kNaN, kNaN});
    EXPECT_THAT(nan_row.ids, ElementsAre(-1, -1));
    EXPECT_THAT(nan_row.weights, ElementsAre(0.0f, 0.0f));

    // In a group score a NaN counts as −inf: group 0 = [NaN, s(3)] scores −inf, group 1 = [0.5, 0.5] wins.
    EXPECT_THAT(route(sigmoid_args(4, 2, 2, 1), {kNaN, 3.0f, 0.0f, 0.0f}).ids, ElementsAre(2, 3));
    // A NaN group score (c = +inf next to a NaN: +inf + −inf) ranks below every other group, unlike
    // torch.topk, which ranks NaN highest.
    EXPECT_THAT(route(sigmoid_args(4, 2, 2, 1), {0.0f, kNaN, 0.0f, 0.0f}, {kInf, 0.0f, 0.0f, 0.0f}).ids,
                ElementsAre(2, 3));
}

// softmax([0.5, 2, −1, 2]) = [0.09817, 0.43996, 0.02190, 0.43996]; order by p, the 2-way tie by id.
TEST(MoeRouterTopk, KEqualToE) {
    const Routed routed = route(softmax_args(4, 4), {0.5f, 2.0f, -1.0f, 2.0f});
    EXPECT_THAT(routed.ids, ElementsAre(1, 3, 0, 2));
    expect_weights_near(routed.weights,
                        {0.4399632276327001, 0.4399632276327001, 0.09816906544110447, 0.02190447929349533});
    // Sigmoid, one group, K = E: every expert, ordered by c = s + bias = [0.5, 0.7311, 0.5689]; w = s.
    const Routed sig = route(sigmoid_args(3, 3, 1, 1), {0.0f, 1.0f, -1.0f}, {0.0f, 0.0f, 0.3f});
    EXPECT_THAT(sig.ids, ElementsAre(1, 2, 0));
    expect_weights_near(sig.weights, {sigmoid(1.0), sigmoid(-1.0), 0.5});
}

// logits = ln [4, 2, 1, 1] → p = [1/2, 1/4, 1/8, 1/8].
TEST(MoeRouterTopk, Renormalisation) {
    const std::vector<float> logits = {std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
    MoeRouterTopkArgs off = softmax_args(4, 2);
    const Routed plain = route(off, logits);
    EXPECT_THAT(plain.ids, ElementsAre(0, 1));
    expect_weights_near(plain.weights, {0.5, 0.25});

    MoeRouterTopkArgs on = softmax_args(4, 2);
    on.norm_topk_prob = true;
    expect_weights_near(route(on, logits).weights, {2.0 / 3.0, 1.0 / 3.0});

    // Sigmoid renormalises s over the chosen (sum + 1e-20): s = [0.8808, 0.5] → [0.6379, 0.3621].
    MoeRouterTopkArgs sig = sigmoid_args(3, 2, 1, 1);
    sig.norm_topk_prob = true;
    const double s0 = sigmoid(2.0), s1 = 0.5;
    expect_weights_near(route(sig, {2.0f, 0.0f, -1.0f}).weights, {s0 / (s0 + s1), s1 / (s0 + s1)});
}

TEST(MoeRouterTopk, RoutedScalingFactorAppliedOnce) {
    const std::vector<float> logits = {std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
    MoeRouterTopkArgs v3 = softmax_args(4, 2);
    v3.norm_topk_prob = true;
    v3.routed_scaling_factor = 2.5f;
    expect_weights_near(route(v3, logits).weights, {2.5 * 2.0 / 3.0, 2.5 / 3.0});  // after renormalising

    MoeRouterTopkArgs v2 = softmax_args(4, 2);  // DeepSeek-V2: no renormalisation, scaled
    v2.routed_scaling_factor = 1.5f;
    expect_weights_near(route(v2, logits).weights, {0.75, 0.375});

    MoeRouterTopkArgs sig = sigmoid_args(3, 2, 1, 1);
    sig.norm_topk_prob = true;
    sig.routed_scaling_factor = 2.827f;
    const double s0 = sigmoid(2.0), s1 = 0.5;
    expect_weights_near(route(sig, {2.0f, 0.0f, -1.0f}).weights,
                        {2.827 * s0 / (s0 + s1), 2.827 * s1 / (s0 + s1)});
}

// DeepSeek-V2 group_limited_greedy, softmax, groups of 2: g0 = [3, −5], g1 = [2.8, 2.8], g2 = [0, 0].
// Max per group keeps g0 alone → [0, 1] (expert 1 despite its logit −5); greedy would take [0, 2] and a
// top-2 sum would keep g1. p from the full softmax: p0 = 0.365314, p1 = 0.000122549; scaled by 1.5.
TEST(MoeRouterTopk, GroupLimitedGreedyUsesMaxPerGroup) {
    const std::vector<float> logits = {3.0f, -5.0f, 2.8f, 2.8f, 0.0f, 0.0f};
    MoeRouterTopkArgs args = softmax_args(6, 2);
    args.topk_method = TopkMethod::kGroupLimitedGreedy;
    args.n_group = 3;
    args.topk_group = 1;
    args.routed_scaling_factor = 1.5f;
    const Routed routed = route(args, logits);
    EXPECT_THAT(routed.ids, ElementsAre(0, 1));
    expect_weights_near(routed.weights, {0.5479710065527551, 0.0001838237938725718});

    args.topk_method = TopkMethod::kGreedy;
    EXPECT_THAT(route(args, logits).ids, ElementsAre(0, 2));
    args.topk_method = TopkMethod::kNoauxTc;
    EXPECT_THAT(route(args, logits).ids, ElementsAre(2, 3));
}

// Qwen3-MoE / OLMoE: softmax over all E, top-K, two tokens.
TEST(MoeRouterTopk, SoftmaxGreedy) {
    const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f,   // token 0
                                       3.0f, 0.0f, 0.0f, 1.0f};  // token 1
    const Routed routed = route(softmax_args(4, 2), logits);
    EXPECT_THAT(routed.ids, ElementsAre(3, 2, 0, 3));
    const double z0 = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
    const double z1 = std::exp(3.0) + 2 + std::exp(1.0);
    expect_weights_near(routed.weights,
                        {std::exp(3.0) / z0, std::exp(2.0) / z0, std::exp(3.0) / z1, std::exp(1.0) / z1});
}

// Mixtral: softmax, top-K, renormalise == softmax over the K chosen logits.
TEST(MoeRouterTopk, MixtralRenormalisedEqualsSoftmaxOfChosen) {
    MoeRouterTopkArgs args = softmax_args(8, 2);
    args.norm_topk_prob = true;
    const Routed routed = route(args, {0.1f, -0.4f, 1.3f, 0.2f, 0.9f, -2.0f, 0.0f, 0.5f});
    EXPECT_THAT(routed.ids, ElementsAre(2, 4));
    const double e0 = std::exp(1.3), e1 = std::exp(0.9);
    expect_weights_near(routed.weights, {e0 / (e0 + e1), e1 / (e0 + e1)});
}

// +inf logits share the softmax mass; −inf logits get p = 0 and are choosable (not NaN).
TEST(MoeRouterTopk, InfiniteLogits) {
    const Routed pos = route(softmax_args(4, 2), {kInf, 0.0f, kInf, 1.0f});
    EXPECT_THAT(pos.ids, ElementsAre(0, 2));
    EXPECT_THAT(pos.weights, ElementsAre(0.5f, 0.5f));
    const Routed neg = route(softmax_args(3, 3), {-kInf, 0.0f, -kInf});
    EXPECT_THAT(neg.ids, ElementsAre(1, 0, 2));
    EXPECT_THAT(neg.weights, ElementsAre(1.0f, 0.0f, 0.0f));
}

TEST(MoeRouterTopk, ZeroTokens) {
    MoeRouterTopkArgs args = sigmoid_args(256, 8, 8, 4);
    args.num_tokens = 0;  // all pointers null
    EXPECT_TRUE(moe_router_topk_check(args).is_ok());
    EXPECT_TRUE(cpu_moe_router_topk(args).is_ok());
}

void expect_rejected(const MoeRouterTopkArgs& args, const char* field) {
    const Status status = moe_router_topk_check(args);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(status.message(), HasSubstr(field));
}

TEST(MoeRouterTopk, CheckRejectsInvalidArgs) {
    const MoeRouterTopkArgs valid = sigmoid_args(256, 8, 8, 4);
    ASSERT_TRUE(moe_router_topk_check(valid).is_ok());
    MoeRouterTopkArgs a = valid;

    a = valid, a.top_k = 257;
    expect_rejected(a, "top_k 257");
    a = valid, a.top_k = 0;
    expect_rejected(a, "top_k 0");
    a = valid, a.n_group = 3;
    expect_rejected(a, "n_group 3 does not divide num_experts 256");
    a = valid, a.n_group = 0;
    expect_rejected(a, "n_group 0");
    a = valid, a.topk_group = 9;
    expect_rejected(a, "topk_group 9");
    a = valid, a.topk_group = 0;
    expect_rejected(a, "topk_group 0");
    a = valid, a.topk_group = 1, a.top_k = 33;  // 1 group of 32 experts cannot give 33
    expect_rejected(a, "topk_group 1 × experts per group 32 < top_k 33");
    a = valid, a.n_group = 256, a.topk_group = 8;  // noaux_tc needs a top-2 in each group
    expect_rejected(a, "noaux_tc");
    a = valid, a.num_experts = 0;
    expect_rejected(a, "num_experts 0");
    a = valid, a.num_tokens = -1;
    expect_rejected(a, "num_tokens -1");
    a = valid, a.routed_scaling_factor = kInf;
    expect_rejected(a, "routed_scaling_factor");
    a = valid, a.num_tokens = 1;  // null pointers with T > 0
    expect_rejected(a, "non-null");

    // The op itself refuses and writes nothing.
    std::vector<float> logits(4, 0.0f);
    std::vector<int32_t> ids(5, -7);
    std::vector<float> weights(5, -7.0f);
    MoeRouterTopkArgs bad = softmax_args(4, 5);
    bad.num_tokens = 1;
    bad.router_logits = logits.data();
    bad.topk_ids = ids.data();
    bad.topk_weights = weights.data();
    EXPECT_EQ(cpu_moe_router_topk(bad).code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(ids, ElementsAre(-7, -7, -7, -7, -7));
}

}  // namespace
}  // namespace epinfer
