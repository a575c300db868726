// The paged-cache row helpers of layers/kv_cache.h on the CPU backend: kv_cache_write_rows puts rows at
// the positions the block table names and issues one copy per run contiguous in the pool;
// kv_cache_gather_rows reads a prefix back in position order; both refuse rows beyond the table.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "layers/kv_cache.h"

namespace epinfer {
namespace {

// The CPU backend, counting copy_on_device calls (every other method forwards; a new Backend method needs
// a line here).
class CountingBackend : public Backend {
public:
    int64_t num_copies = 0;

    const char* name() const override { return "counting-cpu"; }
    bool host_accessible() const override { return true; }
    Result<void*> alloc(size_t num_bytes) override { return cpu_->alloc(num_bytes); }
    void free(void* ptr) override { cpu_->free(ptr); }
    Status copy_to_device(void* dst, const void* src, size_t n) override {
        return cpu_->copy_to_device(dst, src, n);
    }
    Status copy_to_host(void* dst, const void* src, size_t n) override {
        return cpu_->copy_to_host(dst, src, n);
    }
    Status copy_on_device(void* dst, const void* src, size_t n) override {
        ++num_copies;
        return cpu_->copy_on_device(dst, src, n);
    }
    Status copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                               size_t row_bytes, size_t num_rows) override {
        return cpu_->copy_rows_on_device(dst, dst_pitch, src, src_pitch, row_bytes, num_rows);
    }
    Status synchronize() override { return cpu_->synchronize(); }
    Status embedding(const EmbeddingArgs& a) override { return cpu_->embedding(a); }
    Status rms_norm(const RmsNormArgs& a) override { return cpu_->rms_norm(a); }
    Status matmul(const MatmulArgs& a) override { return cpu_->matmul(a); }
    Status rope(const RopeArgs& a) override { return cpu_->rope(a); }
    Status attention(const AttentionArgs& a) override { return cpu_->attention(a); }
    Status silu_mul(const SiluMulArgs& a) override { return cpu_->silu_mul(a); }
    Status add(const AddArgs& a) override { return cpu_->add(a); }
    Status add_sigmoid_gated(const AddSigmoidGatedArgs& a) override { return cpu_->add_sigmoid_gated(a); }
    Status moe_router_topk(const MoeRouterTopkArgs& a) override { return cpu_->moe_router_topk(a); }
    Status moe_experts(const MoeExpertsArgs& a) override { return cpu_->moe_experts(a); }

private:
    std::unique_ptr<Backend> cpu_ = make_cpu_backend(1);
};

constexpr int64_t kWidth = 3;
constexpr int64_t kBlockSize = 4;

// Row i of the written rows holds (100 + i, 100 + i + 0.25, 100 + i + 0.5).
std::vector<float> numbered_rows(int64_t first, int64_t num_rows) {
    std::vector<float> rows;
    for (int64_t i = first; i < first + num_rows; ++i)
        for (int64_t w = 0; w < kWidth; ++w) rows.push_back(100.0f + static_cast<float>(i) + 0.25f * w);
    return rows;
}

struct Fixture {
    CountingBackend backend;
    std::vector<int32_t> table;
    std::vector<float> pool;
    LayerKvCache kv;

