// The activation rounding in front of the bf16 GEMMs (backend/cuda/kernels/dense_ops.cuh,
// launch_f32_rows_to_bf16) against the CPU reference's rounding (core/dtype.h f32_to_bf16, round to nearest
// even), bit for bit: fresh random rows plus values on and beside rounding ties, ±0, ±inf, subnormals and
// the largest finite floats, on the four-column path (columns, stride and base multiples of 4 floats) and on
// the one-value path (an odd column count, an odd stride, a base one float off 16 bytes), with padded
// strides.
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/kernels/dense_ops.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace epinfer::test {
namespace {

float from_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// Values whose rounding is easy to get wrong: ties to even in both directions, the float just past a tie,
// signed zeros, infinities, subnormals, the largest finite float (rounds to inf) and one that stays finite.
std::vector<float> edge_values() {
    return {from_bits(0x3F808000u),
            from_bits(0x3F818000u),
            from_bits(0x3F808001u),
            from_bits(0xBF808000u),
            0.0f,
            -0.0f,
            std::numeric_limits<float>::infinity(),
            -std::numeric_limits<float>::infinity(),
            from_bits(0x00000001u),
            from_bits(0x80400000u),
            std::numeric_limits<float>::max(),
            from_bits(0x7F7F7FFFu)};
}

struct RowsCase {
    int64_t rows, cols, stride, offset;  // offset: floats from a 256-byte-aligned base to row 0
};

TEST_F(CudaTest, F32RowsToBf16RoundsToNearestEven) {
    for (const RowsCase c :
         {RowsCase{5, 2048, 2048, 0}, RowsCase{3, 4096, 4100, 4}, RowsCase{7, 12, 16, 0},
          RowsCase{3, 7, 9, 0}, RowsCase{4, 8, 11, 0}, RowsCase{4, 8, 12, 1}, RowsCase{1, 1, 1, 0}}) {
        const std::string what = "rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) +
                                 " stride " + std::to_string(c.stride) + " offset " +
                                 std::to_string(c.offset);
        const size_t span = static_cast<size_t>(c.offset + (c.rows - 1) * c.stride + c.cols);
        std::vector<float> x = random_floats(span, static_cast<uint32_t>(span + c.cols), -3.0f, 3.0f);
        const std::vector<float> edges = edge_values();
        for (size_t i = 0; i < edges.size() && i < static_cast<size_t>(c.cols); ++i) {
            x[static_cast<size_t>(c.offset) + i] = edges[i];  // row 0
        }
        std::vector<uint16_t> want;
        for (int64_t r = 0; r < c.rows; ++r) {
            for (int64_t col = 0; col < c.cols; ++col)
                want.push_back(f32_to_bf16(x[c.offset + r * c.stride + col]));
        }
        cuda::CudaBuffer d_x = upload(x);
        cuda::CudaBuffer d_dst = poisoned<uint16_t>(want.size() + 4);  // 4 guard values past the rows
        ASSERT_EQ(cuda::launch_f32_rows_to_bf16(d_x.as<float>() + c.offset, c.stride, c.rows, c.cols,
                                                d_dst.data(), nullptr),
                  cudaSuccess)
            << what;
        const std::vector<uint16_t> got = download<uint16_t>(d_dst.data(), want.size() + 4);
        EXPECT_EQ(std::vector<uint16_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(want.size())),
                  want)
            << what;
        EXPECT_EQ(std::vector<uint16_t>(got.end() - 4, got.end()), std::vector<uint16_t>(4, 0x7f7f)) << what;
    }
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
