#include "backend/cuda/moe_bench.h"

#include <cublas_v2.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/bench_timing.h"
#include "backend/cuda/kernels/bench_kernels.cuh"
#include "core/splitmix64.h"

namespace epinfer::cuda {
namespace {

constexpr size_t kStreamReadBytes = size_t{4} << 30;    // the issue asks for ≥ 4 GiB
constexpr int kGemmSize = 8192;
constexpr int kCeilingRepeats = 10;
constexpr int kWarmups = 3;

// splitmix64 (Steele, Lea, Flood 2014), as bench/moe_peers.py.
struct SplitMix64 {
    uint64_t state;
    uint64_t next() { return splitmix64(state); }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// First index i with cum[i] > u·total (the last one when rounding reaches the total).
int64_t draw(SplitMix64& rng, const std::vector<double>& cum) {
    const double x = rng.uniform() * cum.back();
    const int64_t idx = std::upper_bound(cum.begin(), cum.end(), x) - cum.begin();
    return std::min<int64_t>(idx, static_cast<int64_t>(cum.size()) - 1);
}

struct StreamGuard {
    cudaStream_t stream = nullptr;
    ~StreamGuard() { if (stream) cudaStreamDestroy(stream); }
};

struct GraphGuard {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ~GraphGuard() {
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
    }
};

struct CublasGuard {
    cublasHandle_t handle = nullptr;
    ~CublasGuard() { if (handle) cublasDestroy(handle); }
};

Status fill_random(void* data, int64_t count, uint64_t seed, float scale, cudaStream_t stream) {
    FillRandomArgs args;
    args.data = data;
    args.count = count;
    args.seed = seed;
    args.scale = scale;
    EPI_CUDA_CHECK(launch_fill_random_bf16(args, stream));
    return Status::ok();
}

// Router logits [T, E] whose top-K (softmax or sigmoid, any group setting) are `ids` in row order:
// 8 − 0.01·k at the chosen experts, uniform in [−4, 0) elsewhere.
std::vector<float> logits_for(const std::vector<int32_t>& ids, int64_t num_tokens, int64_t num_experts,
                              int64_t top_k, uint64_t seed) {
    SplitMix64 rng{seed ^ 0x5bd1e995ull};
    std::vector<float> logits(static_cast<size_t>(num_tokens * num_experts));
    for (float& v : logits) v = static_cast<float>(-4.0 * rng.uniform());
    for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t k = 0; k < top_k; ++k) {
            logits[t * num_experts + ids[t * top_k + k]] = 8.0f - 0.01f * static_cast<float>(k);
        }
    }
    return logits;
}

Status capture(CudaMoeLayer& layer, const CudaMoeWeights& weights, const float* logits, const void* x,
               int64_t num_tokens, float* out, cudaStream_t stream, CudaMoeStepOptions options, GraphGuard& g) {
    EPI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    const Status status = layer.forward(weights, logits, x, num_tokens, out, stream, options);
    const cudaError_t end = cudaStreamEndCapture(stream, &g.graph);
    EPI_RETURN_IF_ERROR(status);
    EPI_CUDA_CHECK(end);
    EPI_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
    return Status::ok();
}

std::string tiling_name(const CudaMoeTiling& t) {
    if (t.tile == MoeGemmTile::kWide) return "wide";
    if (t.tile == MoeGemmTile::kGemv) return "gemv";
    if (t.split_k_gate_up == 1 && t.split_k_down == 1) return "narrow";
    return fmt::format("narrow split {}/{}", t.split_k_gate_up, t.split_k_down);
}

}  // namespace

const char* moe_bench_routing_name(MoeBenchRouting routing) {
    return routing == MoeBenchRouting::kUniform ? "uniform" : "zipf";
}

