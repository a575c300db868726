// Probes of one synthetic MoE block (fp32 weights; E = 16, K = 4, H = 8, I = 8, a shared expert of width 8)
// under the layout of EPINFER_TEST_LAYOUT, each rank holding its experts and slices as the model loader
// would, against the same block on one rank (moe_block_forward without a layout):
//   routed experts zeroed → the output is the shared expert's (counted exactly once);
//   identical experts, renormalised top-k → the output is routed_scaling_factor · expert(x) (applied once);
//   every token routed to one expert (the last one, on the last EP rank; the others get no token);
//   under DP attention a rank with zero tokens; an empty batch on every rank (no hang, no error).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/compare.h"
#include "layers/moe/moe_block.h"
#include "layers/parallel_context.h"
#include "model_layout_util.h"
#include "mpi_test_world.h"
#include "parallel/sharding.h"

namespace epinfer {
namespace {

constexpr int64_t kE = 16, kK = 4, kH = 8, kI = 8, kShared = 8, kTokens = 10;

// A SwiGLU MLP's full fp32 weights on the host: gate/up [I, H], down [H, I].
struct FullFfn {
    std::vector<float> gate, up, down;
};

FullFfn random_ffn(std::mt19937& rng, int64_t width, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    FullFfn f;
    for (auto* m : {&f.gate, &f.up, &f.down}) {
        m->resize(static_cast<size_t>(width * kH));
        for (float& v : *m) v = u(rng);
    }
    return f;
}

// Part tp_rank of tp of a full MLP (gate/up rows, down columns); the host copies live in `store`.
DenseFfnWeights slice_ffn(const FullFfn& f, int64_t width, int tp, int tp_rank,
                          std::vector<std::vector<float>>& store) {
    const int64_t part = width / tp;
    const ShardRange r{tp_rank * part, part};
    const int64_t shape_in[] = {width, kH}, shape_down[] = {kH, width};
    const auto copy = [&](const std::vector<float>& m, std::span<const int64_t> shape, int dim) {
        store.emplace_back(static_cast<size_t>(part * kH));
        copy_tensor_slice(m.data(), shape, sizeof(float), TensorSlice{dim, r}, store.back().data());
        return static_cast<const void*>(store.back().data());
    };
    DenseFfnWeights w;
    w.gate_proj = {copy(f.gate, shape_in, 0), DType::kF32, nullptr, DType::kF32, part, kH};
    w.up_proj = {copy(f.up, shape_in, 0), DType::kF32, nullptr, DType::kF32, part, kH};
    w.down_proj = {copy(f.down, shape_down, 1), DType::kF32, nullptr, DType::kF32, kH, part};
    return w;
}

struct Probe {
    std::vector<FullFfn> experts;  // [E]
    FullFfn shared;
    std::vector<float> router;       // [E, H]
    std::vector<float> router_bias;  // [E] (empty = none)
    MoeRouterParams params;
};

Probe random_probe(uint32_t seed) {
    std::mt19937 rng(seed);
    Probe p;
    for (int64_t e = 0; e < kE; ++e) p.experts.push_back(random_ffn(rng, kI, 0.5f));
    p.shared = random_ffn(rng, kShared, 0.5f);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    p.router.resize(static_cast<size_t>(kE * kH));
    for (float& v : p.router) v = u(rng);
    p.params.top_k = kK;
    p.params.scoring_func = ScoringFunc::kSoftmax;
    p.params.norm_topk_prob = true;
    p.params.routed_scaling_factor = 2.5f;
    return p;
}

// The block's weights as one rank of `ctx` holds them (all of them when ctx is null).
MoeBlockWeights block_weights(const Probe& p, const ParallelContext* ctx,
                              std::vector<std::vector<float>>& store) {
    MoeBlockWeights w;
    w.router = {p.router.data(), DType::kF32, p.router_bias.empty() ? nullptr : p.router_bias.data(),
                DType::kF32,     kE,          kH};
    const int moe_tp = ctx ? ctx->layout.moe_tp : 1, moe_tp_rank = ctx ? ctx->coords.moe_tp_rank : 0;
    const int attn_tp = ctx ? ctx->layout.attn_tp : 1, attn_tp_rank = ctx ? ctx->coords.attn_tp_rank : 0;
    if (ctx != nullptr) {
        const auto held = ctx->placement.local_experts(ctx->coords.moe_ep_rank);
        w.first_local_expert = held.front();
        for (size_t s = 0; s < held.size(); ++s) {
            w.experts.push_back(
                slice_ffn(p.experts[static_cast<size_t>(held[s])], kI, moe_tp, moe_tp_rank, store));
        }
    } else {
        for (const FullFfn& f : p.experts) w.experts.push_back(slice_ffn(f, kI, 1, 0, store));
    }
    w.shared_mode = SharedExpertMode::kUnweighted;
    w.shared = slice_ffn(p.shared, kShared, attn_tp, attn_tp_rank, store);
    return w;
}

class MoeProbeTest : public ::testing::Test {
protected:
    void SetUp() override {
        auto layout = layout_from_flags(layout_flags_from_env());
        ASSERT_TRUE(layout.is_ok()) << layout.status().to_string();
        LayoutModelDims dims;
        dims.num_hidden_layers = 4;
        dims.num_attention_heads = 8;
        dims.num_key_value_heads = 8;
        dims.n_routed_experts = kE;
        dims.moe_intermediate_size = kI;
        dims.shared_intermediate_size = kShared;
        const Status valid = validate_layout(*layout, dims, mpi_test::world().size());
        if (!valid.is_ok()) GTEST_SKIP() << "the probe block does not fit this layout: " << valid.message();
        auto ctx = create_parallel_context(mpi_test::world(), *layout, dims);
        ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
        ctx_ = std::move(ctx).value();
        backend_ = make_cpu_backend(1);
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        x_.resize(static_cast<size_t>(kTokens * kH));
        for (float& v : x_) v = u(rng);
    }

