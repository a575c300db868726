// qk_norm_rope_kv_store on the CPU backend (Backend's default): equal bit for bit to rms_norm of q and k
// per head, rope of q and k and kv_cache_store of k and v called by hand in that order, with partial
// rotary and without norms; bad arguments are refused with a line naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "op_test_util.h"

namespace epinfer {
namespace {

using test::random_floats;
using test::store_as;
using test::StoredTensor;

struct PrepCase {
    int64_t T = 3, Nh = 4, Nkv = 2, D = 12, rotary = 8, pool_rows = 7;
    std::vector<float> q = random_floats(static_cast<size_t>(T * Nh * D), 1, -2.0f, 2.0f);
    std::vector<float> k = random_floats(static_cast<size_t>(T * Nkv * D), 2, -2.0f, 2.0f);
    std::vector<float> v = random_floats(static_cast<size_t>(T * Nkv * D), 3, -2.0f, 2.0f);
    StoredTensor q_norm = store_as(DType::kBF16, random_floats(static_cast<size_t>(D), 4, 0.5f, 1.5f));
    StoredTensor k_norm = store_as(DType::kBF16, random_floats(static_cast<size_t>(D), 5, 0.5f, 1.5f));
    std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
    std::vector<int32_t> positions = {7, 300, 4095};
    std::vector<int64_t> slots = {5, 0, 3};
    std::vector<float> k_pool = random_floats(static_cast<size_t>(pool_rows * Nkv * D), 6);
    std::vector<float> v_pool = random_floats(static_cast<size_t>(pool_rows * Nkv * D), 7);

