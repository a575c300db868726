#include "backend/cuda/attention_bench.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda/attention_dispatch.h"
#include "backend/cuda/bench_timing.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels/bench_kernels.cuh"

namespace epinfer::cuda {
namespace {

constexpr int kWarmups = 3;
constexpr double kMaxMemoryFraction = 0.8;  // of the GPU's free memory, for one case's buffers
constexpr uint64_t kSeed = 1;

std::string case_name(const AttentionBenchCase& c) {
    return c.phase == AttentionBenchPhase::kDecode
               ? fmt::format("{} decode B={} S={}", c.shape, c.batch, c.context)
               : fmt::format("{} prefill T={}", c.shape, c.context);
}

// Fills an fp32 or bf16 buffer uniformly in [−1, 1) on the backend's stream.
Status fill_random(const DeviceBuffer& buffer, DType dtype, uint64_t seed, cudaStream_t stream) {
    FillRandomArgs args;
    args.data = buffer.data();
    args.count = static_cast<int64_t>(buffer.num_bytes() / dtype_size(dtype));
    args.seed = seed;
    args.scale = 1.0f;
    EPI_CUDA_CHECK(dtype == DType::kBF16 ? launch_fill_random_bf16(args, stream) : launch_fill_random_f32(args, stream));
    return Status::ok();
}

Result<AttentionBenchRow> run_case(Backend& backend, const AttentionDevice& device, const CudaBuffer& flush,
                                   const AttentionBenchCase& c, const AttentionBenchOptions& options) {
    const bool decode = c.phase == AttentionBenchPhase::kDecode;
    if (!decode && c.batch != 1) return invalid_argument(fmt::format("prefill batch {}: must be 1", c.batch));
    AttentionBenchRow row;
    row.c = c;
    row.counts = attention_bench_counts(c, options.kv_dtype);
    const int64_t T = row.counts.num_tokens;
    const int64_t Nh = c.num_heads, Nkv = c.num_kv_heads, Dqk = c.head_dim_qk, Dv = c.head_dim_v;
    const int64_t bs = options.kv_block_size;
    const int64_t table_width = (c.context + bs - 1) / bs;  // blocks per sequence
    const int64_t num_blocks = c.batch * table_width;
    const int64_t pool_rows = num_blocks * bs;

    AttentionArgs args;  // pointers below; the plan reads the sizes and whether K/V are paged
    args.num_tokens = T;
    args.num_kv_tokens = table_width * bs;  // as set_paged_attention (layers/kv_cache.h)
    args.num_heads = Nh;
    args.num_kv_heads = Nkv;
    args.head_dim_qk = Dqk;
    args.head_dim_v = Dv;
    args.q_token_stride = Nh * Dqk;
    args.q_head_stride = Dqk;
    args.k_token_stride = Nkv * Dqk;
    args.k_head_stride = Dqk;
    args.v_token_stride = c.v_in_k ? args.k_token_stride : Nkv * Dv;
    args.v_head_stride = c.v_in_k ? Dqk : Dv;
    args.out_token_stride = Nh * Dv;
    args.out_head_stride = Dv;
    args.scale = 1.0f / std::sqrt(static_cast<float>(Dqk));
    args.num_sequences = c.batch;
    args.block_table_stride = table_width;
    args.kv_block_size = bs;
    args.kv_dtype = options.kv_dtype;
    args.k = args.v = nullptr;  // the pools below are 256-byte aligned, as flash_attention_supports asks
    // Every sequence's block table: its slice of one random permutation of the pool's blocks.
    std::vector<int32_t> tables(static_cast<size_t>(num_blocks));  // [B, table_width]
    std::iota(tables.begin(), tables.end(), 0);
    std::mt19937_64 rng(kSeed);
    std::shuffle(tables.begin(), tables.end(), rng);
    args.kv_block_tables = tables.data();  // host for now: the plan reads only that K/V are paged
    // The kernel CudaBackend::attention picks for these sizes.
    const AttentionDispatch dispatch = plan_attention_dispatch(args, device);
    row.kernel = attention_kernel_name(dispatch.kernel);
    if ((dispatch.kernel == AttentionKernel::kFlash && dispatch.flash.sm90) ||
        (dispatch.kernel == AttentionKernel::kLatent && dispatch.latent.sm90))
        row.kernel += "_sm90";
    row.num_splits = dispatch.split().num_splits;
    const size_t workspace_bytes = dispatch.split().workspace_bytes;

    const size_t f32 = sizeof(float), i32 = sizeof(int32_t), kv = dtype_size(options.kv_dtype);
    const size_t q_bytes = static_cast<size_t>(T * Nh * Dqk) * f32;
    const size_t out_bytes = static_cast<size_t>(T * Nh * Dv) * f32;
    const size_t k_bytes = static_cast<size_t>(pool_rows * Nkv * Dqk) * kv;
    const size_t v_bytes = c.v_in_k ? 0 : static_cast<size_t>(pool_rows * Nkv * Dv) * kv;
    const size_t table_bytes = static_cast<size_t>(num_blocks) * i32;
    const size_t token_bytes = static_cast<size_t>(T) * i32;  // positions, token_sequence
    row.device_bytes = static_cast<double>(q_bytes + out_bytes + k_bytes + v_bytes + table_bytes +
                                           2 * token_bytes + workspace_bytes);
    EPI_ASSIGN_OR_RETURN(DeviceMemory memory, backend.memory_info());
    if (row.device_bytes > kMaxMemoryFraction * static_cast<double>(memory.free_bytes)) {
        return Status(StatusCode::kOutOfMemory,
                      fmt::format("needs {:.2f} GiB of GPU memory, more than {:.0f} % of the {:.2f} GiB free",
                                  row.device_bytes / (1ull << 30), 100 * kMaxMemoryFraction,
                                  static_cast<double>(memory.free_bytes) / (1ull << 30)));
    }

    std::vector<int32_t> positions(static_cast<size_t>(T)), token_sequence(static_cast<size_t>(T));  // [T]
    for (int64_t t = 0; t < T; ++t) {
        positions[t] = static_cast<int32_t>(decode ? c.context - 1 : t);
        token_sequence[t] = static_cast<int32_t>(decode ? t : 0);
    }

    const auto stream = static_cast<cudaStream_t>(cuda_stream_of(backend));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::alloc(backend, q_bytes));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::alloc(backend, out_bytes));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::alloc(backend, k_bytes));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::alloc(backend, v_bytes));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer tables_d, DeviceBuffer::alloc(backend, table_bytes));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer positions_d, DeviceBuffer::alloc(backend, token_bytes));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer token_sequence_d, DeviceBuffer::alloc(backend, token_bytes));
    EPI_RETURN_IF_ERROR(fill_random(q, DType::kF32, kSeed + 1, stream));
    EPI_RETURN_IF_ERROR(fill_random(k, options.kv_dtype, kSeed + 2, stream));
    if (!c.v_in_k) EPI_RETURN_IF_ERROR(fill_random(v, options.kv_dtype, kSeed + 3, stream));
    EPI_RETURN_IF_ERROR(backend.copy_to_device(tables_d.data(), tables.data(), table_bytes));
    EPI_RETURN_IF_ERROR(backend.copy_to_device(positions_d.data(), positions.data(), token_bytes));
    EPI_RETURN_IF_ERROR(backend.copy_to_device(token_sequence_d.data(), token_sequence.data(), token_bytes));
    args.q = q.f32();
    args.k = k.data();  // [num_blocks · bs, Nkv, Dqk], rows through the block tables
    args.v = c.v_in_k ? k.data() : v.data();
    args.out = out.f32();
    args.positions = static_cast<const int32_t*>(positions_d.data());
    args.kv_block_tables = static_cast<const int32_t*>(tables_d.data());
    args.token_sequence = static_cast<const int32_t*>(token_sequence_d.data());

    // One direct run (as the engine before it records a decode graph), then the recorded op.
    EPI_RETURN_IF_ERROR(backend.attention(args));
    EPI_RETURN_IF_ERROR(backend.synchronize());
    EPI_RETURN_IF_ERROR(backend.begin_capture());
    const Status recorded = backend.attention(args);
    Result<std::unique_ptr<OpGraph>> captured = backend.end_capture();
    EPI_RETURN_IF_ERROR(recorded);
    EPI_RETURN_IF_ERROR(captured.status());
    const std::unique_ptr<OpGraph> graph = std::move(captured).value();
    for (int w = 0; w < kWarmups; ++w) EPI_RETURN_IF_ERROR(graph->replay());
    EPI_ASSIGN_OR_RETURN(row.time_us, bench_median_us([&] { return graph->replay(); }, options.repeats, flush, stream));
    EPI_RETURN_IF_ERROR(backend.synchronize());  // the op's error flag
    return row;
}

}  // namespace

