// The paged-cache helpers of layers/kv_cache.h on the CPU backend: build_kv_batch_metadata turns the
// block tables of a batch into the slot mapping, padded block tables and row → sequence map (bit-exact);
// kv_cache_store_rows puts every sequence's rows at the positions its table names in one op;
// kv_cache_gather_rows reads a prefix back in position order with one copy per run (a bf16 pool: one
// cast to fp32 per run); bad batches are refused.
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

// The CPU backend, counting copy_on_device, kv_cache_store and cast calls (every other method forwards; a
// new Backend method needs a line here).
class CountingBackend : public Backend {
public:
    int64_t num_copies = 0;
    int64_t num_stores = 0;
    int64_t num_casts = 0;

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
    Status batched_matmul(const BatchedMatmulArgs& a) override { return cpu_->batched_matmul(a); }
    Status rope(const RopeArgs& a) override { return cpu_->rope(a); }
    Status attention(const AttentionArgs& a) override { return cpu_->attention(a); }
    Status kv_cache_store(const KvCacheStoreArgs& a) override {
        ++num_stores;
        return cpu_->kv_cache_store(a);
    }
    Status argmax(const ArgmaxArgs& a) override { return cpu_->argmax(a); }
    Status silu_mul(const SiluMulArgs& a) override { return cpu_->silu_mul(a); }
    Status add(const AddArgs& a) override { return cpu_->add(a); }
    Status add_sigmoid_gated(const AddSigmoidGatedArgs& a) override { return cpu_->add_sigmoid_gated(a); }
    Status cast(const CastArgs& a) override {
        ++num_casts;
        return cpu_->cast(a);
    }
    Status moe_router_topk(const MoeRouterTopkArgs& a) override { return cpu_->moe_router_topk(a); }
    Status moe_experts(const MoeExpertsArgs& a) override { return cpu_->moe_experts(a); }

private:
    std::unique_ptr<Backend> cpu_ = make_cpu_backend(1);
};

constexpr int64_t kWidth = 3;
constexpr int64_t kBlockSize = 4;

// Row i of position p holds (100 + p, 100 + p + 0.25, 100 + p + 0.5) + 1000 · sequence.
std::vector<float> numbered_rows(int64_t sequence, int64_t first, int64_t num_rows) {
    std::vector<float> rows;
    for (int64_t i = first; i < first + num_rows; ++i)
        for (int64_t w = 0; w < kWidth; ++w)
            rows.push_back(1000.0f * static_cast<float>(sequence) + 100.0f + static_cast<float>(i) + 0.25f * w);
    return rows;
}

// A layer's pool and a few sequences with their block tables.
struct Fixture {
    CountingBackend backend;
    std::vector<float> pool;
    std::vector<std::vector<int32_t>> tables;
    std::vector<LayerKvCache> kv;

    Fixture(std::vector<std::vector<int32_t>> ids, int64_t num_blocks) : tables(std::move(ids)) {
        pool.assign(static_cast<size_t>(num_blocks * kBlockSize * kWidth), std::numeric_limits<float>::quiet_NaN());
        kv.resize(tables.size());
        for (size_t s = 0; s < tables.size(); ++s) {
            kv[s].k_pool = pool.data();
            kv[s].block_table = tables[s];
            kv[s].num_blocks = num_blocks;
            kv[s].block_size = kBlockSize;
        }
    }
    // Writes rows[s] new rows for each sequence s in one batch and advances num_tokens.
    Status write(const std::vector<int64_t>& rows) {
        std::vector<AttentionSequence> seqs;
        std::vector<float> src;
        int64_t T = 0;
        for (size_t s = 0; s < rows.size(); ++s) {
            seqs.push_back({T, rows[s], &kv[s]});
            const std::vector<float> r = numbered_rows(static_cast<int64_t>(s), kv[s].num_tokens, rows[s]);
            src.insert(src.end(), r.begin(), r.end());
            T += rows[s];
        }
        EPI_ASSIGN_OR_RETURN(KvBatchMetadata meta, build_kv_batch_metadata(backend, seqs, T));
        const AttentionBatch batch{nullptr, seqs, &meta};
        EPI_ASSIGN_OR_RETURN(const LayerKvCache* layer, batch_layer_cache(batch));
        EPI_RETURN_IF_ERROR(kv_cache_store_rows(backend, batch, *layer, pool.data(), kWidth, src.data()));
        for (size_t s = 0; s < rows.size(); ++s) kv[s].num_tokens += rows[s];
        return Status::ok();
    }
    // The pool row of position p of sequence s.
    const float* row_of(size_t s, int64_t p) const {
        return pool.data() + (tables[s][static_cast<size_t>(p / kBlockSize)] * kBlockSize + p % kBlockSize) * kWidth;
    }
};

template <typename T>
std::vector<T> host_copy(const DeviceBuffer& buffer) {
    const T* data = static_cast<const T*>(buffer.data());
    return std::vector<T>(data, data + buffer.num_bytes() / sizeof(T));
}

