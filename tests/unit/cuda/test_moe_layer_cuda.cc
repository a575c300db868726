// The whole GPU MoE layer (backend/cuda/cuda_moe_layer.h: router → permute → grouped gate_up/SwiGLU →
// grouped down → combine + shared expert) against a host reference on fresh random bf16 weights and inputs.
// The reference rounds where the GPU stores bf16 (h and y), accumulates dot products in double and combines
// with layers/moe/permute.h moe_combine_rows, so the bound (tolerances.h "moe_layer_cuda") measures fp32
// accumulation order only. Every case states the tiling it covers (narrow, split-K, wide).
#if EPINFER_WITH_CUDA
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/moe_router.h"
#include "backend/cuda/cuda_moe_layer.h"
#include "common/compare.h"
#include "cuda_test_util.h"
#include "layers/moe/permute.h"

namespace epinfer::test {
namespace {

enum class Routing { kRandom, kAllOnOne, kOnlyFirstAndLast };

struct LayerCase {
    std::string name;
    int64_t tokens, experts, top_k, hidden, intermediate;
    bool shared;
    Routing routing;
    cuda::MoeGemmTile want_tile;
    bool want_split;
};

struct HostWeights {
    std::vector<uint16_t> gate_up, down, shared_gate_up, shared_down;  // bf16 bits
};

float silu_mul(float g, float u) {
    return g / (1.0f + std::exp(-g)) * u;
}

// y [H] = bf16(down · bf16(silu(gate · x) · (up · x))) for one expert, dot products in double.
void expert_row(const uint16_t* gate_up, const uint16_t* down, const uint16_t* x, int64_t hidden,
                int64_t intermediate, float* y) {
    std::vector<float> h(static_cast<size_t>(intermediate));
    for (int64_t j = 0; j < intermediate; ++j) {
        double g = 0.0, u = 0.0;
        const uint16_t* gate_row = gate_up + j * hidden;
        const uint16_t* up_row = gate_up + (intermediate + j) * hidden;
        for (int64_t c = 0; c < hidden; ++c) {
            const double xv = bf16_to_f32(x[c]);
            g += xv * bf16_to_f32(gate_row[c]);
            u += xv * bf16_to_f32(up_row[c]);
        }
        h[j] = bf16_round(silu_mul(static_cast<float>(g), static_cast<float>(u)));
    }
    for (int64_t o = 0; o < hidden; ++o) {
        double acc = 0.0;
        const uint16_t* down_row = down + o * intermediate;
        for (int64_t j = 0; j < intermediate; ++j) acc += static_cast<double>(h[j]) * bf16_to_f32(down_row[j]);
        y[o] = bf16_round(static_cast<float>(acc));
    }
}

std::vector<float> make_logits(const LayerCase& c, uint32_t seed) {
    std::vector<float> logits = random_floats(static_cast<size_t>(c.tokens * c.experts), seed, -2.0f, 2.0f);
    for (int64_t t = 0; t < c.tokens; ++t) {
        float* row = logits.data() + t * c.experts;
        if (c.routing == Routing::kAllOnOne) row[c.experts / 2] = 10.0f;
        if (c.routing == Routing::kOnlyFirstAndLast) {
            for (int64_t e = 1; e + 1 < c.experts; ++e) row[e] -= 20.0f;
        }
    }
    return logits;
}

void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

class MoeLayerCudaTest : public CudaTest, public ::testing::WithParamInterface<LayerCase> {};

TEST_P(MoeLayerCudaTest, MatchesHostReference) {
    const LayerCase& c = GetParam();
    const int64_t t_count = c.tokens, e_count = c.experts, k_count = c.top_k, h_dim = c.hidden, i_dim = c.intermediate;
    const uint32_t seed = static_cast<uint32_t>(t_count * 131 + e_count);
    HostWeights w;
    const float gate_up_scale = 1.0f / std::sqrt(static_cast<float>(h_dim));
    const float down_scale = 1.0f / std::sqrt(static_cast<float>(i_dim));
    w.gate_up = random_bf16(static_cast<size_t>(e_count * 2 * i_dim * h_dim), seed + 1, gate_up_scale);
    w.down = random_bf16(static_cast<size_t>(e_count * h_dim * i_dim), seed + 2, down_scale);
    w.shared_gate_up = random_bf16(static_cast<size_t>(2 * i_dim * h_dim), seed + 3, gate_up_scale);
    w.shared_down = random_bf16(static_cast<size_t>(h_dim * i_dim), seed + 4, down_scale);
    const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(t_count * h_dim), seed + 5, 1.0f);
    const std::vector<float> logits = make_logits(c, seed + 6);

