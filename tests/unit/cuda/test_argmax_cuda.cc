// The CUDA argmax op (backend/cuda/kernels/argmax.cuh) against the CPU reference backend on fresh random
// rows: odd vocabularies (1, 7, 1000, 151936), packed rows (so most rows start off a 16-byte boundary),
// padded strides, a misaligned base pointer, planted ties at the maximum, NaN, ±inf, all-NaN and all-equal
// rows, few rows split over clusters of blocks, more rows than the grid's blocks, and drawn rows with
// top-k / top-p floors. Ids, floors and non-finite flags must be exactly equal.
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/argmax.cuh"
#include "backend/gumbel_noise.h"
#include "cuda_test_util.h"

namespace epinfer::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Random rows of `vocab_size` values `row_stride` apart; row r gets the planting r % 10 selects.
std::vector<float> planted_rows(int64_t num_rows, int64_t vocab_size, int64_t row_stride, uint32_t seed) {
    std::vector<float> logits = random_floats(static_cast<size_t>(num_rows * row_stride), seed, -8.0f, 8.0f);
    std::mt19937 rng(seed + 1);
    std::uniform_int_distribution<int64_t> col(0, vocab_size - 1);
    for (int64_t r = 0; r < num_rows; ++r) {
        float* row = logits.data() + r * row_stride;
        switch (r % 10) {
            case 1:  // the maximum at up to four places (different threads and warps for large V)
                for (int k = 0; k < 4; ++k) row[col(rng)] = 9.0f;
                break;
            case 2:  // NaNs, one of them right before the maximum
                for (int k = 0; k < 3; ++k) row[col(rng)] = kNaN;
                break;
            case 3: row[col(rng)] = kInf; break;
            case 4:
                row[col(rng)] = -kInf;
                row[col(rng)] = kNaN;
                break;
            case 5:
                for (int64_t i = 0; i < vocab_size; ++i) row[i] = kNaN;
                break;
            case 6:  // all equal: index 0
                for (int64_t i = 0; i < vocab_size; ++i) row[i] = 1.5f;
                break;
            case 7:  // ties between +0 and −0 at the maximum
                for (int64_t i = 0; i < vocab_size; ++i) row[i] = -1.0f - static_cast<float>(i % 3);
                row[col(rng)] = -0.0f;
                row[col(rng)] = 0.0f;
                break;
            case 8:  // only −inf and NaN
                for (int64_t i = 0; i < vocab_size; ++i) row[i] = (i % 2 == 0) ? kNaN : -kInf;
                break;
            case 9:  // two +inf: the lower wins
                row[col(rng)] = kInf;
                row[col(rng)] = kInf;
                break;
            default: break;
        }
        // Padding that would win, or flag the row, if the kernel read it.
        for (int64_t i = vocab_size; i < row_stride; ++i) row[i] = (i % 2 == 0) ? 100.0f : kNaN;
    }
    return logits;
}

class ArgmaxCudaTest : public CpuAndCudaTest {
protected:
    // Runs both backends on R rows of `logits` starting `base_offset` floats into the buffer, and expects
    // exactly equal ids and flags. Returns the number of flagged rows.
    int64_t expect_same(const std::vector<float>& logits, int64_t base_offset, int64_t num_rows, int64_t vocab_size,
                        int64_t row_stride, const std::string& what) {
        std::vector<int32_t> want_ids(num_rows, -1), want_flags(num_rows, -1);
        ArgmaxArgs args;
        args.logits = logits.data() + base_offset;
        args.out_ids = want_ids.data();
        args.out_non_finite = want_flags.data();
        args.num_rows = num_rows;
        args.vocab_size = vocab_size;
        args.row_stride = row_stride;
        const Status on_cpu = cpu_->argmax(args);
        EXPECT_TRUE(on_cpu.is_ok()) << on_cpu.message();

        cuda::CudaBuffer d_logits = upload(logits);
        cuda::CudaBuffer d_ids = poisoned<int32_t>(num_rows), d_flags = poisoned<int32_t>(num_rows);
        args.logits = static_cast<const float*>(d_logits.data()) + base_offset;
        args.out_ids = static_cast<int32_t*>(d_ids.data());
        args.out_non_finite = static_cast<int32_t*>(d_flags.data());
        const Status on_gpu = gpu_->argmax(args);
        EXPECT_TRUE(on_gpu.is_ok()) << what << ": " << on_gpu.message();
        const Status synced = gpu_->synchronize();
        EXPECT_TRUE(synced.is_ok()) << what << ": " << synced.message();
        const std::vector<int32_t> got_ids = download<int32_t>(d_ids.data(), num_rows);
        const std::vector<int32_t> got_flags = download<int32_t>(d_flags.data(), num_rows);

        int64_t num_flagged = 0, num_mismatches = 0;
        for (int64_t r = 0; r < num_rows; ++r) {
            num_flagged += want_flags[r];
            if (got_ids[r] == want_ids[r] && got_flags[r] == want_flags[r]) continue;
            if (++num_mismatches <= 5) {
                ADD_FAILURE() << what << " row " << r << ": id " << got_ids[r] << " (cpu " << want_ids[r]
                              << "), non_finite " << got_flags[r] << " (cpu " << want_flags[r] << ")";
            }
        }
        EXPECT_EQ(num_mismatches, 0) << what;
        return num_flagged;
    }

};

