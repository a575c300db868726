// CPU reference ops without position or sequence structure: embedding, RMSNorm, matmul, batched matmul,
// SwiGLU, adds.
// Each against hand-computed values and against a double-precision formula on seeded random inputs with
// odd sizes, for bf16/f16/f32 weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/compare.h"
#include "op_test_util.h"

namespace epinfer {
namespace {

using test::random_floats;
using test::store_as;
using test::StoredTensor;

class DenseOpsTest : public ::testing::TestWithParam<DType> {
protected:
    std::unique_ptr<Backend> backend_ = make_cpu_backend(3);
};

TEST(DenseOps, RmsNormHandComputed) {
    auto backend = make_cpu_backend(1);
    // x = [3, 4]: mean(x²) = 12.5, rsqrt(12.5) = 0.28284271; weight [1, 2].
    const std::vector<float> x = {3.0f, 4.0f};
    const StoredTensor w = store_as(DType::kF32, {1.0f, 2.0f});
    std::vector<float> out(2);
    RmsNormArgs a;
    a.x = x.data();
    a.weight = w.data();
    a.weight_dtype = DType::kF32;
    a.out = out.data();
    a.num_rows = 1;
    a.width = 2;
    a.x_row_stride = a.out_row_stride = 2;
    a.eps = 0.0f;
    ASSERT_TRUE(backend->rms_norm(a).is_ok());
    EXPECT_NEAR(out[0], 0.84852814f, 1e-6);
    EXPECT_NEAR(out[1], 2.0f * 1.13137085f, 1e-6);
}

// The fused residual add (RmsNormArgs::residual) equals the add op followed by rms_norm, bit for bit: the
// sum in sum_out (here x itself, as the model runs it) and the normed rows.
TEST_P(DenseOpsTest, RmsNormWithResidualEqualsAddThenNorm) {
    const int64_t rows = 5, width = 37;
    const std::vector<float> x = random_floats(rows * width, 11, -3.0f, 3.0f);
    const std::vector<float> residual = random_floats(rows * width, 12, -3.0f, 3.0f);
    const StoredTensor w = store_as(GetParam(), random_floats(width, 13, 0.5f, 1.5f));
    RmsNormArgs a;
    a.weight = w.data();
    a.weight_dtype = GetParam();
    a.num_rows = rows;
    a.width = width;
    a.x_row_stride = a.out_row_stride = width;
    a.eps = 1e-5f;

    std::vector<float> want_sum(rows * width), want_out(rows * width);
    AddArgs add{x.data(), residual.data(), want_sum.data(), rows * width};
    ASSERT_TRUE(backend_->add(add).is_ok());
    a.x = want_sum.data();
    a.out = want_out.data();
    ASSERT_TRUE(backend_->rms_norm(a).is_ok());

    std::vector<float> hidden = x, out(rows * width, -7.0f);
    a.x = hidden.data();
    a.residual = residual.data();
    a.sum_out = hidden.data();
    a.out = out.data();
    ASSERT_TRUE(backend_->rms_norm(a).is_ok());
    EXPECT_EQ(0, std::memcmp(hidden.data(), want_sum.data(), hidden.size() * sizeof(float))) << "sum_out";
    EXPECT_EQ(0, std::memcmp(out.data(), want_out.data(), out.size() * sizeof(float))) << "out";
}

TEST(DenseOps, RmsNormResidualArgumentsAreChecked) {
    auto backend = make_cpu_backend(1);
    std::vector<float> x(4, 1.0f), residual(4, 1.0f), out(4);
    const StoredTensor w = store_as(DType::kF32, {1.0f, 1.0f, 1.0f, 1.0f});
    RmsNormArgs a;
    a.x = x.data();
    a.weight = w.data();
    a.weight_dtype = DType::kF32;
    a.out = out.data();
    a.num_rows = 1;
    a.width = a.x_row_stride = a.out_row_stride = 4;
    a.residual = residual.data();
    Status s = backend->rms_norm(a);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("sum_out"), std::string::npos) << s.message();
    a.sum_out = x.data();
    a.out = x.data();
    s = backend->rms_norm(a);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("out must not be x, residual or sum_out"), std::string::npos) << s.message();
    a.residual = nullptr;
    a.out = out.data();
    s = backend->rms_norm(a);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("sum_out is set without residual"), std::string::npos) << s.message();
}