    Fixture(std::vector<int32_t> ids, int64_t num_blocks) : table(std::move(ids)) {
        pool.assign(static_cast<size_t>(num_blocks * kBlockSize * kWidth),
                    std::numeric_limits<float>::quiet_NaN());
        kv.k_pool = pool.data();
        kv.block_table = table;
        kv.block_table_device = table.data();
        kv.block_size = kBlockSize;
    }
    // Writes rows for positions num_tokens .. num_tokens + n − 1 and advances num_tokens.
    Status write(int64_t n) {
        const std::vector<float> rows = numbered_rows(kv.num_tokens, n);
        EPI_RETURN_IF_ERROR(kv_cache_write_rows(backend, kv, pool.data(), kWidth, rows.data(), n));
        kv.num_tokens += n;
        return Status::ok();
    }
    // The pool row of position p.
    const float* row_of(int64_t p) const {
        return pool.data() +
               (table[static_cast<size_t>(p / kBlockSize)] * kBlockSize + p % kBlockSize) * kWidth;
    }
};

TEST(KvCacheRows, WriteFollowsTheBlockTableWithOneCopyPerRun) {
    // Blocks 5, 2, 3, 0: positions 0-3 → block 5, 4-11 → blocks 2, 3 (contiguous in the pool), 12-15 → 0.
    Fixture f({5, 2, 3, 0}, 6);
    ASSERT_TRUE(f.write(14).is_ok());  // runs: block 5 | blocks 2-3 | block 0 (2 rows)
    EXPECT_EQ(f.backend.num_copies, 3);
    for (int64_t p = 0; p < 14; ++p) {
        const std::vector<float> want = numbered_rows(p, 1);
        EXPECT_EQ(std::vector<float>(f.row_of(p), f.row_of(p) + kWidth), want) << "position " << p;
    }
    // Rows past the filled positions and blocks outside the table are untouched.
    EXPECT_TRUE(std::isnan(f.row_of(14)[0]));
    EXPECT_TRUE(std::isnan(f.pool[1 * kBlockSize * kWidth]));

    f.backend.num_copies = 0;
    ASSERT_TRUE(f.write(1).is_ok());  // a decode step: one row, one copy
    EXPECT_EQ(f.backend.num_copies, 1);
    EXPECT_EQ(f.row_of(14)[0], 114.0f);
}

TEST(KvCacheRows, WriteAcrossBlockBoundariesFromTheMiddleOfABlock) {
    Fixture f({1, 0, 3}, 4);  // no two consecutive ids in a row: a copy per block touched
    ASSERT_TRUE(f.write(3).is_ok());
    f.backend.num_copies = 0;
    ASSERT_TRUE(f.write(7).is_ok());  // positions 3-9: block 1 (1 row), block 0 (4), block 3 (2)
    EXPECT_EQ(f.backend.num_copies, 3);
    for (int64_t p = 0; p < 10; ++p) EXPECT_EQ(f.row_of(p)[2], 100.0f + static_cast<float>(p) + 0.5f) << p;
}

TEST(KvCacheRows, GatherReturnsThePrefixInPositionOrder) {
    Fixture f({3, 4, 1}, 5);
    ASSERT_TRUE(f.write(11).is_ok());
    f.backend.num_copies = 0;
    std::vector<float> out(static_cast<size_t>(10 * kWidth));
    ASSERT_TRUE(kv_cache_gather_rows(f.backend, f.kv, f.pool.data(), kWidth, 10, out.data()).is_ok());
    EXPECT_EQ(out, numbered_rows(0, 10));
    EXPECT_EQ(f.backend.num_copies, 2);  // blocks 3-4 are one run, then block 1
}

TEST(KvCacheRows, RefusesRowsBeyondTheTableAndNegativeIds) {
    Fixture f({2, 0}, 3);
    ASSERT_TRUE(f.write(6).is_ok());
    f.backend.num_copies = 0;
    const std::vector<float> rows = numbered_rows(6, 3);
    Status st = kv_cache_write_rows(f.backend, f.kv, f.pool.data(), kWidth, rows.data(), 3);  // 6 + 3 > 8
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("exceed the block table's 8 tokens"), std::string::npos) << st.message();
    std::vector<float> out(static_cast<size_t>(9 * kWidth));
    st = kv_cache_gather_rows(f.backend, f.kv, f.pool.data(), kWidth, 9, out.data());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    f.table[1] = -3;
    st = kv_cache_write_rows(f.backend, f.kv, f.pool.data(), kWidth, rows.data(), 2);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("block table entry 1 is -3"), std::string::npos) << st.message();
    EXPECT_EQ(f.backend.num_copies, 0);  // nothing was written

    // check_kv_capacity: the same limit, and a view without storage.
    AttentionSequence seq{0, 3, &f.kv};
    EXPECT_EQ(check_kv_capacity(seq).code(), StatusCode::kInvalidArgument);
    seq.num_rows = 2;
    EXPECT_TRUE(check_kv_capacity(seq).is_ok());
    LayerKvCache empty;
    empty.num_tokens = 6;
    seq.kv = &empty;
    st = check_kv_capacity(seq);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("no storage"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace epinfer
