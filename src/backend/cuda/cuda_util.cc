#include "backend/cuda/cuda_util.h"

#include <fmt/format.h>

namespace epinfer::cuda {

Status cuda_error_status(cudaError_t err, const char* statement, const char* file, int line) {
    return internal_error(fmt::format("CUDA error {} ({}) in '{}' at {}:{}", cudaGetErrorName(err),
                                      cudaGetErrorString(err), statement, file, line));
}

Status cuda_require_device() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error for later callers
        return not_supported(fmt::format("no CUDA GPU: {}", cudaGetErrorString(err)));
    }
    if (count == 0) return not_supported("no CUDA GPU: cudaGetDeviceCount found 0 devices");
    return Status::ok();
}

Result<CudaBuffer> CudaBuffer::alloc(size_t num_bytes) {
    CudaBuffer buffer;
    if (num_bytes == 0) return buffer;
    const cudaError_t err = cudaMalloc(&buffer.data_, num_bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return Status(StatusCode::kOutOfMemory,
                      fmt::format("cudaMalloc of {} bytes failed: {}", num_bytes, cudaGetErrorString(err)));
    }
    buffer.num_bytes_ = num_bytes;
    return buffer;
}

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& other) noexcept {
    if (this != &other) {
        reset();
        data_ = other.data_;
        num_bytes_ = other.num_bytes_;
        other.data_ = nullptr;
        other.num_bytes_ = 0;
    }
    return *this;
}

void CudaBuffer::reset() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    num_bytes_ = 0;
}

}  // namespace epinfer::cuda
