// The CUDA backend (backend/cuda/cuda_backend.h) against the CPU reference backend, op by op, on fresh random
// inputs with odd sizes (T = 1, 7, 33; widths 64, 72, 136; GQA 3:1 and 4:2; strided rows; paged K/V through
// a block table), every weight dtype, in-place variants, and the data-dependent errors reported by synchronize(). Bounds: tolerances.h
// rows "<op>_cuda". Each case prints "measured <op> <dtype> <case>: nmse .. max_rel .." for the record.
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/matmul_small_t.cuh"
#include "common/compare.h"
#include "cuda_test_util.h"

namespace epinfer::test {
namespace {

constexpr DType kWeightDtypes[] = {DType::kBF16, DType::kF16, DType::kF32};

// Values uniform in [−scale, scale) stored as `dtype` (bytes, host).
std::vector<uint8_t> random_weights(size_t n, uint32_t seed, float scale, DType dtype) {
    const std::vector<float> f = random_floats(n, seed, -scale, scale);
    std::vector<uint8_t> out(n * dtype_size(dtype));
    for (size_t i = 0; i < n; ++i) {
        if (dtype == DType::kF32) {
            std::memcpy(out.data() + 4 * i, &f[i], 4);
        } else {
            const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
            std::memcpy(out.data() + 2 * i, &h, 2);
        }
    }
    return out;
}

class CudaBackendTest : public CpuAndCudaTest {
protected:
    // A GPU buffer of n floats set to NaN, so unwritten outputs show.
    DeviceBuffer nan_gpu(size_t n) { return to_gpu(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN())); }
    // One query of one head (D = 64) over K/V rows of 128 floats (K, then V), contiguous (no block table).
    static AttentionArgs one_head_attention(const DeviceBuffer& q, const DeviceBuffer& kv, const DeviceBuffer& pos,
                                            const DeviceBuffer& out, int64_t num_kv_tokens) {
        AttentionArgs args;
        args.q = q.f32();
        args.k = kv.f32();
        args.v = kv.f32() + 64;
        args.positions = static_cast<const int32_t*>(pos.data());
        args.out = out.f32();
        args.num_tokens = 1;
        args.num_kv_tokens = num_kv_tokens;
        args.num_heads = args.num_kv_heads = 1;
        args.head_dim_qk = args.head_dim_v = 64;
        args.q_token_stride = args.q_head_stride = 64;
        args.k_token_stride = args.v_token_stride = 128;
        args.k_head_stride = args.v_head_stride = 64;
        args.out_token_stride = args.out_head_stride = 64;
        return args;
    }

    // Compares and prints the measured error; `op` names the tolerances.h row "<op>_cuda".
    void expect_close(const std::string& op, DType dtype, const std::string& what, const std::vector<float>& got,
                      const std::vector<float>& want) {
        const Diff d = compare<float>(got, want);
        std::printf("measured %s %s %s: nmse %.3g max_rel %.3g\n", op.c_str(), dtype_name(dtype), what.c_str(),
                    d.nmse, d.max_rel);
        EXPECT_TRUE(within(d, tolerance(op + "_cuda", dtype))) << op << " " << dtype_name(dtype) << " " << what;
    }

};

TEST_F(CudaBackendTest, MemoryCopiesRoundTrip) {
    const std::vector<float> host = random_floats(7 * 40, 11);
    DeviceBuffer a = to_gpu(host);
    DeviceBuffer b = nan_gpu(host.size());
    ASSERT_TRUE(gpu_->copy_on_device(b.data(), a.data(), host.size() * sizeof(float)).is_ok());
    EXPECT_EQ(from_gpu(b, host.size()), host);
    // Rows 0..6 of 33 floats from a pitch of 40 floats into a pitch of 35 floats.
    DeviceBuffer c = nan_gpu(7 * 35);
    ASSERT_TRUE(gpu_->copy_rows_on_device(c.data(), 35 * 4, a.data(), 40 * 4, 33 * 4, 7).is_ok());
    const std::vector<float> got = from_gpu(c, 7 * 35);
    for (int r = 0; r < 7; ++r) {
        for (int i = 0; i < 35; ++i) {
            if (i < 33) {
                EXPECT_EQ(got[r * 35 + i], host[r * 40 + i]) << r << "," << i;
            } else {
                EXPECT_TRUE(std::isnan(got[r * 35 + i])) << "pad " << r << "," << i << " was written";
            }
        }
    }
    EXPECT_FALSE(gpu_->copy_rows_on_device(c.data(), 8, a.data(), 40 * 4, 33 * 4, 1).is_ok());
    EXPECT_STREQ(gpu_->name(), "cuda");
    EXPECT_FALSE(gpu_->host_accessible());
}

TEST_F(CudaBackendTest, Embedding) {
    for (DType dtype : kWeightDtypes) {
        for (int64_t T : {1, 7, 33}) {
            for (int64_t H : {64, 72, 136}) {
                const int64_t V = 53;
                const std::vector<uint8_t> table = random_weights(V * H, 100 + T * H, 1.0f, dtype);
                std::vector<int32_t> ids(T);
                for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 37 + H) % V);
                std::vector<float> want(T * H);
                EmbeddingArgs args{ids.data(), table.data(), dtype, want.data(), T, V, H};
                ASSERT_TRUE(cpu_->embedding(args).is_ok());
                DeviceBuffer d_ids = to_gpu(ids), d_table = to_gpu(table), d_out = nan_gpu(T * H);
                args.token_ids = static_cast<const int32_t*>(d_ids.data());
                args.table = d_table.data();
                args.out = d_out.f32();
                ASSERT_TRUE(gpu_->embedding(args).is_ok());
                expect_close("embedding", dtype, fmt::format("T{} H{}", T, H), from_gpu(d_out, T * H), want);
            }
        }
    }
}

TEST_F(CudaBackendTest, EmbeddingBadTokenIdFailsAtSynchronize) {
    const std::vector<uint8_t> table = random_weights(10 * 64, 3, 1.0f, DType::kBF16);
    DeviceBuffer d_ids = to_gpu(std::vector<int32_t>{2, 10}), d_table = to_gpu(table), d_out = nan_gpu(2 * 64);
    EmbeddingArgs args{static_cast<const int32_t*>(d_ids.data()), d_table.data(), DType::kBF16, d_out.f32(), 2, 10, 64};
    ASSERT_TRUE(gpu_->embedding(args).is_ok());
    const Status synced = gpu_->synchronize();
    EXPECT_EQ(synced.code(), StatusCode::kInvalidArgument) << synced.message();
    EXPECT_TRUE(gpu_->synchronize().is_ok()) << "the error is reported once";
}

// Row padding 0 and 4 with W a multiple of 4 runs the register kernel (each of its 1, 2, 4, 8 float4 per
// thread; rows up to 8192), padding 3 and W = 8196 the general one.
TEST_F(CudaBackendTest, RmsNorm) {
    for (DType dtype : kWeightDtypes) {
        for (int64_t R : {1, 7, 33}) {
            for (int64_t W : {64, 72, 136, 256, 257, 2048, 4096, 7168, 8192, 8196}) {
                for (const int64_t pad : {0, 3, 4}) {
                    for (bool in_place : {false, true}) {
                        const int64_t x_stride = W + pad, out_stride = in_place ? x_stride : W + 2 * pad;
                        const std::vector<float> x = random_floats(R * x_stride, 200 + R * W, -2.0f, 2.0f);
                        const std::vector<uint8_t> weight = random_weights(W, 300 + W, 1.5f, dtype);
                        std::vector<float> want = in_place ? x : std::vector<float>(R * out_stride, 0.0f);
                        RmsNormArgs args{x.data(), weight.data(), dtype,      want.data(), R,
                                         W,        x_stride,      out_stride, 1e-5f};
                        ASSERT_TRUE(cpu_->rms_norm(args).is_ok());
                        DeviceBuffer d_x = to_gpu(x), d_w = to_gpu(weight);
                        DeviceBuffer d_out =
                            in_place ? DeviceBuffer() : to_gpu(std::vector<float>(R * out_stride, 0.0f));
                        args.x = d_x.f32();
                        args.weight = d_w.data();
                        args.out = in_place ? d_x.f32() : d_out.f32();
                        ASSERT_TRUE(gpu_->rms_norm(args).is_ok());
                        expect_close("rms_norm", dtype,
                                     fmt::format("R{} W{} pad {}{}", R, W, pad, in_place ? " in_place" : ""),
                                     from_gpu(in_place ? d_x : d_out, R * out_stride), want);
                    }
                }
            }
        }
    }
}