    cuda::CudaMoeLayerConfig config;
    config.hidden = h_dim;
    config.intermediate = i_dim;
    config.num_experts = e_count;
    config.top_k = k_count;
    config.shared_intermediate = c.shared ? i_dim : 0;
    config.scoring_func = ScoringFunc::kSoftmax;
    config.norm_topk_prob = true;
    config.max_tokens = t_count;
    config.narrow_max_rows_per_expert = 64;  // the cases name their tiling under this limit on every GPU
    auto created = cuda::CudaMoeLayer::create(config);
    ASSERT_TRUE(created.is_ok()) << created.status().message();
    cuda::CudaMoeLayer& layer = *created.value();
    const cuda::CudaMoeTiling tiling = layer.tiling(t_count);
    ASSERT_EQ(tiling.tile, c.want_tile) << "the case no longer covers the tiling it names";
    ASSERT_EQ(tiling.split_k_gate_up > 1 && tiling.split_k_down > 1, c.want_split)
        << "split " << tiling.split_k_gate_up << "/" << tiling.split_k_down;

    cuda::CudaBuffer d_gate_up = upload(w.gate_up), d_down = upload(w.down);
    cuda::CudaBuffer d_sgu = upload(w.shared_gate_up), d_sdown = upload(w.shared_down);
    cuda::CudaBuffer d_x = upload(x), d_logits = upload(logits);
    cuda::CudaBuffer d_out = poisoned<float>(static_cast<size_t>(t_count * h_dim));
    cuda::CudaMoeWeights weights;
    weights.gate_up = d_gate_up.data();
    weights.down = d_down.data();
    weights.shared_gate_up = d_sgu.data();
    weights.shared_down = d_sdown.data();
    const Status run = layer.forward(weights, d_logits.as<float>(), d_x.data(), t_count, d_out.as<float>(), nullptr);
    ASSERT_TRUE(run.is_ok()) << run.message();
    const std::vector<float> got = download<float>(d_out.data(), static_cast<size_t>(t_count * h_dim));
    const cuda::CudaMoePlanView view = layer.plan();
    const std::vector<int32_t> ids = download<int32_t>(view.topk_ids, static_cast<size_t>(t_count * k_count));
    const std::vector<float> topk_weights = download<float>(view.topk_weights, ids.size());

    // Routing: the CPU router's ids on the same logits.
    std::vector<int32_t> cpu_ids(ids.size());
    std::vector<float> cpu_weights(ids.size());
    MoeRouterTopkArgs router;
    router.router_logits = logits.data();
    router.topk_ids = cpu_ids.data();
    router.topk_weights = cpu_weights.data();
    router.num_tokens = t_count;
    router.num_experts = e_count;
    router.top_k = k_count;
    router.norm_topk_prob = true;
    ASSERT_TRUE(cpu_moe_router_topk(router).is_ok());
    ASSERT_EQ(ids, cpu_ids);