std::vector<int32_t> moe_bench_routing(int64_t num_tokens, const CudaMoeLayerConfig& config,
                                       MoeBenchRouting routing, uint64_t seed) {
    const int64_t num_experts = config.num_experts;
    const int64_t top_k = config.top_k;
    const bool zipf = routing == MoeBenchRouting::kZipf;
    const bool group_limited = config.topk_method != TopkMethod::kGreedy && config.topk_group < config.n_group;
    const int64_t group_size = num_experts / config.n_group;
    std::vector<double> cum(static_cast<size_t>(num_experts));  // [E]
    std::vector<double> group_cum(static_cast<size_t>(config.n_group));  // [G]
    double total = 0.0;
    for (int64_t e = 0; e < num_experts; ++e) {
        const double w = zipf ? 1.0 / static_cast<double>(e + 1) : 1.0;
        total += w;
        cum[e] = total;
    }
    double group_total = 0.0;
    for (int64_t g = 0; g < config.n_group; ++g) {
        double sum = 0.0;
        for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) sum += zipf ? 1.0 / static_cast<double>(e + 1) : 1.0;
        group_total += sum;
        group_cum[g] = group_total;
    }
    SplitMix64 rng{seed * 1000003ull + 2ull * static_cast<uint64_t>(num_tokens) + (zipf ? 1ull : 0ull)};
    std::vector<int32_t> ids(static_cast<size_t>(num_tokens * top_k));
    std::vector<char> group_kept(static_cast<size_t>(config.n_group));
    for (int64_t t = 0; t < num_tokens; ++t) {
        if (group_limited) {
            std::fill(group_kept.begin(), group_kept.end(), 0);
            for (int64_t kept = 0; kept < config.topk_group;) {
                const int64_t g = draw(rng, group_cum);
                if (!group_kept[g]) {
                    group_kept[g] = 1;
                    ++kept;
                }
            }
        }
        int32_t* row = ids.data() + t * top_k;
        for (int64_t k = 0; k < top_k;) {
            const int64_t e = draw(rng, cum);
            if (group_limited && !group_kept[e / group_size]) continue;
            if (std::find(row, row + k, static_cast<int32_t>(e)) != row + k) continue;
            row[k++] = static_cast<int32_t>(e);
        }
    }
    return ids;
}

Result<MoeBenchCeilings> cuda_bench_ceilings() {
    EPI_RETURN_IF_ERROR(cuda_require_device());
    MoeBenchCeilings c;
    int device = 0;
    cudaDeviceProp prop{};
    EPI_CUDA_CHECK(cudaGetDevice(&device));
    EPI_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    c.gpu_name = prop.name;
    c.num_sms = prop.multiProcessorCount;
    EPI_CUDA_CHECK(cudaDriverGetVersion(&c.driver_version));
    EPI_CUDA_CHECK(cudaRuntimeGetVersion(&c.runtime_version));
    StreamGuard s;
    EPI_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    const CudaBuffer no_flush;

    {  // Read-only stream over 4 GiB of random data: the buffer is far larger than L2, so no flush.
        EPI_ASSIGN_OR_RETURN(CudaBuffer data, CudaBuffer::alloc(kStreamReadBytes));
        EPI_ASSIGN_OR_RETURN(CudaBuffer sink, CudaBuffer::alloc(16));
        EPI_RETURN_IF_ERROR(fill_random(data.data(), static_cast<int64_t>(kStreamReadBytes / 2), 7, 1.0f, s.stream));
        StreamReadArgs args;
        args.data = data.data();
        args.num_bytes = kStreamReadBytes;
        args.sink = sink.as<uint32_t>();
        args.num_sms = c.num_sms;
        auto run = [&] { return launch_stream_read(args, s.stream); };
        for (int i = 0; i < kWarmups; ++i) EPI_CUDA_CHECK(run());
        EPI_ASSIGN_OR_RETURN(double us, bench_median_us(run, kCeilingRepeats, no_flush, s.stream));
        c.stream_read_bytes = static_cast<double>(kStreamReadBytes);
        c.stream_read_gbps = c.stream_read_bytes / (us * 1e-6) / 1e9;
    }
    {  // cuBLAS bf16 GEMM, fp32 accumulation, random inputs (zeros run faster: METHOD.md).
        const int64_t n = kGemmSize;
        EPI_ASSIGN_OR_RETURN(CudaBuffer a, CudaBuffer::alloc(static_cast<size_t>(n * n * 2)));
        EPI_ASSIGN_OR_RETURN(CudaBuffer b, CudaBuffer::alloc(static_cast<size_t>(n * n * 2)));
        EPI_ASSIGN_OR_RETURN(CudaBuffer out, CudaBuffer::alloc(static_cast<size_t>(n * n * 2)));
        EPI_RETURN_IF_ERROR(fill_random(a.data(), n * n, 11, 1.0f, s.stream));
        EPI_RETURN_IF_ERROR(fill_random(b.data(), n * n, 12, 1.0f, s.stream));
        CublasGuard cublas;
        if (cublasCreate(&cublas.handle) != CUBLAS_STATUS_SUCCESS) return internal_error("cublasCreate failed");
        if (cublasSetStream(cublas.handle, s.stream) != CUBLAS_STATUS_SUCCESS) {
            return internal_error("cublasSetStream failed");
        }
        const float alpha = 1.0f, beta = 0.0f;
        cublasStatus_t gemm_status = CUBLAS_STATUS_SUCCESS;
        auto run = [&] {
            gemm_status = cublasGemmEx(cublas.handle, CUBLAS_OP_N, CUBLAS_OP_N, kGemmSize, kGemmSize, kGemmSize,
                                       &alpha, a.data(), CUDA_R_16BF, kGemmSize, b.data(), CUDA_R_16BF, kGemmSize,
                                       &beta, out.data(), CUDA_R_16BF, kGemmSize, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);
            return gemm_status == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
        };
        for (int i = 0; i < kWarmups; ++i) {
            if (run() != cudaSuccess) return internal_error(fmt::format("cublasGemmEx failed: status {}", static_cast<int>(gemm_status)));
        }
        EPI_ASSIGN_OR_RETURN(double us, bench_median_us(run, kCeilingRepeats, no_flush, s.stream));
        c.gemm_size = kGemmSize;
        c.gemm_tflops = 2.0 * n * n * n / (us * 1e-6) / 1e12;
    }
    return c;
}