// The fused residual add (RmsNormArgs::residual, sum_out = x as the model runs it) against the CPU: the
// sums bit-equal (one fp32 add each), the normed rows within the rms_norm tolerance; both kernels (the
// register one for W a multiple of 4 and rows up to 8192, the general one for W = 257 and 8196).
TEST_F(CudaBackendTest, RmsNormWithResidual) {
    for (DType dtype : kWeightDtypes) {
        for (int64_t R : {1, 7, 33}) {
            for (int64_t W : {64, 257, 2048, 7168, 8196}) {
                const std::vector<float> x = random_floats(R * W, 700 + R * W, -2.0f, 2.0f);
                const std::vector<float> residual = random_floats(R * W, 800 + R * W, -2.0f, 2.0f);
                const std::vector<uint8_t> weight = random_weights(W, 900 + W, 1.5f, dtype);
                std::vector<float> want_sum = x, want(R * W, 0.0f);
                RmsNormArgs args{x.data(), weight.data(), dtype, want.data(), R, W, W, W, 1e-5f};
                args.x = want_sum.data();
                args.residual = residual.data();
                args.sum_out = want_sum.data();
                ASSERT_TRUE(cpu_->rms_norm(args).is_ok());
                DeviceBuffer d_x = to_gpu(x), d_res = to_gpu(residual), d_w = to_gpu(weight);
                DeviceBuffer d_out = nan_gpu(R * W);
                args.x = d_x.f32();
                args.residual = d_res.f32();
                args.sum_out = d_x.f32();
                args.weight = d_w.data();
                args.out = d_out.f32();
                ASSERT_TRUE(gpu_->rms_norm(args).is_ok());
                const std::string what = fmt::format("R{} W{}", R, W);
                EXPECT_EQ(from_gpu(d_x, R * W), want_sum) << what << ": sum_out";
                expect_close("rms_norm", dtype, what, from_gpu(d_out, R * W), want);
            }
        }
    }
}

// T ≤ 16 runs kernels/matmul_small_t.cuh (16-byte loads when W, x and the strides allow, else 4-byte
// loads; K split over 2 or 4 warps of a block for few rows and a long K: N 37 and 130 with K 2048, 4096,
// and K 512 from T = 5); T > 16 runs cuBLAS (BF16 weights with bf16-rounded activations: tolerance
// "matmul_cuda_bf16_activations"; F16/F32 weights in fp32).
TEST_F(CudaBackendTest, Matmul) {
    struct Shape {
        int64_t n, k;
    };
    for (DType dtype : kWeightDtypes) {
        for (int64_t T : {1, 2, 3, 5, 8, 13, 16, 17, 33, 100}) {
            for (Shape s : {Shape{64, 72}, Shape{136, 64}, Shape{72, 136}, Shape{257, 1001}, Shape{1031, 512},
                            Shape{37, 4096}, Shape{130, 2048}}) {
                for (int variant = 0; variant < 3; ++variant) {
                    const bool bias = variant == 1;
                    // 0: packed rows (the 16-byte path where K allows); 1, 2: strided rows (+5: 4-byte loads).
                    const int64_t x_stride = variant == 0 ? s.k : s.k + (variant == 1 ? 5 : 4);
                    const int64_t y_stride = variant == 0 ? s.n : s.n + 3;
                    const std::vector<float> x = random_floats(T * x_stride, 400 + T * s.n + s.k + variant);
                    const std::vector<uint8_t> w = random_weights(s.n * s.k, 500 + s.n, 0.1f, dtype);
                    const std::vector<uint8_t> b = random_weights(s.n, 600 + s.n, 0.5f, DType::kBF16);
                    std::vector<float> want(T * y_stride, 0.0f);
                    MatmulArgs args{x.data(), w.data(), dtype, bias ? b.data() : nullptr, DType::kBF16, want.data(),
                                    T, s.n, s.k, x_stride, y_stride};
                    ASSERT_TRUE(cpu_->matmul(args).is_ok());
                    DeviceBuffer d_x = to_gpu(x), d_w = to_gpu(w), d_b = to_gpu(b);
                    DeviceBuffer d_y = to_gpu(std::vector<float>(T * y_stride, 0.0f));
                    args.x = d_x.f32();
                    args.w = d_w.data();
                    args.bias = bias ? d_b.data() : nullptr;
                    args.y = d_y.f32();
                    ASSERT_TRUE(gpu_->matmul(args).is_ok());
                    const bool bf16_activations = T > 16 && dtype == DType::kBF16;
                    char what[96];
                    std::snprintf(what, sizeof(what), "T%lld N%lld K%lld x_stride%lld%s", static_cast<long long>(T),
                                  static_cast<long long>(s.n), static_cast<long long>(s.k),
                                  static_cast<long long>(x_stride), bias ? " bias" : "");
                    expect_close(bf16_activations ? "matmul_bf16_activations" : "matmul", dtype, what,
                                 from_gpu(d_y, T * y_stride), want);
                }
            }
        }
    }
}

// Rows of at least 7168 elements at 8 to 16 activation rows: f16 weights on the few-row kernel with two
// chunks in flight per lane (matmul_small_t.cu chunk_batch), K split over the warps (N 37) and not (N 8200, ≥
// 512 blocks); bf16 weights there up to cuda::kMatmulLongKMaxRows rows, on cuBLAS above.
TEST_F(CudaBackendTest, MatmulLongRows) {
    for (DType dtype : {DType::kBF16, DType::kF16}) {
        for (int64_t T : {8, 13, 16}) {
            for (int64_t n : {37, 8200}) {
                const int64_t k = 7176;
                const std::vector<float> x = random_floats(T * k, 700 + T * n);
                const std::vector<uint8_t> w = random_weights(n * k, 800 + n, 0.1f, dtype);
                std::vector<float> want(T * n, 0.0f);
                MatmulArgs args{x.data(), w.data(), dtype, nullptr, DType::kBF16, want.data(), T, n, k, k, n};
                ASSERT_TRUE(cpu_->matmul(args).is_ok());
                DeviceBuffer d_x = to_gpu(x), d_w = to_gpu(w), d_y = to_gpu(std::vector<float>(T * n, 0.0f));
                args.x = d_x.f32();
                args.w = d_w.data();
                args.y = d_y.f32();
                ASSERT_TRUE(gpu_->matmul(args).is_ok());
                // bf16 above cuda::kMatmulLongKMaxRows rows: cuBLAS, on bf16-rounded activations.
                const bool few_row = cuda::matmul_small_t_takes(T, k, dtype == DType::kBF16);
                expect_close(few_row ? "matmul" : "matmul_bf16_activations", dtype,
                             fmt::format("T{} N{} K{}", T, n, k), from_gpu(d_y, T * n), want);
            }
        }
    }
}

