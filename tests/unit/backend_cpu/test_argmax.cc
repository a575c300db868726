// The CPU reference of the argmax op (backend op_args.h ArgmaxArgs): hand cases for ties, NaN, ±inf, ±0,
// strided rows and R = 0; argument errors naming the field; and agreement with the definition and the host
// sampler's argmax_token (engine/sampler.h) on seeded random rows with planted ties and non-finite values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "op_test_util.h"

namespace epinfer {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int32_t kPoison = -77;

struct ArgmaxResult {
    std::vector<int32_t> ids;
    std::vector<int32_t> non_finite;
};

class ArgmaxTest : public ::testing::Test {
protected:
    // Runs the op on `logits` viewed as R rows of V values, row_stride apart (R = size / row_stride).
    ArgmaxResult run(const std::vector<float>& logits, int64_t vocab_size, int64_t row_stride) {
        const int64_t num_rows = static_cast<int64_t>(logits.size()) / row_stride;
        ArgmaxResult result{std::vector<int32_t>(num_rows, kPoison), std::vector<int32_t>(num_rows, kPoison)};
        ArgmaxArgs a;
        a.logits = logits.data();
        a.out_ids = result.ids.data();
        a.out_non_finite = result.non_finite.data();
        a.num_rows = num_rows;
        a.vocab_size = vocab_size;
        a.row_stride = row_stride;
        const Status st = backend_->argmax(a);
        EXPECT_TRUE(st.is_ok()) << st.message();
        return result;
    }
    // One row of V = logits.size().
    ArgmaxResult run_row(const std::vector<float>& logits) {
        return run(logits, static_cast<int64_t>(logits.size()), static_cast<int64_t>(logits.size()));
    }

    std::unique_ptr<Backend> backend_ = make_cpu_backend(1);
};

TEST_F(ArgmaxTest, LargestValueWins) {
    const ArgmaxResult r = run_row({0.5f, -2.0f, 3.25f, 3.0f, -7.0f});
    EXPECT_EQ(r.ids, std::vector<int32_t>{2});
    EXPECT_EQ(r.non_finite, std::vector<int32_t>{0});
}

TEST_F(ArgmaxTest, TiesGoToTheLowerIndex) {
    EXPECT_EQ(run_row({1.0f, 4.0f, 2.0f, 4.0f, 4.0f}).ids, std::vector<int32_t>{1});
    EXPECT_EQ(run_row({-3.0f, -3.0f, -3.0f}).ids, std::vector<int32_t>{0});
    // +0 and −0 compare equal: the first of them wins whichever sign it has.
    EXPECT_EQ(run_row({-1.0f, -0.0f, 0.0f}).ids, std::vector<int32_t>{1});
    EXPECT_EQ(run_row({-1.0f, 0.0f, -0.0f}).ids, std::vector<int32_t>{1});
}

TEST_F(ArgmaxTest, NanNeverWinsAndIsFlagged) {
    const ArgmaxResult r = run_row({kNaN, 1.0f, kNaN, 2.0f, kNaN});
    EXPECT_EQ(r.ids, std::vector<int32_t>{3});
    EXPECT_EQ(r.non_finite, std::vector<int32_t>{1});
    // A NaN first is skipped rather than taken as the running best.
    EXPECT_EQ(run_row({kNaN, -5.0f}).ids, std::vector<int32_t>{1});
}

TEST_F(ArgmaxTest, AllNanRowGivesZero) {
    const ArgmaxResult r = run_row({kNaN, kNaN, kNaN});
    EXPECT_EQ(r.ids, std::vector<int32_t>{0});
    EXPECT_EQ(r.non_finite, std::vector<int32_t>{1});
}

TEST_F(ArgmaxTest, PlusInfWinsAndIsFlagged) {
    const ArgmaxResult r = run_row({1.0f, kInf, 3.0e38f, kInf});
    EXPECT_EQ(r.ids, std::vector<int32_t>{1});
    EXPECT_EQ(r.non_finite, std::vector<int32_t>{1});
}

TEST_F(ArgmaxTest, MinusInfIsFlaggedAndCanWinAlone) {
    const ArgmaxResult r = run_row({-kInf, -1.0f, -kInf});
    EXPECT_EQ(r.ids, std::vector<int32_t>{1});
    EXPECT_EQ(r.non_finite, std::vector<int32_t>{1});
    // Only −inf and NaN: −inf is a value, so the first −inf wins.
    EXPECT_EQ(run_row({kNaN, -kInf, -kInf}).ids, std::vector<int32_t>{1});
}

TEST_F(ArgmaxTest, FiniteExtremesAreNotFlagged) {
    const float max = std::numeric_limits<float>::max();
    const float denorm = std::numeric_limits<float>::denorm_min();
    const ArgmaxResult r = run_row({-max, denorm, max, 0.0f});
    EXPECT_EQ(r.ids, std::vector<int32_t>{2});
    EXPECT_EQ(r.non_finite, std::vector<int32_t>{0});
}

TEST_F(ArgmaxTest, SingleElementRows) {
    const ArgmaxResult r = run({-4.0f, kNaN, kInf}, 1, 1);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 0, 0}));
    EXPECT_EQ(r.non_finite, (std::vector<int32_t>{0, 1, 1}));
}

TEST_F(ArgmaxTest, StridedRowsIgnoreThePadding) {
    // 3 rows of V = 3, 5 apart; the padding holds values (and a NaN) that would win or flag if read.
    const std::vector<float> logits = {
        1.0f, 2.0f, 0.0f, 99.0f, kNaN,   //
        5.0f, 5.0f, 4.0f, kInf, 99.0f,   //
        -1.0f, kNaN, -2.0f, 99.0f, 99.0f,
    };
    const ArgmaxResult r = run(logits, 3, 5);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 0, 0}));
    EXPECT_EQ(r.non_finite, (std::vector<int32_t>{0, 0, 1}));
}

