// KvBlockPool (engine/kv_block_pool.h): creation checks, allocate/release and the free-list order,
// exhaustion (kOutOfMemory, table unchanged), per-layer views (storage only for the pool's layers), a bf16
// pool (half the bytes, views carry the dtype), and the shape a loaded model asks for (GQA and MLA
// fixtures).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/kv_block_pool.h"
#include "models/model.h"

namespace epinfer {
namespace {

KvPoolShape gqa_shape(int64_t num_layers = 3) {
    KvPoolShape shape;
    shape.num_layers = num_layers;
    shape.layers = {0, num_layers};
    shape.k_width = shape.v_width = 8;
    return shape;
}

class KvBlockPoolTest : public ::testing::Test {
protected:
    std::unique_ptr<Backend> backend_ = make_cpu_backend(1);
    KvBlockPool make(int64_t num_blocks, int64_t block_size, const KvPoolShape& shape = gqa_shape()) {
        auto pool = KvBlockPool::create(*backend_, shape, num_blocks, block_size);
        EXPECT_TRUE(pool.is_ok()) << pool.status().to_string();
        return std::move(pool).value();
    }
};

TEST_F(KvBlockPoolTest, CreateRejectsBadSizesAndShapes) {
    const auto code = [&](int64_t num_blocks, int64_t block_size, const KvPoolShape& shape) {
        return KvBlockPool::create(*backend_, shape, num_blocks, block_size).status().code();
    };
    EXPECT_EQ(code(0, 16, gqa_shape()), StatusCode::kInvalidArgument);
    EXPECT_EQ(code(4, 0, gqa_shape()), StatusCode::kInvalidArgument);
    KvPoolShape bad = gqa_shape();
    bad.layers = {2, 2};  // [2, 4) is not inside [0, 3)
    EXPECT_EQ(code(4, 16, bad), StatusCode::kInvalidArgument);
    bad = gqa_shape();
    bad.k_width = 0;
    EXPECT_EQ(code(4, 16, bad), StatusCode::kInvalidArgument);
    Status st = KvBlockPool::create(*backend_, gqa_shape(), 4, -1).status();
    EXPECT_NE(st.message().find("block_size -1"), std::string::npos) << st.message();
    bad = gqa_shape();
    bad.dtype = DType::kF16;
    st = KvBlockPool::create(*backend_, bad, 4, 16).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("dtype F16 is not supported (F32 or BF16)"), std::string::npos)
        << st.message();
}

// A bf16 pool of the same shape holds half the bytes; its views carry the dtype, and the layers' pools,
// each 6·4·8 bf16 elements of k, do not overlap.
TEST_F(KvBlockPoolTest, Bf16PoolHalvesTheStorageAndViewsCarryTheDtype) {
    KvPoolShape shape = gqa_shape();
    const int64_t fp32_bytes = make(6, 4, shape).storage_bytes();
    shape.dtype = DType::kBF16;
    KvBlockPool pool = make(6, 4, shape);
    EXPECT_EQ(pool.storage_bytes(), 3 * 6 * 4 * (8 + 8) * 2);
    EXPECT_EQ(pool.storage_bytes() * 2, fp32_bytes);
    EXPECT_EQ(pool.shape().dtype, DType::kBF16);
    std::vector<int32_t> table;
    ASSERT_TRUE(pool.allocate(2, &table).is_ok());
    const std::vector<LayerKvCache> views = pool.views(table, 3);
    ASSERT_EQ(views.size(), 3u);
    for (const LayerKvCache& kv : views) EXPECT_EQ(kv.dtype, DType::kBF16);
    const auto* a = static_cast<const uint16_t*>(views[0].k_pool);
    const auto* b = static_cast<const uint16_t*>(views[1].k_pool);
    EXPECT_TRUE(a + 6 * 4 * 8 <= b || b + 6 * 4 * 8 <= a);
}

TEST_F(KvBlockPoolTest, AllocateAndRelease) {
    KvBlockPool pool = make(6, 4);
    EXPECT_EQ(pool.block_size(), 4);
    EXPECT_EQ(pool.num_blocks(), 6);
    EXPECT_EQ(pool.num_free_blocks(), 6);
    EXPECT_EQ(pool.blocks_for(0), 0);
    EXPECT_EQ(pool.blocks_for(1), 1);
    EXPECT_EQ(pool.blocks_for(4), 1);
    EXPECT_EQ(pool.blocks_for(5), 2);
    EXPECT_EQ(pool.storage_bytes(), 3 * 6 * 4 * (8 + 8) * 4);

    std::vector<int32_t> a, b;
    ASSERT_TRUE(pool.allocate(2, &a).is_ok());
    ASSERT_TRUE(pool.allocate(3, &b).is_ok());
    EXPECT_EQ(a, (std::vector<int32_t>{0, 1}));  // a fresh pool hands out the lowest ids first
    EXPECT_EQ(b, (std::vector<int32_t>{2, 3, 4}));
    ASSERT_TRUE(pool.allocate(1, &a).is_ok());  // appends
    EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 5}));
    EXPECT_EQ(pool.num_free_blocks(), 0);
    ASSERT_TRUE(pool.allocate(0, &a).is_ok());
    EXPECT_EQ(pool.allocate(-1, &a).code(), StatusCode::kInvalidArgument);

    pool.release(&b);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(pool.num_free_blocks(), 3);
    std::vector<int32_t> c;
    ASSERT_TRUE(pool.allocate(3, &c).is_ok());
    EXPECT_EQ(c, (std::vector<int32_t>{2, 3, 4}));  // released blocks come back in their order

    // Every id is held by exactly one table.
    std::set<int32_t> ids(a.begin(), a.end());
    ids.insert(c.begin(), c.end());
    EXPECT_EQ(ids.size(), 6u);
    pool.release(&a);
    pool.release(&c);
    EXPECT_EQ(pool.num_free_blocks(), 6);
}