// matmul_group against the CPU: one launch of the few-row kernel for T ≤ 16 (entries of different N, one
// with a bias; K = 1001 takes the 4-byte path for the whole launch, K = 4096 splits K over the warps), the
// matmul of each entry above 16 rows or with mixed weight dtypes. Every output row of every entry is
// compared, and the padding between rows stays untouched.
TEST_F(CudaBackendTest, MatmulGroup) {
    for (DType dtype : kWeightDtypes) {
        for (int64_t T : {1, 2, 5, 16, 17}) {
            for (int64_t K : {136, 1001, 4096}) {
                for (bool mixed : {false, true}) {
                    const int64_t ns[] = {257, 64, 72};
                    const std::vector<float> x = random_floats(T * K, 1100 + T * K + mixed);
                    const std::vector<uint8_t> b = random_weights(257, 1200, 0.5f, DType::kBF16);
                    std::vector<std::vector<uint8_t>> w;
                    std::vector<std::vector<float>> want;
                    MatmulGroupArgs group;
                    for (int i = 0; i < 3; ++i) {
                        const DType wd = mixed && i == 2 ? DType::kF32 : dtype;
                        w.push_back(random_weights(ns[i] * K, 1300 + i + K, 0.1f, wd));
                        want.emplace_back(T * (ns[i] + 3), -5.0f);
                        group.matmuls[i] = MatmulArgs{x.data(),
                                                      w.back().data(),
                                                      wd,
                                                      i == 0 ? b.data() : nullptr,
                                                      DType::kBF16,
                                                      want.back().data(),
                                                      T,
                                                      ns[i],
                                                      K,
                                                      K,
                                                      ns[i] + 3};
                    }
                    group.num_matmuls = 3;
                    for (int i = 0; i < 3; ++i) group.matmuls[i].y = want[i].data();
                    ASSERT_TRUE(cpu_->matmul_group(group).is_ok());
                    DeviceBuffer d_x = to_gpu(x), d_b = to_gpu(b);
                    std::vector<DeviceBuffer> d_w, d_y;
                    for (int i = 0; i < 3; ++i) {
                        d_w.push_back(to_gpu(w[i]));
                        d_y.push_back(to_gpu(std::vector<float>(T * (ns[i] + 3), -5.0f)));
                        group.matmuls[i].x = d_x.f32();
                        group.matmuls[i].w = d_w.back().data();
                        group.matmuls[i].bias = i == 0 ? d_b.data() : nullptr;
                        group.matmuls[i].y = d_y.back().f32();
                    }
                    ASSERT_TRUE(gpu_->matmul_group(group).is_ok());
                    for (int i = 0; i < 3; ++i) {
                        const DType wd = group.matmuls[i].w_dtype;
                        const bool bf16_activations = T > 16 && wd == DType::kBF16;
                        expect_close(bf16_activations ? "matmul_bf16_activations" : "matmul", wd,
                                     fmt::format("group T{} K{} entry {}{}", T, K, i, mixed ? " mixed" : ""),
                                     from_gpu(d_y[i], T * (ns[i] + 3)), want[i]);
                    }
                }
            }
        }
    }
}

// matmul_group of stacked entries (MatmulGroupArgs: the weights one right after another in one buffer, the
// outputs adjacent column blocks of rows of one stride, biases stacked or none) against the CPU, which runs
// each entry: the few-row kernel up to 16 rows, one cuBLAS GEMM of the concatenated weights above. K = 1001
// leaves the second and third weights off 16-byte alignment. Every output block and the padding after the
// last one are compared.
TEST_F(CudaBackendTest, MatmulGroupStacked) {
    for (int64_t T : {1, 5, 17, 33, 256}) {
        for (int64_t K : {136, 1001}) {
            for (bool bias : {false, true}) {
                const int64_t ns[] = {257, 64, 72};
                const int64_t n_all = 257 + 64 + 72, stride = n_all + 3;
                const std::vector<float> x = random_floats(T * K, 1500 + T * K + bias);
                const std::vector<uint8_t> w = random_weights(n_all * K, 1600 + K, 0.1f, DType::kBF16);
                const std::vector<uint8_t> b = random_weights(n_all, 1700, 0.5f, DType::kBF16);
                std::vector<float> want(T * stride, -5.0f);
                MatmulGroupArgs group;
                group.num_matmuls = 3;
                int64_t n0 = 0;
                for (int i = 0; i < 3; ++i) {
                    group.matmuls[i] = MatmulArgs{x.data(),
                                                  w.data() + n0 * K * 2,
                                                  DType::kBF16,
                                                  bias ? b.data() + n0 * 2 : nullptr,
                                                  DType::kBF16,
                                                  want.data() + n0,
                                                  T,
                                                  ns[i],
                                                  K,
                                                  K,
                                                  stride};
                    n0 += ns[i];
                }
                ASSERT_TRUE(cpu_->matmul_group(group).is_ok());
                DeviceBuffer d_x = to_gpu(x), d_w = to_gpu(w), d_b = to_gpu(b);
                DeviceBuffer d_y = to_gpu(std::vector<float>(T * stride, -5.0f));
                n0 = 0;
                for (int i = 0; i < 3; ++i) {
                    group.matmuls[i].x = d_x.f32();
                    group.matmuls[i].w = static_cast<const uint8_t*>(d_w.data()) + n0 * K * 2;
                    group.matmuls[i].bias = bias ? static_cast<const uint8_t*>(d_b.data()) + n0 * 2 : nullptr;
                    group.matmuls[i].y = d_y.f32() + n0;
                    n0 += ns[i];
                }
                ASSERT_TRUE(gpu_->matmul_group(group).is_ok());
                const std::vector<float> got = from_gpu(d_y, T * stride);
                n0 = 0;
                for (int i = 0; i < 3; ++i) {
                    std::vector<float> got_i, want_i;
                    for (int64_t t = 0; t < T; ++t) {
                        got_i.insert(got_i.end(), got.begin() + t * stride + n0,
                                     got.begin() + t * stride + n0 + ns[i]);
                        want_i.insert(want_i.end(), want.begin() + t * stride + n0,
                                      want.begin() + t * stride + n0 + ns[i]);
                    }
                    expect_close(
                        T > 16 ? "matmul_bf16_activations" : "matmul", DType::kBF16,
                        fmt::format("stacked group T{} K{} entry {}{}", T, K, i, bias ? " bias" : ""), got_i,
                        want_i);
                    n0 += ns[i];
                }
                for (int64_t t = 0; t < T; ++t) {
                    for (int64_t j = n_all; j < stride; ++j)
                        ASSERT_EQ(got[t * stride + j], -5.0f) << "padding";
                }
            }
        }
    }
}

// Per-head matmuls (cuBLAS strided batched): BF16 weights with x rounded to bf16 (tolerance
// "matmul_bf16_activations"), F16/F32 weights in fp32 SGEMM; both weight layouts; odd sizes and MLA's
// shapes (W_UK absorption kKN, W_UV kNK) with x heads inside tokens, padded strides, T = 1 with no token
// stride.
TEST_F(CudaBackendTest, BatchedMatmul) {
    struct Shape {
        int64_t b, n, k;
        BatchedWeightLayout layout;
    };
    const Shape shapes[] = {{5, 7, 9, BatchedWeightLayout::kNK}, {5, 7, 9, BatchedWeightLayout::kKN},
                            {16, 512, 128, BatchedWeightLayout::kKN}, {16, 128, 512, BatchedWeightLayout::kNK}};
    for (DType dtype : kWeightDtypes) {
        for (int64_t T : {1, 3, 17, 64}) {
            for (const Shape& s : shapes) {
                const int64_t x_batch_stride = s.k + 3, x_token_stride = s.b * x_batch_stride + 2;
                const int64_t y_batch_stride = s.n + 1, y_token_stride = s.b * y_batch_stride + 5;
                const int64_t w_batch_stride = s.n * s.k + 8;
                const std::vector<float> x = random_floats(T * x_token_stride, 700 + T + s.n);
                const std::vector<uint8_t> w = random_weights(s.b * w_batch_stride, 800 + s.k, 0.1f, dtype);
                std::vector<float> want(T * y_token_stride, 0.0f);
                BatchedMatmulArgs args;
                args.x = x.data();
                args.w = w.data();
                args.w_dtype = dtype;
                args.w_layout = s.layout;
                args.y = want.data();
                args.num_rows = T;
                args.num_batches = s.b;
                args.out_features = s.n;
                args.in_features = s.k;
                args.x_token_stride = x_token_stride;
                args.x_batch_stride = x_batch_stride;
                args.w_batch_stride = w_batch_stride;
                args.y_token_stride = T == 1 ? 0 : y_token_stride;
                args.y_batch_stride = y_batch_stride;
                ASSERT_TRUE(cpu_->batched_matmul(args).is_ok());
                DeviceBuffer d_x = to_gpu(x), d_w = to_gpu(w), d_y = to_gpu(std::vector<float>(T * y_token_stride, 0.0f));
                args.x = d_x.f32();
                args.w = d_w.data();
                args.y = d_y.f32();
                const Status st = gpu_->batched_matmul(args);
                ASSERT_TRUE(st.is_ok()) << st.message();
                char what[96];
                std::snprintf(what, sizeof(what), "batched T%lld B%lld N%lld K%lld %s", static_cast<long long>(T),
                              static_cast<long long>(s.b), static_cast<long long>(s.n), static_cast<long long>(s.k),
                              s.layout == BatchedWeightLayout::kKN ? "kKN" : "kNK");
                expect_close(dtype == DType::kBF16 ? "matmul_bf16_activations" : "matmul", dtype, what,
                             from_gpu(d_y, T * y_token_stride), want);
            }
        }
    }
}