TEST(KvCacheRows, MetadataIsTheSlotMappingPaddedTablesAndRowSequences) {
    Fixture f({{5, 2}, {1}, {0, 3, 4}}, 6);
    f.kv[0].num_tokens = 3;  // next rows: positions 3, 4 → block 5 row 3, block 2 row 0
    f.kv[2].num_tokens = 7;  // position 7 → block 3 row 3
    const std::vector<AttentionSequence> seqs = {{0, 2, &f.kv[0]}, {2, 3, &f.kv[1]}, {5, 1, &f.kv[2]}};
    Result<KvBatchMetadata> meta = build_kv_batch_metadata(f.backend, seqs, 6);
    ASSERT_TRUE(meta.is_ok()) << meta.status().message();
    EXPECT_EQ(meta->num_rows, 6);
    EXPECT_EQ(meta->num_sequences, 3);
    EXPECT_EQ(meta->block_table_stride, 3);
    EXPECT_EQ(host_copy<int64_t>(meta->slot_mapping), (std::vector<int64_t>{23, 8, 4, 5, 6, 15}));
    EXPECT_EQ(host_copy<int32_t>(meta->token_sequence), (std::vector<int32_t>{0, 0, 1, 1, 1, 2}));
    EXPECT_EQ(host_copy<int32_t>(meta->block_tables), (std::vector<int32_t>{5, 2, -1, 1, -1, -1, 0, 3, 4}));
}

// A fixed table width (decode graphs): rows padded with −1 to it; narrower than the longest table: refused.
TEST(KvCacheRows, HostMetadataAtAFixedTableWidth) {
    Fixture f({{5, 2}, {1}}, 6);
    const std::vector<AttentionSequence> seqs = {{0, 1, &f.kv[0]}, {1, 1, &f.kv[1]}};
    Result<KvBatchHostMetadata> meta = kv_batch_host_metadata(seqs, 2, 4);
    ASSERT_TRUE(meta.is_ok()) << meta.status().message();
    EXPECT_EQ(meta->block_table_stride, 4);
    EXPECT_EQ(meta->block_tables, (std::vector<int32_t>{5, 2, -1, -1, 1, -1, -1, -1}));
    EXPECT_EQ(meta->slot_mapping, (std::vector<int64_t>{20, 4}));
    EXPECT_EQ(meta->token_sequence, (std::vector<int32_t>{0, 1}));
    const Status st = kv_batch_host_metadata(seqs, 2, 1).status();
    EXPECT_NE(st.message().find("block table width 1 is below the longest table's 2"), std::string::npos)
        << st.message();
}

TEST(KvCacheRows, OneStorePerBatchPutsEveryRowAtItsPosition) {
    Fixture f({{5, 2, 3, 0}, {1, 4}}, 6);
    ASSERT_TRUE(f.write({14, 5}).is_ok());  // prefill of both sequences
    ASSERT_TRUE(f.write({1, 1}).is_ok());   // a decode step
    EXPECT_EQ(f.backend.num_stores, 2);
    EXPECT_EQ(f.backend.num_copies, 0);
    for (int64_t p = 0; p < 15; ++p) {
        EXPECT_EQ(std::vector<float>(f.row_of(0, p), f.row_of(0, p) + kWidth), numbered_rows(0, p, 1)) << p;
    }
    for (int64_t p = 0; p < 6; ++p) {
        EXPECT_EQ(std::vector<float>(f.row_of(1, p), f.row_of(1, p) + kWidth), numbered_rows(1, p, 1)) << p;
    }
    EXPECT_TRUE(std::isnan(f.row_of(0, 15)[0]));  // past the filled positions: untouched
    EXPECT_TRUE(std::isnan(f.row_of(1, 6)[0]));
}

TEST(KvCacheRows, GatherReturnsThePrefixInPositionOrder) {
    Fixture f({{3, 4, 1}}, 5);
    ASSERT_TRUE(f.write({11}).is_ok());
    std::vector<float> out(static_cast<size_t>(10 * kWidth));
    ASSERT_TRUE(kv_cache_gather_rows(f.backend, f.kv[0], f.pool.data(), kWidth, 10, out.data()).is_ok());
    EXPECT_EQ(out, numbered_rows(0, 0, 10));
    EXPECT_EQ(f.backend.num_copies, 2);  // blocks 3-4 are one run, then block 1
}

