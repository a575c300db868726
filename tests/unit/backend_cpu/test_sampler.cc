// The sampler: greedy ties, determinism for a seed, top-k and top-p filtering, parameter checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "backend/cpu/cpu_argmax.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/gumbel_noise.h"
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

TEST(Sampler, TopKAndTopPDrawsFollowTheRenormalisedSoftmax) {
    // Probabilities 0.4, 0.25, 0.15, 0.1, 0.06, 0.04 (logits their logs). top_k 4 keeps the first four
    // (renormalised over 0.9); top_p 0.7 the first three (0.65 < 0.7 ≤ 0.8); top_k 2 then top_p 0.5 keeps
    // only the first (0.4 / 0.65 ≥ 0.5: the nucleus is taken within the top-k, transformers' order).
    const std::vector<double> probs = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
    std::vector<float> logits;
    for (const double q : probs) logits.push_back(static_cast<float>(std::log(q)));
    const int n = 40000;  // standard error of a frequency ≤ 0.0025
    const auto expect_renormalised = [&](const SamplingParams& p, size_t kept, const char* what) {
        const std::vector<double> f = frequencies(p, logits, n);
        double mass = 0.0;
        for (size_t i = 0; i < kept; ++i) mass += probs[i];
        for (size_t i = 0; i < probs.size(); ++i)
            EXPECT_NEAR(f[i], i < kept ? probs[i] / mass : 0.0, 0.01) << what << ", token " << i;
    };
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = 21;
    p.top_k = 4;
    expect_renormalised(p, 4, "top_k 4");
    p.top_k = 0;
    p.top_p = 0.7;
    expect_renormalised(p, 3, "top_p 0.7");
    p.top_k = 2;
    p.top_p = 0.5;
    expect_renormalised(p, 1, "top_k 2, top_p 0.5");
}

TEST(Sampler, ItsDrawIsTheOpsDraw) {
    // What the engine hands the device for a request (next_draw) gives, through the op's CPU reference, the
    // token the sampler draws itself; the two share one draw counter. Temperature only, top-k, top-p, both.
    std::vector<SamplingParams> cases(4);
    for (SamplingParams& p : cases) {
        p.temperature = 0.8;
        p.seed = 1234;
    }
    cases[1].top_k = 3;
    cases[2].top_p = 0.6;
    cases[3].top_k = 5;
    cases[3].top_p = 0.9;
    const std::unique_ptr<Backend> cpu = make_cpu_backend(2);
    for (const SamplingParams& p : cases) {
        Sampler host(p), device(p);
        std::vector<float> logits = kLogits;
        std::set<int32_t> seen;
        for (int step = 0; step < 50; ++step) {
            logits[static_cast<size_t>(step) % logits.size()] += 0.05f;
            const TokenDraw draw = device.next_draw();
            int32_t id = -1, non_finite = -1;
            float floor = 0.0f;
            ArgmaxArgs op;
            op.logits = logits.data();
            op.out_ids = &id;
            op.out_non_finite = &non_finite;
            op.num_rows = 1;
            op.vocab_size = static_cast<int64_t>(logits.size());
            op.row_stride = op.vocab_size;
            op.draws = &draw;
            op.floor = &floor;
            ASSERT_TRUE(cpu->argmax(op).is_ok());
            EXPECT_EQ(host.sample(logits), id)
                << "top_k " << p.top_k << ", top_p " << p.top_p << ", step " << step;
            EXPECT_EQ(non_finite, 0);
            EXPECT_EQ(floor, cpu_sampling_floor(logits, draw));
            seen.insert(id);
        }
        EXPECT_GT(seen.size(), 1u) << "top_k " << p.top_k << ", top_p " << p.top_p;  // it really draws
    }
}