TEST_F(ArgmaxCudaTest, MatchesCpuOnPlantedRows) {
    struct Shape {
        int64_t vocab_size, num_rows;
    };
    for (const Shape s : {Shape{1, 300}, Shape{7, 300}, Shape{1000, 300}, Shape{151936, 40}}) {
        const int64_t V = s.vocab_size, R = s.num_rows;
        // Packed rows (V odd: rows start at every alignment), a padded stride, and a 16-byte stride.
        for (const int64_t stride : {V, V + 3, (V + 3) / 4 * 4 + 4}) {
            for (const int64_t base_offset : {0, 1}) {
                const std::string what =
                    "V " + std::to_string(V) + " stride " + std::to_string(stride) + " base +" + std::to_string(base_offset);
                const std::vector<float> logits =
                    planted_rows(R, V, stride, static_cast<uint32_t>(V * 31 + stride * 7 + base_offset));
                std::vector<float> shifted(static_cast<size_t>(base_offset), 0.0f);
                shifted.insert(shifted.end(), logits.begin(), logits.end());
                const int64_t num_flagged = expect_same(shifted, base_offset, R, V, stride, what);
                EXPECT_GE(num_flagged, R / 10 * 4) << what;  // rows 3, 4, 5, 8 (mod 10) at least
            }
        }
    }
}

TEST_F(ArgmaxCudaTest, FewRowsSplitOverAClusterOfBlocks) {
    // 8 blocks per row while they fit one block per SM, then 2, then 1 (132 SMs: rows 16 and 66 are the
    // last).
    EXPECT_EQ(cuda::argmax_blocks_per_row(1, 132), 8);
    EXPECT_EQ(cuda::argmax_blocks_per_row(16, 132), 8);
    EXPECT_EQ(cuda::argmax_blocks_per_row(17, 132), 2);
    EXPECT_EQ(cuda::argmax_blocks_per_row(66, 132), 2);
    EXPECT_EQ(cuda::argmax_blocks_per_row(67, 132), 1);
    // Slices of one element or none (V < 8), slices that hold no whole float4, and each slice boundary
    // falling on every alignment (odd V, packed rows, base +1).
    for (const int64_t R : {1, 3, 8, 33, 50, 90}) {
        for (const int64_t V : {1, 7, 13, 37, 1000, 151936}) {
            if (V == 151936 && R > 8) continue;
            for (const int64_t base_offset : {0, 1}) {
                const std::string what = "R " + std::to_string(R) + " V " + std::to_string(V) + " base +" +
                                         std::to_string(base_offset);
                const std::vector<float> logits =
                    planted_rows(R, V, V, static_cast<uint32_t>(R * 1009 + V * 13 + base_offset));
                std::vector<float> shifted(static_cast<size_t>(base_offset), 0.0f);
                shifted.insert(shifted.end(), logits.begin(), logits.end());
                expect_same(shifted, base_offset, R, V, V, what);
            }
        }
    }
    // Ties across the cluster's blocks only: the maximum at the last slice's end and start, the end of the
    // third and the start of the fourth slice (8 slices of 18992 logits): the start of the fourth wins.
    const int64_t V = 151936, slice = V / 8;
    for (const int64_t R : {1, 5}) {
        std::vector<float> rows = random_floats(static_cast<size_t>(R * V), 11, -1.0f, 1.0f);
        for (int64_t r = 0; r < R; ++r) {
            for (const int64_t i : {V - 1, 7 * slice, 4 * slice - 1, 3 * slice}) rows[r * V + i] = 2.0f;
        }
        cuda::CudaBuffer d_rows = upload(rows), d_ids = poisoned<int32_t>(R), d_flags = poisoned<int32_t>(R);
        ArgmaxArgs args;
        args.logits = static_cast<const float*>(d_rows.data());
        args.out_ids = static_cast<int32_t*>(d_ids.data());
        args.out_non_finite = static_cast<int32_t*>(d_flags.data());
        args.num_rows = R;
        args.vocab_size = V;
        args.row_stride = V;
        ASSERT_TRUE(gpu_->argmax(args).is_ok());
        ASSERT_TRUE(gpu_->synchronize().is_ok());
        EXPECT_EQ(download<int32_t>(d_ids.data(), R),
                  std::vector<int32_t>(R, static_cast<int32_t>(3 * slice)));
        EXPECT_EQ(download<int32_t>(d_flags.data(), R), std::vector<int32_t>(R, 0));
    }
}

