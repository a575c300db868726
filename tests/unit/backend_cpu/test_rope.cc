// RoPE: the op (half-split, interleaved, partial rotary, offset, attention scaling) and the tables
// computed from RopeConfig (default, linear, YaRN with mscale, llama3) plus the MLA softmax scale.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/compare.h"
#include "models/rope_table.h"
#include "op_test_util.h"

namespace epinfer {
namespace {

Status run_rope(Backend& backend, std::vector<float>& x, const std::vector<int32_t>& positions,
                const std::vector<float>& inv_freq, int64_t num_heads, int64_t token_stride,
                int64_t head_stride, int64_t rot_offset, int64_t rotary_dim, bool interleaved,
                float scaling) {
    RopeArgs a;
    a.x = x.data();
    a.positions = positions.data();
    a.inv_freq = inv_freq.data();
    a.attention_scaling = scaling;
    a.num_tokens = static_cast<int64_t>(positions.size());
    a.num_heads = num_heads;
    a.token_stride = token_stride;
    a.head_stride = head_stride;
    a.rot_offset = rot_offset;
    a.rotary_dim = rotary_dim;
    a.interleaved = interleaved;
    return backend.rope(a);
}

TEST(Rope, HalfSplitAndInterleavedHandComputed) {
    auto backend = make_cpu_backend(1);
    const std::vector<float> inv_freq = {1.0f, 0.01f};
    const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.01), s1 = std::sin(0.01);
    std::vector<float> x = {1, 2, 3, 4};
    ASSERT_TRUE(run_rope(*backend, x, {1}, inv_freq, 1, 4, 4, 0, 4, false, 1.0f).is_ok());
    // Pairs (0, 2) and (1, 3) (transformers rotate_half).
    EXPECT_NEAR(x[0], 1 * c0 - 3 * s0, 1e-6);
    EXPECT_NEAR(x[2], 3 * c0 + 1 * s0, 1e-6);
    EXPECT_NEAR(x[1], 2 * c1 - 4 * s1, 1e-6);
    EXPECT_NEAR(x[3], 4 * c1 + 2 * s1, 1e-6);

    x = {1, 2, 3, 4};
    ASSERT_TRUE(run_rope(*backend, x, {1}, inv_freq, 1, 4, 4, 0, 4, true, 1.0f).is_ok());
    // Pairs (0, 1) and (2, 3), written de-interleaved: [rotated evens | rotated odds].
    EXPECT_NEAR(x[0], 1 * c0 - 2 * s0, 1e-6);
    EXPECT_NEAR(x[2], 2 * c0 + 1 * s0, 1e-6);
    EXPECT_NEAR(x[1], 3 * c1 - 4 * s1, 1e-6);
    EXPECT_NEAR(x[3], 4 * c1 + 3 * s1, 1e-6);
}

TEST(Rope, PositionZeroIsIdentityTimesScaling) {
    auto backend = make_cpu_backend(1);
    std::vector<float> x = {1, -2, 3, 5};
    ASSERT_TRUE(run_rope(*backend, x, {0}, {0.5f, 0.25f}, 1, 4, 4, 0, 4, false, 2.0f).is_ok());
    EXPECT_EQ(x, (std::vector<float>{2, -4, 6, 10}));
}

// Several tokens and heads; only rotary_dim elements at rot_offset of each head change (partial rotary,
// MLA q_pe after q_nope), against the formula in double.
TEST(Rope, PartialOffsetStridedMatchesFormula) {
    auto backend = make_cpu_backend(3);
    const int64_t T = 5, heads = 3, head_stride = 24, token_stride = heads * head_stride + 5;
    const int64_t offset = 16, rot = 8, half = rot / 2;
    const std::vector<int32_t> positions = {0, 3, 17, 4, 511};
    const std::vector<float> inv_freq = test::random_floats(half, 11, 0.001f, 1.0f);
    for (const bool interleaved : {false, true}) {
        const std::vector<float> x0 = test::random_floats(T * token_stride, 12);
        std::vector<float> x = x0, got, want;
        ASSERT_TRUE(run_rope(*backend, x, positions, inv_freq, heads, token_stride, head_stride, offset, rot,
                             interleaved, 1.25f)
                        .is_ok());
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t h = 0; h < heads; ++h) {
                const int64_t base = t * token_stride + h * head_stride;
                for (int64_t i = 0; i < head_stride; ++i) {
                    if (i < offset || i >= offset + rot) {
                        EXPECT_EQ(x[base + i], x0[base + i]) << "untouched " << i;
                    }
                }
                for (int64_t i = 0; i < half; ++i) {
                    const double angle = double(float(positions[t]) * inv_freq[i]);
                    const double c = std::cos(angle) * 1.25, s = std::sin(angle) * 1.25;
                    const double x1 = x0[base + offset + (interleaved ? 2 * i : i)];
                    const double x2 = x0[base + offset + (interleaved ? 2 * i + 1 : i + half)];
                    want.push_back(static_cast<float>(x1 * c - x2 * s));
                    want.push_back(static_cast<float>(x2 * c + x1 * s));
                    got.push_back(x[base + offset + i]);
                    got.push_back(x[base + offset + i + half]);
                }
            }
        }
        EXPECT_TRUE(test::within(test::compare<float>(got, want), test::tolerance("rope", DType::kF32)));
    }
}

