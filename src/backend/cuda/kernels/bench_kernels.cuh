// Kernels of the benchmarks: the memory-bandwidth ceiling (a read-only stream of 16-byte loads) and a
// random bf16 or fp32 fill for weights, activations and KV caches. Framework-free (STYLE.md R2).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace epinfer::cuda {

struct StreamReadArgs {
    const void* data = nullptr;  // [num_bytes] device, 16-byte aligned
    size_t num_bytes = 0;        // a multiple of 16
    uint32_t* sink = nullptr;    // [1] device: written only when the XOR of everything read hits a magic value
    int num_sms = 1;             // grid = num_sms × 4 blocks of 512 threads
};

// Reads every byte once with 16-byte loads (4 in flight per thread). Errors: cudaErrorInvalidValue when
// num_bytes is not a multiple of 16.
cudaError_t launch_stream_read(const StreamReadArgs& args, cudaStream_t stream);

struct FillRandomArgs {
    void* data = nullptr;  // [count] bf16 or fp32 (by the launch below), device
    int64_t count = 0;
    uint64_t seed = 0;
    float scale = 1.0f;  // values uniform in [−scale, scale), from a counter-based hash of (seed, index)
};

cudaError_t launch_fill_random_bf16(const FillRandomArgs& args, cudaStream_t stream);
cudaError_t launch_fill_random_f32(const FillRandomArgs& args, cudaStream_t stream);

}  // namespace epinfer::cuda
