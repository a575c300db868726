// The floor of a drawn row (backend/sampling_floor.h, cpu_sampling_floor): hand cases of top-k, top-p, their
// order, ties, NaN / −0 keys and the rows without a floor; the order map's round trip; and seeded random
// rows against a brute-force reading of the definition (for each candidate floor, its mass summed afresh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_argmax.h"
#include "backend/sampling_floor.h"

namespace epinfer {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TokenDraw draw_of(int32_t top_k, float top_p, float inv_temperature = 1.0f) {
    TokenDraw d;
    d.inv_temperature = inv_temperature;
    d.top_k = top_k;
    d.top_p = top_p;
    return d;
}

std::vector<float> logs(const std::vector<double>& probs) {
    std::vector<float> out;
    for (const double q : probs) out.push_back(static_cast<float>(std::log(q)));
    return out;
}

TEST(SamplingFloor, TopKIsTheKthBestWithItsTies) {
    const std::vector<float> row = {5.0f, 1.0f, 4.0f, 4.0f, 2.0f, 4.0f};
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(1, 1.0f)), 5.0f);
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(3, 1.0f)), 4.0f);
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(5, 1.0f)), 2.0f);
    // NaN ranks as −inf, −0 as +0: the 2nd best of {NaN, −0, +0, −1} is 0.
    const std::vector<float> zeros = {kNaN, -0.0f, 0.0f, -1.0f};
    const float f = cpu_sampling_floor(zeros, draw_of(2, 1.0f));
    EXPECT_EQ(f, 0.0f);
    EXPECT_FALSE(std::signbit(f));
    EXPECT_EQ(cpu_sampling_floor(zeros, draw_of(4, 1.0f)), -kInf);  // the NaN's key
}

TEST(SamplingFloor, TopPIsTheSmallestHeadReachingTheMass) {
    const std::vector<float> row = logs({0.4, 0.3, 0.2, 0.1});
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.35f)), row[0]);
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.5f)), row[1]);
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.85f)), row[2]);
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.95f)), row[3]);
    // top-k first, the nucleus renormalised within it (transformers' order): of {0.4, 0.3}, 0.4 / 0.7 ≥ 0.5.
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(2, 0.5f)), row[0]);
    // A higher temperature flattens the weights: at T = 4 (∝ p^¼) the first two hold 0.555, below 0.6.
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.6f, 1.0f)), row[1]);
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.6f, 0.25f)), row[2]);
    // A tiny top_p keeps the best alone (at least one token).
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 1e-30f)), row[0]);
}

TEST(SamplingFloor, TiesAtTheNucleusEndAreAllKept) {
    const std::vector<float> row = {1.0f, 3.0f, 3.0f, 3.0f, 2.0f};
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.1f)), 3.0f);
}

TEST(SamplingFloor, WeightsBelowTwoToTheMinus40AreZero) {
    // exp(−30) < 2^-40: the second logit weighs nothing, so even top_p just below 1 keeps the first alone.
    const std::vector<float> row = {0.0f, -30.0f};
    EXPECT_EQ(nucleus_weight(-30.0f, 0.0f, 1.0f), 0u);
    EXPECT_EQ(nucleus_weight(0.0f, 0.0f, 1.0f), uint64_t{1} << 40);
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.999999f)), 0.0f);
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 0.999999f, 0.5f)), 0.0f);  // exp(−15) · 2^40 ≥ 1 …
    EXPECT_GT(nucleus_weight(-30.0f, 0.0f, 0.5f), 0u);                      // … and it weighs, but
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 1.0f - 1e-7f, 0.5f)), -30.0f);  // only past 1 − 3e-7
}

TEST(SamplingFloor, RowsWithoutAFloor) {
    const std::vector<float> row = {0.5f, 2.0f, -1.0f};
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(2, 0.5f, 0.0f)), -kInf);  // greedy
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(0, 1.0f)), -kInf);        // no filter
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(3, 1.0f)), -kInf);        // top_k = V
    EXPECT_EQ(cpu_sampling_floor(row, draw_of(-4, 1.0f)), -kInf);       // a negative top_k: none
    EXPECT_EQ(cpu_sampling_floor(std::vector<float>{1.0f, kInf}, draw_of(1, 0.5f)), -kInf);
    EXPECT_EQ(cpu_sampling_floor(std::vector<float>{kNaN, -kInf}, draw_of(1, 0.5f)), -kInf);
}

