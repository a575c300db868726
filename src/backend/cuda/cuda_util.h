// Host-side CUDA helpers of the CUDA backend: CUDA errors as Status, the "is there a GPU" question, and an
// owning device buffer. Host code only; the kernels under kernels/ never include this (STYLE.md R2).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace epinfer::cuda {

// kInternal Status "CUDA error <name> (<text>) in '<statement>' at <file>:<line>".
Status cuda_error_status(cudaError_t err, const char* statement, const char* file, int line);

// Returns that Status from the enclosing function when `expr` (a cudaError_t) is not cudaSuccess.
#define EPI_CUDA_CHECK(expr)                                                                     \
    do {                                                                                         \
        const cudaError_t epi_cuda_err_ = (expr);                                                \
        if (epi_cuda_err_ != cudaSuccess)                                                        \
            return ::epinfer::cuda::cuda_error_status(epi_cuda_err_, #expr, __FILE__, __LINE__); \
    } while (0)

// OK when at least one CUDA device is usable. Any failure of cudaGetDeviceCount means "no GPU" (without a
// driver the runtime says "CUDA driver version is insufficient for CUDA runtime version"): kNotSupported
// "no CUDA GPU: <the runtime's reason>".
Status cuda_require_device();

// Device memory from cudaMalloc, freed on destruction. Move-only.
class CudaBuffer {
public:
    CudaBuffer() = default;
    // Errors: kOutOfMemory naming the size and the runtime's reason.
    static Result<CudaBuffer> alloc(size_t num_bytes);
    ~CudaBuffer() { reset(); }
    CudaBuffer(CudaBuffer&& other) noexcept { *this = static_cast<CudaBuffer&&>(other); }
    CudaBuffer& operator=(CudaBuffer&& other) noexcept;
    CudaBuffer(const CudaBuffer&) = delete;
    CudaBuffer& operator=(const CudaBuffer&) = delete;

    void* data() const { return data_; }
    template <typename T>
    T* as() const { return static_cast<T*>(data_); }
    size_t num_bytes() const { return num_bytes_; }
    void reset();

private:
    void* data_ = nullptr;
    size_t num_bytes_ = 0;
};

}  // namespace epinfer::cuda