// The stream-ordered pool: a buffer freed while an op that reads it may still run is not handed out
// (and overwritten) before that op has run, and memory comes back 64-byte aligned.
TEST_F(CudaBackendTest, FreedBuffersAreReusedInStreamOrder) {
    const int64_t T = 64, N = 512, K = 2048;
    const std::vector<float> x = random_floats(T * K, 71);
    const std::vector<uint8_t> w = random_weights(N * K, 72, 0.05f, DType::kBF16);
    std::vector<float> want(T * N);
    MatmulArgs args{x.data(), w.data(), DType::kBF16, nullptr, DType::kBF16, want.data(), T, N, K, K, N};
    ASSERT_TRUE(cpu_->matmul(args).is_ok());
    DeviceBuffer d_w = to_gpu(w), d_y = to_gpu(std::vector<float>(T * N, 0.0f));
    for (int round = 0; round < 20; ++round) {
        DeviceBuffer d_x = to_gpu(x);
        args.x = d_x.f32();
        args.w = d_w.data();
        args.y = d_y.f32();
        ASSERT_TRUE(gpu_->matmul(args).is_ok());
        d_x.reset();  // freed right after the launch, before the matmul has run
        auto other = DeviceBuffer::alloc(*gpu_, x.size() * sizeof(float));
        ASSERT_TRUE(other.is_ok());
        EXPECT_EQ(reinterpret_cast<uintptr_t>(other->data()) % 64, 0u);
        // Ordered after the matmul on the backend's stream, even if it reuses d_x's memory.
        ASSERT_TRUE(gpu_->copy_to_device(other->data(), std::vector<float>(x.size(), 1e30f).data(),
                                         x.size() * sizeof(float)).is_ok());
        expect_close("matmul_bf16_activations", DType::kBF16, "pool round " + std::to_string(round),
                     from_gpu(d_y, T * N), want);
    }
}

// Heads fewer and more than the half-split kernel's head groups, and half a rotary dim past its block.
TEST_F(CudaBackendTest, Rope) {
    struct Shape {
        int64_t num_heads, rotary_dim;
    };
    for (const Shape shape : {Shape{3, 64}, Shape{32, 128}, Shape{5, 600}}) {
        const int64_t num_heads = shape.num_heads, rotary_dim = shape.rotary_dim, rot_offset = 8;
        const int64_t head_stride = rot_offset + rotary_dim, token_stride = num_heads * head_stride + 4;
        std::vector<float> inv_freq(rotary_dim / 2);
        for (int64_t i = 0; i < rotary_dim / 2; ++i)
            inv_freq[i] =
                1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
        for (int64_t T : {1, 7, 33}) {
            for (bool interleaved : {false, true}) {
                const std::vector<float> x = random_floats(T * token_stride, 700 + T + interleaved);
                std::vector<int32_t> positions(T);
                for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>((t * 977 + 13) % 5000);
                std::vector<float> want = x;
                RopeArgs args{want.data(), positions.data(), inv_freq.data(), 1.3f,
                              T,           num_heads,        token_stride,    head_stride,
                              rot_offset,  rotary_dim,       interleaved};
                ASSERT_TRUE(cpu_->rope(args).is_ok());
                DeviceBuffer d_x = to_gpu(x), d_pos = to_gpu(positions), d_freq = to_gpu(inv_freq);
                args.x = d_x.f32();
                args.positions = static_cast<const int32_t*>(d_pos.data());
                args.inv_freq = d_freq.f32();
                ASSERT_TRUE(gpu_->rope(args).is_ok());
                expect_close("rope", DType::kF32,
                             fmt::format("{} heads, d {}, T{} {}", num_heads, rotary_dim, T,
                                         interleaved ? "interleaved" : "half"),
                             from_gpu(d_x, T * token_stride), want);
            }
        }
    }
}

struct AttentionCase {
    int64_t tokens, kv_tokens, heads, kv_heads, dqk, dv;
};

TEST_F(CudaBackendTest, Attention) {
    const AttentionCase cases[] = {
        {1, 1, 3, 1, 64, 64},    {7, 7, 3, 1, 72, 72},      {33, 33, 3, 1, 136, 136}, {33, 40, 4, 2, 72, 64},
        {1, 517, 3, 1, 72, 72},  {7, 300, 6, 3, 136, 128},  {5, 9, 2, 2, 576, 512},
        // Groups of more than 8 query heads per KV head (several blocks per KV head), Dqk not a multiple of
        // 4 (scalar K loads), MLA's expanded shapes.
        {9, 20, 24, 2, 67, 50},  {3, 70, 16, 1, 128, 128},  {2, 40, 12, 1, 192, 128}, {4, 33, 40, 4, 128, 128},
    };
    for (const AttentionCase& c : cases) {
        // q packed [T, Nh, Dqk] with 2 floats of padding per token; k, v in one cache row [S, Nkv, Dqk + Dv].
        const int64_t q_tok = c.heads * c.dqk + 2, kv_tok = c.kv_heads * (c.dqk + c.dv);
        const int64_t out_tok = c.heads * c.dv + 1;
        const std::vector<float> q = random_floats(c.tokens * q_tok, 800 + c.tokens * c.dqk, -2.0f, 2.0f);
        const std::vector<float> kv = random_floats(c.kv_tokens * kv_tok, 900 + c.kv_tokens, -2.0f, 2.0f);
        std::vector<int32_t> positions(c.tokens);  // the last T of the S cached tokens
        for (int64_t t = 0; t < c.tokens; ++t) positions[t] = static_cast<int32_t>(c.kv_tokens - c.tokens + t);
        std::vector<float> want(c.tokens * out_tok, 0.0f);
        AttentionArgs args;
        args.q = q.data();
        args.k = kv.data();
        args.v = kv.data() + c.kv_heads * c.dqk;
        args.positions = positions.data();
        args.out = want.data();
        args.num_tokens = c.tokens;
        args.num_kv_tokens = c.kv_tokens;
        args.num_heads = c.heads;
        args.num_kv_heads = c.kv_heads;
        args.head_dim_qk = c.dqk;
        args.head_dim_v = c.dv;
        args.q_token_stride = q_tok;
        args.q_head_stride = c.dqk;
        args.k_token_stride = kv_tok;
        args.k_head_stride = c.dqk;
        args.v_token_stride = kv_tok;
        args.v_head_stride = c.dv;
        args.out_token_stride = out_tok;
        args.out_head_stride = c.dv;
        args.scale = 1.0f / std::sqrt(static_cast<float>(c.dqk));
        ASSERT_TRUE(cpu_->attention(args).is_ok());
        DeviceBuffer d_q = to_gpu(q), d_kv = to_gpu(kv), d_pos = to_gpu(positions);
        DeviceBuffer d_out = to_gpu(std::vector<float>(c.tokens * out_tok, 0.0f));
        args.q = d_q.f32();
        args.k = d_kv.f32();
        args.v = d_kv.f32() + c.kv_heads * c.dqk;
        args.positions = static_cast<const int32_t*>(d_pos.data());
        args.out = d_out.f32();
        ASSERT_TRUE(gpu_->attention(args).is_ok());
        expect_close("attention", DType::kF32,
                     fmt::format("T{} S{} heads{}/{} D{}/{}", c.tokens, c.kv_tokens, c.heads, c.kv_heads, c.dqk, c.dv),
                     from_gpu(d_out, c.tokens * out_tok), want);
    }
}

