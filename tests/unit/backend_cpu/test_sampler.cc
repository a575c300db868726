// The sampler: greedy ties, determinism for a seed, top-k and top-p filtering, parameter checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "backend/cpu/cpu_argmax.h"
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

// Frequencies of `n` draws over `logits`, one Sampler (its draws are independent).
std::vector<double> frequencies(const SamplingParams& params, const std::vector<float>& logits, int n) {
    std::vector<double> f(logits.size(), 0.0);
    for (int32_t t : draw(params, logits, n)) f[static_cast<size_t>(t)] += 1.0 / n;
    return f;
}

TEST(Sampler, TemperatureOnlyDrawsFollowTheSoftmax) {
    // The Gumbel-max draw: logits ln 1, ln 2, ln 4 at T = 1 give 1/7, 2/7, 4/7; at T = 2, ∝ 1, √2, 2.
    const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(4.0f)};
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = 9;
    ASSERT_TRUE(draws_on_device(p));
    const int n = 40000;  // standard error of a frequency ≤ 0.0025
    std::vector<double> f = frequencies(p, logits, n);
    EXPECT_NEAR(f[0], 1.0 / 7, 0.01);
    EXPECT_NEAR(f[1], 2.0 / 7, 0.01);
    EXPECT_NEAR(f[2], 4.0 / 7, 0.01);
    p.temperature = 2.0;
    f = frequencies(p, logits, n);
    const double z = 1.0 + std::sqrt(2.0) + 2.0;
    EXPECT_NEAR(f[0], 1.0 / z, 0.01);
    EXPECT_NEAR(f[1], std::sqrt(2.0) / z, 0.01);
    EXPECT_NEAR(f[2], 2.0 / z, 0.01);
}

TEST(Sampler, TemperatureOnlyDrawIsTheDevicesDraw) {
    // What the engine hands the device for such a request (1 / T and the next key) gives, through the op's
    // CPU reference, the token the sampler draws itself; the two share one draw counter.
    SamplingParams p;
    p.temperature = 0.8;
    p.seed = 1234;
    Sampler host(p), device(p);
    std::vector<float> logits = kLogits;
    for (int step = 0; step < 50; ++step) {
        logits[static_cast<size_t>(step) % logits.size()] += 0.05f;
        const float inv_t = device.inv_temperature();
        const uint64_t key = device.next_noise_key();
        int32_t id = -1, non_finite = -1;
        ArgmaxArgs op;
        op.logits = logits.data();
        op.out_ids = &id;
        op.out_non_finite = &non_finite;
        op.num_rows = 1;
        op.vocab_size = static_cast<int64_t>(logits.size());
        op.row_stride = op.vocab_size;
        op.inv_temperature = &inv_t;
        op.noise_keys = &key;
        cpu_argmax(op);
        EXPECT_EQ(host.sample(logits), id) << "step " << step;
        EXPECT_EQ(non_finite, 0);
    }
    EXPECT_FLOAT_EQ(device.inv_temperature(), 1.25f);
}

TEST(Sampler, WhichDrawsTheDeviceMakes) {
    SamplingParams p;
    EXPECT_TRUE(draws_on_device(p));  // greedy
    p.temperature = 0.7;
    EXPECT_TRUE(draws_on_device(p));
    p.top_p = 0.9;
    EXPECT_FALSE(draws_on_device(p));
    p.top_p = 1.0;
    p.top_k = 40;
    EXPECT_FALSE(draws_on_device(p));
    // Outside fp32's safe range 1 / T overflows (or vanishes) on the device: the host draws in double.
    p.top_k = 0;
    p.temperature = 1e-39;
    EXPECT_FALSE(draws_on_device(p));
    p.temperature = 1e46;
    EXPECT_FALSE(draws_on_device(p));
    p.temperature = kDeviceDrawMinTemperature;
    EXPECT_TRUE(draws_on_device(p));
}

TEST(Sampler, ATinyTemperatureIsGreedy) {
    // 1 / T overflows fp32 at T = 1e-39 (a fresh-user find: the device then drew ties among the first ids).
    SamplingParams p;
    p.temperature = 1e-39;
    p.seed = 3;
    for (int32_t t : draw(p, kLogits, 10)) EXPECT_EQ(t, 1);
}

TEST(Sampler, TopPOverManyFlatLogitsKeepsExactlyTheNucleus) {
    // 3000 logits in a narrow band (a flat distribution: the nucleus holds ~half of them, past the ranking
    // by selection's small-range sort): every draw lies in the nucleus a full sort gives.
    std::vector<float> logits(3000);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.001f * static_cast<float>((i * 7919) % 1000);
    SamplingParams p;
    p.temperature = 1.0;
    p.top_p = 0.5;
    p.seed = 77;
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    double sum = 0.0;
    for (float l : logits) sum += std::exp(static_cast<double>(l));
    std::set<int32_t> nucleus;
    double mass = 0.0;
    for (size_t i = 0; i < order.size() && (i == 0 || mass < 0.5 * sum); ++i) {
        mass += std::exp(static_cast<double>(logits[order[i]]));
        nucleus.insert(order[i]);
    }
    ASSERT_GT(nucleus.size(), 1000u);
    ASSERT_LT(nucleus.size(), 2000u);
    std::set<int32_t> seen;
    for (int32_t t : draw(p, logits, 3000)) {
        EXPECT_EQ(nucleus.count(t), 1u) << "token " << t << " is outside the nucleus";
        seen.insert(t);
    }
    EXPECT_GT(seen.size(), 500u);  // it draws across the nucleus
}

TEST(Sampler, TopPOverEqualLogitsIsTheLowestIds) {
    // 1024 equal logits rank by id; top_p 513/1024 keeps exactly ids 0 … 512 (masses are exact in double),
    // one past the selection's first halving point, and 20000 draws reach every one of them (each ~39 times).
    const std::vector<float> logits(1024, 0.25f);
    SamplingParams p;
    p.temperature = 1.0;
    p.top_p = 513.0 / 1024.0;
    p.seed = 5;
    const std::vector<int32_t> tokens = draw(p, logits, 20000);
    const std::set<int32_t> seen(tokens.begin(), tokens.end());
    ASSERT_EQ(seen.size(), 513u);
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 512);
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