    QkNormRopeKvStoreArgs args(bool norms) {
        QkNormRopeKvStoreArgs a;
        a.q = q.data();
        a.k = k.data();
        a.v = v.data();
        a.num_tokens = T;
        a.num_heads = Nh;
        a.num_kv_heads = Nkv;
        a.head_dim = D;
        a.q_norm = norms ? q_norm.data() : nullptr;
        a.k_norm = norms ? k_norm.data() : nullptr;
        a.norm_dtype = DType::kBF16;
        a.norm_eps = 1e-5f;
        a.positions = positions.data();
        a.inv_freq = inv_freq.data();
        a.attention_scaling = 1.25f;
        a.rotary_dim = rotary;
        a.k_pool = k_pool.data();
        a.v_pool = v_pool.data();
        a.pool_dtype = DType::kF32;
        a.slot_mapping = slots.data();
        a.num_pool_rows = pool_rows;
        return a;
    }
};

// The six ops with arguments written out here, not taken from qk_norm_rope_kv_store_parts.
void run_by_hand(Backend& backend, PrepCase& c, bool norms) {
    for (int part = 0; part < 2 && norms; ++part) {
        RmsNormArgs n;
        n.x = n.out = part == 0 ? c.q.data() : c.k.data();
        n.weight = part == 0 ? c.q_norm.data() : c.k_norm.data();
        n.weight_dtype = DType::kBF16;
        n.num_rows = c.T * (part == 0 ? c.Nh : c.Nkv);
        n.width = n.x_row_stride = n.out_row_stride = c.D;
        n.eps = 1e-5f;
        ASSERT_TRUE(backend.rms_norm(n).is_ok());
    }
    for (int part = 0; part < 2; ++part) {
        const int64_t heads = part == 0 ? c.Nh : c.Nkv;
        RopeArgs r{part == 0 ? c.q.data() : c.k.data(),
                   c.positions.data(),
                   c.inv_freq.data(),
                   1.25f,
                   c.T,
                   heads,
                   heads * c.D,
                   c.D,
                   0,
                   c.rotary,
                   false};
        ASSERT_TRUE(backend.rope(r).is_ok());
    }
    for (int part = 0; part < 2; ++part) {
        KvCacheStoreArgs s;
        s.src = part == 0 ? c.k.data() : c.v.data();
        s.pool = part == 0 ? c.k_pool.data() : c.v_pool.data();
        s.slot_mapping = c.slots.data();
        s.num_tokens = c.T;
        s.width = s.src_row_stride = c.Nkv * c.D;
        s.num_pool_rows = c.pool_rows;
        ASSERT_TRUE(backend.kv_cache_store(s).is_ok());
    }
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << what;
}

TEST(QkNormRopeKvStore, EqualsTheSixOpsInOrder) {
    auto backend = make_cpu_backend(2);
    for (bool norms : {false, true}) {
        PrepCase fused, by_hand;
        ASSERT_TRUE(backend->qk_norm_rope_kv_store(fused.args(norms)).is_ok());
        run_by_hand(*backend, by_hand, norms);
        expect_same(fused.q, by_hand.q, "q");
        expect_same(fused.k, by_hand.k, "k");
        expect_same(fused.k_pool, by_hand.k_pool, "k pool");
        expect_same(fused.v_pool, by_hand.v_pool, "v pool");
        // The op did something: q changed, and slot 5 holds token 0's v row.
        EXPECT_NE(fused.q, PrepCase().q);
        EXPECT_EQ(std::vector<float>(fused.v_pool.begin() + 5 * fused.Nkv * fused.D,
                                     fused.v_pool.begin() + 6 * fused.Nkv * fused.D),
                  std::vector<float>(fused.v.begin(), fused.v.begin() + fused.Nkv * fused.D));
    }
}

// q, k and v as column blocks of one [T, (Nh + 2·Nkv)·D] buffer with padding (the GQA layer's stacked
// projection output): the same q, k and pools as packed, bit for bit, and the padding untouched.
TEST(QkNormRopeKvStore, StridedRowsEqualPacked) {
    auto backend = make_cpu_backend(2);
    for (bool norms : {false, true}) {
        PrepCase packed, strided;
        const int64_t T = packed.T, q_row = packed.Nh * packed.D, kv_row = packed.Nkv * packed.D;
        const int64_t S = q_row + 2 * kv_row + 5;  // token stride, 5 floats of padding
        std::vector<float> qkv = random_floats(static_cast<size_t>(T * S), 8);
        const std::vector<float> qkv0 = qkv;
        for (int64_t t = 0; t < T; ++t) {
            std::copy_n(packed.q.begin() + t * q_row, q_row, qkv.begin() + t * S);
            std::copy_n(packed.k.begin() + t * kv_row, kv_row, qkv.begin() + t * S + q_row);
            std::copy_n(packed.v.begin() + t * kv_row, kv_row, qkv.begin() + t * S + q_row + kv_row);
        }
        ASSERT_TRUE(backend->qk_norm_rope_kv_store(packed.args(norms)).is_ok());
        QkNormRopeKvStoreArgs a = strided.args(norms);
        a.q = qkv.data();
        a.k = qkv.data() + q_row;
        a.v = qkv.data() + q_row + kv_row;
        a.q_token_stride = a.k_token_stride = a.v_token_stride = S;
        ASSERT_TRUE(backend->qk_norm_rope_kv_store(a).is_ok());
        std::vector<float> got_q, got_k;
        for (int64_t t = 0; t < T; ++t) {
            got_q.insert(got_q.end(), qkv.begin() + t * S, qkv.begin() + t * S + q_row);
            got_k.insert(got_k.end(), qkv.begin() + t * S + q_row, qkv.begin() + t * S + q_row + kv_row);
            // v and the padding are only read.
            EXPECT_TRUE(std::equal(qkv.begin() + t * S + q_row + kv_row,
                                   qkv.begin() + t * S + q_row + 2 * kv_row, strided.v.begin() + t * kv_row))
                << "v of token " << t;
            EXPECT_TRUE(std::equal(qkv.begin() + t * S + q_row + 2 * kv_row, qkv.begin() + (t + 1) * S,
                                   qkv0.begin() + t * S + q_row + 2 * kv_row))
                << "padding of token " << t;
        }
        expect_same(got_q, packed.q, "q");
        expect_same(got_k, packed.k, "k");
        expect_same(strided.k_pool, packed.k_pool, "k pool");
        expect_same(strided.v_pool, packed.v_pool, "v pool");
        EXPECT_NE(packed.q, PrepCase().q);
    }
}

TEST(QkNormRopeKvStore, BadArgumentsNameTheField) {
    auto backend = make_cpu_backend(1);
    const auto expect_refused = [&](QkNormRopeKvStoreArgs a, const std::string& text) {
        const Status s = backend->qk_norm_rope_kv_store(a);
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
        EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
    };
    PrepCase c;
    QkNormRopeKvStoreArgs a = c.args(true);
    a.rotary_dim = 14;
    expect_refused(a, "rotary_dim 14 > head_dim 12");
    a = c.args(true);
    a.k_norm = nullptr;
    expect_refused(a, "q_norm and k_norm must both be set or both null");
    a = c.args(false);
    a.rotary_dim = 7;
    expect_refused(a, "rotary_dim must be even");
    a = c.args(false);
    a.v_pool = nullptr;
    expect_refused(a, "pool");
    a = c.args(false);
    a.k_token_stride = 23;
    expect_refused(a, "k_token_stride 23 is below 24");
    a = c.args(false);
    c.slots[1] = 7;
    expect_refused(a, "slot_mapping[1] = 7");
}

}  // namespace
}  // namespace epinfer
