// The sampler: greedy ties, determinism for a seed, top-k and top-p filtering, parameter checks.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "engine/sampler.h"

namespace epinfer {
namespace {

TEST(Sampler, GreedyTiesGoToTheLowerId) {
    EXPECT_EQ(argmax_token(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
    EXPECT_EQ(argmax_token(std::vector<float>{NAN, -1.0f, NAN, -1.0f}), 1);
    EXPECT_EQ(argmax_token(std::vector<float>{-INFINITY, -INFINITY}), 0);
    Sampler greedy(SamplingParams{});
    EXPECT_EQ(greedy.sample(std::vector<float>{0.5f, 7.0f, 7.0f}), 1);
}

std::vector<int32_t> draw(const SamplingParams& params, const std::vector<float>& logits, int n) {
    Sampler s(params);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(s.sample(logits));
    return out;
}

const std::vector<float> kLogits = {0.1f, 1.2f, -0.3f, 0.9f, 1.1f, 0.0f, 0.7f};

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = 42;
    const auto a = draw(p, kLogits, 64), b = draw(p, kLogits, 64);
    EXPECT_EQ(a, b);
    p.seed = 43;
    EXPECT_NE(draw(p, kLogits, 64), a);
    EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 3u);  // it really samples
}

TEST(Sampler, TopKKeepsTheKBest) {
    SamplingParams p;
    p.temperature = 1.0;
    p.top_k = 2;
    p.seed = 7;
    const auto tokens = draw(p, kLogits, 200);
    EXPECT_EQ(std::set<int32_t>(tokens.begin(), tokens.end()), (std::set<int32_t>{1, 4}));
    p.top_k = 1;
    for (int32_t t : draw(p, kLogits, 20)) EXPECT_EQ(t, 1);
}

TEST(Sampler, TopKKeepsTiesWithTheKthBest) {
    // transformers keeps every logit ≥ the k-th best: with top_k 2 over {3, 1, 3, 3} all three 3s stay.
    SamplingParams p;
    p.temperature = 1.0;
    p.top_k = 2;
    p.seed = 11;
    const auto tokens = draw(p, std::vector<float>{3.0f, 1.0f, 3.0f, 3.0f}, 300);
    EXPECT_EQ(std::set<int32_t>(tokens.begin(), tokens.end()), (std::set<int32_t>{0, 2, 3}));
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
    // Probabilities 0.5, 0.3, 0.2 (logits are their logs): top_p 0.7 keeps {0, 1}; 0.5 keeps {0}.
    const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    SamplingParams p;
    p.temperature = 1.0;
    p.top_p = 0.7;
    p.seed = 3;
    const auto tokens = draw(p, logits, 300);
    EXPECT_EQ(std::set<int32_t>(tokens.begin(), tokens.end()), (std::set<int32_t>{0, 1}));
    p.top_p = 0.5;
    for (int32_t t : draw(p, logits, 20)) EXPECT_EQ(t, 0);
}

TEST(Sampler, LowTemperatureIsNearlyGreedy) {
    SamplingParams p;
    p.temperature = 1e-4;
    p.seed = 5;
    for (int32_t t : draw(p, kLogits, 20)) EXPECT_EQ(t, 1);
}

TEST(Sampler, ParameterChecksNameTheField) {
    SamplingParams p;
    EXPECT_TRUE(sampling_params_check(p).is_ok());
    p.top_p = 0.0;
    EXPECT_NE(sampling_params_check(p).message().find("top_p"), std::string::npos);
    p = {};
    p.temperature = -1.0;
    EXPECT_NE(sampling_params_check(p).message().find("temperature"), std::string::npos);
    p = {};
    p.top_k = -2;
    EXPECT_NE(sampling_params_check(p).message().find("top_k"), std::string::npos);
}

}  // namespace
}  // namespace epinfer
