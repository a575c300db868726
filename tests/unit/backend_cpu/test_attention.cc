// Causal attention: hand-computed softmax, GQA grouping and strided K/V against a double-precision
// reference, the causal mask, paged K/V (block tables) against the contiguous path, bf16 K/V against the
// fp32 path on the same rounded values, and thread-count independence of the CPU kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/compare.h"
#include "op_test_util.h"

namespace epinfer {
namespace {

struct AttentionCase {
    int64_t T = 5, S = 7, Nh = 6, Nkv = 2, Dqk = 12, Dv = 10;
    int64_t pad = 3;  // extra floats per token row, so strides differ from the packed ones
    std::vector<int32_t> positions = {2, 3, 4, 5, 6};
    std::vector<float> q, k, v;
    float scale = 0.3f;

    AttentionCase() { fill(); }
    // T queries at positions S − T .. S − 1 (a chunk after S − T cached tokens).
    AttentionCase(int64_t num_tokens, int64_t num_kv_tokens, int64_t head_dim)
        : T(num_tokens), S(num_kv_tokens) {
        Dqk = Dv = head_dim;
        positions.clear();
        for (int64_t t = 0; t < T; ++t) positions.push_back(static_cast<int32_t>(S - T + t));
        fill();
    }
    void fill() {
        q = test::random_floats(T * q_stride(), 21, -2.0f, 2.0f);
        k = test::random_floats(S * k_stride(), 22, -2.0f, 2.0f);
        v = test::random_floats(S * v_stride(), 23);
    }
    int64_t q_stride() const { return Nh * Dqk + pad; }
    int64_t k_stride() const { return Nkv * Dqk + pad; }
    int64_t v_stride() const { return Nkv * Dv + pad; }

    AttentionArgs args(float* out) const {
        AttentionArgs a;
        a.q = q.data();
        a.k = k.data();
        a.v = v.data();
        a.positions = positions.data();
        a.out = out;
        a.num_tokens = T;
        a.num_kv_tokens = S;
        a.num_heads = Nh;
        a.num_kv_heads = Nkv;
        a.head_dim_qk = Dqk;
        a.head_dim_v = Dv;
        a.q_token_stride = q_stride();
        a.q_head_stride = Dqk;
        a.k_token_stride = k_stride();
        a.k_head_stride = Dqk;
        a.v_token_stride = v_stride();
        a.v_head_stride = Dv;
        a.out_token_stride = Nh * Dv;
        a.out_head_stride = Dv;
        a.scale = scale;
        return a;
    }

    // transformers eager attention in double, with repeat_kv: query head h reads kv head h / (Nh / Nkv).
    std::vector<float> reference() const {
        std::vector<float> out(T * Nh * Dv);
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t h = 0; h < Nh; ++h) {
                const int64_t kvh = h / (Nh / Nkv), n = positions[t] + 1;
                std::vector<double> s(n);
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < n; ++j) {
                    double dot = 0.0;
                    for (int64_t d = 0; d < Dqk; ++d)
                        dot += double(q[t * q_stride() + h * Dqk + d]) * k[j * k_stride() + kvh * Dqk + d];
                    s[j] = dot * scale;
                    mx = std::max(mx, s[j]);
                }
                for (double& x : s) sum += (x = std::exp(x - mx));
                for (int64_t d = 0; d < Dv; ++d) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < n; ++j) acc += s[j] / sum * v[j * v_stride() + kvh * Dv + d];
                    out[(t * Nh + h) * Dv + d] = static_cast<float>(acc);
                }
            }
        }
        return out;
    }
};

