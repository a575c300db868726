// Calibration: turning `epinfer bench comm` / `epinfer bench moe` measurements into a hardware profile
// (docs/planner.md §1, "Calibration"), so that `epinfer plan --hardware measured.json` uses the user's own
// figures instead of datasheet ones.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "planner/hardware_profile.h"

namespace epinfer::planner {

// time_us = latency_us + bytes / (bandwidth_gbps · 1e3): bandwidth in GB/s (1e9 B/s) of the size as given
// (for a collective: the nccl-tests algbw; × the bus factor f(n) gives busbw).
struct LatencyBandwidthFit {
    double latency_us = 0.0;
    double bandwidth_gbps = 0.0;
};

// Least squares of time = latency + bytes / bandwidth over `points` [(bytes, time_us)], with latency ≥ 0:
// the ordinary fit when its intercept is ≥ 0, else the fit through the origin (latency 0).
// Errors: kInvalidArgument when fewer than two distinct sizes are given, a value is not finite and > 0,
// or the best fit has no positive slope (times do not grow with size: bandwidth not resolved).
// Example: (1000, 12), (2000, 14), (4000, 18) → latency 10 µs, 1000 B per 2 µs = 0.5 GB/s.
Result<LatencyBandwidthFit> fit_latency_bandwidth(const std::vector<std::pair<double, double>>& points);

// One MoE layer time of `epinfer bench moe` (its "layer µs" column) with the work it did.
struct MeasuredMoeLayer {
    int64_t tokens = 0;
    double weight_bytes = 0.0;  // distinct experts touched × bytes of one expert (the bench's "weight GB")
    double flops = 0.0;         // 2 · expert params · T · K (the bench's "GFLOP")
    double time_us = 0.0;
    int64_t kernels = 0;           // nodes (kernels, memsets) of the layer's CUDA graph; 0: not counted
    double rows_per_expert = 0.0;  // T·K / distinct experts touched (pairs per touched expert); 0: unknown
};

// What the engine's own kernels reach, from MoE layer times (gpu.memory_efficiency,
// gpu.expert_matmul_efficiency; gpu.kernel_latency_us with engine_kernel_latency_us).
struct MoeLayerFit {
    double latency_us = 0.0;      // the layer's fixed time (its chain of kernels)
    double bandwidth_gbps = 0.0;  // the rate its kernels stream weights at
    double expert_tflops = 0.0;   // the grouped GEMMs' rate at compute_bound_tokens
};

// fit_latency_bandwidth over (weight_bytes, time_us) of the layers with tokens ≤ max_memory_bound_tokens;
// then expert_tflops = flops / (time − latency) of the layer with tokens == compute_bound_tokens.
// Example (docs/benchmarks/moe_h200.md, Qwen3-30B-A3B, uniform): T 1, 8, 64, 256 → 59.96 µs + bytes at
// 3814.6 GB/s; T 1024: 77.3 GFLOP in 515.0 − 59.96 µs = 169.9 TFLOP/s.
// Errors: kInvalidArgument as fit_latency_bandwidth, or when no layer has compute_bound_tokens or its
// time is not above the latency.
Result<MoeLayerFit> fit_moe_layers(const std::vector<MeasuredMoeLayer>& layers,
                                   int64_t max_memory_bound_tokens, int64_t compute_bound_tokens);

// The sizes the engine fit of `epinfer bench moe --profile-out` takes: memory-bound up to 256 tokens, the
// grouped GEMMs' rate at 1024 (docs/benchmarks/moe_h200.md: Qwen3-30B-A3B is compute-bound there).
inline constexpr int64_t kMoeFitMaxMemoryBoundTokens = 256;
inline constexpr int64_t kMoeFitComputeBoundTokens = 1024;

// The GPU figures of the engine's own kernels from one shape's MoE layers.
struct MoeEngineFit {
    MoeLayerFit layers;   // fit_moe_layers(·, kMoeFitMaxMemoryBoundTokens, kMoeFitComputeBoundTokens)
    int64_t tokens = 0;   // the fitted layer with the fewest tokens ...
    int64_t kernels = 0;  // ... and its graph nodes
    double kernel_latency_us = 0.0;  // layers.latency_us / kernels − graph_kernel_us
};

// fit_moe_layers over T ≤ 256 and T = 1024, then a kernel's latency: the fitted latency is the fixed time of
// the layer's chain of graph nodes, each costing graph_kernel_us + kernel_latency_us in the cost model, so
// kernel_latency_us = latency / kernels − graph_kernel_us. The chain is that of the fitted layer with the
// fewest tokens (the intercept is the time at few bytes: the decode chain); the layer's node count can grow
// with T (Qwen3-30B-A3B, CUDA 13: 4 nodes at one token, pick mode launching no permute, 5 up to 128 tokens,
// 8 at 256 where the permute sorts with CUB, 13 at 1024), which the sources written by
// calibrated_profile_json list.
// Example (2026-11-29, a 7-node chain): 59.96 µs / 7 − 0.5 µs = 8.07 µs.
// Errors: those of fit_moe_layers; kInvalidArgument when that layer has no kernel count or the latency per
// node is below graph_kernel_us.
Result<MoeEngineFit> fit_moe_engine(const std::vector<MeasuredMoeLayer>& layers, double graph_kernel_us);

// gpu.expert_memory_efficiency_by_rows from MoE layer times. In each layer of T ≤ kMoeFitMaxMemoryBoundTokens
// the expert weights stream for the layer's time less the fixed time the planner prices for its graph
// nodes, kernels · kernel_fixed_us (graph_kernel_us + kernel_latency_us: a kernel in a decode graph,
// cost_model.h), so efficiency = weight_bytes / ((time − kernels · kernel_fixed_us) · memory_bandwidth_gbps)
// at the layer's rows_per_expert, capped at 1 (a layer faster than its fixed time plus its bytes at the
// peak: the fixed time over-counts it). Points sorted by rows; layers of equal rows give their mean.
// Example (one H200, Qwen3-30B-A3B, 2026-11-30; kernel_fixed_us 0.5 + 2.18): T 1, 8 experts of 9,437,184 B,
// 1 row each, 57.312 µs over 5 nodes: 75,497,472 B / ((57.312 − 5 · 2.68) µs · 4800 GB/s) = 0.358.
// Errors: kInvalidArgument for no layer of T ≤ kMoeFitMaxMemoryBoundTokens, one of them without
// rows_per_expert or kernels, a bandwidth not > 0 or a kernel_fixed_us not ≥ 0.
Result<std::vector<RowsEfficiencyPoint>> expert_memory_efficiency_by_rows(
    const std::vector<MeasuredMoeLayer>& layers, double kernel_fixed_us, double memory_bandwidth_gbps);

// One case of `epinfer bench attention` (bf16 KV cache): the score FLOPs it did and its median time.
struct MeasuredAttentionCase {
    std::string name;     // e.g. "qwen3_30b_a3b prefill 1 x 4096", quoted in the figure's source
    bool latent = false;  // MLA's absorbed attention over the latent cache (the bench's "mla" cases)
    bool prompt = false;  // a causal prompt (the bench's "prefill" cases); else decode rows
    double flops = 0.0;   // 2 · (Dqk + Dv) · Nh · keys summed over the queries (the bench's "GFLOP")
    double time_us = 0.0;
};

// The median of flops / time over `cases` (the mean of the two middle ones for an even count), in TFLOP/s,
// over bf16_tflops: the fraction of the tensor-core rate an attention kernel's score FLOPs reach.
// Example (one H200, 2026-12-01, the latent kernel): Kimi K2 64 × 4096 and 8 × 32768, 36.507 GFLOP in
// 119.85 and 135.45 µs; DeepSeek-V3, 73.014 GFLOP in 185.4 and 199.3 µs: 304.6, 269.5, 393.8, 366.4
// TFLOP/s, median 335.5 over 989.4 = 0.339.
// Errors: kInvalidArgument for no cases, a case without FLOPs > 0 and a time > 0 (naming it), or a
// bf16_tflops not > 0.
Result<double> attention_matmul_efficiency(const std::vector<MeasuredAttentionCase>& cases,
                                           double bf16_tflops);

// gpu.expert_matmul_efficiency_by_rows from the same MoE layer times: in each layer of T ≥
// kMoeFitComputeBoundTokens (compute-bound) the grouped GEMMs run for the layer's time less the fixed
// time of its graph nodes, so efficiency = flops / ((time − kernels · kernel_fixed_us) · bf16_tflops) at
// the layer's rows_per_expert, capped at 1; points sorted by rows, equal rows averaged.
// Example (one H200, Qwen3-30B-A3B, 2026-11-30 11:23 UTC, 13 nodes at 0.5 + 2.30 µs): T 4096, 256 rows,
// 309.24 GFLOP in 849.5 − 36.4 = 813.1 µs = 380.3 TFLOP/s, 0.3844 of 989.4.
// Errors: kInvalidArgument for no layer of T ≥ kMoeFitComputeBoundTokens, one of them without
// rows_per_expert, kernels or FLOPs > 0, a rate not > 0 or a kernel_fixed_us not ≥ 0.
Result<std::vector<RowsEfficiencyPoint>> expert_matmul_efficiency_by_rows(
    const std::vector<MeasuredMoeLayer>& layers, double kernel_fixed_us, double bf16_tflops);

// A kernel's fixed time beyond its bytes: (Σ durations_us − bytes / bandwidth) / number of kernels, from
// the measured durations of a step's kernels (Nsight Compute) that together read `bytes`.
// Errors: kInvalidArgument for no durations, a bandwidth ≤ 0 or a result < 0.
Result<double> engine_kernel_latency_us(const std::vector<double>& durations_us, double bytes,
                                        double bandwidth_gbps);

// One collective measured by `epinfer bench comm` at a group size.
struct MeasuredCollective {
    Collective collective = Collective::kAllReduce;
    int ranks = 0;                                  // ≥ 2
    std::vector<std::pair<double, double>> points;  // (nccl-tests size bytes, time_us), sizes ascending
};

// Ceilings measured by `epinfer bench moe` on one GPU.
struct MeasuredGpuCeilings {
    double stream_read_gbps = 0.0;  // read-only stream over a large buffer, GB/s
    double gemm_tflops = 0.0;       // cuBLAS bf16 GEMM, TFLOP/s
};

// The MoE layers of one model shape under uniform routing measured by `epinfer bench moe`.
struct MeasuredMoeEngine {
    std::string shape;                     // the model config's name, e.g. "qwen3_30b_a3b"
    std::vector<MeasuredMoeLayer> layers;  // tokens ascending
};

// What the measurements are and where they came from; `source` is written into every replaced figure
// (e.g. "epinfer bench comm --ranks 2 ... on host1, 2026-11-29T10:00:00Z, backend mpi").
struct Calibration {
    std::vector<MeasuredCollective> collectives;    // replace intra_node.<collective>
    std::vector<MeasuredGpuCeilings> gpu_ceilings;  // at most one: replace gpu.{memory,matmul}_efficiency
    std::vector<MeasuredMoeEngine> moe_engine;      // at most one: the engine fit (calibrated_profile_json)
    std::vector<MeasuredAttentionCase> attention;   // gpu.{prefill,latent}_attention_matmul_efficiency
    std::string source;
};

// The text of a complete profile: `base_json` (the base profile's file text, notes kept) with
//  - for each measured collective, intra_node.<collective> replaced by {latency_us, bus_bandwidth_gbps
//    (fit_latency_bandwidth over the points, algbw × collective_bus_factor), tables [{ranks, points}]}, all
//    "provenance": "measured"; when the fit cannot resolve a bandwidth, the smallest size's time and the
//    largest size's busbw, and the source says so;
//  - for measured GPU ceilings, gpu.memory_efficiency = stream GB/s / gpu.memory_bandwidth_gbps and
//    gpu.matmul_efficiency = GEMM TFLOP/s / gpu.bf16_tflops (the base's peaks stay, so fp8/fp4 rates
//    scale alike), "provenance": "measured";
//  - for measured MoE layers, fit_moe_engine with the base's gpu.graph_kernel_us: gpu.memory_efficiency =
//    fitted GB/s / gpu.memory_bandwidth_gbps (in place of the stream's, which its source then quotes),
//    gpu.expert_matmul_efficiency = fitted TFLOP/s / gpu.bf16_tflops, gpu.kernel_latency_us and
//    gpu.expert_memory_efficiency_by_rows and gpu.expert_matmul_efficiency_by_rows
//    (expert_{memory,matmul}_efficiency_by_rows at graph_kernel_us + that kernel_latency_us), each
//    source naming the shape, the sizes, times, bytes or FLOPs, rows, node counts
//    and fitted numbers;
//  - for measured attention cases, gpu.prefill_attention_matmul_efficiency = the median TFLOP/s of the GQA
//    prompt cases and gpu.latent_attention_matmul_efficiency = that of the latent (MLA) cases, decode and
//    prompt, each over gpu.bf16_tflops (attention_matmul_efficiency); GQA decode cases, bound by their KV
//    bytes, replace nothing (memory_efficiency prices them); a figure without cases stays the base's;
//  - name "<base name>_measured" (the base's name when it already ends so) and a note_calibration naming
//    the source; the base's own note_calibration is kept as note_calibration_base (…base2, … when taken).
// The result is checked with parse_hardware_profile. Errors: kInvalidArgument for a base that does not
// parse (naming `base_source`), a collective with ranks < 2 or no points, more than one set of ceilings or
// of MoE layers, those of fit_moe_engine, expert_memory_efficiency_by_rows and attention_matmul_efficiency,
// attention cases of which none is a GQA prompt or latent case, or a ceiling or fitted rate above the
// base's peak (efficiency > 1: a base profile of another GPU).
Result<std::string> calibrated_profile_json(const std::string& base_json, const std::string& base_source,
                                            const Calibration& calibration);

}  // namespace epinfer::planner
