// Helpers of the CUDA op tests: the GPU-or-skip fixture, seeded random host data, and device round trips.
// Every test of this folder derives from CudaTest, whose SetUp skips with the runtime's reason when
// there is no usable GPU (CI: "no CUDA GPU: CUDA driver version is insufficient for CUDA runtime version").
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "core/dtype.h"

namespace epinfer::test {

class CudaTest : public ::testing::Test {
protected:
    void SetUp() override {
        const Status gpu = cuda::cuda_require_device();
        if (!gpu.is_ok()) GTEST_SKIP() << gpu.message();
    }
};

// The CUDA backend under test and the CPU backend it is compared with (skipped without a GPU).
class CpuAndCudaTest : public CudaTest {
protected:
    void SetUp() override {
        CudaTest::SetUp();
        if (IsSkipped()) return;
        auto gpu = make_cuda_backend();
        ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
        gpu_ = std::move(gpu).value();
        cpu_ = make_cpu_backend(2);
    }

    // A device buffer of the GPU backend holding `host` (uploaded through copy_to_device).
    template <typename T>
    DeviceBuffer to_gpu(const std::vector<T>& host) {
        auto buffer = DeviceBuffer::alloc(*gpu_, host.size() * sizeof(T));
        EXPECT_TRUE(buffer.is_ok()) << buffer.status().message();
        if (!buffer.is_ok()) return DeviceBuffer();
        EXPECT_TRUE(gpu_->copy_to_device(buffer->data(), host.data(), host.size() * sizeof(T)).is_ok());
        return std::move(buffer).value();
    }
    // n elements of a GPU buffer, after synchronize() (which must succeed).
    template <typename T = float>
    std::vector<T> from_gpu(const DeviceBuffer& buffer, size_t n) {
        const Status synced = gpu_->synchronize();
        EXPECT_TRUE(synced.is_ok()) << synced.message();
        std::vector<T> host(n);
        EXPECT_TRUE(gpu_->copy_to_host(host.data(), buffer.data(), n * sizeof(T)).is_ok());
        return host;
    }

    std::unique_ptr<Backend> gpu_;
    std::unique_ptr<Backend> cpu_;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> out(n);
    for (float& v : out) v = dist(rng);
    return out;
}

// Random bf16 bit patterns of values uniform in [−scale, scale).
inline std::vector<uint16_t> random_bf16(size_t n, uint32_t seed, float scale) {
    std::vector<float> f = random_floats(n, seed, -scale, scale);
    std::vector<uint16_t> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(f[i]);
    return out;
}

inline float bf16_round(float v) {
    return bf16_to_f32(f32_to_bf16(v));
}

// Uploads a host vector into a new device buffer (fails the test on error).
template <typename T>
cuda::CudaBuffer upload(const std::vector<T>& host) {
    auto buffer = cuda::CudaBuffer::alloc(host.size() * sizeof(T));
    EXPECT_TRUE(buffer.is_ok()) << buffer.status().message();
    if (!buffer.is_ok() || host.empty()) return cuda::CudaBuffer();
    EXPECT_EQ(cudaMemcpy(buffer->data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // a pageable copy may still be in flight on return
    return std::move(buffer).value();
}

// Copies `count` elements of device memory to the host (after synchronising the device).
template <typename T>
std::vector<T> download(const void* device, size_t count) {
    std::vector<T> host(count);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (count > 0) {
        EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
}

// A device buffer of `count` elements filled with a poison byte, so unwritten outputs show.
template <typename T>
cuda::CudaBuffer poisoned(size_t count, int byte = 0x7f) {
    auto buffer = cuda::CudaBuffer::alloc(count * sizeof(T));
    EXPECT_TRUE(buffer.is_ok()) << buffer.status().message();
    if (!buffer.is_ok() || count == 0) return cuda::CudaBuffer();
    EXPECT_EQ(cudaMemset(buffer->data(), byte, count * sizeof(T)), cudaSuccess);
    // cudaMemset may return before it is done, and the backend's stream does not wait for the legacy one.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return std::move(buffer).value();
}

}  // namespace epinfer::test