TEST(Attention, HandComputedSoftmax) {
    auto backend = make_cpu_backend(1);
    const std::vector<float> q = {1, 0}, k = {1, 0, 0, 1}, v = {1, 2, 3, 4};
    const std::vector<int32_t> pos = {1};
    std::vector<float> out(2);
    AttentionArgs a;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.positions = pos.data();
    a.out = out.data();
    a.num_tokens = 1;
    a.num_kv_tokens = 2;
    a.num_heads = a.num_kv_heads = 1;
    a.head_dim_qk = a.head_dim_v = 2;
    a.q_token_stride = a.k_token_stride = a.v_token_stride = a.out_token_stride = 2;
    a.q_head_stride = a.k_head_stride = a.v_head_stride = a.out_head_stride = 2;
    a.scale = 1.0f;
    ASSERT_TRUE(backend->attention(a).is_ok());
    const double p0 = std::exp(1.0) / (std::exp(1.0) + 1.0), p1 = 1.0 - p0;  // scores (1, 0)
    EXPECT_NEAR(out[0], p0 * 1 + p1 * 3, 1e-6);
    EXPECT_NEAR(out[1], p0 * 2 + p1 * 4, 1e-6);
}

TEST(Attention, GqaStridedMatchesReference) {
    auto backend = make_cpu_backend(3);
    const AttentionCase c;
    std::vector<float> out(c.T * c.Nh * c.Dv);
    ASSERT_TRUE(backend->attention(c.args(out.data())).is_ok());
    EXPECT_TRUE(
        test::within(test::compare<float>(out, c.reference()), test::tolerance("attention", DType::kF32)));
}

// Keys and values after a query's position do not change its output.
TEST(Attention, CausalMaskIgnoresLaterTokens) {
    auto backend = make_cpu_backend(2);
    AttentionCase c;
    c.positions = {0, 1, 2, 3, 4};
    std::vector<float> before(c.T * c.Nh * c.Dv), after(before.size());
    ASSERT_TRUE(backend->attention(c.args(before.data())).is_ok());
    for (int64_t j = 5; j < c.S; ++j) {  // tokens 5, 6 lie after every query
        for (int64_t i = 0; i < c.k_stride(); ++i) c.k[j * c.k_stride() + i] = 100.0f;
        for (int64_t i = 0; i < c.v_stride(); ++i) c.v[j * c.v_stride() + i] = -100.0f;
    }
    ASSERT_TRUE(backend->attention(c.args(after.data())).is_ok());
    EXPECT_EQ(before, after);
    // Query 0 sees only key 0: its output is v[0] of its kv head.
    for (int64_t d = 0; d < c.Dv; ++d) EXPECT_FLOAT_EQ(after[d], c.v[d]);
}

TEST(Attention, RejectsPositionOutsideCache) {
    auto backend = make_cpu_backend(1);
    AttentionCase c;
    c.positions = {0, 1, 2, 3, 7};  // S = 7
    std::vector<float> out(c.T * c.Nh * c.Dv);
    const Status st = backend->attention(c.args(out.data()));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("position 7"), std::string::npos) << st.message();
    c.Nkv = 4;  // does not divide Nh = 6
    EXPECT_EQ(backend->attention(c.args(out.data())).code(), StatusCode::kInvalidArgument);
}

// The K/V rows of a case in pools of blocks of block_size rows (row strides as in the case), at the blocks
// of a table drawn from a shuffled list of twice as many blocks as needed (plus one): ids are scattered
// and non-monotone. Pool rows the table does not reach hold NaN, so a wrong read shows in the output.
struct PagedKv {
    std::vector<int32_t> table;  // [ceil(S / block_size)]
    std::vector<float> k_pool;   // [num_blocks·block_size, k_stride]
    std::vector<float> v_pool;   // [num_blocks·block_size, v_stride]
};

PagedKv page_kv(const AttentionCase& c, int64_t block_size, uint32_t seed) {
    const int64_t used = (c.S + block_size - 1) / block_size, num_blocks = 2 * used + 1;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    PagedKv p;
    p.table.assign(ids.begin(), ids.begin() + used);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    p.k_pool.assign(static_cast<size_t>(num_blocks * block_size * c.k_stride()), nan);
    p.v_pool.assign(static_cast<size_t>(num_blocks * block_size * c.v_stride()), nan);
    for (int64_t s = 0; s < c.S; ++s) {
        const int64_t row = p.table[s / block_size] * block_size + s % block_size;
        std::copy_n(c.k.begin() + s * c.k_stride(), c.k_stride(), p.k_pool.begin() + row * c.k_stride());
        std::copy_n(c.v.begin() + s * c.v_stride(), c.v_stride(), p.v_pool.begin() + row * c.v_stride());
    }
    return p;
}