const char* attention_bench_phase_name(AttentionBenchPhase phase) {
    return phase == AttentionBenchPhase::kDecode ? "decode" : "prefill";
}

AttentionBenchCounts attention_bench_counts(const AttentionBenchCase& c, DType kv_dtype) {
    const bool decode = c.phase == AttentionBenchPhase::kDecode;
    const double context = static_cast<double>(c.context);
    const double rows = decode ? static_cast<double>(c.batch) * context : context;  // K/V rows attended
    const double keys = decode ? rows : 0.5 * context * (context + 1.0);           // (query, key) pairs
    const double row_elems =
        static_cast<double>(c.num_kv_heads * (c.v_in_k ? c.head_dim_qk : c.head_dim_qk + c.head_dim_v));
    AttentionBenchCounts n;
    n.num_tokens = decode ? c.batch : c.context;
    n.kv_bytes = rows * row_elems * static_cast<double>(dtype_size(kv_dtype));
    n.kv_bytes_bf16 = rows * row_elems * 2;
    n.flops = 2.0 * static_cast<double>((c.head_dim_qk + c.head_dim_v) * c.num_heads) * keys;
    return n;
}

Status cuda_bench_attention(const std::vector<AttentionBenchCase>& cases, const AttentionBenchOptions& options,
                            const std::function<void(const AttentionBenchRow&)>& on_row) {
    EPI_RETURN_IF_ERROR(cuda_require_device());
    if (options.repeats < 1) return invalid_argument(fmt::format("bench attention: repeats {} < 1", options.repeats));
    if (options.kv_block_size < 1) {
        return invalid_argument(fmt::format("bench attention: kv_block_size {} < 1", options.kv_block_size));
    }
    if (options.kv_dtype != DType::kF32 && options.kv_dtype != DType::kBF16) {
        return invalid_argument(fmt::format("bench attention: kv dtype {}: expected F32 or BF16",
                                            dtype_name(options.kv_dtype)));
    }
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_cuda_backend(0));
    AttentionDevice device;
    EPI_CUDA_CHECK(query_attention_device(0, &device));
    EPI_ASSIGN_OR_RETURN(CudaBuffer flush, CudaBuffer::alloc(kBenchFlushBytes));
    for (const AttentionBenchCase& c : cases) {
        Result<AttentionBenchRow> row = run_case(*backend, device, flush, c, options);
        if (!row.is_ok()) return row.status().with_context("bench attention " + case_name(c));
        on_row(row.value());
    }
    return Status::ok();
}

}  // namespace epinfer::cuda