    // The rows of the kTokens tokens this rank owns: all of them, or under DP attention its group's share,
    // with DP group 1 owning none when zero_tokens_on_group1 (and group 0 taking its share).
    ShardRange own_rows(bool zero_tokens_on_group1) const {
        const int dp = ctx_->layout.attn_dp, d = ctx_->coords.attn_dp_rank;
        if (dp == 1) return {0, kTokens};
        if (!zero_tokens_on_group1) return split_evenly(kTokens, dp, d);
        if (d == 1) return {0, 0};
        const int other = d == 0 ? 0 : d - 1;  // groups 0, 2, 3, ... share the tokens
        return split_evenly(kTokens, dp - 1, other);
    }

    // Runs the block under the layout on this rank's rows and on one rank for all rows; compares this
    // rank's rows. Returns the parallel output rows.
    std::vector<float> run_and_compare(const Probe& p, bool zero_tokens_on_group1,
                                       const std::vector<float>& want_all) {
        std::vector<std::vector<float>> store;
        const MoeBlockWeights par_w = block_weights(p, ctx_.get(), store);
        const ShardRange rows = own_rows(zero_tokens_on_group1);
        const MoeParallel mp = moe_parallel_of(*ctx_);
        std::vector<float> got(static_cast<size_t>(rows.size * kH));
        const Status st = moe_block_forward(*backend_, par_w, p.params, x_.data() + rows.begin * kH,
                                            rows.size, kH, got.data(), &mp);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        const std::vector<float> want(want_all.begin() + rows.begin * kH, want_all.begin() + rows.end() * kH);
        const test::Diff d = test::compare(std::span<const float>(got), std::span<const float>(want));
        EXPECT_TRUE(test::within(d, test::tolerance("moe_block_multi_rank", DType::kF32)))
            << "rank " << mpi_test::world().rank() << " rows [" << rows.begin << ", " << rows.end() << ")";
        std::printf("[rank %d] %s: nmse %.3g max_rel %.3g over %lld rows\n", mpi_test::world().rank(),
                    ::testing::UnitTest::GetInstance()->current_test_info()->name(), d.nmse, d.max_rel,
                    static_cast<long long>(rows.size));
        return got;
    }

    // The block on one rank, all tokens.
    std::vector<float> one_rank(const Probe& p) {
        std::vector<std::vector<float>> store;
        const MoeBlockWeights w = block_weights(p, nullptr, store);
        std::vector<float> out(static_cast<size_t>(kTokens * kH));
        const Status st = moe_block_forward(*backend_, w, p.params, x_.data(), kTokens, kH, out.data());
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        return out;
    }

    // expert(x) of one full MLP on one rank, all tokens.
    std::vector<float> mlp_alone(const FullFfn& f, int64_t width) {
        std::vector<std::vector<float>> store;
        const DenseFfnWeights w = slice_ffn(f, width, 1, 0, store);
        std::vector<float> out(static_cast<size_t>(kTokens * kH));
        const Status st = dense_ffn_forward(*backend_, w, x_.data(), kTokens, out.data());
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        return out;
    }

    std::unique_ptr<ParallelContext> ctx_;
    std::unique_ptr<Backend> backend_;
    std::vector<float> x_;  // [kTokens, H]
};

TEST_F(MoeProbeTest, RandomRoutingMatchesOneRank) {
    const Probe p = random_probe(11);
    run_and_compare(p, false, one_rank(p));
}

TEST_F(MoeProbeTest, ZeroedRoutedExpertsGiveTheSharedExpertOnce) {
    Probe p = random_probe(12);
    for (FullFfn& f : p.experts) std::fill(f.down.begin(), f.down.end(), 0.0f);
    const std::vector<float> shared = mlp_alone(p.shared, kShared);
    run_and_compare(p, false, shared);
}

TEST_F(MoeProbeTest, IdenticalExpertsApplyRoutedScalingFactorOnce) {
    Probe p = random_probe(13);
    for (FullFfn& f : p.experts) f = p.experts[0];
    std::fill(p.shared.down.begin(), p.shared.down.end(), 0.0f);  // isolate the routed part
    std::vector<float> want = mlp_alone(p.experts[0], kI);
    for (float& v : want) v *= p.params.routed_scaling_factor;  // weights sum to 1 before the factor
    run_and_compare(p, false, want);
}

TEST_F(MoeProbeTest, AllTokensToOneExpert) {
    Probe p = random_probe(14);
    p.params.top_k = 1;
    p.router_bias.assign(kE, 0.0f);
    p.router_bias[kE - 1] = 100.0f;  // the last expert, on the last EP rank, wins every token
    const std::vector<float> want = one_rank(p);
    run_and_compare(p, false, want);
}

TEST_F(MoeProbeTest, RankWithZeroTokens) {
    if (ctx_->layout.attn_dp == 1) GTEST_SKIP() << "tokens are replicated in the stage (no DP attention)";
    const Probe p = random_probe(15);
    run_and_compare(p, true, one_rank(p));
}

TEST_F(MoeProbeTest, EmptyBatchOnEveryRank) {
    const Probe p = random_probe(16);
    std::vector<std::vector<float>> store;
    const MoeBlockWeights w = block_weights(p, ctx_.get(), store);
    const MoeParallel mp = moe_parallel_of(*ctx_);
    float out = 0.0f;
    const Status st = moe_block_forward(*backend_, w, p.params, x_.data(), 0, kH, &out, &mp);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    // The groups are still in step afterwards.
    EXPECT_TRUE(mpi_test::world().barrier().is_ok());
}

}  // namespace
}  // namespace epinfer