AttentionArgs paged_args(const AttentionCase& c, const PagedKv& p, int64_t block_size, float* out) {
    AttentionArgs a = c.args(out);
    a.k = p.k_pool.data();
    a.v = p.v_pool.data();
    a.kv_block_tables = p.table.data();
    a.num_sequences = 1;
    a.block_table_stride = static_cast<int64_t>(p.table.size());
    a.kv_block_size = block_size;
    return a;
}

// Paged K/V give the same bits as the contiguous rows they hold: odd sizes, GQA, padded strides, block
// sizes from 1 to more than S, scattered block ids.
TEST(Attention, PagedMatchesContiguous) {
    auto backend = make_cpu_backend(3);
    std::vector<AttentionCase> cases(1);  // T 5, S 7, Nh 6, Nkv 2, Dqk 12, Dv 10, arbitrary positions
    cases.emplace_back(1, 13, 16);        // decode after 12 cached tokens
    cases.emplace_back(9, 9, 8);          // prefill
    cases.emplace_back(7, 37, 24);        // a chunk after 30 cached tokens
    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const AttentionCase& c = cases[ci];
        std::vector<float> want(c.T * c.Nh * c.Dv);
        ASSERT_TRUE(backend->attention(c.args(want.data())).is_ok());
        for (const int64_t bs : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{16}, c.S + 4}) {
            const PagedKv p = page_kv(c, bs, static_cast<uint32_t>(100 * ci + bs));
            std::vector<float> got(want.size(), -7.0f);
            const Status st = backend->attention(paged_args(c, p, bs, got.data()));
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            EXPECT_EQ(got, want) << "case " << ci << ", block_size " << bs;
        }
    }
}

// Elementwise bf16 (round to nearest even; NaN stays NaN), as the KV cache stores fp32 rows.
std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
    std::vector<uint16_t> out(x.size());
    std::transform(x.begin(), x.end(), out.begin(), f32_to_bf16);
    return out;
}

// The case with K and V replaced by the fp32 values of their bf16 rounding.
AttentionCase round_kv_to_bf16(AttentionCase c) {
    for (std::vector<float>* x : {&c.k, &c.v})
        for (float& e : *x) e = bf16_to_f32(f32_to_bf16(e));
    return c;
}

// bf16 K/V (kv_dtype kBF16) give the same bits as the fp32 path fed the values they hold, contiguous and
// paged, with GQA (6 query heads on 2 KV heads) and padded strides (counted in bf16 elements).
TEST(Attention, Bf16KvMatchesFp32OnTheRoundedValues) {
    auto backend = make_cpu_backend(3);
    std::vector<AttentionCase> cases(1);
    cases.emplace_back(1, 13, 16);  // decode
    cases.emplace_back(9, 9, 8);    // prefill
    cases.emplace_back(7, 37, 24);  // a chunk after 30 cached tokens
    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const AttentionCase& c = cases[ci];
        const AttentionCase rounded = round_kv_to_bf16(c);
        std::vector<float> want(c.T * c.Nh * c.Dv), unrounded(want.size());
        ASSERT_TRUE(backend->attention(rounded.args(want.data())).is_ok());
        ASSERT_TRUE(backend->attention(c.args(unrounded.data())).is_ok());
        EXPECT_NE(want, unrounded) << "case " << ci << ": the rounding changes nothing";

        const std::vector<uint16_t> k = to_bf16(c.k), v = to_bf16(c.v);
        std::vector<float> got(want.size(), -7.0f);
        AttentionArgs a = c.args(got.data());
        a.k = k.data();
        a.v = v.data();
        a.kv_dtype = DType::kBF16;
        Status st = backend->attention(a);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        EXPECT_EQ(got, want) << "contiguous, case " << ci;

        for (const int64_t bs : {int64_t{1}, int64_t{3}, int64_t{16}}) {
            const PagedKv p = page_kv(rounded, bs, static_cast<uint32_t>(100 * ci + bs));
            // The same pools in bf16 (NaN where the table does not reach).
            const std::vector<uint16_t> k_pool = to_bf16(p.k_pool), v_pool = to_bf16(p.v_pool);
            std::fill(got.begin(), got.end(), -7.0f);
            a = paged_args(c, p, bs, got.data());
            a.k = k_pool.data();
            a.v = v_pool.data();
            a.kv_dtype = DType::kBF16;
            st = backend->attention(a);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            EXPECT_EQ(got, want) << "paged, case " << ci << ", block_size " << bs;
        }
    }
}

