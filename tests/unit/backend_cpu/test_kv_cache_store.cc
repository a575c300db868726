// kv_cache_store on the CPU backend: rows land at their slots bit for bit (strided source, slots in any
// order), untouched pool rows stay as they were, and bad arguments or slots are refused before anything
// is written.
#include <gtest/gtest.h>

#include <cmath>
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