TEST(SamplingFloor, TargetIsTheCeilingClampedToOneAndTheTotal) {
    EXPECT_EQ(nucleus_target(10, 0.25f), 3u);  // ceil(2.5)
    EXPECT_EQ(nucleus_target(8, 0.25f), 2u);   // exact: no rounding up
    EXPECT_EQ(nucleus_target(10, 1e-30f), 1u);
    // (double) total rounds up to 2^57 here: the target is still at most the total.
    const uint64_t total = (uint64_t{1} << 57) - 1;
    EXPECT_EQ(nucleus_target(total, 1.0f), total);
    EXPECT_EQ(nucleus_target(total, 0.99999994f), uint64_t{144115179485921280});
    EXPECT_LT(nucleus_target(total, 0.5f), total);
}

TEST(SamplingFloor, OrderMapIsMonotoneAndInvertible) {
    const std::vector<float> keys = {-kInf,  -3.0e38f, -1.0f, -1e-40f, 0.0f,
                                     1e-40f, 1.0f,     2.5f,  3.0e38f, kInf};
    for (size_t i = 0; i < keys.size(); ++i) {
        EXPECT_EQ(sampling_order_key(sampling_order(keys[i])), keys[i]);
        if (i > 0) {
            EXPECT_LT(sampling_order(keys[i - 1]), sampling_order(keys[i])) << keys[i];
        }
    }
    EXPECT_EQ(sampling_order(sampling_key(-0.0f)), sampling_order(0.0f));
}

// The definition read literally: the largest kept key value f with mass(keys ≥ f) ≥ target, each
// candidate's mass summed afresh (O(V²); no sort, no running sum).
float brute_force_floor(const std::vector<float>& row, const TokenDraw& d) {
    const auto V = static_cast<int64_t>(row.size());
    std::vector<float> keys;
    for (const float x : row) keys.push_back(sampling_key(x));
    const float max_key = *std::max_element(keys.begin(), keys.end());
    float kth = -kInf;
    if (d.top_k > 0 && d.top_k < V) {
        for (const float c : keys) {  // the largest c with at least top_k keys ≥ c
            const auto at_least = std::count_if(keys.begin(), keys.end(), [&](float k) { return k >= c; });
            if (at_least >= d.top_k && c > kth) kth = c;
        }
    }
    if (!(d.top_p < 1.0f)) return kth;
    uint64_t total = 0;
    for (const float k : keys)
        if (k >= kth) total += nucleus_weight(k, max_key, d.inv_temperature);
    const uint64_t target = nucleus_target(total, d.top_p);
    float best = -kInf;
    for (const float c : keys) {
        if (!(c >= kth) || c <= best) continue;
        uint64_t mass = 0;
        for (const float k : keys)
            if (k >= c) mass += nucleus_weight(k, max_key, d.inv_temperature);
        if (mass >= target) best = c;
    }
    return best;
}

TEST(SamplingFloor, MatchesTheDefinitionOnRandomRows) {
    std::mt19937 rng(777);
    std::normal_distribution<float> logit(0.0f, 3.0f);
    int64_t checked = 0;
    for (const int64_t V : {1, 2, 5, 64, 301}) {
        std::uniform_int_distribution<int64_t> col(0, V - 1);
        for (int r = 0; r < 60; ++r) {
            std::vector<float> row(static_cast<size_t>(V));
            for (float& x : row) x = logit(rng);
            if (r % 5 == 1) row[col(rng)] = kNaN;
            if (r % 5 == 2) row[col(rng)] = -kInf;
            if (r % 5 == 3)  // ties
                for (int k = 0; k < 4; ++k) row[col(rng)] = row[0];
            if (r % 5 == 4)  // quantised logits: many ties everywhere
                for (float& x : row) x = std::round(x);
            const int32_t ks[] = {0, 1, 3, static_cast<int32_t>(V / 2), static_cast<int32_t>(V)};
            const float ps[] = {1.0f, 0.01f, 0.5f, 0.9f, 0.999f};
            const float ts[] = {1.0f, 0.3f, 2.0f};
            const TokenDraw d = draw_of(ks[r % 5], ps[(r / 5) % 5], ts[r % 3]);
            if (d.top_k == 0 && d.top_p == 1.0f) continue;
            EXPECT_EQ(cpu_sampling_floor(row, d), brute_force_floor(row, d))
                << "V " << V << " row " << r << " top_k " << d.top_k << " top_p " << d.top_p;
            ++checked;
        }
    }
    EXPECT_GT(checked, 250);
}

}  // namespace
}  // namespace epinfer
