// Whether this binary can test the GPU at all: with CUDA built in, the device query (skipped, with the
// runtime's reason, where there is no GPU); without it, one skipped test that says so.
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include "cuda_test_util.h"

namespace epinfer::test {
namespace {

TEST_F(CudaTest, DeviceIsUsable) {
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    EXPECT_GE(count, 1);
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    RecordProperty("gpu", prop.name);
    EXPECT_GE(prop.major, 8) << "the MoE kernels need sm_80 or newer (mma.sync bf16, cp.async)";
}

}  // namespace
}  // namespace epinfer::test
#else
TEST(CudaBackend, NotBuilt) {
    GTEST_SKIP() << "epinfer was configured without the CUDA backend (-DEPINFER_CUDA=ON builds these tests)";
}
#endif