TEST_F(KvBlockPoolTest, ReleaseSkipsIdsNotAllocated) {
    KvBlockPool pool = make(4, 2);
    std::vector<int32_t> a;
    ASSERT_TRUE(pool.allocate(2, &a).is_ok());
    std::vector<int32_t> copy = a;
    pool.release(&a);
    pool.release(&copy);  // a second release of the same ids
    std::vector<int32_t> junk = {-1, 4, 99};
    pool.release(&junk);
    EXPECT_TRUE(junk.empty());
    EXPECT_EQ(pool.num_free_blocks(), 4);
    std::vector<int32_t> all;
    ASSERT_TRUE(pool.allocate(4, &all).is_ok());
    std::sort(all.begin(), all.end());
    EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3}));  // no id handed out twice
}

TEST_F(KvBlockPoolTest, ExhaustionIsOutOfMemoryAndLeavesTheTable) {
    KvBlockPool pool = make(5, 16);
    std::vector<int32_t> a;
    ASSERT_TRUE(pool.allocate(3, &a).is_ok());
    std::vector<int32_t> b = {42};  // a table may hold ids already; they are kept as they are
    const Status st = pool.allocate(3, &b);
    EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
    EXPECT_NE(st.message().find("3 blocks asked for, 2 of 5 free"), std::string::npos) << st.message();
    EXPECT_EQ(b, std::vector<int32_t>{42});
    EXPECT_EQ(pool.num_free_blocks(), 2);
    ASSERT_TRUE(pool.allocate(2, &a).is_ok());
    EXPECT_EQ(pool.allocate(1, &a).code(), StatusCode::kOutOfMemory);
    EXPECT_EQ(a.size(), 5u);
}