// Paged K/V: the cache rows of each case scattered over a pool of blocks (shuffled ids, block sizes 1, 16
// and more than S, unused pool rows NaN), read through a device block table, against the CPU backend on the
// same pool.
TEST_F(CudaBackendTest, AttentionPaged) {
    const AttentionCase cases[] = {{1, 1, 3, 1, 64, 64}, {7, 19, 4, 2, 72, 64}, {1, 517, 3, 1, 72, 72},
                                   {33, 40, 6, 3, 136, 128}, {5, 9, 2, 2, 576, 512}};
    for (const AttentionCase& c : cases) {
        for (const int64_t bs : {int64_t{1}, int64_t{16}, c.kv_tokens + 3}) {
            const int64_t kv_tok = c.kv_heads * (c.dqk + c.dv), out_tok = c.heads * c.dv;
            const int64_t used = (c.kv_tokens + bs - 1) / bs, num_blocks = 2 * used + 1;
            std::vector<int32_t> ids(num_blocks);
            for (int64_t b = 0; b < num_blocks; ++b) ids[b] = static_cast<int32_t>(b);
            std::shuffle(ids.begin(), ids.end(), std::mt19937(static_cast<uint32_t>(c.kv_tokens * 31 + bs)));
            const std::vector<int32_t> table(ids.begin(), ids.begin() + used);
            const std::vector<float> rows = random_floats(c.kv_tokens * kv_tok, 950 + c.kv_tokens, -2.0f, 2.0f);
            std::vector<float> pool(num_blocks * bs * kv_tok, std::numeric_limits<float>::quiet_NaN());
            for (int64_t s = 0; s < c.kv_tokens; ++s)
                std::copy_n(rows.begin() + s * kv_tok, kv_tok, pool.begin() + (table[s / bs] * bs + s % bs) * kv_tok);
            const std::vector<float> q = random_floats(c.tokens * c.heads * c.dqk, 850 + c.tokens, -2.0f, 2.0f);
            std::vector<int32_t> positions(c.tokens);
            for (int64_t t = 0; t < c.tokens; ++t) positions[t] = static_cast<int32_t>(c.kv_tokens - c.tokens + t);
            std::vector<float> want(c.tokens * out_tok, 0.0f);
            AttentionArgs args;
            args.q = q.data();
            args.k = pool.data();
            args.v = pool.data() + c.kv_heads * c.dqk;
            args.kv_block_tables = table.data();
            args.num_sequences = 1;
            args.block_table_stride = used;
            args.kv_block_size = bs;
            args.positions = positions.data();
            args.out = want.data();
            args.num_tokens = c.tokens;
            args.num_kv_tokens = c.kv_tokens;
            args.num_heads = c.heads;
            args.num_kv_heads = c.kv_heads;
            args.head_dim_qk = c.dqk;
            args.head_dim_v = c.dv;
            args.q_token_stride = c.heads * c.dqk;
            args.q_head_stride = c.dqk;
            args.k_token_stride = args.v_token_stride = kv_tok;
            args.k_head_stride = c.dqk;
            args.v_head_stride = c.dv;
            args.out_token_stride = out_tok;
            args.out_head_stride = c.dv;
            args.scale = 1.0f / std::sqrt(static_cast<float>(c.dqk));
            ASSERT_TRUE(cpu_->attention(args).is_ok());
            DeviceBuffer d_q = to_gpu(q), d_pool = to_gpu(pool), d_pos = to_gpu(positions), d_table = to_gpu(table);
            DeviceBuffer d_out = nan_gpu(c.tokens * out_tok);
            args.q = d_q.f32();
            args.k = d_pool.f32();
            args.v = d_pool.f32() + c.kv_heads * c.dqk;
            args.kv_block_tables = static_cast<const int32_t*>(d_table.data());
            args.positions = static_cast<const int32_t*>(d_pos.data());
            args.out = d_out.f32();
            ASSERT_TRUE(gpu_->attention(args).is_ok());
            expect_close("attention", DType::kF32,
                         "paged bs" + std::to_string(bs) + " T" + std::to_string(c.tokens) + " S" +
                             std::to_string(c.kv_tokens) + " D" + std::to_string(c.dqk) + "/" + std::to_string(c.dv),
                         from_gpu(d_out, c.tokens * out_tok), want);
        }
    }
}

// A batch of sequences in one call: decode rows and prefill chunks of different lengths, block tables
// padded with −1, one shared pool (unused rows NaN), GQA groups of 4 and 12; against the CPU backend.
TEST_F(CudaBackendTest, AttentionBatchOfSequences) {
    struct Shape {
        int64_t heads, kv_heads, d;
    };
    for (const Shape shape : {Shape{8, 2, 128}, Shape{24, 2, 64}, Shape{6, 3, 36}}) {
        const int64_t bs = 16, kv_tok = 2 * shape.kv_heads * shape.d, out_tok = shape.heads * shape.d;
        const std::vector<int64_t> cached = {0, 37, 5, 200, 16, 1};   // tokens already in each cache
        const std::vector<int64_t> new_rows = {9, 1, 1, 1, 20, 1};   // rows of this step
        const int64_t num_seqs = static_cast<int64_t>(cached.size());
        int64_t stride = 0, num_blocks = 0;
        for (int64_t s = 0; s < num_seqs; ++s) {
            stride = std::max(stride, (cached[s] + new_rows[s] + bs - 1) / bs);
            num_blocks += (cached[s] + new_rows[s] + bs - 1) / bs;
        }
        num_blocks += 3;  // blocks no table names
        std::vector<int32_t> ids(num_blocks);
        for (int64_t b = 0; b < num_blocks; ++b) ids[b] = static_cast<int32_t>(b);
        std::shuffle(ids.begin(), ids.end(), std::mt19937(static_cast<uint32_t>(shape.heads * 7 + shape.d)));
        std::vector<int32_t> tables(num_seqs * stride, -1), token_sequence, positions;
        std::vector<float> pool(num_blocks * bs * kv_tok, std::numeric_limits<float>::quiet_NaN());
        size_t next = 0;
        for (int64_t s = 0; s < num_seqs; ++s) {
            const int64_t S = cached[s] + new_rows[s];
            for (int64_t b = 0; b < (S + bs - 1) / bs; ++b) tables[s * stride + b] = ids[next++];
            const std::vector<float> rows = random_floats(S * kv_tok, static_cast<uint32_t>(970 + s), -2.0f, 2.0f);
            for (int64_t j = 0; j < S; ++j)
                std::copy_n(rows.begin() + j * kv_tok, kv_tok,
                            pool.begin() + (tables[s * stride + j / bs] * bs + j % bs) * kv_tok);
            for (int64_t i = 0; i < new_rows[s]; ++i) {
                token_sequence.push_back(static_cast<int32_t>(s));
                positions.push_back(static_cast<int32_t>(cached[s] + i));
            }
        }
        const int64_t T = static_cast<int64_t>(positions.size());
        const std::vector<float> q = random_floats(T * shape.heads * shape.d, 860, -2.0f, 2.0f);
        std::vector<float> want(T * out_tok, 0.0f);
        AttentionArgs args;
        args.q = q.data();
        args.k = pool.data();
        args.v = pool.data() + shape.kv_heads * shape.d;
        args.kv_block_tables = tables.data();
        args.token_sequence = token_sequence.data();
        args.num_sequences = num_seqs;
        args.block_table_stride = stride;
        args.kv_block_size = bs;
        args.positions = positions.data();
        args.out = want.data();
        args.num_tokens = T;
        args.num_kv_tokens = stride * bs;
        args.num_heads = shape.heads;
        args.num_kv_heads = shape.kv_heads;
        args.head_dim_qk = args.head_dim_v = shape.d;
        args.q_token_stride = shape.heads * shape.d;
        args.q_head_stride = args.k_head_stride = args.v_head_stride = args.out_head_stride = shape.d;
        args.k_token_stride = args.v_token_stride = kv_tok;
        args.out_token_stride = out_tok;
        args.scale = 1.0f / std::sqrt(static_cast<float>(shape.d));
        ASSERT_TRUE(cpu_->attention(args).is_ok());
        DeviceBuffer d_q = to_gpu(q), d_pool = to_gpu(pool), d_pos = to_gpu(positions), d_tables = to_gpu(tables);
        DeviceBuffer d_seq = to_gpu(token_sequence), d_out = nan_gpu(T * out_tok);
        args.q = d_q.f32();
        args.k = d_pool.f32();
        args.v = d_pool.f32() + shape.kv_heads * shape.d;
        args.kv_block_tables = static_cast<const int32_t*>(d_tables.data());
        args.token_sequence = static_cast<const int32_t*>(d_seq.data());
        args.positions = static_cast<const int32_t*>(d_pos.data());
        args.out = d_out.f32();
        ASSERT_TRUE(gpu_->attention(args).is_ok());
        expect_close("attention", DType::kF32,
                     fmt::format("batch heads{}/{} D{}", shape.heads, shape.kv_heads, shape.d),
                     from_gpu(d_out, T * out_tok), want);
    }
}