// A bf16 pool: the store rounds each row to nearest even, the gather returns the prefix widened to fp32
// with one cast per run (no copy), and the paged attention arguments carry the dtype.
TEST(KvCacheRows, Bf16PoolStoresRoundedRowsAndGathersThemAsFp32) {
    CountingBackend backend;
    const int64_t num_blocks = 5;
    std::vector<uint16_t> pool(static_cast<size_t>(num_blocks * kBlockSize * kWidth), 0x7FC0);  // NaN
    const std::vector<int32_t> table = {3, 4, 1};
    LayerKvCache kv;
    kv.k_pool = pool.data();
    kv.dtype = DType::kBF16;
    kv.block_table = table;
    kv.num_blocks = num_blocks;
    kv.block_size = kBlockSize;
    const std::vector<float> rows = numbered_rows(0, 0, 11);
    const std::vector<AttentionSequence> seqs = {{0, 11, &kv}};
    Result<KvBatchMetadata> meta = build_kv_batch_metadata(backend, seqs, 11);
    ASSERT_TRUE(meta.is_ok()) << meta.status().message();
    const AttentionBatch batch{nullptr, seqs, &*meta};
    ASSERT_TRUE(kv_cache_store_rows(backend, batch, kv, pool.data(), kWidth, rows.data()).is_ok());
    kv.num_tokens = 11;
    EXPECT_EQ(pool[3 * kBlockSize * kWidth + 1], f32_to_bf16(100.25f));  // position 0 in block 3, bf16 bits
    EXPECT_NE(bf16_to_f32(f32_to_bf16(100.25f)), 100.25f);              // which round 100.25

    std::vector<float> want;
    for (const float x : numbered_rows(0, 0, 10)) want.push_back(bf16_to_f32(f32_to_bf16(x)));
    std::vector<float> out(static_cast<size_t>(10 * kWidth), -7.0f);
    ASSERT_TRUE(kv_cache_gather_rows(backend, kv, pool.data(), kWidth, 10, out.data()).is_ok());
    EXPECT_EQ(out, want);
    EXPECT_EQ(backend.num_casts, 2);  // blocks 3-4 are one run, then block 1
    EXPECT_EQ(backend.num_copies, 0);

    AttentionArgs args;
    set_paged_attention(batch, kv, &args);
    EXPECT_EQ(args.kv_dtype, DType::kBF16);

    kv.dtype = DType::kF16;
    const Status st = kv_cache_gather_rows(backend, kv, pool.data(), kWidth, 10, out.data());
    EXPECT_EQ(st.code(), StatusCode::kNotSupported);
    EXPECT_NE(st.message().find("pool dtype F16 is not supported (F32 or BF16)"), std::string::npos)
        << st.message();
}

TEST(KvCacheRows, RefusesRowsBeyondTheTableNegativeIdsAndBadBatches) {
    Fixture f({{2, 0}, {1}}, 3);
    ASSERT_TRUE(f.write({6, 1}).is_ok());
    const int64_t stores = f.backend.num_stores;
    Status st = f.write({3, 0});  // 6 + 3 > 8
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("cannot take 3 more after 6"), std::string::npos) << st.message();
    std::vector<float> out(static_cast<size_t>(9 * kWidth));
    st = kv_cache_gather_rows(f.backend, f.kv[0], f.pool.data(), kWidth, 9, out.data());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    f.tables[0][1] = -3;
    st = f.write({2, 0});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("block table entry 1 of sequence 0 is -3"), std::string::npos) << st.message();
    EXPECT_EQ(f.backend.num_stores, stores);  // nothing was written

    // Rows that do not cover the batch in order.
    std::vector<AttentionSequence> seqs = {{1, 1, &f.kv[1]}};
    st = build_kv_batch_metadata(f.backend, seqs, 2).status();
    EXPECT_NE(st.message().find("rows start at 1 where row 0 was expected"), std::string::npos) << st.message();
    seqs = {{0, 1, &f.kv[1]}};
    st = build_kv_batch_metadata(f.backend, seqs, 2).status();
    EXPECT_NE(st.message().find("cover 1 of 2 rows"), std::string::npos) << st.message();

    // Views of one batch must share the layer's pools.
    std::vector<float> other_pool(f.pool.size());
    LayerKvCache other = f.kv[1];
    other.k_pool = other_pool.data();
    f.tables[0][1] = 0;
    seqs = {{0, 1, &f.kv[0]}, {1, 1, &other}};
    Result<KvBatchMetadata> meta = build_kv_batch_metadata(f.backend, seqs, 2);
    ASSERT_TRUE(meta.is_ok()) << meta.status().message();
    const AttentionBatch batch{nullptr, seqs, &*meta};
    st = batch_layer_cache(batch).status();
    EXPECT_NE(st.message().find("do not share one layer's KV pools"), std::string::npos) << st.message();
    other.k_pool = f.pool.data();  // the same pool read as another dtype
    other.dtype = DType::kBF16;
    st = batch_layer_cache(batch).status();
    EXPECT_NE(st.message().find("do not share one layer's KV pools"), std::string::npos) << st.message();

    // check_kv_capacity: a view without storage.
    LayerKvCache empty;
    empty.num_tokens = 6;
    AttentionSequence seq{0, 2, &empty};
    st = check_kv_capacity(seq);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("no storage"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace epinfer