// A K/V dtype other than F32 and BF16 is one line naming it.
TEST(Attention, RefusesAnotherKvDtype) {
    auto backend = make_cpu_backend(1);
    const AttentionCase c;
    std::vector<float> out(c.T * c.Nh * c.Dv, -7.0f);
    AttentionArgs a = c.args(out.data());
    a.kv_dtype = DType::kF16;
    const Status st = backend->attention(a);
    EXPECT_EQ(st.code(), StatusCode::kNotSupported);
    EXPECT_EQ(st.message(), "attention: kv_dtype F16 is not supported (F32 or BF16)");
    for (const float x : out) EXPECT_EQ(x, -7.0f);
}

// The scale must be positive and finite (the GPU kernels take each row's max before scaling).
TEST(Attention, RefusesScaleNotPositiveAndFinite) {
    auto backend = make_cpu_backend(1);
    const AttentionCase c;
    std::vector<float> out(c.T * c.Nh * c.Dv, -7.0f);
    for (const float scale :
         {0.0f, -0.5f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        AttentionArgs a = c.args(out.data());
        a.scale = scale;
        const Status st = backend->attention(a);
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << scale;
        EXPECT_NE(st.message().find("must be positive and finite"), std::string::npos) << st.message();
    }
    for (const float x : out) EXPECT_EQ(x, -7.0f);
}

// One call over several sequences (token_sequence, block tables padded with −1, one shared pool) gives
// the same bits as each sequence alone on contiguous K/V.
TEST(Attention, BatchOfSequencesMatchesEachAlone) {
    auto backend = make_cpu_backend(2);
    const std::vector<AttentionCase> cases = {{1, 13, 16}, {9, 9, 16}, {1, 2, 16}, {7, 37, 16}};
    const int64_t bs = 3, stride = (37 + bs - 1) / bs;
    const AttentionCase& c0 = cases[0];
    int64_t num_blocks = 0;
    for (const AttentionCase& c : cases) num_blocks += (c.S + bs - 1) / bs;
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(17));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> k_pool(static_cast<size_t>(num_blocks * bs * c0.k_stride()), nan);
    std::vector<float> v_pool(static_cast<size_t>(num_blocks * bs * c0.v_stride()), nan);
    std::vector<int32_t> tables(cases.size() * static_cast<size_t>(stride), -1), token_sequence, positions;
    std::vector<float> q, want;
    size_t next_id = 0;
    for (size_t s = 0; s < cases.size(); ++s) {
        const AttentionCase& c = cases[s];
        for (int64_t b = 0; b < (c.S + bs - 1) / bs; ++b) tables[s * stride + b] = ids[next_id++];
        for (int64_t j = 0; j < c.S; ++j) {
            const int64_t row = tables[s * stride + j / bs] * bs + j % bs;
            std::copy_n(c.k.begin() + j * c.k_stride(), c.k_stride(), k_pool.begin() + row * c.k_stride());
            std::copy_n(c.v.begin() + j * c.v_stride(), c.v_stride(), v_pool.begin() + row * c.v_stride());
        }
        q.insert(q.end(), c.q.begin(), c.q.end());
        positions.insert(positions.end(), c.positions.begin(), c.positions.end());
        token_sequence.insert(token_sequence.end(), c.T, static_cast<int32_t>(s));
        std::vector<float> alone(c.T * c.Nh * c.Dv);
        ASSERT_TRUE(backend->attention(c.args(alone.data())).is_ok());
        want.insert(want.end(), alone.begin(), alone.end());
    }
    AttentionArgs a = c0.args(nullptr);
    std::vector<float> got(want.size(), -7.0f);
    a.q = q.data();
    a.k = k_pool.data();
    a.v = v_pool.data();
    a.positions = positions.data();
    a.out = got.data();
    a.num_tokens = static_cast<int64_t>(positions.size());
    a.num_kv_tokens = 37;
    a.kv_block_tables = tables.data();
    a.token_sequence = token_sequence.data();
    a.num_sequences = static_cast<int64_t>(cases.size());
    a.block_table_stride = stride;
    a.kv_block_size = bs;
    const Status st = backend->attention(a);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(got, want);

    token_sequence[3] = 4;  // a row naming a sequence past the tables
    EXPECT_NE(backend->attention(a).message().find("token_sequence[3] = 4 is outside [0, 4)"), std::string::npos);
}