Result<std::vector<MoeBenchRow>> cuda_bench_moe(const MoeBenchShape& shape, const MoeBenchOptions& options) {
    EPI_RETURN_IF_ERROR(cuda_require_device());
    if (options.tokens.empty() || options.repeats < 1) return invalid_argument("bench moe: no tokens or repeats < 1");
    CudaMoeLayerConfig config = shape.layer;
    config.max_tokens = *std::max_element(options.tokens.begin(), options.tokens.end());
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<CudaMoeLayer> layer, CudaMoeLayer::create(config));
    const int64_t h = config.hidden, i = config.intermediate, e = config.num_experts, k = config.top_k;
    const bool has_shared = config.shared_intermediate > 0;
    StreamGuard s;
    EPI_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));

    const int64_t expert_elems = 3 * h * i;
    EPI_ASSIGN_OR_RETURN(CudaBuffer gate_up, CudaBuffer::alloc(static_cast<size_t>(e * 2 * h * i * 2)));
    EPI_ASSIGN_OR_RETURN(CudaBuffer down, CudaBuffer::alloc(static_cast<size_t>(e * h * i * 2)));
    EPI_ASSIGN_OR_RETURN(CudaBuffer shared_gate_up, CudaBuffer::alloc(has_shared ? static_cast<size_t>(2 * h * i * 2) : 0));
    EPI_ASSIGN_OR_RETURN(CudaBuffer shared_down, CudaBuffer::alloc(has_shared ? static_cast<size_t>(h * i * 2) : 0));
    const float gate_up_scale = 1.0f / std::sqrt(static_cast<float>(h));
    const float down_scale = 1.0f / std::sqrt(static_cast<float>(i));
    EPI_RETURN_IF_ERROR(fill_random(gate_up.data(), e * 2 * h * i, 101, gate_up_scale, s.stream));
    EPI_RETURN_IF_ERROR(fill_random(down.data(), e * h * i, 102, down_scale, s.stream));
    if (has_shared) {
        EPI_RETURN_IF_ERROR(fill_random(shared_gate_up.data(), 2 * h * i, 103, gate_up_scale, s.stream));
        EPI_RETURN_IF_ERROR(fill_random(shared_down.data(), h * i, 104, down_scale, s.stream));
    }
    CudaMoeWeights weights;
    weights.gate_up = gate_up.data();
    weights.down = down.data();
    weights.shared_gate_up = shared_gate_up.data();
    weights.shared_down = shared_down.data();

    const int64_t t_max = config.max_tokens;
    EPI_ASSIGN_OR_RETURN(CudaBuffer x, CudaBuffer::alloc(static_cast<size_t>(t_max * h * 2)));
    EPI_ASSIGN_OR_RETURN(CudaBuffer logits, CudaBuffer::alloc(static_cast<size_t>(t_max * e * 4)));
    EPI_ASSIGN_OR_RETURN(CudaBuffer out, CudaBuffer::alloc(static_cast<size_t>(t_max * h * 4)));
    EPI_ASSIGN_OR_RETURN(CudaBuffer flush, CudaBuffer::alloc(kBenchFlushBytes));
    EPI_RETURN_IF_ERROR(fill_random(x.data(), t_max * h, 105, 1.0f, s.stream));
    EPI_CUDA_CHECK(cudaStreamSynchronize(s.stream));

    std::vector<MoeBenchRow> rows;
    for (int64_t t : options.tokens) {
        for (MoeBenchRouting routing : options.routings) {
            const std::vector<int32_t> ids = moe_bench_routing(t, config, routing, options.seed);
            const std::vector<float> host_logits = logits_for(ids, t, e, k, options.seed + static_cast<uint64_t>(t));
            // On the layer's stream: a pageable cudaMemcpy may return before its DMA lands, and a
            // non-blocking stream does not wait for it.
            EPI_CUDA_CHECK(cudaMemcpyAsync(logits.data(), host_logits.data(), host_logits.size() * 4,
                                           cudaMemcpyHostToDevice, s.stream));
            const CudaMoeStepOptions full{true, true};
            const CudaMoeStepOptions routed{false, false};
            EPI_RETURN_IF_ERROR(layer->forward(weights, logits.as<float>(), x.data(), t, out.as<float>(), s.stream, full));
            EPI_CUDA_CHECK(cudaStreamSynchronize(s.stream));

            MoeBenchRow row;
            row.shape = shape.name;
            row.routing = routing;
            row.tokens = t;
            const CudaMoePlanView plan = layer->plan();
            std::vector<int32_t> got_ids(ids.size());
            EPI_CUDA_CHECK(cudaMemcpy(got_ids.data(), plan.topk_ids, got_ids.size() * 4, cudaMemcpyDeviceToHost));
            std::vector<int32_t> counts(static_cast<size_t>(e));  // picks per expert
            for (int32_t id : got_ids) {
                if (id >= 0 && id < e) ++counts[static_cast<size_t>(id)];
            }
            row.routing_exact = got_ids == ids;
            if (!row.routing_exact) {
                int64_t differ = 0, first = -1;
                for (int64_t tok = 0; tok < t; ++tok) {
                    if (!std::equal(ids.begin() + tok * k, ids.begin() + (tok + 1) * k, got_ids.begin() + tok * k)) {
                        if (first < 0) first = tok;
                        ++differ;
                    }
                }
                auto row_ids = [&](const std::vector<int32_t>& v) {
                    return fmt::format("{}", fmt::join(v.begin() + first * k, v.begin() + (first + 1) * k, ","));
                };
                row.routing_note = fmt::format("{} tokens differ; token {}: want {} got {}", differ, first,
                                               row_ids(ids), row_ids(got_ids));
            }
            row.experts_touched = std::count_if(counts.begin(), counts.end(), [](int32_t c) { return c > 0; });
            const double slots = static_cast<double>(t * k);
            row.routed_weight_bytes = static_cast<double>(row.experts_touched) * expert_elems * 2;
            row.routed_flops = 2.0 * expert_elems * slots;
            row.weight_bytes = row.routed_weight_bytes + (has_shared ? expert_elems * 2.0 : 0.0);
            row.flops = row.routed_flops + (has_shared ? 2.0 * expert_elems * static_cast<double>(t) : 0.0);
            row.tiling = tiling_name(layer->tiling(t));

            GraphGuard full_graph, routed_graph;
            EPI_RETURN_IF_ERROR(capture(*layer, weights, logits.as<float>(), x.data(), t, out.as<float>(), s.stream,
                                        full, full_graph));
            EPI_RETURN_IF_ERROR(capture(*layer, weights, logits.as<float>(), x.data(), t, out.as<float>(), s.stream,
                                        routed, routed_graph));
            size_t nodes = 0;
            EPI_CUDA_CHECK(cudaGraphGetNodes(full_graph.graph, nullptr, &nodes));
            row.graph_nodes = static_cast<int64_t>(nodes);
            auto run_full = [&] { return cudaGraphLaunch(full_graph.exec, s.stream); };
            auto run_routed = [&] { return cudaGraphLaunch(routed_graph.exec, s.stream); };
            for (int w = 0; w < kWarmups; ++w) {
                EPI_CUDA_CHECK(run_full());
                EPI_CUDA_CHECK(run_routed());
            }
            EPI_ASSIGN_OR_RETURN(row.time_us, bench_median_us(run_full, options.repeats, flush, s.stream));
            EPI_ASSIGN_OR_RETURN(row.routed_time_us, bench_median_us(run_routed, options.repeats, flush, s.stream));
            rows.push_back(row);
        }
    }
    return rows;
}

}  // namespace epinfer::cuda
