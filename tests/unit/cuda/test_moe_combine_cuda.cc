// GPU weighted combine (backend/cuda/kernels/moe_combine.cuh) against layers/moe/permute.h
// moe_combine_rows (+ the fp32 add of the shared expert): bit-exact, since both round every product and
// sum the same way in the same order.
#if EPINFER_WITH_CUDA
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/kernels/moe_combine.cuh"
#include "cuda_test_util.h"
#include "layers/moe/permute.h"

namespace epinfer::test {
namespace {

void run_case(int64_t t_count, int64_t k_count, int64_t e_count, int64_t hidden, bool shared, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(t_count * k_count));
    for (int32_t& id : ids) id = rng() % 9 == 0 ? -1 : static_cast<int32_t>(rng() % e_count);
    const MoeRoutePlan plan = moe_permute_plan(ids.data(), t_count, k_count, e_count);
    const int64_t s_count = plan.num_slots();
    const std::vector<float> weights = random_floats(ids.size(), seed + 1, 0.0f, 2.0f);
    const std::vector<uint16_t> y = random_bf16(static_cast<size_t>(std::max<int64_t>(s_count, 1) * hidden), seed + 2, 3.0f);
    const std::vector<uint16_t> shared_y = random_bf16(static_cast<size_t>(t_count * hidden), seed + 3, 3.0f);

    std::vector<float> y_f32(y.size()), want(static_cast<size_t>(t_count * hidden));
    for (size_t i = 0; i < y.size(); ++i) y_f32[i] = bf16_to_f32(y[i]);
    moe_combine_rows(plan, y_f32.data(), weights.data(), hidden, want.data());
    if (shared) {
        for (size_t i = 0; i < want.size(); ++i) want[i] += bf16_to_f32(shared_y[i]);
    }

    cuda::CudaBuffer d_y = upload(y), d_shared = upload(shared_y), d_w = upload(weights);
    cuda::CudaBuffer d_slots = upload(plan.slot_of_token_k);
    cuda::CudaBuffer d_out = poisoned<float>(want.size());
    cuda::MoeCombineArgs args;
    args.y = d_y.data();
    args.topk_weights = d_w.as<float>();
    args.slot_of_token_k = d_slots.as<int32_t>();
    args.shared_y = shared ? d_shared.data() : nullptr;
    args.out = d_out.as<float>();
    args.num_tokens = t_count;
    args.top_k = k_count;
    args.hidden = hidden;
    ASSERT_EQ(cuda::launch_moe_combine(args, nullptr), cudaSuccess);
    const std::vector<float> got = download<float>(d_out.data(), want.size());
    ASSERT_EQ(got.size(), want.size());
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(differ, 0) << "T " << t_count << " K " << k_count << " H " << hidden << " shared " << shared;
}

TEST_F(CudaTest, CombineBitExactOddSizes) { run_case(37, 3, 11, 200, false, 1); }
TEST_F(CudaTest, CombineBitExactWithShared) { run_case(53, 8, 384, 7168, true, 2); }
TEST_F(CudaTest, CombineBitExactLargeK) { run_case(9, 96, 96, 72, true, 3); }  // K > the shared-memory cache
// H past one 1024-column block by one 8-column chunk; K past one 8-pick load batch by 5.
TEST_F(CudaTest, CombineBitExactColumnBlocksAndLoadBatches) { run_case(5, 13, 40, 1032, true, 4); }
// Pick mode (slot_of_token_k null): y row t·K + k is pick (t, k); picks outside this rank's experts are
// dropped. Bit-exact with the plan mode given the same slots (the plan mode is checked above).
TEST_F(CudaTest, CombinePickModeEqualsPlanMode) {
    const int64_t t_count = 3, k_count = 5, hidden = 1032, first = 4, num_experts = 7;
    std::mt19937 rng(9);
    std::vector<int32_t> ids(static_cast<size_t>(t_count * k_count)), slots(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<int32_t>(rng() % 14) - 1;  // −1, below, inside and past [first, first + E)
        slots[i] = ids[i] >= first && ids[i] < first + num_experts ? static_cast<int32_t>(i) : -1;
    }
    const std::vector<float> weights = random_floats(ids.size(), 10, 0.0f, 2.0f);
    const std::vector<uint16_t> y = random_bf16(ids.size() * static_cast<size_t>(hidden), 11, 3.0f);
    const std::vector<uint16_t> shared_y = random_bf16(static_cast<size_t>(t_count * hidden), 12, 3.0f);
    cuda::CudaBuffer d_y = upload(y), d_shared = upload(shared_y), d_w = upload(weights);
    cuda::CudaBuffer d_ids = upload(ids), d_slots = upload(slots);
    cuda::MoeCombineArgs args;
    args.y = d_y.data();
    args.topk_weights = d_w.as<float>();
    args.shared_y = d_shared.data();
    args.num_tokens = t_count;
    args.top_k = k_count;
    args.hidden = hidden;
    std::vector<std::vector<float>> got;
    for (const bool pick_mode : {false, true}) {
        cuda::CudaBuffer d_out = poisoned<float>(static_cast<size_t>(t_count * hidden));
        args.slot_of_token_k = pick_mode ? nullptr : d_slots.as<int32_t>();
        args.topk_ids = pick_mode ? d_ids.as<int32_t>() : nullptr;
        args.first_expert = first;
        args.num_experts = num_experts;
        args.out = d_out.as<float>();
        ASSERT_EQ(cuda::launch_moe_combine(args, nullptr), cudaSuccess);
        got.push_back(download<float>(d_out.data(), static_cast<size_t>(t_count * hidden)));
    }
    const int64_t dropped = std::count(slots.begin(), slots.end(), -1);
    EXPECT_GT(dropped, 0);
    EXPECT_LT(dropped, static_cast<int64_t>(slots.size()));
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * 4), 0);
    args.topk_ids = nullptr;  // pick mode needs the ids
    EXPECT_EQ(cuda::launch_moe_combine(args, nullptr), cudaErrorInvalidValue);
}

TEST_F(CudaTest, CombineHiddenNotMultipleOf8IsRejected) {
    cuda::MoeCombineArgs args;
    args.num_tokens = 1;
    args.top_k = 1;
    args.hidden = 12;
    EXPECT_EQ(cuda::launch_moe_combine(args, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
