// Event timing of the GPU benchmarks (bench moe, bench attention): the median of repeated runs, each
// timed with CUDA events on one stream after an L2 flush. Host code.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "core/status.h"

namespace epinfer::cuda {

// The L2 flush of the benchmarks: a memset of this many bytes, > the H200's 60 MB L2 many times over.
inline constexpr size_t kBenchFlushBytes = size_t{512} << 20;

inline Status bench_run_status(cudaError_t err) {
    return err == cudaSuccess ? Status::ok() : cuda_error_status(err, "timed run", __FILE__, __LINE__);
}
inline Status bench_run_status(Status status) { return status; }

// Median in µs of `repeats` runs of `run` (a callable returning cudaError_t or Status that issues its work
// on `stream`), each between two events and after a memset of `flush` (none when `flush` is empty).
// Errors: the first failing run, memset or event call.
template <typename Run>
Result<double> bench_median_us(Run run, int repeats, const CudaBuffer& flush, cudaStream_t stream) {
    std::vector<cudaEvent_t> events(2 * static_cast<size_t>(repeats), nullptr);
    Status status = Status::ok();
    auto destroy = [&] {
        for (cudaEvent_t e : events)
            if (e) cudaEventDestroy(e);
    };
    for (cudaEvent_t& e : events) {
        if (cudaEventCreate(&e) != cudaSuccess) {
            destroy();
            return internal_error("cudaEventCreate failed");
        }
    }
    for (int r = 0; r < repeats && status.is_ok(); ++r) {
        cudaError_t err = flush.num_bytes() ? cudaMemsetAsync(flush.data(), r & 0xff, flush.num_bytes(), stream)
                                            : cudaSuccess;
        if (err == cudaSuccess) err = cudaEventRecord(events[2 * r], stream);
        if (err != cudaSuccess) {
            status = cuda_error_status(err, "timed run", __FILE__, __LINE__);
            break;
        }
        status = bench_run_status(run());
        if (status.is_ok()) {
            err = cudaEventRecord(events[2 * r + 1], stream);
            if (err != cudaSuccess) status = cuda_error_status(err, "timed run", __FILE__, __LINE__);
        }
    }
    std::vector<double> times_us;
    if (status.is_ok()) {
        const cudaError_t err = cudaStreamSynchronize(stream);
        if (err != cudaSuccess) status = cuda_error_status(err, "cudaStreamSynchronize", __FILE__, __LINE__);
    }
    for (int r = 0; r < repeats && status.is_ok(); ++r) {
        float ms = 0.0f;
        const cudaError_t err = cudaEventElapsedTime(&ms, events[2 * r], events[2 * r + 1]);
        if (err != cudaSuccess) status = cuda_error_status(err, "cudaEventElapsedTime", __FILE__, __LINE__);
        times_us.push_back(1000.0 * ms);
    }
    destroy();
    if (!status.is_ok()) return status;
    std::sort(times_us.begin(), times_us.end());
    const size_t n = times_us.size();
    return n % 2 ? times_us[n / 2] : 0.5 * (times_us[n / 2 - 1] + times_us[n / 2]);
}

}  // namespace epinfer::cuda