TEST_F(ArgmaxTest, ZeroRowsWritesNothing) {
    ArgmaxArgs a;
    a.num_rows = 0;
    a.vocab_size = 10;
    a.row_stride = 10;
    EXPECT_TRUE(backend_->argmax(a).is_ok());  // null pointers are fine with no rows
    std::vector<int32_t> ids = {kPoison}, flags = {kPoison};
    const std::vector<float> logits(10, 1.0f);
    a.logits = logits.data();
    a.out_ids = ids.data();
    a.out_non_finite = flags.data();
    EXPECT_TRUE(backend_->argmax(a).is_ok());
    EXPECT_EQ(ids[0], kPoison);
    EXPECT_EQ(flags[0], kPoison);
}

// The error of backend->argmax(a) must be kInvalidArgument mentioning `what`.
void expect_rejected(Backend& backend, const ArgmaxArgs& a, const std::string& what) {
    const Status st = backend.argmax(a);
    ASSERT_FALSE(st.is_ok()) << "accepted; expected an error about " << what;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find("argmax"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
}

TEST_F(ArgmaxTest, BadArgumentsAreRejectedWithTheField) {
    std::vector<float> logits(8, 0.0f);
    std::vector<int32_t> ids(2), flags(2);
    ArgmaxArgs good;
    good.logits = logits.data();
    good.out_ids = ids.data();
    good.out_non_finite = flags.data();
    good.num_rows = 2;
    good.vocab_size = 4;
    good.row_stride = 4;
    ASSERT_TRUE(backend_->argmax(good).is_ok());

    ArgmaxArgs a = good;
    a.num_rows = -1;
    expect_rejected(*backend_, a, "num_rows must be ≥ 0, got -1");
    a = good;
    a.vocab_size = 0;
    expect_rejected(*backend_, a, "vocab_size must be > 0, got 0");
    a = good;
    a.vocab_size = int64_t{1} << 31;
    a.row_stride = a.vocab_size;
    expect_rejected(*backend_, a, "vocab_size 2147483648");
    a = good;
    a.row_stride = 3;
    expect_rejected(*backend_, a, "row_stride 3 is below 4");
    const TokenDraw draws[2] = {};
    a = good;
    a.draws = draws;  // without the floor workspace
    expect_rejected(*backend_, a, "draws need the floor workspace");
    a = good;
    a.logits = nullptr;
    expect_rejected(*backend_, a, "logits is null");
    a = good;
    a.out_ids = nullptr;
    expect_rejected(*backend_, a, "out_ids is null");
    a = good;
    a.out_non_finite = nullptr;
    expect_rejected(*backend_, a, "out_non_finite is null");
}

// The definition read literally, apart from the op's code: the first index whose value no other non-NaN
// value exceeds (0 for an all-NaN row). O(V²).
int32_t brute_force_argmax(std::span<const float> row) {
    for (size_t i = 0; i < row.size(); ++i) {
        if (std::isnan(row[i])) continue;
        bool beaten = false;
        for (const float v : row) beaten |= v > row[i];
        if (!beaten) return static_cast<int32_t>(i);
    }
    return 0;
}

// Seeded random rows with planted ties at the maximum, NaN, and ±inf, against the definition and the host
// sampler's argmax_token row by row.
TEST_F(ArgmaxTest, MatchesTheDefinitionOnRandomRows) {
    std::mt19937 rng(20240611);
    for (const int64_t V : {1, 2, 7, 33, 1000}) {
        const int64_t stride = V + 3, rows = 64;
        std::vector<float> logits = test::random_floats(static_cast<size_t>(rows * stride), static_cast<uint32_t>(V));
        std::uniform_int_distribution<int64_t> col(0, V - 1);
        int64_t num_flagged = 0;
        for (int64_t r = 0; r < rows; ++r) {
            float* row = logits.data() + r * stride;
            switch (r % 8) {
                case 1:  // the maximum planted at two or three places
                    for (int k = 0; k < 3; ++k) row[col(rng)] = 2.0f;
                    break;
                case 2: row[col(rng)] = kNaN; break;
                case 3: row[col(rng)] = kInf; break;
                case 4: row[col(rng)] = -kInf; break;
                case 5:  // all NaN
                    for (int64_t i = 0; i < V; ++i) row[i] = kNaN;
                    break;
                case 6:  // all equal
                    for (int64_t i = 0; i < V; ++i) row[i] = -0.5f;
                    break;
                case 7:  // a NaN and a tie at the maximum
                    row[col(rng)] = kNaN;
                    row[col(rng)] = 3.0f;
                    row[col(rng)] = 3.0f;
                    break;
                default: break;
            }
        }
        const ArgmaxResult got = run(logits, V, stride);
        for (int64_t r = 0; r < rows; ++r) {
            const std::span<const float> row(logits.data() + r * stride, static_cast<size_t>(V));
            bool non_finite = false;
            for (const float v : row) non_finite |= !std::isfinite(v);
            num_flagged += non_finite;
            EXPECT_EQ(got.ids[r], brute_force_argmax(row)) << "V " << V << " row " << r;
            EXPECT_EQ(got.ids[r], argmax_token(row)) << "V " << V << " row " << r;
            EXPECT_EQ(got.non_finite[r], non_finite ? 1 : 0) << "V " << V << " row " << r;
        }
        EXPECT_GE(num_flagged, rows / 8 * 4) << "V " << V;  // the planted NaN, +inf, −inf and all-NaN rows
    }
}

}  // namespace
}  // namespace epinfer