// matmul_group is the matmul op on each entry, bit for bit; entries must share x, T and K.
TEST_P(DenseOpsTest, MatmulGroupEqualsEachMatmul) {
    const int64_t T = 3, K = 19;
    const std::vector<float> x = random_floats(T * K, 21);
    const int64_t ns[] = {5, 11, 2};
    std::vector<StoredTensor> w;
    for (int i = 0; i < 3; ++i) w.push_back(store_as(GetParam(), random_floats(ns[i] * K, 22 + i)));
    MatmulGroupArgs group;
    std::vector<std::vector<float>> got(3), want(3);
    for (int i = 0; i < 3; ++i) {
        got[i].assign(T * ns[i], -1.0f);
        want[i].assign(T * ns[i], -2.0f);
        MatmulArgs m{x.data(), w[i].data(), GetParam(), nullptr, DType::kBF16, want[i].data(),
                     T,        ns[i],       K,          K,       ns[i]};
        ASSERT_TRUE(backend_->matmul(m).is_ok());
        m.y = got[i].data();
        group.matmuls[i] = m;
    }
    group.num_matmuls = 3;
    ASSERT_TRUE(backend_->matmul_group(group).is_ok());
    for (int i = 0; i < 3; ++i)
        EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)))
            << "entry " << i;

    MatmulGroupArgs bad = group;
    bad.matmuls[1].in_features = K - 1;
    bad.matmuls[1].x_row_stride = K;
    Status s = backend_->matmul_group(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("entry 1 has another x, x_row_stride, num_rows or in_features"),
              std::string::npos)
        << s.message();
    bad = group;
    bad.num_matmuls = 0;
    s = backend_->matmul_group(bad);
    EXPECT_NE(s.message().find("num_matmuls must be in [1, 4], got 0"), std::string::npos) << s.message();
}

TEST_P(DenseOpsTest, RmsNormMatchesFormulaOnStridedRows) {
    const int64_t rows = 7, width = 37, x_stride = 41, out_stride = 39;
    const std::vector<float> x = random_floats(rows * x_stride, 1, -3.0f, 3.0f);
    const StoredTensor w = store_as(GetParam(), random_floats(width, 2, 0.5f, 1.5f));
    const float eps = 1e-5f;
    std::vector<float> out(rows * out_stride, -7.0f), got, want;
    RmsNormArgs a;
    a.x = x.data();
    a.weight = w.data();
    a.weight_dtype = GetParam();
    a.out = out.data();
    a.num_rows = rows;
    a.width = width;
    a.x_row_stride = x_stride;
    a.out_row_stride = out_stride;
    a.eps = eps;
    ASSERT_TRUE(backend_->rms_norm(a).is_ok());
    for (int64_t r = 0; r < rows; ++r) {
        double ss = 0.0;
        for (int64_t i = 0; i < width; ++i) ss += double(x[r * x_stride + i]) * x[r * x_stride + i];
        const double inv = 1.0 / std::sqrt(ss / width + eps);
        for (int64_t i = 0; i < width; ++i) {
            want.push_back(static_cast<float>(w.values[i] * (x[r * x_stride + i] * inv)));
            got.push_back(out[r * out_stride + i]);
        }
        EXPECT_EQ(out[r * out_stride + width], -7.0f) << "wrote past the row";
    }
    EXPECT_TRUE(test::within(test::compare<float>(got, want), test::tolerance("rms_norm", GetParam())));
}

TEST(DenseOps, MatmulHandComputedWithBias) {
    auto backend = make_cpu_backend(1);
    // x [2, 3] · W[2, 3]ᵀ + b: rows (1,2,3),(4,5,6); W rows (1,0,-1),(0.5,0.5,0.5); b (10, -1).
    const std::vector<float> x = {1, 2, 3, 4, 5, 6};
    const StoredTensor w = store_as(DType::kBF16, {1, 0, -1, 0.5f, 0.5f, 0.5f});
    const StoredTensor b = store_as(DType::kBF16, {10, -1});
    std::vector<float> y(4);
    MatmulArgs a;
    a.x = x.data();
    a.w = w.data();
    a.w_dtype = DType::kBF16;
    a.bias = b.data();
    a.bias_dtype = DType::kBF16;
    a.y = y.data();
    a.num_rows = 2;
    a.out_features = 2;
    a.in_features = 3;
    a.x_row_stride = 3;
    a.y_row_stride = 2;
    ASSERT_TRUE(backend->matmul(a).is_ok());
    EXPECT_EQ(y, (std::vector<float>{8.0f, 2.0f, 8.0f, 6.5f}));
}