TEST(Attention, PagedRejectsBadBlockTable) {
    auto backend = make_cpu_backend(1);
    const AttentionCase c;
    PagedKv p = page_kv(c, 2, 5);
    std::vector<float> out(c.T * c.Nh * c.Dv);
    p.table[2] = -1;
    Status st = backend->attention(paged_args(c, p, 2, out.data()));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("block table entry 2 of query 2 is -1"), std::string::npos) << st.message();
    st = backend->attention(paged_args(c, p, 0, out.data()));  // a table without a block size
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("kv_block_size must be > 0"), std::string::npos) << st.message();
    AttentionArgs a = paged_args(c, p, 1, out.data());  // S = 7 > 4 entries × 1 row
    st = backend->attention(a);
    EXPECT_NE(st.message().find("num_kv_tokens 7 exceeds block_table_stride 4 × kv_block_size 1"),
              std::string::npos) << st.message();
    a = c.args(out.data());  // a block size without a table
    a.kv_block_size = 4;
    st = backend->attention(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("need kv_block_tables"), std::string::npos) << st.message();
}

// Every output element is computed by one thread in a fixed order: 1 and 3 threads agree bit for bit
// (sizes large enough for the kernels to split the work).
TEST(ThreadCount, MatmulAndAttentionAreBitIdentical) {
    auto one = make_cpu_backend(1), three = make_cpu_backend(3);
    const AttentionCase c(24, 301, 64);
    std::vector<float> a1(c.T * c.Nh * c.Dv), a3(a1.size());
    ASSERT_TRUE(one->attention(c.args(a1.data())).is_ok());
    ASSERT_TRUE(three->attention(c.args(a3.data())).is_ok());
    EXPECT_EQ(a1, a3);

    const int64_t T = 9, N = 1001, K = 129;
    const std::vector<float> x = test::random_floats(T * K, 31);
    const test::StoredTensor w = test::store_as(DType::kBF16, test::random_floats(N * K, 32));
    std::vector<float> y1(T * N), y3(T * N);
    MatmulArgs m;
    m.x = x.data();
    m.w = w.data();
    m.w_dtype = DType::kBF16;
    m.num_rows = T;
    m.out_features = N;
    m.in_features = K;
    m.x_row_stride = K;
    m.y_row_stride = N;
    m.y = y1.data();
    ASSERT_TRUE(one->matmul(m).is_ok());
    m.y = y3.data();
    ASSERT_TRUE(three->matmul(m).is_ok());
    EXPECT_EQ(y1, y3);
}

}  // namespace
}  // namespace epinfer
