// The routed-experts op with expert parallelism's global ids (MoeExpertsArgs::first_expert): an op over the
// block [first_expert, first_expert + E) given global ids gives the same bits as the op over local ids
// (id − first_expert inside the block, −1 outside) with first_expert 0; picks of other ranks' experts and
// −1 drop; a token with no pick in the block is a zero row; a negative first_expert is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "op_test_util.h"

namespace epinfer {
namespace {

constexpr int64_t kTokens = 13, kTopK = 3, kHidden = 24, kInter = 10;
constexpr int64_t kTotalExperts = 11, kFirst = 4, kLocal = 5;  // this rank holds experts 4..8

struct Experts {
    std::vector<test::StoredTensor> tensors;  // gate, up, down of each local expert
    std::vector<MoeExpertWeights> table;      // [kLocal]
};

Experts make_experts(uint32_t seed) {
    Experts ex;
    for (int64_t e = 0; e < kLocal; ++e) {
        const auto s = static_cast<uint32_t>(seed + 3 * e);
        ex.tensors.push_back(test::store_as(DType::kBF16, test::random_floats(kInter * kHidden, s, -0.3f, 0.3f)));
        ex.tensors.push_back(
            test::store_as(DType::kBF16, test::random_floats(kInter * kHidden, s + 1, -0.3f, 0.3f)));
        ex.tensors.push_back(
            test::store_as(DType::kBF16, test::random_floats(kHidden * kInter, s + 2, -0.3f, 0.3f)));
    }
    for (int64_t e = 0; e < kLocal; ++e) {
        ex.table.push_back({ex.tensors[3 * e].data(), ex.tensors[3 * e + 1].data(), ex.tensors[3 * e + 2].data()});
    }
    return ex;
}

// Global ids over all kTotalExperts, distinct per token, with some −1; token 0 only picks other ranks' experts.
std::vector<int32_t> global_ids(uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(kTokens * kTopK));
    std::vector<int32_t> order(kTotalExperts);
    for (int64_t t = 0; t < kTokens; ++t) {
        for (int32_t e = 0; e < kTotalExperts; ++e) order[static_cast<size_t>(e)] = e;
        std::shuffle(order.begin(), order.end(), rng);
        for (int64_t k = 0; k < kTopK; ++k) {
            int32_t id = order[static_cast<size_t>(k)];
            if (t == 0) id = static_cast<int32_t>(k == 0 ? 0 : kFirst + kLocal + k - 1);  // 0, 9, 10
            if (t == 5 && k == 1) id = -1;
            ids[static_cast<size_t>(t * kTopK + k)] = id;
        }
    }
    return ids;
}

MoeExpertsArgs args_of(const Experts& ex, const std::vector<float>& x, const std::vector<int32_t>& ids,
                       const std::vector<float>& weights, std::vector<float>& out, int64_t first_expert) {
    MoeExpertsArgs a;
    a.x = x.data();
    a.topk_ids = ids.data();
    a.topk_weights = weights.data();
    a.experts = ex.table.data();
    a.weight_dtype = DType::kBF16;
    a.out = out.data();
    a.num_tokens = kTokens;
    a.top_k = kTopK;
    a.num_experts = kLocal;
    a.first_expert = first_expert;
    a.hidden = kHidden;
    a.intermediate = kInter;
    return a;
}

TEST(MoeExpertsBlock, GlobalIdsEqualLocalIdsBitForBit) {
    std::unique_ptr<Backend> cpu = make_cpu_backend(2);
    for (uint32_t seed : {3u, 4u}) {
        const Experts ex = make_experts(seed * 100);
        const std::vector<float> x = test::random_floats(kTokens * kHidden, seed + 1);
        const std::vector<float> weights = test::random_floats(kTokens * kTopK, seed + 2, 0.0f, 1.0f);
        const std::vector<int32_t> global = global_ids(seed + 3);
        std::vector<int32_t> local(global.size());
        int64_t in_block = 0;
        for (size_t i = 0; i < global.size(); ++i) {
            const bool mine = global[i] >= kFirst && global[i] < kFirst + kLocal;
            local[i] = mine ? global[i] - static_cast<int32_t>(kFirst) : -1;
            in_block += mine ? 1 : 0;
        }
        ASSERT_GT(in_block, kTokens / 2);  // the case exercises the block, not only drops
        std::vector<float> want(kTokens * kHidden, std::numeric_limits<float>::quiet_NaN());
        std::vector<float> got(kTokens * kHidden, std::numeric_limits<float>::quiet_NaN());
        ASSERT_TRUE(cpu->moe_experts(args_of(ex, x, local, weights, want, 0)).is_ok());
        ASSERT_TRUE(cpu->moe_experts(args_of(ex, x, global, weights, got, kFirst)).is_ok());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "seed " << seed;
        for (int64_t h = 0; h < kHidden; ++h) EXPECT_EQ(got[static_cast<size_t>(h)], 0.0f) << h;  // token 0
        bool nonzero = false;
        for (size_t i = kHidden; i < got.size(); ++i) nonzero = nonzero || got[i] != 0.0f;
        EXPECT_TRUE(nonzero);
    }
}

TEST(MoeExpertsBlock, NegativeFirstExpertIsRefused) {
    std::unique_ptr<Backend> cpu = make_cpu_backend(1);
    const Experts ex = make_experts(7);
    const std::vector<float> x = test::random_floats(kTokens * kHidden, 8);
    const std::vector<float> weights = test::random_floats(kTokens * kTopK, 9, 0.0f, 1.0f);
    const std::vector<int32_t> ids = global_ids(10);
    std::vector<float> out(kTokens * kHidden, 0.0f);
    const Status st = cpu->moe_experts(args_of(ex, x, ids, weights, out, -2));
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("first_expert must be ≥ 0, got -2"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace epinfer