    // Host reference with the GPU's routing weights.
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), t_count, k_count, e_count);
    std::vector<float> y(static_cast<size_t>(plan.num_slots() * h_dim));
    for (int64_t s = 0; s < plan.num_slots(); ++s) {
        const int32_t t = plan.token_of_slot[s];
        const int32_t e = ids[t * k_count + plan.k_of_slot[s]];
        expert_row(w.gate_up.data() + e * 2 * i_dim * h_dim, w.down.data() + e * h_dim * i_dim, x.data() + t * h_dim,
                   h_dim, i_dim, y.data() + s * h_dim);
    }
    std::vector<float> want(static_cast<size_t>(t_count * h_dim));
    moe_combine_rows(plan, y.data(), topk_weights.data(), h_dim, want.data());
    if (c.shared) {
        std::vector<float> shared_y(static_cast<size_t>(h_dim));
        for (int64_t t = 0; t < t_count; ++t) {
            expert_row(w.shared_gate_up.data(), w.shared_down.data(), x.data() + t * h_dim, h_dim, i_dim,
                       shared_y.data());
            for (int64_t o = 0; o < h_dim; ++o) want[t * h_dim + o] += shared_y[o];
        }
    }
    const Diff d = compare<float>(got, want);
    EXPECT_TRUE(within(d, tolerance("moe_layer_cuda", DType::kBF16))) << c.name;
}

using cuda::MoeGemmTile;
INSTANTIATE_TEST_SUITE_P(
    Cases, MoeLayerCudaTest,
    ::testing::Values(
        // One to four tokens: the kGemv tile at each tile height (4, 1, 2 rows), with a shared expert, at odd
        // sizes, and K = E (every expert's group has T rows).
        LayerCase{"decode_gemv", 3, 10, 3, 2048, 1040, true, Routing::kRandom, MoeGemmTile::kGemv, false},
        LayerCase{"decode_gemv_one_token", 1, 37, 4, 200, 72, false, Routing::kRandom, MoeGemmTile::kGemv,
                  false},
        LayerCase{"decode_gemv_two_tokens_k_equals_e", 2, 9, 9, 264, 136, true, Routing::kRandom,
                  MoeGemmTile::kGemv, false},
        // Past four tokens: few tiles, split-K on both GEMMs, K tails (I = 1040 is not a multiple of 64).
        LayerCase{"decode_split_k", 6, 10, 3, 2048, 1040, true, Routing::kRandom, MoeGemmTile::kNarrow, true},
        LayerCase{"decode_odd_sizes", 5, 37, 4, 200, 72, false, Routing::kRandom, MoeGemmTile::kNarrow,
                  false},
        LayerCase{"hidden_7168", 6, 4, 2, 7168, 512, true, Routing::kRandom, MoeGemmTile::kNarrow, false},
        // 150 rows on one expert: several narrow row tiles of one group.
        LayerCase{"all_on_one_expert", 150, 8, 1, 136, 88, true, Routing::kAllOnOne, MoeGemmTile::kNarrow,
                  false},
        // Prefill tiles; experts 1..E−2 get no token; H and I not multiples of the tile.
        LayerCase{"wide_zero_token_experts", 700, 6, 2, 264, 136, true, Routing::kOnlyFirstAndLast,
                  MoeGemmTile::kWide, false},
        LayerCase{"k_equals_e", 31, 4, 4, 128, 64, true, Routing::kRandom, MoeGemmTile::kNarrow, false},
        LayerCase{"wide_many_experts", 600, 16, 4, 192, 96, false, Routing::kRandom, MoeGemmTile::kWide,
                  false}),
    [](const ::testing::TestParamInfo<LayerCase>& info) { return info.param.name; });

TEST_F(CudaTest, LayerRejectsSharedWidthOtherThanI) {
    cuda::CudaMoeLayerConfig config;
    config.hidden = 64;
    config.intermediate = 32;
    config.num_experts = 4;
    config.top_k = 2;
    config.shared_intermediate = 64;
    config.max_tokens = 4;
    auto created = cuda::CudaMoeLayer::create(config);
    ASSERT_FALSE(created.is_ok());
    EXPECT_EQ(created.status().code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