TEST(Sampler, NextDrawCarriesTheParameters) {
    SamplingParams p;
    p.seed = 99;
    EXPECT_EQ(Sampler(p).next_draw().inv_temperature, 0.0f);  // greedy
    p.temperature = 0.8;
    p.top_k = 40;
    p.top_p = 0.95;
    Sampler s(p);
    const TokenDraw first = s.next_draw(), second = s.next_draw();
    EXPECT_FLOAT_EQ(first.inv_temperature, 1.25f);
    EXPECT_EQ(first.top_k, 40);
    EXPECT_EQ(first.top_p, 0.95f);
    EXPECT_EQ(first.noise_key, sampling_noise_key(99, 0));
    EXPECT_EQ(second.noise_key, sampling_noise_key(99, 1));
    // A top_k beyond int32 is no filter, as one ≥ V; temperatures below kMinDrawTemperature are greedy, those
    // above kMaxDrawTemperature draw as at it.
    p.top_k = int64_t{1} << 40;
    EXPECT_EQ(Sampler(p).next_draw().top_k, INT32_MAX);
    p.temperature = 1e-39;
    EXPECT_EQ(Sampler(p).next_draw().inv_temperature, 0.0f);
    p.temperature = 1e46;
    EXPECT_FLOAT_EQ(Sampler(p).next_draw().inv_temperature, static_cast<float>(1.0 / kMaxDrawTemperature));
}

TEST(Sampler, ATinyTemperatureIsGreedy) {
    // 1 / T overflows fp32 at T = 1e-39 (a fresh-user find: the device then drew ties among the first ids).
    SamplingParams p;
    p.temperature = 1e-39;
    p.seed = 3;
    for (int32_t t : draw(p, kLogits, 10)) EXPECT_EQ(t, 1);
}

TEST(Sampler, TopPOverManyFlatLogitsKeepsExactlyTheNucleus) {
    // 3000 logits in a narrow band, each value three times (a flat distribution: the nucleus holds ~half of
    // them): every draw lies in the nucleus a full sort gives, extended to the ties of its last logit.
    std::vector<float> logits(3000);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.001f * static_cast<float>((i * 7919) % 1000);
    SamplingParams p;
    p.temperature = 1.0;
    p.top_p = 0.5;
    p.seed = 77;
    std::vector<float> ranked = logits;
    std::sort(ranked.begin(), ranked.end(), std::greater<>());
    const float max_logit = ranked[0];
    double sum = 0.0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
    double mass = 0.0;
    float last = ranked[0];
    for (size_t i = 0; i < ranked.size() && mass < 0.5 * sum; ++i) {
        mass += std::exp(static_cast<double>(ranked[i]) - max_logit);
        last = ranked[i];
    }
    std::set<int32_t> nucleus;
    for (size_t i = 0; i < logits.size(); ++i)
        if (logits[i] >= last) nucleus.insert(static_cast<int32_t>(i));
    ASSERT_GT(nucleus.size(), 1000u);
    ASSERT_LT(nucleus.size(), 2000u);
    ASSERT_EQ(nucleus.size() % 3, 0u);  // whole groups of ties
    std::set<int32_t> seen;
    for (int32_t t : draw(p, logits, 3000)) {
        EXPECT_EQ(nucleus.count(t), 1u) << "token " << t << " is outside the nucleus";
        seen.insert(t);
    }
    EXPECT_GT(seen.size(), 500u);  // it draws across the nucleus
}

TEST(Sampler, TopPKeepsEveryTieAtTheNucleusEnd) {
    // 1024 equal logits: any top_p reaches its mass inside the one group of ties, and the whole group is
    // kept (as FlashInfer's threshold, where transformers would keep the lowest ids): 20000 draws reach
    // every one of them (each ~20 times).
    const std::vector<float> logits(1024, 0.25f);
    SamplingParams p;
    p.temperature = 1.0;
    p.top_p = 513.0 / 1024.0;
    p.seed = 5;
    const std::vector<int32_t> tokens = draw(p, logits, 20000);
    EXPECT_EQ(std::set<int32_t>(tokens.begin(), tokens.end()).size(), 1024u);
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