// A pool for layers [1, 3) of 4 (one pipeline stage): views of the other layers are empty but carry
// num_tokens and block_size; the stage's layers have distinct pools and share the block table.
TEST_F(KvBlockPoolTest, ViewsHaveStorageOnlyForThePoolsLayers) {
    KvPoolShape shape;
    shape.num_layers = 4;
    shape.layers = {1, 2};
    shape.k_width = 6;
    shape.v_width = 0;  // MLA: no V rows
    KvBlockPool pool = make(3, 5, shape);
    EXPECT_EQ(pool.storage_bytes(), 2 * 3 * 5 * 6 * 4);
    std::vector<int32_t> table;
    ASSERT_TRUE(pool.allocate(2, &table).is_ok());
    const std::vector<LayerKvCache> views = pool.views(table, 7);
    ASSERT_EQ(views.size(), 4u);
    for (size_t l = 0; l < views.size(); ++l) {
        const LayerKvCache& kv = views[l];
        EXPECT_EQ(kv.num_tokens, 7) << l;
        EXPECT_EQ(kv.block_size, 5) << l;
        EXPECT_EQ(kv.v_pool, nullptr) << l;
        const bool on_stage = l == 1 || l == 2;
        EXPECT_EQ(kv.k_pool != nullptr, on_stage) << l;
        EXPECT_EQ(kv.capacity(), on_stage ? 10 : 0) << l;
        EXPECT_EQ(kv.num_blocks, on_stage ? 3 : 0) << l;
        if (on_stage) {
            EXPECT_EQ(kv.block_table.data(), table.data()) << l;
        }
    }
    EXPECT_NE(views[1].k_pool, views[2].k_pool);
    // Different layers' pools do not overlap: layer 1's pool is 3·5·6 floats.
    const auto* a = static_cast<const float*>(views[1].k_pool);
    const auto* b = static_cast<const float*>(views[2].k_pool);
    EXPECT_TRUE(a + 3 * 5 * 6 <= b || b + 3 * 5 * 6 <= a);
}

// The shape of a loaded model: every layer on one rank, widths of its KV heads (GQA) or latent (MLA).
TEST_F(KvBlockPoolTest, CreateFromModel) {
    for (const char* fixture : {"qwen3_moe_tiny", "deepseek_v3_tiny"}) {
        auto model = Model::load(std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + fixture, *backend_);
        ASSERT_TRUE(model.is_ok()) << model.status().to_string();
        const KvPoolShape shape = kv_pool_shape(**model);
        const ModelConfig& c = (*model)->config();
        EXPECT_EQ(shape.num_layers, c.num_hidden_layers) << fixture;
        EXPECT_EQ(shape.layers, (ShardRange{0, c.num_hidden_layers})) << fixture;
        EXPECT_EQ(shape.k_width, (*model)->kv_k_width()) << fixture;
        EXPECT_EQ(shape.v_width, (*model)->kv_v_width()) << fixture;
        auto pool = KvBlockPool::create(**model, 4, 16);
        ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
        std::vector<int32_t> table;
        ASSERT_TRUE(pool->allocate(1, &table).is_ok());
        const std::vector<LayerKvCache> views = pool->views(table, 0);
        ASSERT_EQ(static_cast<int64_t>(views.size()), c.num_hidden_layers);
        for (const LayerKvCache& kv : views) {
            EXPECT_NE(kv.k_pool, nullptr) << fixture;
            EXPECT_EQ(kv.v_pool != nullptr, c.attention != AttentionKind::kMla) << fixture;
            EXPECT_EQ(kv.dtype, DType::kF32) << fixture;
        }
        // The model's pool in bf16: half the bytes.
        EXPECT_EQ(kv_pool_shape(**model, DType::kBF16).dtype, DType::kBF16) << fixture;
        auto bf16 = KvBlockPool::create(**model, 4, 16, DType::kBF16);
        ASSERT_TRUE(bf16.is_ok()) << bf16.status().to_string();
        EXPECT_EQ(bf16->storage_bytes() * 2, pool->storage_bytes()) << fixture;
        EXPECT_EQ(bf16->views(table, 0)[0].dtype, DType::kBF16) << fixture;
    }
}

}  // namespace
}  // namespace epinfer