TEST(RopeTable, DefaultAndLinear) {
    RopeConfig rope;
    rope.theta = 10000.0;
    rope.rotary_dim = 8;
    auto table = compute_rope_table(rope);
    ASSERT_TRUE(table.is_ok()) << table.status().to_string();
    ASSERT_EQ(table->inv_freq.size(), 4u);
    EXPECT_FLOAT_EQ(table->inv_freq[0], 1.0f);
    EXPECT_FLOAT_EQ(table->inv_freq[1], 0.1f);
    EXPECT_FLOAT_EQ(table->inv_freq[2], 0.01f);
    EXPECT_FLOAT_EQ(table->inv_freq[3], 0.001f);
    EXPECT_EQ(table->attention_scaling, 1.0f);

    rope.type = RopeType::kLinear;
    rope.factor = 4.0;
    table = compute_rope_table(rope);
    ASSERT_TRUE(table.is_ok());
    EXPECT_FLOAT_EQ(table->inv_freq[1], 0.025f);
}

// kimi_k2_tiny_yarn: theta 5e4, d = 8, factor 32, original 64, beta_fast = beta_slow = 1: the correction
// dim 8·ln(64 / 2π) / (2·ln 5e4) = 0.858 gives the range [0, 1]: pair 0 extrapolates, the others are
// interpolated (÷ 32). mscale = mscale_all_dim = 1 → attention_factor 1.
TEST(RopeTable, YarnKimiFixture) {
    RopeConfig rope;
    rope.type = RopeType::kYarn;
    rope.theta = 50000.0;
    rope.rotary_dim = 8;
    rope.factor = 32.0;
    rope.original_max_position_embeddings = 64;
    rope.beta_fast = 1.0;
    rope.beta_slow = 1.0;
    rope.mscale = 1.0;
    rope.mscale_all_dim = 1.0;
    auto table = compute_rope_table(rope);
    ASSERT_TRUE(table.is_ok()) << table.status().to_string();
    EXPECT_FLOAT_EQ(table->inv_freq[0], 1.0f);
    for (int i = 1; i < 4; ++i)
        EXPECT_FLOAT_EQ(table->inv_freq[i], float(std::pow(50000.0, -i / 4.0) / 32.0)) << i;
    EXPECT_FLOAT_EQ(table->attention_scaling, 1.0f);

    // Without mscale: attention_factor = 0.1·ln(32) + 1.
    rope.mscale = rope.mscale_all_dim = 0.0;
    table = compute_rope_table(rope);
    ASSERT_TRUE(table.is_ok());
    EXPECT_FLOAT_EQ(table->attention_scaling, float(0.1 * std::log(32.0) + 1.0));
}

// DeepSeek-V3 YaRN (theta 1e4, d = 64, factor 40, original 4096, beta 32/1): pairs below the range keep
// their frequency, pairs above are divided by 40, a ramp in between.
TEST(RopeTable, YarnDeepseekV3Ramp) {
    RopeConfig rope;
    rope.type = RopeType::kYarn;
    rope.theta = 10000.0;
    rope.rotary_dim = 64;
    rope.factor = 40.0;
    rope.original_max_position_embeddings = 4096;
    rope.mscale = rope.mscale_all_dim = 1.0;
    auto table = compute_rope_table(rope);
    ASSERT_TRUE(table.is_ok());
    // low = floor(64·ln(4096/(2π·32)) / (2·ln 1e4)) = 10, high = ceil(64·ln(4096/2π) / (2·ln 1e4)) = 23.
    for (int i = 0; i < 32; ++i) {
        const double extrapolation = std::pow(10000.0, -2.0 * i / 64.0);
        const double ramp = std::clamp((i - 10.0) / 13.0, 0.0, 1.0);
        const double want = extrapolation / 40.0 * ramp + extrapolation * (1.0 - ramp);
        EXPECT_NEAR(table->inv_freq[i], want, 1e-6 * want) << i;
    }
}

TEST(RopeTable, Llama3KeepsHighAndDividesLowFrequencies) {
    RopeConfig rope;
    rope.type = RopeType::kLlama3;
    rope.theta = 500000.0;
    rope.rotary_dim = 128;
    rope.factor = 8.0;
    rope.low_freq_factor = 1.0;
    rope.high_freq_factor = 4.0;
    rope.original_max_position_embeddings = 8192;
    auto table = compute_rope_table(rope);
    ASSERT_TRUE(table.is_ok());
    EXPECT_FLOAT_EQ(table->inv_freq[0], 1.0f);  // wavelength 2π < 8192/4
    EXPECT_FLOAT_EQ(table->inv_freq[63], float(std::pow(500000.0, -126.0 / 128.0)) / 8.0f);  // > 8192
}

TEST(RopeTable, RejectsOddRotaryDim) {
    RopeConfig rope;
    rope.rotary_dim = 7;
    EXPECT_EQ(compute_rope_table(rope).status().code(), StatusCode::kInvalidArgument);
}

TEST(MlaSoftmaxScale, AppliesMscaleSquaredOnlyForScaledRope) {
    ModelConfig c;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    EXPECT_FLOAT_EQ(mla_softmax_scale(c), float(1.0 / std::sqrt(24.0)));
    c.rope.type = RopeType::kYarn;
    c.rope.factor = 32.0;
    c.rope.mscale_all_dim = 1.0;
    const double mscale = 0.1 * std::log(32.0) + 1.0;
    EXPECT_FLOAT_EQ(mla_softmax_scale(c), float(mscale * mscale / std::sqrt(24.0)));
    c.rope.mscale_all_dim = 0.0;  // DeepSeek applies it only with mscale_all_dim
    EXPECT_FLOAT_EQ(mla_softmax_scale(c), float(1.0 / std::sqrt(24.0)));
}

}  // namespace
}  // namespace epinfer
