// kv_cache_store on the CPU backend: rows land at their slots bit for bit (strided source, slots in any
// order), untouched pool rows stay as they were, a bf16 pool gets each value rounded to nearest even (as
// torch's .to(torch.bfloat16)), and bad arguments, dtypes or slots are refused before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "op_test_util.h"

namespace epinfer {
namespace {

struct StoreCase {
    int64_t T = 5, width = 7, src_stride = 9, num_pool_rows = 11;
    std::vector<float> src = test::random_floats(static_cast<size_t>(T * src_stride), 41);
    std::vector<float> pool = std::vector<float>(static_cast<size_t>(num_pool_rows * width),
                                                 std::numeric_limits<float>::quiet_NaN());
    std::vector<int64_t> slots = {9, 0, 4, 10, 3};

    KvCacheStoreArgs args() {
        KvCacheStoreArgs a;
        a.src = src.data();
        a.pool = pool.data();
        a.slot_mapping = slots.data();
        a.num_tokens = T;
        a.width = width;
        a.src_row_stride = src_stride;
        a.num_pool_rows = num_pool_rows;
        return a;
    }
};

TEST(KvCacheStore, RowsLandAtTheirSlots) {
    auto backend = make_cpu_backend(1);
    StoreCase c;
    ASSERT_TRUE(backend->kv_cache_store(c.args()).is_ok());
    std::vector<bool> written(static_cast<size_t>(c.num_pool_rows), false);
    for (int64_t t = 0; t < c.T; ++t) {
        written[static_cast<size_t>(c.slots[t])] = true;
        for (int64_t i = 0; i < c.width; ++i)
            EXPECT_EQ(c.pool[c.slots[t] * c.width + i], c.src[t * c.src_stride + i]) << t << " " << i;
    }
    for (int64_t r = 0; r < c.num_pool_rows; ++r) {
        if (!written[static_cast<size_t>(r)]) {
            EXPECT_TRUE(std::isnan(c.pool[r * c.width])) << r;
        }
    }
}

float float_of_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Each fp32 value against the bf16 bits torch rounds it to (round to nearest, ties to even).
TEST(KvCacheStore, Bf16PoolRoundsToNearestEven) {
    struct Rounding {
        uint32_t f32;
        uint16_t bf16;
    };
    const std::vector<Rounding> cases = {
        {0x3F800000u, 0x3F80},  // 1.0: exact
        {0x3F808000u, 0x3F80},  // 1 + 2^-8, half-way between 0x3F80 and 0x3F81: to the even 0x3F80
        {0x3F818000u, 0x3F82},  // 1 + 3·2^-8, half-way between 0x3F81 and 0x3F82: to the even 0x3F82
        {0xBF818000u, 0xBF82},  // the same tie, negative
        {0x3F808001u, 0x3F81},  // just above half-way: up
        {0x3F807FFFu, 0x3F80},  // just below half-way: down
        {0x3FFFFFFFu, 0x4000},  // 1.99999988: rounds up across the exponent to 2.0
        {0x7F7FFFFFu, 0x7F80},  // FLT_MAX: rounds up to +inf
        {0x7F800000u, 0x7F80},  // +inf
        {0xFF800000u, 0xFF80},  // -inf
        {0x7FC00000u, 0x7FC0},  // quiet NaN
        {0x00000000u, 0x0000},  // +0
        {0x80000000u, 0x8000},  // -0
    };
    const int64_t width = 3, T = static_cast<int64_t>(cases.size() + width - 1) / width;
    const int64_t src_stride = width + 2, num_pool_rows = T + 2;
    std::vector<float> src(static_cast<size_t>(T * src_stride), 0.0f);
    std::vector<int64_t> slots;
    for (int64_t t = 0; t < T; ++t) slots.push_back(num_pool_rows - 1 - t);  // reversed
    for (size_t i = 0; i < cases.size(); ++i) {
        const int64_t t = static_cast<int64_t>(i) / width, w = static_cast<int64_t>(i) % width;
        src[static_cast<size_t>(t * src_stride + w)] = float_of_bits(cases[i].f32);
    }
    constexpr uint16_t kUntouched = 0x1234;
    std::vector<uint16_t> pool(static_cast<size_t>(num_pool_rows * width), kUntouched);
    KvCacheStoreArgs a;
    a.src = src.data();
    a.pool = pool.data();
    a.pool_dtype = DType::kBF16;
    a.slot_mapping = slots.data();
    a.num_tokens = T;
    a.width = width;
    a.src_row_stride = src_stride;
    a.num_pool_rows = num_pool_rows;
    auto backend = make_cpu_backend(1);
    ASSERT_TRUE(backend->kv_cache_store(a).is_ok());
    for (size_t i = 0; i < cases.size(); ++i) {
        const int64_t t = static_cast<int64_t>(i) / width, w = static_cast<int64_t>(i) % width;
        EXPECT_EQ(pool[static_cast<size_t>(slots[t] * width + w)], cases[i].bf16)
            << std::hex << "f32 0x" << cases[i].f32;
    }
    for (int64_t r = 0; r < num_pool_rows - T; ++r)  // rows no slot names
        for (int64_t w = 0; w < width; ++w) EXPECT_EQ(pool[static_cast<size_t>(r * width + w)], kUntouched);

    // A NaN whose payload sits only in the low 16 bits stays NaN (plain rounding would make it +inf).
    src[0] = float_of_bits(0x7F800001u);
    ASSERT_TRUE(backend->kv_cache_store(a).is_ok());
    const uint16_t nan_bits = pool[static_cast<size_t>(slots[0] * width)];
    EXPECT_TRUE(std::isnan(bf16_to_f32(nan_bits))) << std::hex << nan_bits;
}

// A pool dtype other than F32 and BF16 is one line naming it, and nothing is written.
TEST(KvCacheStore, RefusesAnotherPoolDtype) {
    auto backend = make_cpu_backend(1);
    StoreCase c;
    KvCacheStoreArgs a = c.args();
    a.pool_dtype = DType::kF16;
    const Status st = backend->kv_cache_store(a);
    EXPECT_EQ(st.code(), StatusCode::kNotSupported);
    EXPECT_EQ(st.message(), "kv_cache_store: pool_dtype F16 is not supported (F32 or BF16)");
    for (const float x : c.pool) EXPECT_TRUE(std::isnan(x));
}

TEST(KvCacheStore, RefusesBadSlotsAndArgumentsWithoutWriting) {
    auto backend = make_cpu_backend(1);
    StoreCase c;
    c.slots[3] = 11;  // one past the pool
    Status st = backend->kv_cache_store(c.args());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("slot_mapping[3] = 11 is outside the pool's 11 rows"), std::string::npos)
        << st.message();
    c.slots[3] = -1;
    EXPECT_EQ(backend->kv_cache_store(c.args()).code(), StatusCode::kInvalidArgument);
    for (const float x : c.pool) EXPECT_TRUE(std::isnan(x));

    c.slots[3] = 1;
    KvCacheStoreArgs a = c.args();
    a.src_row_stride = 6;
    st = backend->kv_cache_store(a);
    EXPECT_NE(st.message().find("src_row_stride 6 < width 7"), std::string::npos) << st.message();
    a = c.args();
    a.slot_mapping = nullptr;
    EXPECT_EQ(backend->kv_cache_store(a).code(), StatusCode::kInvalidArgument);
    a.num_tokens = 0;  // nothing to store: no pointer needed
    EXPECT_TRUE(backend->kv_cache_store(a).is_ok());
}

}  // namespace
}  // namespace epinfer