// Row r's draw: greedy, temperature only, top-k, top-p, or both, at a few temperatures; top_k from 1 to
// past V, top_p from tiny (one token) to nearly 1. Every 6th row greedy.
TokenDraw planted_draw(int64_t r, int64_t V) {
    TokenDraw d;
    if (r % 6 == 5) return d;
    d.noise_key = sampling_noise_key(1000 + static_cast<uint64_t>(r), 7);
    d.inv_temperature = r % 3 == 0 ? 1.0f : (r % 3 == 1 ? 0.5f : 3.3f);
    const int64_t ks[] = {0, 1, 2, 40, V - 1, V, V + 5};
    const float ps[] = {1.0f, 1e-6f, 0.3f, 0.9f, 0.95f, 0.9999f};
    if (r % 4 != 0) d.top_k = static_cast<int32_t>(std::max<int64_t>(0, ks[(r / 4) % 7]));
    if (r % 4 != 1) d.top_p = ps[(r / 3) % 6];
    return d;
}

TEST_F(ArgmaxCudaTest, DrawnRowsMatchTheCpuReference) {
    // Drawn rows (temperature, top-k, top-p; planted_draw) on one block per row, on clusters, and with
    // planted ties, NaN and ±inf: the floors (sampling_floor.cuh against cpu_sampling_floor) bit for bit,
    // and the same ids and flags as the CPU reference (the noise is computed in double on both sides, so
    // only a score tie within fp32 rounding could differ; a mismatch prints both scores).
    struct Shape {
        int64_t vocab_size, num_rows;
    };
    int64_t compared = 0, filtered = 0;
    for (const Shape sh : {Shape{7, 300}, Shape{1000, 90}, Shape{4099, 40}, Shape{151936, 1},
                           Shape{151936, 12}, Shape{151936, 40}}) {
        const int64_t V = sh.vocab_size, R = sh.num_rows;
        std::vector<float> logits = planted_rows(R, V, V, static_cast<uint32_t>(V + 17 * R));
        // Rows 10k: a peaked row (one logit far above, as a trained model's), ties right at a likely floor.
        for (int64_t r = 0; r < R; r += 10) {
            float* row = logits.data() + r * V;
            row[(r * 31) % V] = 20.0f;
            for (int64_t i = 0; i < V; i += 97) row[i] = 7.0f;
        }
        std::vector<TokenDraw> draws(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r) draws[static_cast<size_t>(r)] = planted_draw(r, V);
        std::vector<int32_t> want_ids(R, -1), want_flags(R, -1);
        std::vector<float> want_floor(R, 0.0f);
        ArgmaxArgs args;
        args.logits = logits.data();
        args.out_ids = want_ids.data();
        args.out_non_finite = want_flags.data();
        args.num_rows = R;
        args.vocab_size = V;
        args.row_stride = V;
        args.draws = draws.data();
        args.floor = want_floor.data();
        ASSERT_TRUE(cpu_->argmax(args).is_ok());

        cuda::CudaBuffer d_logits = upload(logits), d_draws = upload(draws);
        cuda::CudaBuffer d_ids = poisoned<int32_t>(R), d_flags = poisoned<int32_t>(R);
        cuda::CudaBuffer d_floor = poisoned<float>(R);
        args.logits = static_cast<const float*>(d_logits.data());
        args.out_ids = static_cast<int32_t*>(d_ids.data());
        args.out_non_finite = static_cast<int32_t*>(d_flags.data());
        args.draws = static_cast<const TokenDraw*>(d_draws.data());
        args.floor = static_cast<float*>(d_floor.data());
        ASSERT_TRUE(gpu_->argmax(args).is_ok());
        ASSERT_TRUE(gpu_->synchronize().is_ok());
        const std::vector<int32_t> got_ids = download<int32_t>(d_ids.data(), R);
        const std::vector<int32_t> got_flags = download<int32_t>(d_flags.data(), R);
        const std::vector<float> got_floor = download<float>(d_floor.data(), R);
        for (int64_t r = 0; r < R; ++r) {
            const TokenDraw& d = draws[static_cast<size_t>(r)];
            EXPECT_EQ(got_flags[r], want_flags[r]) << "V " << V << " row " << r;
            EXPECT_EQ(std::bit_cast<uint32_t>(got_floor[r]), std::bit_cast<uint32_t>(want_floor[r]))
                << "V " << V << " row " << r << " (top_k " << d.top_k << ", top_p " << d.top_p << ", 1/T "
                << d.inv_temperature << "): floor " << got_floor[r] << ", cpu " << want_floor[r];
            filtered += std::isfinite(want_floor[r]) ? 1 : 0;
            ++compared;
            if (got_ids[r] == want_ids[r]) continue;
            const auto score = [&](int32_t i) {
                const float l = logits[static_cast<size_t>(r * V + i)];
                return d.inv_temperature > 0.0f ? gumbel_score(l, d.inv_temperature, d.noise_key, i) : l;
            };
            ADD_FAILURE() << "V " << V << " row " << r << " (1/T " << d.inv_temperature << "): id "
                          << got_ids[r] << " (score " << score(got_ids[r]) << "), cpu " << want_ids[r]
                          << " (score " << score(want_ids[r]) << ")";
        }
    }
    EXPECT_GT(compared, 480);
    EXPECT_GT(filtered, 180);  // 201 rows have a finite floor: the filters were exercised
}