TEST_P(DenseOpsTest, MatmulMatchesFormulaWithBiasAndStrides) {
    const int64_t T = 5, N = 37, K = 67, x_stride = 70, y_stride = 40;
    const std::vector<float> x = random_floats(T * x_stride, 3);
    const StoredTensor w = store_as(GetParam(), random_floats(N * K, 4));
    const StoredTensor b = store_as(GetParam(), random_floats(N, 5));
    std::vector<float> y(T * y_stride, -7.0f), got, want;
    MatmulArgs a;
    a.x = x.data();
    a.w = w.data();
    a.w_dtype = GetParam();
    a.bias = b.data();
    a.bias_dtype = GetParam();
    a.y = y.data();
    a.num_rows = T;
    a.out_features = N;
    a.in_features = K;
    a.x_row_stride = x_stride;
    a.y_row_stride = y_stride;
    ASSERT_TRUE(backend_->matmul(a).is_ok());
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t n = 0; n < N; ++n) {
            double acc = b.values[n];
            for (int64_t k = 0; k < K; ++k) acc += double(x[t * x_stride + k]) * w.values[n * K + k];
            want.push_back(static_cast<float>(acc));
            got.push_back(y[t * y_stride + n]);
        }
        EXPECT_EQ(y[t * y_stride + N], -7.0f) << "wrote past the row";
    }
    EXPECT_TRUE(test::within(test::compare<float>(got, want), test::tolerance("matmul", GetParam())));
}

TEST_P(DenseOpsTest, EmbeddingCopiesRowsExactly) {
    const int64_t V = 11, H = 13;
    const StoredTensor table = store_as(GetParam(), random_floats(V * H, 6));
    const std::vector<int32_t> ids = {3, 0, 10, 3};
    std::vector<float> out(ids.size() * H), want;
    EmbeddingArgs a;
    a.token_ids = ids.data();
    a.table = table.data();
    a.table_dtype = GetParam();
    a.out = out.data();
    a.num_tokens = static_cast<int64_t>(ids.size());
    a.vocab_size = V;
    a.hidden_size = H;
    ASSERT_TRUE(backend_->embedding(a).is_ok());
    for (int32_t id : ids)
        want.insert(want.end(), table.values.begin() + id * H, table.values.begin() + (id + 1) * H);
    EXPECT_EQ(out, want);
}

TEST(DenseOps, EmbeddingRejectsIdOutsideVocab) {
    auto backend = make_cpu_backend(1);
    const StoredTensor table = store_as(DType::kF32, random_floats(4 * 2, 7));
    std::vector<float> out(4);
    for (const int32_t bad : {4, -1}) {
        const std::vector<int32_t> ids = {1, bad};
        EmbeddingArgs a;
        a.token_ids = ids.data();
        a.table = table.data();
        a.table_dtype = DType::kF32;
        a.out = out.data();
        a.num_tokens = 2;
        a.vocab_size = 4;
        a.hidden_size = 2;
        const Status st = backend->embedding(a);
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(st.message().find(std::to_string(bad)), std::string::npos) << st.message();
    }
}

