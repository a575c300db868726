// `epinfer bench moe`: one MoE layer on the GPU at a model's real shapes, with random bf16 weights, timed
// against the H200's speed of light, plus the ceilings this GPU actually reaches in the same run.
//
// Per (tokens T, routing): the layer (router top-k → permute → grouped gate_up/SwiGLU → grouped down →
// combine, + the shared expert) is captured in a CUDA graph and replayed `repeats` times, each replay
// timed with events after an L2 flush (a 512 MiB memset); the median is reported. A second graph times
// the routed experts alone (permute → grouped FFN → combine from fixed ids, no router, no shared expert):
// the work of bench/moe_peers.py's PyTorch paths. The router's input is fp32 logits made so that its top-K
// are the ids of moe_bench_routing() (the router GEMM x·W_gᵀ, a dense E×H GEMM, is not part of the step).
//   bytes  = distinct experts touched · 3·H·I·2 (+ the shared expert's 3·H·I·2)
//   FLOPs  = 2 · 3·H·I · (slots + T for the shared expert)
//   SOL    = max(bytes / 4.8 TB/s, FLOPs / 989 TFLOP/s) / time  (H200 datasheet: HBM3e, dense bf16)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/cuda_moe_layer.h"
#include "core/status.h"

namespace epinfer::cuda {

inline constexpr double kH200PeakBytesPerS = 4.8e12;
inline constexpr double kH200PeakBf16FlopsPerS = 989e12;

enum class MoeBenchRouting { kUniform, kZipf };
const char* moe_bench_routing_name(MoeBenchRouting routing);

// Routing of the benchmark, reproduced bit for bit by bench/moe_peers.py: splitmix64 seeded with
// seed·1000003 + 2·T + (zipf ? 1 : 0); expert weights 1 (uniform) or 1/(e + 1) (Zipf, s = 1); each token
// draws distinct experts from the cumulative weights (u = (next >> 11)·2⁻⁵³, first e with cum[e] > u·total),
// rejecting repeats. Group-limited routers (topk_group < n_group) first draw topk_group distinct groups
// from the group sums the same way and reject experts outside them.
// Returns ids [T, K] int32, each row in draw order.
std::vector<int32_t> moe_bench_routing(int64_t num_tokens, const CudaMoeLayerConfig& config,
                                       MoeBenchRouting routing, uint64_t seed);

struct MoeBenchShape {
    std::string name;          // e.g. "kimi_k2_instruct_0905"
    CudaMoeLayerConfig layer;  // max_tokens is set by the bench
};

struct MoeBenchOptions {
    std::vector<int64_t> tokens = {1, 8, 64, 256, 1024, 4096, 16384};
    std::vector<MoeBenchRouting> routings = {MoeBenchRouting::kUniform, MoeBenchRouting::kZipf};
    int repeats = 20;
    uint64_t seed = 1;
};

struct MoeBenchRow {
    std::string shape;
    MoeBenchRouting routing = MoeBenchRouting::kUniform;
    int64_t tokens = 0;
    int64_t experts_touched = 0;  // distinct routed experts with ≥ 1 slot
    double weight_bytes = 0;      // touched routed experts + shared expert
    double flops = 0;
    double time_us = 0;           // the whole layer, median
    int64_t graph_nodes = 0;      // nodes (kernels, memsets) of the whole layer's CUDA graph
    double routed_weight_bytes = 0;
    double routed_flops = 0;
    double routed_time_us = 0;    // routed experts only (the peers' work), median
    bool routing_exact = false;   // the router's ids equal moe_bench_routing()
    std::string routing_note;     // when not: how many tokens differ, and the first one
    std::string tiling;           // e.g. "narrow split 4/3"
};

struct MoeBenchCeilings {
    std::string gpu_name;
    int num_sms = 0;
    int driver_version = 0;   // cudaDriverGetVersion
    int runtime_version = 0;  // cudaRuntimeGetVersion
    double stream_read_bytes = 0;
    double stream_read_gbps = 0;  // median of 10 passes over the buffer
    int gemm_size = 0;            // M = N = K
    double gemm_tflops = 0;       // cuBLAS bf16 GEMM, fp32 accumulation, random data, median of 10
};

// Measures the two ceilings. Errors: kNotSupported without a GPU; CUDA/cuBLAS errors.
Result<MoeBenchCeilings> cuda_bench_ceilings();

// Runs every (tokens, routing) of `options` for one shape. Errors: kNotSupported without a GPU;
// kOutOfMemory when the weights do not fit; CUDA errors.
Result<std::vector<MoeBenchRow>> cuda_bench_moe(const MoeBenchShape& shape, const MoeBenchOptions& options);

}  // namespace epinfer::cuda
