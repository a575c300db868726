// Router top-k CPU reference against transformers goldens (DeepseekV3TopkRouter, 257 tokens each):
// tests/data/fixtures/router_v3_256e_top8_g8 (DeepSeek-V3 shape) and router_k2_384e_top8_g1 (Kimi K2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/moe_router.h"
#include "checkpoint/safetensors.h"

namespace epinfer {
namespace {

struct RouterFixtureConfig {
    const char* dir;
    int64_t num_experts;
    int64_t n_group;
    int64_t topk_group;
    float routed_scaling_factor;
};

// As in each folder's README.txt (top-8, sigmoid, noaux_tc, norm_topk_prob, 257 tokens, hidden 64).
constexpr RouterFixtureConfig kV3 = {"router_v3_256e_top8_g8", 256, 8, 4, 2.5f};
constexpr RouterFixtureConfig kK2 = {"router_k2_384e_top8_g1", 384, 1, 1, 2.827f};
constexpr int64_t kTokens = 257;
constexpr int64_t kHidden = 64;
constexpr int64_t kTopK = 8;

// Copies tensor `name` (dtype, shape checked) out of the file.
template <typename T>
std::vector<T> read_tensor(const SafetensorsFile& file, const std::string& name, DType dtype,
                           const std::vector<int64_t>& shape) {
    const TensorInfo* info = file.find(name);
    EXPECT_NE(info, nullptr) << name;
    if (info == nullptr) return {};
    EXPECT_EQ(info->dtype, dtype) << name;
    EXPECT_EQ(info->shape, shape) << name;
    std::vector<T> out(info->numel());
    if (info->dtype != dtype || out.size() * sizeof(T) != info->num_bytes()) return {};
    std::memcpy(out.data(), file.data(*info), info->num_bytes());
    return out;
}

class RouterFixture : public ::testing::TestWithParam<RouterFixtureConfig> {
protected:
    void SetUp() override {
        const RouterFixtureConfig& config = GetParam();
        const std::string path =
            std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + config.dir + "/router.safetensors";
        Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(path);
        ASSERT_TRUE(file.is_ok()) << file.status().to_string();
        const int64_t e = config.num_experts;
        x_ = read_tensor<float>(**file, "x", DType::kF32, {kTokens, kHidden});
        gate_weight_ = read_tensor<float>(**file, "gate_weight", DType::kF32, {e, kHidden});
        bias_ = read_tensor<float>(**file, "e_score_correction_bias", DType::kF32, {e});
        golden_logits_ = read_tensor<float>(**file, "gate_out0", DType::kF32, {kTokens, e});
        golden_weights_ = read_tensor<float>(**file, "gate_out1", DType::kF32, {kTokens, kTopK});
        golden_ids_ = read_tensor<int64_t>(**file, "gate_out2", DType::kI64, {kTokens, kTopK});
        ASSERT_FALSE(x_.empty() || gate_weight_.empty() || bias_.empty() || golden_logits_.empty() ||
                     golden_weights_.empty() || golden_ids_.empty());
    }

    // logits = x · gate_weightᵀ, fp32, summed in order of the hidden index.
    std::vector<float> compute_logits() const {
        const int64_t e_count = GetParam().num_experts;
        std::vector<float> logits(kTokens * e_count);  // [T, E]
        for (int64_t t = 0; t < kTokens; ++t) {
            for (int64_t e = 0; e < e_count; ++e) {
                float acc = 0.0f;
                for (int64_t h = 0; h < kHidden; ++h) {
                    acc += x_[t * kHidden + h] * gate_weight_[e * kHidden + h];
                }
                logits[t * e_count + e] = acc;
            }
        }
        return logits;
    }

    // Routes `logits` and compares every token with the golden: the same id set, weights within 1e-6 by id.
    void expect_matches_golden(const std::vector<float>& logits) const {
        const RouterFixtureConfig& config = GetParam();
        std::vector<int32_t> ids(kTokens * kTopK, -7);    // [T, K]
        std::vector<float> weights(kTokens * kTopK, -7);  // [T, K]
        MoeRouterTopkArgs args;
        args.router_logits = logits.data();
        args.e_score_correction_bias = bias_.data();
        args.topk_ids = ids.data();
        args.topk_weights = weights.data();
        args.num_tokens = kTokens;
        args.num_experts = config.num_experts;
        args.top_k = kTopK;
        args.scoring_func = ScoringFunc::kSigmoid;
        args.topk_method = TopkMethod::kNoauxTc;
        args.n_group = config.n_group;
        args.topk_group = config.topk_group;
        args.norm_topk_prob = true;
        args.routed_scaling_factor = config.routed_scaling_factor;
        const Status status = cpu_moe_router_topk(args);
        ASSERT_TRUE(status.is_ok()) << status.to_string();

        int64_t num_bad_tokens = 0;
        for (int64_t t = 0; t < kTokens; ++t) {
            std::map<int64_t, float> golden;  // id → weight
            std::map<int64_t, float> ours;
            for (int64_t k = 0; k < kTopK; ++k) {
                golden[golden_ids_[t * kTopK + k]] = golden_weights_[t * kTopK + k];
                ours[ids[t * kTopK + k]] = weights[t * kTopK + k];
            }
            bool same = golden.size() == static_cast<size_t>(kTopK) && ours.size() == golden.size();
            for (auto [id, w] : golden) {
                const auto it = ours.find(id);
                same = same && it != ours.end() && std::fabs(it->second - w) <= 1e-6f;
            }
            if (!same && ++num_bad_tokens <= 3) ADD_FAILURE() << config.dir << ": token " << t << " differs";
            // Row order: descending choice score s + bias.
            for (int64_t k = 1; k < kTopK; ++k) {
                const auto c = [&](int64_t kk) {
                    const int32_t id = ids[t * kTopK + kk];
                    const float l = logits[t * config.num_experts + id];
                    return 1.0f / (1.0f + std::exp(-l)) + bias_[id];
                };
                EXPECT_GE(c(k - 1), c(k)) << "token " << t;
            }
        }
        EXPECT_EQ(num_bad_tokens, 0);
    }

    std::vector<float> x_, gate_weight_, bias_, golden_logits_, golden_weights_;
    std::vector<int64_t> golden_ids_;
};

TEST_P(RouterFixture, LogitsMatchGolden) {
    const std::vector<float> logits = compute_logits();
    float max_diff = 0.0f;
    for (size_t i = 0; i < logits.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(logits[i] - golden_logits_[i]));
    }
    EXPECT_LE(max_diff, 1e-5f);
}

TEST_P(RouterFixture, RoutesFromOwnLogitsLikeTransformers) {
    expect_matches_golden(compute_logits());
}

TEST_P(RouterFixture, RoutesFromGoldenLogitsLikeTransformers) {
    expect_matches_golden(golden_logits_);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RouterFixture, ::testing::Values(kV3, kK2),
                         [](const ::testing::TestParamInfo<RouterFixtureConfig>& info) {
                             return info.param.num_experts == 256 ? std::string("V3") : std::string("K2");
                         });

}  // namespace
}  // namespace epinfer