TEST(DenseOps, SiluMulAddAndSigmoidGatedMatchFormulas) {
    auto backend = make_cpu_backend(1);
    const int64_t T = 3, H = 29;
    const std::vector<float> g = random_floats(T * H, 8, -6.0f, 6.0f), u = random_floats(T * H, 9);
    const std::vector<float> gate = {-2.0f, 0.0f, 3.5f};
    std::vector<float> out(T * H), want(T * H);

    SiluMulArgs s;
    s.gate = g.data();
    s.up = u.data();
    s.out = out.data();
    s.num_elements = T * H;
    ASSERT_TRUE(backend->silu_mul(s).is_ok());
    for (int64_t i = 0; i < T * H; ++i)
        want[i] = static_cast<float>(g[i] / (1.0 + std::exp(-double(g[i]))) * u[i]);
    EXPECT_TRUE(test::within(test::compare<float>(out, want), test::tolerance("silu_mul", DType::kF32)));

    AddArgs add;
    add.a = g.data();
    add.b = u.data();
    add.out = out.data();
    add.num_elements = T * H;
    ASSERT_TRUE(backend->add(add).is_ok());
    for (int64_t i = 0; i < T * H; ++i) EXPECT_EQ(out[i], g[i] + u[i]);

    AddSigmoidGatedArgs gated;
    gated.a = g.data();
    gated.gate = gate.data();
    gated.b = u.data();
    gated.out = out.data();
    gated.num_rows = T;
    gated.width = H;
    ASSERT_TRUE(backend->add_sigmoid_gated(gated).is_ok());
    for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < H; ++i)
            want[t * H + i] =
                static_cast<float>(g[t * H + i] + u[t * H + i] / (1.0 + std::exp(-double(gate[t]))));
    EXPECT_TRUE(
        test::within(test::compare<float>(out, want), test::tolerance("add_sigmoid_gated", DType::kF32)));
    EXPECT_FLOAT_EQ(out[H], g[H] + 0.5f * u[H]);  // sigmoid(0) = 1/2
}

TEST(DenseOps, CastRoundsToNearestEvenAndWidensExactly) {
    auto backend = make_cpu_backend(1);
    // 1 + 2⁻⁸ is halfway between bf16 1 and 1 + 2⁻⁷ (ties to the even 1); 1 + 3·2⁻⁸ is halfway between
    // 1 + 2⁻⁷ and 1 + 2⁻⁶ (ties to the even 1 + 2⁻⁶); 1 + 2⁻⁸ + 2⁻¹⁶ is above halfway (up); the rest of 37
    // random values.
    std::vector<float> x = {1.0f, 0x1.01p0f, 0x1.03p0f, 0x1.0101p0f, -2.5f};
    const std::vector<uint16_t> hand = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020};
    const std::vector<float> r = random_floats(32, 17, -100.0f, 100.0f);
    x.insert(x.end(), r.begin(), r.end());
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<uint16_t> bf16(x.size(), 0xFFFF);
    ASSERT_TRUE(backend->cast({x.data(), DType::kF32, bf16.data(), DType::kBF16, n}).is_ok());
    for (size_t i = 0; i < hand.size(); ++i) EXPECT_EQ(bf16[i], hand[i]) << "value " << i;
    std::vector<float> back(x.size(), -1.0f);
    ASSERT_TRUE(backend->cast({bf16.data(), DType::kBF16, back.data(), DType::kF32, n}).is_ok());
    EXPECT_EQ(back[2], 1.015625f);
    for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(bf16[i], f32_to_bf16(x[i])) << "value " << i;
        EXPECT_LE(std::fabs(back[i] - x[i]), std::fabs(x[i]) * 0x1p-8f) << "value " << i;  // half a bf16 ulp
        uint32_t bits = 0;
        std::memcpy(&bits, &back[i], 4);
        EXPECT_EQ(bits, static_cast<uint32_t>(bf16[i]) << 16) << "value " << i;
    }

    const Status st = backend->cast({x.data(), DType::kF16, back.data(), DType::kF32, n});
    EXPECT_EQ(st.code(), StatusCode::kNotSupported);
    EXPECT_NE(st.message().find("F16 → F32"), std::string::npos) << st.message();
    EXPECT_EQ(backend->cast({x.data(), DType::kF32, nullptr, DType::kBF16, n}).code(), StatusCode::kInvalidArgument);
}