// kv_cache_store: the same pool bits as the CPU backend (strided rows, slots in any order, odd width);
// a slot outside the pool fails at synchronize.
TEST_F(CudaBackendTest, KvCacheStore) {
    const int64_t T = 37, width = 133, stride = 140, pool_rows = 101;
    const std::vector<float> src = random_floats(T * stride, 990);
    std::vector<int64_t> slots(pool_rows);
    for (int64_t i = 0; i < pool_rows; ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), std::mt19937(991));
    slots.resize(T);
    std::vector<float> want = random_floats(pool_rows * width, 992);
    DeviceBuffer d_src = to_gpu(src), d_pool = to_gpu(want), d_slots = to_gpu(slots);
    KvCacheStoreArgs args;
    args.src = src.data();
    args.pool = want.data();
    args.slot_mapping = slots.data();
    args.num_tokens = T;
    args.width = width;
    args.src_row_stride = stride;
    args.num_pool_rows = pool_rows;
    ASSERT_TRUE(cpu_->kv_cache_store(args).is_ok());
    args.src = d_src.f32();
    args.pool = d_pool.f32();
    args.slot_mapping = static_cast<const int64_t*>(d_slots.data());
    ASSERT_TRUE(gpu_->kv_cache_store(args).is_ok());
    ASSERT_TRUE(gpu_->synchronize().is_ok());
    EXPECT_EQ(from_gpu(d_pool, pool_rows * width), want);

    DeviceBuffer d_bad = to_gpu(std::vector<int64_t>{3, pool_rows});
    args.slot_mapping = static_cast<const int64_t*>(d_bad.data());
    args.num_tokens = 2;
    ASSERT_TRUE(gpu_->kv_cache_store(args).is_ok());
    const Status st = gpu_->synchronize();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("slot_mapping"), std::string::npos) << st.message();
}