TEST_F(ArgmaxCudaTest, TiesAcrossWarpsGoToTheLowerIndex) {
    // One row of 151936: the maximum at indices read by different threads, warps and float4 lanes.
    const int64_t V = 151936;
    std::vector<float> row = random_floats(V, 5, -1.0f, 1.0f);
    for (const int64_t i : {151935, 70001, 4099, 515, 514}) row[i] = 2.0f;
    cuda::CudaBuffer d_row = upload(row), d_id = poisoned<int32_t>(1), d_flag = poisoned<int32_t>(1);
    ArgmaxArgs args;
    args.logits = static_cast<const float*>(d_row.data());
    args.out_ids = static_cast<int32_t*>(d_id.data());
    args.out_non_finite = static_cast<int32_t*>(d_flag.data());
    args.num_rows = 1;
    args.vocab_size = V;
    args.row_stride = V;
    ASSERT_TRUE(gpu_->argmax(args).is_ok());
    ASSERT_TRUE(gpu_->synchronize().is_ok());
    EXPECT_EQ(download<int32_t>(d_id.data(), 1), std::vector<int32_t>{514});
    EXPECT_EQ(download<int32_t>(d_flag.data(), 1), std::vector<int32_t>{0});
}

TEST_F(ArgmaxCudaTest, MoreRowsThanGridBlocks) {
    // V = 1 and V = 5 with more rows than the kernel's grid (65535·16 blocks): rows loop inside blocks.
    const int64_t R = 65535LL * 16 + 37;
    expect_same(planted_rows(R, 1, 1, 77), 0, R, 1, 1, "V 1, R " + std::to_string(R));
    expect_same(planted_rows(R, 5, 5, 78), 0, R, 5, 5, "V 5, R " + std::to_string(R));
}

TEST_F(ArgmaxCudaTest, ZeroRowsAndBadArguments) {
    ArgmaxArgs args;
    args.num_rows = 0;
    args.vocab_size = 8;
    args.row_stride = 8;
    EXPECT_TRUE(gpu_->argmax(args).is_ok());
    EXPECT_TRUE(gpu_->synchronize().is_ok());
    args.row_stride = 7;
    const Status st = gpu_->argmax(args);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find("row_stride 7 is below 8"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