// Per-head matmuls in both weight layouts, on MLA's layouts: x heads inside tokens with padding (x_token_stride
// > B · x_batch_stride), y written token-major with a gap after each head's N and after each token.
TEST_P(DenseOpsTest, BatchedMatmulMatchesFormulaInBothLayouts) {
    const int64_t T = 3, B = 5, N = 7, K = 9;
    const int64_t x_batch_stride = 11, x_token_stride = B * x_batch_stride + 4;
    const int64_t y_batch_stride = N + 2, y_token_stride = B * y_batch_stride + 1, w_batch_stride = N * K + 6;
    const std::vector<float> x = random_floats(T * x_token_stride, 21);
    const StoredTensor w = store_as(GetParam(), random_floats(B * w_batch_stride, 22));
    for (const BatchedWeightLayout layout : {BatchedWeightLayout::kNK, BatchedWeightLayout::kKN}) {
        std::vector<float> y(T * y_token_stride, -7.0f), got, want;
        BatchedMatmulArgs a;
        a.x = x.data();
        a.w = w.data();
        a.w_dtype = GetParam();
        a.w_layout = layout;
        a.y = y.data();
        a.num_rows = T;
        a.num_batches = B;
        a.out_features = N;
        a.in_features = K;
        a.x_token_stride = x_token_stride;
        a.x_batch_stride = x_batch_stride;
        a.w_batch_stride = w_batch_stride;
        a.y_token_stride = y_token_stride;
        a.y_batch_stride = y_batch_stride;
        ASSERT_TRUE(backend_->batched_matmul(a).is_ok());
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t b = 0; b < B; ++b) {
                for (int64_t n = 0; n < N; ++n) {
                    double acc = 0.0;
                    for (int64_t k = 0; k < K; ++k) {
                        const int64_t wi = b * w_batch_stride + (layout == BatchedWeightLayout::kNK ? n * K + k : k * N + n);
                        acc += double(x[t * x_token_stride + b * x_batch_stride + k]) * w.values[wi];
                    }
                    want.push_back(static_cast<float>(acc));
                    got.push_back(y[t * y_token_stride + b * y_batch_stride + n]);
                }
                EXPECT_EQ(y[t * y_token_stride + b * y_batch_stride + N], -7.0f) << "wrote past a row";
            }
        }
        EXPECT_TRUE(test::within(test::compare<float>(got, want), test::tolerance("matmul", GetParam())))
            << (layout == BatchedWeightLayout::kNK ? "kNK" : "kKN");
    }
}

TEST(DenseOps, BatchedMatmulRefusesOverlappingOutputRows) {
    auto backend = make_cpu_backend(1);
    std::vector<float> buf(256);
    BatchedMatmulArgs a;
    a.x = a.y = buf.data();
    a.w = buf.data();
    a.w_dtype = DType::kF32;
    a.num_rows = 2;
    a.num_batches = 3;
    a.out_features = 4;
    a.in_features = 4;
    a.x_token_stride = 12;
    a.x_batch_stride = 4;
    a.w_batch_stride = 16;
    a.y_token_stride = 8;  // < 3 heads × 4: token 1's rows land on token 0's third head
    a.y_batch_stride = 4;
    Status st = backend->batched_matmul(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("y rows overlap"), std::string::npos) << st.message();
    a.y_token_stride = 12;
    a.w_batch_stride = 15;  // < N · K
    st = backend->batched_matmul(a);
    EXPECT_NE(st.message().find("w_batch_stride 15 is below 16"), std::string::npos) << st.message();
}

TEST(DenseOps, ChecksRejectBadArgumentsNamingTheField) {
    auto backend = make_cpu_backend(1);
    std::vector<float> buf(64);
    MatmulArgs m;
    m.x = m.y = buf.data();
    m.w = buf.data();
    m.w_dtype = DType::kF32;
    m.num_rows = 2;
    m.out_features = 4;
    m.in_features = 8;
    m.x_row_stride = 7;  // < K
    m.y_row_stride = 4;
    Status st = backend->matmul(m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("x_row_stride"), std::string::npos) << st.message();
    m.x_row_stride = 8;
    m.w_dtype = DType::kI32;
    EXPECT_EQ(backend->matmul(m).code(), StatusCode::kNotSupported);

    RmsNormArgs r;
    r.num_rows = 1;
    r.width = 0;
    st = backend->rms_norm(r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("width"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, DenseOpsTest, ::testing::ValuesIn(test::kWeightDtypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                             return std::string(dtype_name(info.param));
                         });

}  // namespace
}  // namespace epinfer
