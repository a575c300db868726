// GPU permutation plan (backend/cuda/kernels/moe_permute.cuh) against layers/moe/permute.h: counts,
// offsets, token_of_slot, k_of_slot and slot_of_token_k bit-exact; the grouped-GEMM schedule (group row
// ranges, tile prefix sums, shared-expert rows) against a host computation.
#if EPINFER_WITH_CUDA
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/moe_permute.cuh"
#include "cuda_test_util.h"
#include "layers/moe/permute.h"

namespace epinfer::test {
namespace {

enum class Pattern { kRandomDistinct, kRandomWithDrops, kAllOnOne, kFewExperts };

std::vector<int32_t> make_ids(int64_t t_count, int64_t k_count, int64_t e_count, Pattern pattern, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(t_count * k_count));
    for (int64_t t = 0; t < t_count; ++t) {
        int32_t* row = ids.data() + t * k_count;
        for (int64_t k = 0; k < k_count; ++k) {
            switch (pattern) {
                case Pattern::kAllOnOne: row[k] = static_cast<int32_t>(e_count / 2); break;
                case Pattern::kFewExperts: row[k] = static_cast<int32_t>((rng() % 2) * (e_count - 1)); break;
                case Pattern::kRandomWithDrops:
                    if (rng() % 6 == 0) {  // dropped: −1 or out of range
                        row[k] = rng() % 2 ? -1 : static_cast<int32_t>(e_count + rng() % 5);
                        break;
                    }
                    [[fallthrough]];
                case Pattern::kRandomDistinct: {
                    int32_t e;
                    do {
                        e = static_cast<int32_t>(rng() % e_count);
                    } while (pattern == Pattern::kRandomDistinct && k_count <= e_count &&
                             std::find(row, row + k, e) != row + k);
                    row[k] = e;
                }
            }
        }
    }
    return ids;
}

struct PermuteCase {
    std::string name;
    int64_t tokens, top_k, experts;
    Pattern pattern;
    bool shared;
    int64_t tile_rows;
};

void PrintTo(const PermuteCase& c, std::ostream* os) { *os << c.name; }

class MoePermuteCudaTest : public CudaTest, public ::testing::WithParamInterface<PermuteCase> {};

TEST_P(MoePermuteCudaTest, MatchesHostPlan) {
    const PermuteCase& c = GetParam();
    const std::vector<int32_t> ids = make_ids(c.tokens, c.top_k, c.experts, c.pattern, 1234u + c.tokens);
    const MoeRoutePlan want = moe_permute_plan(ids.data(), c.tokens, c.top_k, c.experts);
    const size_t picks = ids.size();
    const size_t rows = picks + static_cast<size_t>(c.shared ? c.tokens : 0);
    const size_t groups = static_cast<size_t>(c.experts + (c.shared ? 1 : 0));

    cuda::CudaBuffer d_ids = upload(ids);
    cuda::CudaBuffer counts = poisoned<int32_t>(c.experts), offsets = poisoned<int32_t>(c.experts + 1);
    cuda::CudaBuffer token_of_row = poisoned<int32_t>(rows), k_of_slot = poisoned<int32_t>(picks);
    cuda::CudaBuffer slot_of_token_k = poisoned<int32_t>(picks);
    cuda::CudaBuffer begin = poisoned<int32_t>(groups), end = poisoned<int32_t>(groups);
    cuda::CudaBuffer tile_offsets = poisoned<int32_t>(groups + 1);
    cuda::MoePermuteArgs args;
    args.topk_ids = d_ids.as<int32_t>();
    args.num_tokens = c.tokens;
    args.top_k = c.top_k;
    args.num_experts = c.experts;
    args.expert_counts = counts.as<int32_t>();
    args.expert_offsets = offsets.as<int32_t>();
    args.token_of_row = token_of_row.as<int32_t>();
    args.k_of_slot = k_of_slot.as<int32_t>();
    args.slot_of_token_k = slot_of_token_k.as<int32_t>();
    args.group_row_begin = begin.as<int32_t>();
    args.group_row_end = end.as<int32_t>();
    args.group_tile_offsets = tile_offsets.as<int32_t>();
    args.tile_rows = c.tile_rows;
    args.shared_group = c.shared;
    auto workspace = cuda::CudaBuffer::alloc(cuda::moe_permute_workspace_bytes(args));
    ASSERT_TRUE(workspace.is_ok());
    ASSERT_EQ(cuda::launch_moe_permute(args, workspace->data(), workspace->num_bytes(), nullptr), cudaSuccess);

    const int64_t s_count = want.num_slots();
    EXPECT_EQ(download<int32_t>(counts.data(), c.experts), want.expert_counts);
    EXPECT_EQ(download<int32_t>(offsets.data(), c.experts + 1), want.expert_offsets);
    const std::vector<int32_t> got_rows = download<int32_t>(token_of_row.data(), rows);
    const std::vector<int32_t> got_k = download<int32_t>(k_of_slot.data(), picks);
    EXPECT_EQ(std::vector<int32_t>(got_rows.begin(), got_rows.begin() + s_count), want.token_of_slot);
    EXPECT_EQ(std::vector<int32_t>(got_k.begin(), got_k.begin() + s_count), want.k_of_slot);
    EXPECT_EQ(download<int32_t>(slot_of_token_k.data(), picks), want.slot_of_token_k);

    // Schedule: expert groups are the plan's ranges; the shared group is rows [T·K, T·K + T), token t.
    std::vector<int32_t> want_begin, want_end, want_tiles = {0};
    for (int64_t e = 0; e < c.experts; ++e) {
        want_begin.push_back(want.expert_offsets[e]);
        want_end.push_back(want.expert_offsets[e + 1]);
    }
    if (c.shared) {
        want_begin.push_back(static_cast<int32_t>(picks));
        want_end.push_back(static_cast<int32_t>(picks + c.tokens));
        for (int64_t t = 0; t < c.tokens; ++t) EXPECT_EQ(got_rows[picks + t], t);
    }
    for (size_t g = 0; g < groups; ++g) {
        want_tiles.push_back(want_tiles.back() +
                             static_cast<int32_t>((want_end[g] - want_begin[g] + c.tile_rows - 1) / c.tile_rows));
    }
    EXPECT_EQ(download<int32_t>(begin.data(), groups), want_begin);
    EXPECT_EQ(download<int32_t>(end.data(), groups), want_end);
    EXPECT_EQ(download<int32_t>(tile_offsets.data(), groups + 1), want_tiles);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MoePermuteCudaTest,
    ::testing::Values(PermuteCase{"one_token", 1, 8, 384, Pattern::kRandomDistinct, true, 64},
                      PermuteCase{"odd_sizes", 97, 3, 37, Pattern::kRandomDistinct, false, 64},
                      PermuteCase{"drops", 131, 4, 29, Pattern::kRandomWithDrops, true, 128},
                      PermuteCase{"all_on_one_expert", 203, 1, 16, Pattern::kAllOnOne, true, 64},
                      PermuteCase{"zero_token_experts", 77, 2, 300, Pattern::kFewExperts, false, 64},
                      PermuteCase{"k_equals_e", 45, 7, 7, Pattern::kRandomDistinct, true, 64},
                      PermuteCase{"decode_kimi", 64, 8, 384, Pattern::kRandomDistinct, true, 64},
                      // Both sides of each path's bounds: the one-block plan's last size (640 picks), CUB's
                      // one-tile sort (up to 4864 on sm_90), its onesweep path just above.
                      PermuteCase{"one_block_limit", 80, 8, 128, Pattern::kRandomDistinct, true, 32},
                      PermuteCase{"one_tile_just_above", 641, 1, 128, Pattern::kRandomWithDrops, true, 32},
                      PermuteCase{"serving_qwen3", 256, 8, 128, Pattern::kRandomDistinct, true, 32},
                      PermuteCase{"one_tile_with_drops", 511, 6, 160, Pattern::kRandomWithDrops, false, 32},
                      PermuteCase{"one_tile_all_on_one", 4096, 1, 16, Pattern::kAllOnOne, true, 128},
                      PermuteCase{"onesweep_just_above", 4865, 1, 16, Pattern::kFewExperts, false, 128},
                      PermuteCase{"prefill_many_blocks", 4099, 8, 384, Pattern::kRandomWithDrops, true, 128},
                      PermuteCase{"large_groups", 3000, 2, 2000, Pattern::kRandomDistinct, true, 128}),
    [](const ::testing::TestParamInfo<PermuteCase>& info) { return info.param.name; });

TEST_F(CudaTest, PermuteNoTokens) {
    cuda::CudaBuffer counts = poisoned<int32_t>(5), offsets = poisoned<int32_t>(6);
    cuda::CudaBuffer begin = poisoned<int32_t>(5), end = poisoned<int32_t>(5), tiles = poisoned<int32_t>(6);
    cuda::MoePermuteArgs args;
    args.num_tokens = 0;
    args.top_k = 2;
    args.num_experts = 5;
    args.expert_counts = counts.as<int32_t>();
    args.expert_offsets = offsets.as<int32_t>();
    args.group_row_begin = begin.as<int32_t>();
    args.group_row_end = end.as<int32_t>();
    args.group_tile_offsets = tiles.as<int32_t>();
    auto workspace = cuda::CudaBuffer::alloc(cuda::moe_permute_workspace_bytes(args) + 256);
    ASSERT_TRUE(workspace.is_ok());
    ASSERT_EQ(cuda::launch_moe_permute(args, workspace->data(), workspace->num_bytes(), nullptr), cudaSuccess);
    EXPECT_EQ(download<int32_t>(counts.data(), 5), std::vector<int32_t>(5, 0));
    EXPECT_EQ(download<int32_t>(offsets.data(), 6), std::vector<int32_t>(6, 0));
    EXPECT_EQ(download<int32_t>(tiles.data(), 6), std::vector<int32_t>(6, 0));
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