// The fused GQA preparation against the CPU's six ops (Backend's default): q, k in place and the k/v pool
// rows, for head dims 16…256 (Qwen3 128/128, GLM-4.5's partial rotary 128/64, a tiny fixture's 16), with
// and without q/k norms, fp32 and bf16 pools, shuffled slots; interleaved RoPE takes the unfused path.
TEST_F(CudaBackendTest, QkNormRopeKvStore) {
    struct Shape {
        int64_t heads, kv_heads, head_dim, rotary_dim;
        bool interleaved;
    };
    const Shape shapes[] = {{4, 2, 128, 128, false}, {6, 2, 128, 64, false},  {3, 1, 16, 16, false},
                            {5, 5, 96, 32, false},   {2, 1, 256, 256, false}, {4, 2, 64, 64, true}};
    for (const Shape& s : shapes) {
        for (int64_t T : {1, 3, 17}) {
            for (DType pool_dtype : {DType::kF32, DType::kBF16}) {
                for (bool norms : {false, true}) {
                    const int64_t D = s.head_dim, q_n = T * s.heads * D, kv_n = T * s.kv_heads * D;
                    const int64_t pool_rows = T + 11, kv_row = s.kv_heads * D;
                    const uint32_t seed = static_cast<uint32_t>(T * 1000 + D + s.heads + norms);
                    const std::vector<float> q = random_floats(q_n, seed, -2.0f, 2.0f);
                    const std::vector<float> k = random_floats(kv_n, seed + 1, -2.0f, 2.0f);
                    const std::vector<float> v = random_floats(kv_n, seed + 2, -2.0f, 2.0f);
                    const std::vector<uint8_t> q_w = random_weights(D, seed + 3, 1.5f, DType::kBF16);
                    const std::vector<uint8_t> k_w = random_weights(D, seed + 4, 1.5f, DType::kBF16);
                    std::vector<float> inv_freq(s.rotary_dim / 2);
                    for (size_t i = 0; i < inv_freq.size(); ++i)
                        inv_freq[i] = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) /
                                                                static_cast<float>(s.rotary_dim));
                    std::vector<int32_t> positions(T);
                    for (int64_t t = 0; t < T; ++t)
                        positions[t] = static_cast<int32_t>((t * 977 + 4093) % 40000);
                    std::vector<int64_t> slots(pool_rows);
                    for (int64_t i = 0; i < pool_rows; ++i) slots[i] = i;
                    std::shuffle(slots.begin(), slots.end(), std::mt19937(seed));
                    slots.resize(T);
                    // Pools start as random bits of their dtype (rows not stored must stay as they were).
                    const size_t pool_bytes =
                        static_cast<size_t>(pool_rows * kv_row) * dtype_size(pool_dtype);
                    const std::vector<uint8_t> pool0 =
                        random_weights(pool_rows * kv_row, seed + 5, 1.0f, pool_dtype);
                    ASSERT_EQ(pool0.size(), pool_bytes);

                    std::vector<float> want_q = q, want_k = k;
                    std::vector<uint8_t> want_kp = pool0, want_vp = pool0;
                    QkNormRopeKvStoreArgs args;
                    args.q = want_q.data();
                    args.k = want_k.data();
                    args.v = v.data();
                    args.num_tokens = T;
                    args.num_heads = s.heads;
                    args.num_kv_heads = s.kv_heads;
                    args.head_dim = D;
                    args.q_norm = norms ? q_w.data() : nullptr;
                    args.k_norm = norms ? k_w.data() : nullptr;
                    args.norm_dtype = DType::kBF16;
                    args.norm_eps = 1e-6f;
                    args.positions = positions.data();
                    args.inv_freq = inv_freq.data();
                    args.attention_scaling = 1.1f;
                    args.rotary_dim = s.rotary_dim;
                    args.interleaved = s.interleaved;
                    args.k_pool = want_kp.data();
                    args.v_pool = want_vp.data();
                    args.pool_dtype = pool_dtype;
                    args.slot_mapping = slots.data();
                    args.num_pool_rows = pool_rows;
                    ASSERT_TRUE(cpu_->qk_norm_rope_kv_store(args).is_ok());

                    // The GPU reads q, k and v as column blocks of one [T, (Nh + 2·Nkv)·D + 3] buffer (the
                    // GQA layer's stacked projection output) where `stacked`, packed buffers otherwise.
                    const bool stacked = T != 3;
                    const int64_t q_row = s.heads * D, S = q_row + 2 * kv_row + 3;
                    std::vector<float> qkv(T * S, -7.0f);
                    for (int64_t t = 0; t < T; ++t) {
                        std::copy_n(q.begin() + t * q_row, q_row, qkv.begin() + t * S);
                        std::copy_n(k.begin() + t * kv_row, kv_row, qkv.begin() + t * S + q_row);
                        std::copy_n(v.begin() + t * kv_row, kv_row, qkv.begin() + t * S + q_row + kv_row);
                    }
                    DeviceBuffer d_qkv = to_gpu(qkv);
                    DeviceBuffer d_q = to_gpu(q), d_k = to_gpu(k), d_v = to_gpu(v), d_qw = to_gpu(q_w),
                                 d_kw = to_gpu(k_w), d_freq = to_gpu(inv_freq), d_pos = to_gpu(positions),
                                 d_slots = to_gpu(slots), d_kp = to_gpu(pool0), d_vp = to_gpu(pool0);
                    args.q = stacked ? d_qkv.f32() : d_q.f32();
                    args.k = stacked ? d_qkv.f32() + q_row : d_k.f32();
                    args.v = stacked ? d_qkv.f32() + q_row + kv_row : d_v.f32();
                    args.q_token_stride = args.k_token_stride = args.v_token_stride = stacked ? S : 0;
                    args.q_norm = norms ? d_qw.data() : nullptr;
                    args.k_norm = norms ? d_kw.data() : nullptr;
                    args.positions = static_cast<const int32_t*>(d_pos.data());
                    args.inv_freq = d_freq.f32();
                    args.k_pool = d_kp.data();
                    args.v_pool = d_vp.data();
                    args.slot_mapping = static_cast<const int64_t*>(d_slots.data());
                    ASSERT_TRUE(gpu_->qk_norm_rope_kv_store(args).is_ok());
                    const std::string what =
                        fmt::format("Nh {} Nkv {} D {} rot {}{} T{} pool {}{}{}", s.heads, s.kv_heads, D,
                                    s.rotary_dim, s.interleaved ? " interleaved" : "", T,
                                    dtype_name(pool_dtype), norms ? " norms" : "", stacked ? " stacked" : "");
                    std::vector<float> got_q = from_gpu(d_q, q_n), got_k = from_gpu(d_k, kv_n);
                    if (stacked) {
                        const std::vector<float> got = from_gpu(d_qkv, T * S);
                        for (int64_t t = 0; t < T; ++t) {
                            std::copy_n(got.begin() + t * S, q_row, got_q.begin() + t * q_row);
                            std::copy_n(got.begin() + t * S + q_row, kv_row, got_k.begin() + t * kv_row);
                            // v and the padding are only read
                            ASSERT_TRUE(std::equal(got.begin() + t * S + q_row + kv_row,
                                                   got.begin() + (t + 1) * S,
                                                   qkv.begin() + t * S + q_row + kv_row))
                                << what << " token " << t;
                        }
                    }
                    expect_close("qk_norm_rope_kv_store", DType::kF32, what + " q", got_q, want_q);
                    expect_close("qk_norm_rope_kv_store", DType::kF32, what + " k", got_k, want_k);
                    const auto pool_f32 = [&](const std::vector<uint8_t>& bytes) {
                        std::vector<float> out(static_cast<size_t>(pool_rows * kv_row));
                        for (size_t i = 0; i < out.size(); ++i) {
                            if (pool_dtype == DType::kF32) {
                                std::memcpy(&out[i], bytes.data() + 4 * i, 4);
                            } else {
                                uint16_t b;
                                std::memcpy(&b, bytes.data() + 2 * i, 2);
                                out[i] = bf16_to_f32(b);
                            }
                        }
                        return out;
                    };
                    for (const auto& [name, d_pool, want_pool] :
                         {std::tuple{"k pool", &d_kp, &want_kp}, std::tuple{"v pool", &d_vp, &want_vp}}) {
                        const std::vector<uint8_t> got = from_gpu<uint8_t>(*d_pool, pool_bytes);
                        expect_close("qk_norm_rope_kv_store", pool_dtype, what + " " + name, pool_f32(got),
                                     pool_f32(*want_pool));
                        for (int64_t r = 0; r < pool_rows; ++r) {  // rows no token stores are untouched
                            if (std::find(slots.begin(), slots.end(), r) != slots.end()) continue;
                            const size_t row_bytes = static_cast<size_t>(kv_row) * dtype_size(pool_dtype);
                            ASSERT_EQ(0, std::memcmp(got.data() + r * row_bytes, pool0.data() + r * row_bytes,
                                                     row_bytes))
                                << what << " " << name << " row " << r;
                        }
                    }
                }
            }
        }
    }
}

// A slot outside the pool: that token's k/v rows are skipped and synchronize() reports kv_cache_store's
// error.
TEST_F(CudaBackendTest, QkNormRopeKvStoreBadSlotFailsAtSynchronize) {
    const int64_t D = 128;
    DeviceBuffer d_q = to_gpu(random_floats(2 * D, 1)), d_k = to_gpu(random_floats(D, 2)),
                 d_v = to_gpu(random_floats(D, 3)), d_pos = to_gpu(std::vector<int32_t>{5}),
                 d_freq = to_gpu(std::vector<float>(D / 2, 0.01f)), d_slots = to_gpu(std::vector<int64_t>{4}),
                 d_kp = to_gpu(std::vector<float>(4 * D, 0.0f)),
                 d_vp = to_gpu(std::vector<float>(4 * D, 0.0f));
    QkNormRopeKvStoreArgs args;
    args.q = d_q.f32();
    args.k = d_k.f32();
    args.v = d_v.f32();
    args.num_tokens = 1;
    args.num_heads = 2;
    args.num_kv_heads = 1;
    args.head_dim = D;
    args.positions = static_cast<const int32_t*>(d_pos.data());
    args.inv_freq = d_freq.f32();
    args.rotary_dim = D;
    args.k_pool = d_kp.data();
    args.v_pool = d_vp.data();
    args.slot_mapping = static_cast<const int64_t*>(d_slots.data());
    args.num_pool_rows = 4;
    ASSERT_TRUE(gpu_->qk_norm_rope_kv_store(args).is_ok());
    const Status st = gpu_->synchronize();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("slot_mapping"), std::string::npos) << st.message();
    EXPECT_EQ(from_gpu(d_kp, 4 * D), std::vector<float>(4 * D, 0.0f));
}

TEST_F(CudaBackendTest, AttentionPagedNegativeBlockIdFailsAtSynchronize) {
    const std::vector<float> q = random_floats(64, 1), pool = random_floats(8 * 128, 2);
    DeviceBuffer d_q = to_gpu(q), d_pool = to_gpu(pool), d_pos = to_gpu(std::vector<int32_t>{5});
    DeviceBuffer d_table = to_gpu(std::vector<int32_t>{1, -1}), d_out = nan_gpu(64);
    AttentionArgs args = one_head_attention(d_q, d_pool, d_pos, d_out, 6);
    args.kv_block_tables = static_cast<const int32_t*>(d_table.data());
    args.num_sequences = 1;
    args.block_table_stride = 2;
    args.kv_block_size = 4;
    ASSERT_TRUE(gpu_->attention(args).is_ok());
    const Status st = gpu_->synchronize();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("block table entry"), std::string::npos) << st.message();
}

