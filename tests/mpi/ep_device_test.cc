// ep_dispatch_device / ep_combine_device (layers/moe/ep_device.h) on CPU ranks over MPI against the host
// ep_dispatch / ep_combine on the same routing: the same rows, picks and weights in the same order, and the
// same combined sums bit for bit; a share inside a larger x, a rank with zero tokens, and the moe_tp
// non-lead (combine_writes = false: zeros); the uploaded slots and weights equal the host plan's. With bf16
// on the wire: the rows are the host rows rounded through bf16 and the sums are the host's fp32 sums of
// bf16-rounded partials, bit for bit; a bad wire dtype is refused.
#include "layers/moe/ep_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "layers/moe/ep_combine.h"
#include "mpi_test_world.h"

namespace epinfer::mpi_test {
namespace {

constexpr int64_t kHidden = 6, kTopK = 3, kExperts = 10;

struct Batch {
    int64_t num_rows = 0, first = 0, num_tokens = 0;  // x rows; the share [first, first + num_tokens)
    std::vector<float> x;                             // [num_rows, H]
    std::vector<int32_t> ids;                         // [num_tokens, K]
    std::vector<float> weights;                       // [num_tokens, K]
};

Batch make_batch(uint32_t seed, int rank, bool empty) {
    std::mt19937 rng(seed * 131 + static_cast<uint32_t>(rank));
    Batch b;
    b.num_tokens = empty ? 0 : std::uniform_int_distribution<int64_t>(1, 9)(rng);
    b.first = std::uniform_int_distribution<int64_t>(0, 3)(rng);
    b.num_rows = b.first + b.num_tokens + 2;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < b.num_rows * kHidden; ++i) b.x.push_back(u(rng));
    std::vector<int32_t> experts(kExperts);
    for (int64_t t = 0; t < b.num_tokens; ++t) {
        std::iota(experts.begin(), experts.end(), 0);
        std::shuffle(experts.begin(), experts.end(), rng);
        for (int64_t k = 0; k < kTopK; ++k) {
            b.ids.push_back((t + k) % 5 == 4 ? -1 : experts[static_cast<size_t>(k)]);
            b.weights.push_back(std::uniform_real_distribution<float>(0.01f, 1.0f)(rng));
        }
    }
    return b;
}

bool same_bits(const float* a, const float* b, size_t n) {
    return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

// n values as the wire carries them: unchanged for F32; BF16: rounded to nearest even and widened back.
std::vector<float> through_wire(const float* v, size_t n, DType wire) {
    std::vector<float> out(v, v + n);
    if (wire == DType::kBF16)
        for (float& f : out) f = bf16_to_f32(f32_to_bf16(f));
    return out;
}

void check_against_host(uint32_t seed, bool empty_on_rank_one, DType wire = DType::kF32) {
    Communicator& w = world();
    const int me = w.rank();
    std::unique_ptr<Backend> cpu = make_cpu_backend(1);
    auto placement = ExpertPlacement::contiguous(kExperts, w.size());
    ASSERT_TRUE(placement.is_ok()) << placement.status().message();
    const Batch b = make_batch(seed, me, empty_on_rank_one && me == 1);

    // Host reference: the share's rows as a contiguous block.
    EpDispatchArgs host_args{b.x.data() + b.first * kHidden, b.num_tokens, kHidden * sizeof(float), b.ids.data(),
                             b.weights.data(), kTopK};
    auto host = ep_dispatch(w, *placement, host_args);
    ASSERT_TRUE(host.is_ok()) << host.status().message();

    EpDeviceDispatchArgs args;
    args.x = b.x.data();
    args.num_rows = b.num_rows;
    args.hidden = kHidden;
    args.first_token = b.first;
    args.num_tokens = b.num_tokens;
    args.topk_ids = b.ids.data();
    args.topk_weights = b.weights.data();
    args.top_k = kTopK;
    args.wire_dtype = wire;
    // Partial rows the owner would compute: any values, the same on both paths.
    const int64_t R = host->num_rows;
    std::vector<float> partial(static_cast<size_t>(R * kHidden));
    for (size_t i = 0; i < partial.size(); ++i) partial[i] = 0.001f * static_cast<float>(i) - 0.7f + me;
    std::vector<float> want(static_cast<size_t>(b.num_tokens * kHidden), -1.0f);
    const std::vector<float> partial_wire = through_wire(partial.data(), partial.size(), wire);
    ASSERT_TRUE(ep_combine(w, {&host->handle, partial_wire.data(), kHidden, want.data()}).is_ok());
    for (const bool write : {true, false}) {
        args.combine_writes = write;
        auto dev = ep_dispatch_device(*cpu, w, w, *placement, args);
        ASSERT_TRUE(dev.is_ok()) << dev.status().message();
        ASSERT_EQ(dev->plan.num_rows, R);
        const std::vector<float> want_rows = through_wire(reinterpret_cast<const float*>(host->rows.data()),
                                                          static_cast<size_t>(R * kHidden), wire);
        EXPECT_TRUE(same_bits(dev->rows.f32(), want_rows.data(), want_rows.size())) << "seed " << seed;
        EXPECT_EQ(dev->plan.local_slots, host->local_slots);
        EXPECT_TRUE(same_bits(dev->plan.weights.data(), host->weights.data(), host->weights.size()));
        // The uploaded index: the same slots and weights in backend memory (host memory on the CPU backend).
        const size_t picks = host->local_slots.size();
        EXPECT_TRUE(std::equal(host->local_slots.begin(), host->local_slots.end(), dev->local_slots()));
        EXPECT_TRUE(same_bits(dev->weights(), host->weights.data(), picks));

        std::vector<float> got(static_cast<size_t>(b.num_rows * kHidden), -5.0f);
        EpDeviceCombineArgs combine;
        combine.dispatch = &*dev;
        combine.partial = partial.data();
        combine.hidden = kHidden;
        combine.out = got.data();
        combine.wire_dtype = wire;
        ASSERT_TRUE(ep_combine_device(*cpu, w, combine).is_ok());
        for (int64_t r = 0; r < b.num_rows; ++r) {
            const bool in_share = r >= b.first && r < b.first + b.num_tokens;
            for (int64_t h = 0; h < kHidden; ++h) {
                const float g = got[static_cast<size_t>(r * kHidden + h)];
                const float e = write && in_share ? want[static_cast<size_t>((r - b.first) * kHidden + h)] : 0.0f;
                ASSERT_EQ(g, e) << "seed " << seed << " row " << r << " h " << h << " write " << write;
            }
        }
    }
}

TEST(EpDevice, SameRowsAndSumsAsTheHostPath) {
    for (uint32_t seed = 1; seed <= 20; ++seed) check_against_host(seed, false);
}

TEST(EpDevice, ARankWithZeroTokens) {
    check_against_host(99, true);
}

TEST(EpDevice, Bf16WireRoundsRowsAndPartialsAndSumsInFp32) {
    for (uint32_t seed = 1; seed <= 20; ++seed) check_against_host(seed, false, DType::kBF16);
    check_against_host(99, true, DType::kBF16);
}

TEST(EpDevice, RefusesAWireDtypeOtherThanF32AndBf16) {
    Communicator& w = world();
    std::unique_ptr<Backend> cpu = make_cpu_backend(1);
    auto placement = ExpertPlacement::contiguous(kExperts, w.size());
    ASSERT_TRUE(placement.is_ok()) << placement.status().message();
    EpDeviceDispatchArgs args;
    args.hidden = kHidden;
    args.top_k = kTopK;
    args.wire_dtype = DType::kF16;
    auto dev = ep_dispatch_device(*cpu, w, w, *placement, args);
    ASSERT_EQ(dev.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(dev.status().message().find("wire dtype F16"), std::string::npos) << dev.status().message();

    EpDeviceDispatch dispatch;
    dispatch.plan.handle.send_counts.assign(static_cast<size_t>(w.size()), 0);
    EpDeviceCombineArgs combine;
    combine.dispatch = &dispatch;
    combine.hidden = kHidden;
    combine.wire_dtype = DType::kI32;
    const Status st = ep_combine_device(*cpu, w, combine);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("wire dtype I32"), std::string::npos) << st.message();
    combine.dispatch = nullptr;
    EXPECT_EQ(ep_combine_device(*cpu, w, combine).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace epinfer::mpi_test
