// Causal attention: hand-computed softmax, GQA grouping and strided K/V against a double-precision
// reference, the causal mask, and thread-count independence of the CPU kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
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
