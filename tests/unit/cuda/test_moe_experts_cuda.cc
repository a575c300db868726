// The routed-experts op (backend/moe_experts_args.h) on the CUDA backend against the CPU reference backend,
// on fresh random inputs: the grouped path (BF16 weights, H and I multiples of 8: gemv tile at ≤ 4 tokens,
// narrow tile, split-K, wide tile) and the general path (F32/F16 weights, odd H and I), with zero-token experts, all tokens on
// one expert, K = E and dropped picks (−1), and an expert-parallel block (global ids, first_expert > 0,
// picks of other ranks' experts dropped; the CPU reference runs the same picks as local ids). Each expert's tensors are separate device buffers, as the model
// loader makes them. Bounds: tolerances.h "moe_experts_cuda" (BF16: the grouped path rounds x, h and y to
// bf16; F16/F32: fp32 activations). Each case prints its measured error.
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "common/compare.h"
#include "cuda_test_util.h"

namespace epinfer::test {
namespace {

enum class Routing {
    kRandom,       // K distinct experts per token
    kAllOnOne,     // K = 1, every token on the last expert
    kWithDrops,    // random, with some picks −1 and one token with none
    kFirstExperts  // every token on experts 0..K−1 (the others get no token)
};

struct ExpertsCase {
    std::string name;
    int64_t tokens, experts, top_k, hidden, intermediate;
    DType dtype;
    Routing routing;
    int64_t first_expert = 0;  // > 0: ids are global over first_expert + experts + first_expert experts
};

void PrintTo(const ExpertsCase& c, std::ostream* os) {
    *os << c.name;
}

// Values uniform in [−scale, scale) stored as `dtype` (bytes).
std::vector<uint8_t> random_weights(size_t n, uint32_t seed, float scale, DType dtype) {
    const std::vector<float> f = random_floats(n, seed, -scale, scale);
    std::vector<uint8_t> out(n * dtype_size(dtype));
    for (size_t i = 0; i < n; ++i) {
        if (dtype == DType::kF32) {
            std::memcpy(out.data() + 4 * i, &f[i], 4);
        } else {
            const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
            std::memcpy(out.data() + 2 * i, &h, 2);
        }
    }
    return out;
}

std::vector<int32_t> make_ids(const ExpertsCase& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(c.tokens * c.top_k));
    std::vector<int32_t> order(static_cast<size_t>(c.experts + 2 * c.first_expert));
    for (int64_t t = 0; t < c.tokens; ++t) {
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (int64_t k = 0; k < c.top_k; ++k) {
            int32_t id = order[static_cast<size_t>(k)];
            if (c.routing == Routing::kAllOnOne) id = static_cast<int32_t>(c.experts - 1);
            if (c.routing == Routing::kFirstExperts) id = static_cast<int32_t>(k);
            if (c.routing == Routing::kWithDrops && (t == 0 || (t + k) % 3 == 0)) id = -1;
            ids[static_cast<size_t>(t * c.top_k + k)] = id;
        }
    }
    return ids;
}

class MoeExpertsCudaTest : public CpuAndCudaTest, public ::testing::WithParamInterface<ExpertsCase> {};

TEST_P(MoeExpertsCudaTest, MatchesCpuReference) {
    const ExpertsCase& c = GetParam();
    const int64_t T = c.tokens, E = c.experts, K = c.top_k, H = c.hidden, I = c.intermediate;
    for (uint32_t seed : {1u, 2u}) {  // fresh inputs each run of the loop
        const uint32_t base = seed * 7919u + static_cast<uint32_t>(T * 131 + E * 17 + H);
        const std::vector<float> x = random_floats(static_cast<size_t>(T * H), base, -1.0f, 1.0f);
        const std::vector<int32_t> ids = make_ids(c, base + 1);  // global ids
        std::vector<int32_t> local_ids(ids.size());              // the reference's: id − first, −1 outside
        for (size_t i = 0; i < ids.size(); ++i) {
            const int64_t local = int64_t{ids[i]} - c.first_expert;
            local_ids[i] = ids[i] >= 0 && local >= 0 && local < E ? static_cast<int32_t>(local) : -1;
        }
        const std::vector<float> weights = random_floats(static_cast<size_t>(T * K), base + 2, 0.0f, 1.0f);
        std::vector<std::vector<uint8_t>> gate(E), up(E), down(E);
        std::vector<MoeExpertWeights> host_table(E);
        for (int64_t e = 0; e < E; ++e) {
            gate[e] = random_weights(static_cast<size_t>(I * H), base + 10 + 3 * e, 0.15f, c.dtype);
            up[e] = random_weights(static_cast<size_t>(I * H), base + 11 + 3 * e, 0.15f, c.dtype);
            down[e] = random_weights(static_cast<size_t>(H * I), base + 12 + 3 * e, 0.15f, c.dtype);
            host_table[e] = {gate[e].data(), up[e].data(), down[e].data()};
        }
        std::vector<float> want(static_cast<size_t>(T * H), std::numeric_limits<float>::quiet_NaN());
        MoeExpertsArgs args;
        args.x = x.data();
        args.topk_ids = local_ids.data();
        args.topk_weights = weights.data();
        args.experts = host_table.data();
        args.weight_dtype = c.dtype;
        args.out = want.data();
        args.num_tokens = T;
        args.top_k = K;
        args.num_experts = E;
        args.hidden = H;
        args.intermediate = I;
        ASSERT_TRUE(cpu_->moe_experts(args).is_ok());

        std::vector<DeviceBuffer> d_weights;  // one buffer per tensor, as the model loader makes them
        std::vector<MoeExpertWeights> gpu_table(E);
        for (int64_t e = 0; e < E; ++e) {
            d_weights.push_back(to_gpu(gate[e]));
            d_weights.push_back(to_gpu(up[e]));
            d_weights.push_back(to_gpu(down[e]));
            gpu_table[e] = {d_weights[3 * e].data(), d_weights[3 * e + 1].data(),
                            d_weights[3 * e + 2].data()};
        }
        DeviceBuffer d_x = to_gpu(x), d_ids = to_gpu(ids), d_w = to_gpu(weights);
        DeviceBuffer d_out =
            to_gpu(std::vector<float>(static_cast<size_t>(T * H), std::numeric_limits<float>::quiet_NaN()));
        args.x = d_x.f32();
        args.topk_ids = static_cast<const int32_t*>(d_ids.data());
        args.topk_weights = d_w.f32();
        args.experts = gpu_table.data();
        args.out = d_out.f32();
        args.first_expert = c.first_expert;
        for (int run = 0; run < 2; ++run) {  // the second run reuses the cached pointer table
            ASSERT_TRUE(gpu_->moe_experts(args).is_ok());
            ASSERT_TRUE(gpu_->synchronize().is_ok());
            std::vector<float> got(static_cast<size_t>(T * H));
            ASSERT_TRUE(gpu_->copy_to_host(got.data(), d_out.data(), got.size() * sizeof(float)).is_ok());
            const Diff d = compare<float>(got, want);
            std::printf("measured moe_experts_cuda %s %s seed %u run %d: nmse %.3g max_rel %.3g\n",
                        dtype_name(c.dtype), c.name.c_str(), seed, run, d.nmse, d.max_rel);
            EXPECT_TRUE(within(d, tolerance("moe_experts_cuda", c.dtype))) << c.name << " seed " << seed;
            if (c.routing == Routing::kWithDrops) {  // token 0 has no valid pick: an exact zero row
                for (int64_t h = 0; h < H; ++h) ASSERT_EQ(got[static_cast<size_t>(h)], 0.0f) << h;
            }
        }
    }
}

// Grouped path: BF16, H and I multiples of 8. General path: F32/F16 weights, or H/I not multiples of 8.
INSTANTIATE_TEST_SUITE_P(
    Cases, MoeExpertsCudaTest,
    ::testing::Values(
        ExpertsCase{"grouped_t1_gemv", 1, 8, 2, 512, 256, DType::kBF16, Routing::kRandom},
        ExpertsCase{"grouped_t4_gemv_drops", 4, 8, 3, 512, 256, DType::kBF16, Routing::kWithDrops},
        ExpertsCase{"grouped_t6_split_k", 6, 8, 2, 512, 256, DType::kBF16, Routing::kRandom},
        ExpertsCase{"grouped_t7_odd_e", 7, 9, 3, 72, 40, DType::kBF16, Routing::kRandom},
        ExpertsCase{"grouped_t33_zero_token_experts", 33, 60, 4, 136, 48, DType::kBF16, Routing::kRandom},
        ExpertsCase{"grouped_t3_few_tokens_many_experts", 3, 64, 2, 64, 32, DType::kBF16, Routing::kRandom},
        ExpertsCase{"grouped_all_on_one", 45, 6, 1, 64, 32, DType::kBF16, Routing::kAllOnOne},
        ExpertsCase{"grouped_k_equals_e", 11, 5, 5, 64, 24, DType::kBF16, Routing::kRandom},
        ExpertsCase{"grouped_drops", 13, 8, 3, 64, 32, DType::kBF16, Routing::kWithDrops},
        ExpertsCase{"grouped_first_experts_only", 21, 12, 3, 64, 32, DType::kBF16, Routing::kFirstExperts},
        ExpertsCase{"grouped_wide_tile", 600, 8, 2, 256, 136, DType::kBF16, Routing::kRandom},
        ExpertsCase{"grouped_cub_plan", 400, 16, 4, 64, 32, DType::kBF16, Routing::kRandom},
        ExpertsCase{"general_bf16_odd_h", 9, 6, 2, 70, 36, DType::kBF16, Routing::kRandom},
        ExpertsCase{"general_f32", 19, 7, 3, 72, 40, DType::kF32, Routing::kRandom},
        ExpertsCase{"general_f16_odd", 5, 4, 4, 33, 17, DType::kF16, Routing::kWithDrops},
        ExpertsCase{"general_f32_all_on_one", 40, 5, 1, 64, 24, DType::kF32, Routing::kAllOnOne},
        ExpertsCase{"grouped_ep_block", 29, 6, 4, 64, 32, DType::kBF16, Routing::kRandom, 5},
        ExpertsCase{"grouped_t1_ep_block_picks", 1, 6, 8, 64, 32, DType::kBF16, Routing::kRandom, 5},
        ExpertsCase{"grouped_ep_block_cub_plan", 300, 8, 4, 64, 32, DType::kBF16, Routing::kRandom, 3},
        ExpertsCase{"general_f32_ep_block", 17, 5, 3, 40, 24, DType::kF32, Routing::kWithDrops, 2}),
    [](const ::testing::TestParamInfo<ExpertsCase>& info) { return info.param.name; });

class MoeExpertsCudaApiTest : public CudaTest {};

TEST_F(MoeExpertsCudaApiTest, BadArgumentsAreRejectedBeforeLaunch) {
    auto gpu = make_cuda_backend();
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
    MoeExpertsArgs bad;
    bad.num_tokens = 2;
    bad.top_k = 1;
    bad.num_experts = 1;
    bad.hidden = 8;
    bad.intermediate = 8;  // null pointers
    EXPECT_EQ((*gpu)->moe_experts(bad).code(), StatusCode::kInvalidArgument);
    bad.num_tokens = 0;  // nothing to do: OK without pointers
    EXPECT_TRUE((*gpu)->moe_experts(bad).is_ok());
    EXPECT_TRUE((*gpu)->synchronize().is_ok());
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