TEST_F(CudaBackendTest, AttentionBadPositionFailsAtSynchronize) {
    const std::vector<float> q = random_floats(64, 1), kv = random_floats(4 * 128, 2);
    DeviceBuffer d_q = to_gpu(q), d_kv = to_gpu(kv), d_pos = to_gpu(std::vector<int32_t>{4}), d_out = nan_gpu(64);
    const AttentionArgs args = one_head_attention(d_q, d_kv, d_pos, d_out, 4);  // position 4 of 4 rows
    ASSERT_TRUE(gpu_->attention(args).is_ok());
    EXPECT_EQ(gpu_->synchronize().code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, ElementwiseOps) {
    for (int64_t T : {1, 7, 33}) {
        for (int64_t H : {64, 72, 136}) {
            const int64_t n = T * H;
            const std::string what = fmt::format("T{} H{}", T, H);
            const std::vector<float> a = random_floats(n, 1000 + n, -6.0f, 6.0f);
            const std::vector<float> b = random_floats(n, 2000 + n, -3.0f, 3.0f);
            const std::vector<float> g = random_floats(T, 3000 + n, -4.0f, 4.0f);
            DeviceBuffer d_a = to_gpu(a), d_b = to_gpu(b), d_g = to_gpu(g), d_out = nan_gpu(n);

            std::vector<float> want(n);
            ASSERT_TRUE(cpu_->silu_mul(SiluMulArgs{a.data(), b.data(), want.data(), n}).is_ok());
            ASSERT_TRUE(gpu_->silu_mul(SiluMulArgs{d_a.f32(), d_b.f32(), d_out.f32(), n}).is_ok());
            expect_close("silu_mul", DType::kF32, what, from_gpu(d_out, n), want);

            ASSERT_TRUE(cpu_->add(AddArgs{a.data(), b.data(), want.data(), n}).is_ok());
            ASSERT_TRUE(gpu_->add(AddArgs{d_a.f32(), d_b.f32(), d_out.f32(), n}).is_ok());
            expect_close("add", DType::kF32, what, from_gpu(d_out, n), want);

            ASSERT_TRUE(cpu_->add_sigmoid_gated(AddSigmoidGatedArgs{a.data(), g.data(), b.data(), want.data(), T, H})
                            .is_ok());
            ASSERT_TRUE(
                gpu_->add_sigmoid_gated(AddSigmoidGatedArgs{d_a.f32(), d_g.f32(), d_b.f32(), d_out.f32(), T, H}).is_ok());
            expect_close("add_sigmoid_gated", DType::kF32, what, from_gpu(d_out, n), want);

            // In place (out == first input), the way the model updates its residual stream.
            ASSERT_TRUE(gpu_->silu_mul(SiluMulArgs{d_a.f32(), d_b.f32(), d_a.f32(), n}).is_ok());
            ASSERT_TRUE(cpu_->silu_mul(SiluMulArgs{a.data(), b.data(), want.data(), n}).is_ok());
            expect_close("silu_mul", DType::kF32, what + " in_place", from_gpu(d_a, n), want);
        }
    }
}

TEST_F(CudaBackendTest, CastMatchesTheCpuBitForBit) {
    for (int64_t n : {1, 37, 4099}) {
        // Ties first (1 + 2⁻⁸ and 1 + 3·2⁻⁸ round to even), then random values of several magnitudes.
        std::vector<float> x = random_floats(static_cast<size_t>(n), 5000 + static_cast<uint32_t>(n), -300.0f,
                                             300.0f);
        x[0] = 0x1.01p0f;
        if (n > 1) x[1] = 0x1.03p0f;
        DeviceBuffer d_x = to_gpu(x);
        auto d_bf16 = DeviceBuffer::alloc(*gpu_, static_cast<size_t>(n) * 2);
        ASSERT_TRUE(d_bf16.is_ok()) << d_bf16.status().message();
        std::vector<uint16_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
        ASSERT_TRUE(cpu_->cast({x.data(), DType::kF32, want.data(), DType::kBF16, n}).is_ok());
        ASSERT_TRUE(gpu_->cast({d_x.data(), DType::kF32, d_bf16->data(), DType::kBF16, n}).is_ok());
        ASSERT_TRUE(gpu_->synchronize().is_ok());
        ASSERT_TRUE(gpu_->copy_to_host(got.data(), d_bf16->data(), got.size() * 2).is_ok());
        EXPECT_EQ(got, want) << "F32 → BF16, n " << n;

        std::vector<float> back(static_cast<size_t>(n));
        ASSERT_TRUE(cpu_->cast({want.data(), DType::kBF16, back.data(), DType::kF32, n}).is_ok());
        DeviceBuffer d_back = nan_gpu(static_cast<size_t>(n));
        ASSERT_TRUE(gpu_->cast({d_bf16->data(), DType::kBF16, d_back.data(), DType::kF32, n}).is_ok());
        EXPECT_EQ(from_gpu(d_back, static_cast<size_t>(n)), back) << "BF16 → F32, n " << n;
    }
    EXPECT_EQ(gpu_->cast({nullptr, DType::kF16, nullptr, DType::kF32, 1}).code(), StatusCode::kNotSupported);
}

TEST_F(CudaBackendTest, MoeRouterTopk) {
    struct Case {
        int64_t tokens, experts, top_k;
        ScoringFunc scoring;
        TopkMethod method;
        int64_t n_group, topk_group;
        bool norm, bias;
    };
    const Case cases[] = {{33, 60, 8, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, true, false},
                          {7, 64, 6, ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 8, 3, true, true},
                          {1, 9, 9, ScoringFunc::kSoftmax, TopkMethod::kGreedy, 1, 1, false, false}};
    for (const Case& c : cases) {
        const std::vector<float> logits = random_floats(c.tokens * c.experts, 4000 + c.experts, -3.0f, 3.0f);
        const std::vector<float> bias = random_floats(c.experts, 5000 + c.experts, -0.1f, 0.1f);
        const size_t picks = static_cast<size_t>(c.tokens * c.top_k);
        MoeRouterTopkArgs args;
        args.num_tokens = c.tokens;
        args.num_experts = c.experts;
        args.top_k = c.top_k;
        args.scoring_func = c.scoring;
        args.topk_method = c.method;
        args.n_group = c.n_group;
        args.topk_group = c.topk_group;
        args.norm_topk_prob = c.norm;
        args.routed_scaling_factor = 2.5f;
        std::vector<int32_t> want_ids(picks);
        std::vector<float> want_weights(picks);
        MoeRouterTopkArgs cpu = args;
        cpu.router_logits = logits.data();
        cpu.e_score_correction_bias = c.bias ? bias.data() : nullptr;
        cpu.topk_ids = want_ids.data();
        cpu.topk_weights = want_weights.data();
        ASSERT_TRUE(cpu_->moe_router_topk(cpu).is_ok());
        DeviceBuffer d_logits = to_gpu(logits), d_bias = to_gpu(bias);
        DeviceBuffer d_ids = to_gpu(std::vector<int32_t>(picks, -7)), d_weights = nan_gpu(picks);
        args.router_logits = d_logits.f32();
        args.e_score_correction_bias = c.bias ? d_bias.f32() : nullptr;
        args.topk_ids = static_cast<int32_t*>(d_ids.data());
        args.topk_weights = d_weights.f32();
        ASSERT_TRUE(gpu_->moe_router_topk(args).is_ok());
        const std::vector<float> got_weights = from_gpu(d_weights, picks);
        std::vector<int32_t> got_ids(picks);
        ASSERT_TRUE(gpu_->copy_to_host(got_ids.data(), d_ids.data(), picks * sizeof(int32_t)).is_ok());
        EXPECT_EQ(got_ids, want_ids) << "E" << c.experts;
        EXPECT_TRUE(within(compare<float>(got_weights, want_weights), tolerance("moe_router_weights", DType::kF32)));
    }
}

TEST_F(CudaBackendTest, BadArgumentsAreRejectedBeforeLaunch) {
    MatmulArgs bad;
    bad.num_rows = 2;
    bad.out_features = 3;
    bad.in_features = 4;  // null pointers, zero strides
    EXPECT_EQ(gpu_->matmul(bad).code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(gpu_->synchronize().is_ok());
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
