// The GPU and its measured ceilings as `bench moe` and `bench attention` report them (CUDA builds only): the
// two header lines of the printed table, and the JSON fields both result files share.
#pragma once

#if EPINFER_WITH_CUDA
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "backend/cuda/moe_bench.h"

namespace epinfer::cli {

// "GPU …, driver …, CUDA runtime …" and "ceilings: read-only stream … of 4.8 TB/s; cuBLAS bf16 GEMM … of 989".
inline void print_bench_ceilings(const cuda::MoeBenchCeilings& c) {
    fmt::print("GPU {} ({} SMs), driver {}, CUDA runtime {}\n", c.gpu_name, c.num_sms, c.driver_version,
               c.runtime_version);
    fmt::print("ceilings: read-only stream (16-byte loads, {:.1f} GiB) {:.0f} GB/s = {:.2f} of 4.8 TB/s; "
               "cuBLAS bf16 GEMM {}^3 {:.0f} TFLOP/s = {:.2f} of 989\n",
               c.stream_read_bytes / (1ull << 30), c.stream_read_gbps, c.stream_read_gbps / 4800.0, c.gemm_size,
               c.gemm_tflops, c.gemm_tflops / 989.0);
}

// gpu, num_sms, driver_version, runtime_version, the H200 peaks SOL is taken against, and the ceilings.
inline nlohmann::json bench_ceilings_json(const cuda::MoeBenchCeilings& c) {
    return {{"gpu", c.gpu_name},
            {"num_sms", c.num_sms},
            {"driver_version", c.driver_version},
            {"runtime_version", c.runtime_version},
            {"peak_bytes_per_s", cuda::kH200PeakBytesPerS},
            {"peak_flops_per_s", cuda::kH200PeakBf16FlopsPerS},
            {"ceilings", {{"stream_read_bytes", c.stream_read_bytes},
                          {"stream_read_gbps", c.stream_read_gbps},
                          {"gemm_size", c.gemm_size},
                          {"gemm_tflops", c.gemm_tflops}}}};
}

}  // namespace epinfer::cli
#endif  // EPINFER_WITH_CUDA
