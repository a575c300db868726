#include "backend/cuda/cuda_moe_experts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_moe_layer.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels/dense_ops.cuh"
#include "backend/cuda/kernels/moe_combine.cuh"
#include "backend/cuda/kernels/moe_grouped_gemm.cuh"
#include "backend/cuda/kernels/moe_permute.cuh"
#include "backend/cuda/kernels/moe_router.cuh"
#include "backend/cuda/kernels/moe_rows_f32.cuh"

namespace epinfer::cuda {

namespace {

constexpr size_t kPieceAlign = 256;
constexpr size_t kMaxCachedTables = 4096;        // a model has one per MoE layer; tests make more

// Offsets of consecutive 256-byte aligned pieces inside one allocation.
class Pieces {
public:
    size_t add(size_t num_bytes) {
        const size_t offset = total_;
        total_ += (num_bytes + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
        return offset;
    }
    size_t total() const { return total_; }

private:
    size_t total_ = 0;
};

template <typename T>
T* at(const DeviceBuffer& buffer, size_t offset) {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(buffer.data()) + offset);
}

// The plan's device arrays for T tokens (moe_permute.cuh), carved from one buffer.
struct PlanLayout {
    size_t counts, offsets, token_of_row, k_of_slot, slot_of_token_k, row_begin, row_end, tile_offsets,
        workspace;
    size_t workspace_bytes = 0;
};

PlanLayout plan_layout(Pieces& pieces, const MoePermuteArgs& permute) {
    const size_t picks = static_cast<size_t>(permute.num_tokens * permute.top_k);
    const size_t e = static_cast<size_t>(permute.num_experts);
    PlanLayout p;
    p.counts = pieces.add(e * 4);
    p.offsets = pieces.add((e + 1) * 4);
    p.token_of_row = pieces.add(picks * 4);
    p.k_of_slot = pieces.add(picks * 4);
    p.slot_of_token_k = pieces.add(picks * 4);
    p.row_begin = pieces.add(e * 4);
    p.row_end = pieces.add(e * 4);
    p.tile_offsets = pieces.add((e + 1) * 4);
    p.workspace_bytes = moe_permute_workspace_bytes(permute);
    p.workspace = pieces.add(p.workspace_bytes);
    return p;
}

void bind_plan(MoePermuteArgs& permute, const PlanLayout& p, const DeviceBuffer& buffer) {
    permute.expert_counts = at<int32_t>(buffer, p.counts);
    permute.expert_offsets = at<int32_t>(buffer, p.offsets);
    permute.token_of_row = at<int32_t>(buffer, p.token_of_row);
    permute.k_of_slot = at<int32_t>(buffer, p.k_of_slot);
    permute.slot_of_token_k = at<int32_t>(buffer, p.slot_of_token_k);
    permute.group_row_begin = at<int32_t>(buffer, p.row_begin);
    permute.group_row_end = at<int32_t>(buffer, p.row_end);
    permute.group_tile_offsets = at<int32_t>(buffer, p.tile_offsets);
}

bool aligned16(const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

}  // namespace

CudaMoeExperts::~CudaMoeExperts() {
    clear_tables();
}

void CudaMoeExperts::clear_tables() {
    for (auto& [key, table] : tables_) {
        if (table.device != nullptr) cudaFree(table.device);
    }
    tables_.clear();
}

Result<const CudaMoeExperts::Table*> CudaMoeExperts::table_of(const MoeExpertsArgs& a, cudaStream_t stream) {
    const size_t num = static_cast<size_t>(a.num_experts) * 3;
    std::vector<const void*> flat(num);  // [E, 3]
    for (int64_t e = 0; e < a.num_experts; ++e) {
        flat[3 * e] = a.experts[e].gate;
        flat[3 * e + 1] = a.experts[e].up;
        flat[3 * e + 2] = a.experts[e].down;
    }
    const void* key = flat[0];
    auto found = tables_.find(key);
    if (found != tables_.end() && found->second.host == flat) return &found->second;
    // A new table, or new contents under a known key: the old device table may still be read by work in
    // flight, so wait for it before reusing the slot.
    EPI_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (found == tables_.end() && tables_.size() >= kMaxCachedTables) clear_tables();
    Table& table = tables_[key];
    if (table.device != nullptr && table.host.size() != num) {
        EPI_CUDA_CHECK(cudaFree(table.device));
        table.device = nullptr;
    }
    if (table.device == nullptr) {
        void* device = nullptr;
        const cudaError_t err = cudaMalloc(&device, num * sizeof(void*));
        if (err != cudaSuccess) {
            cudaGetLastError();
            tables_.erase(key);
            return Status(
                StatusCode::kOutOfMemory,
                fmt::format("cuda moe_experts: cannot allocate the {}-byte expert pointer table: {}",
                            num * sizeof(void*), cudaGetErrorString(err)));
        }
        table.device = static_cast<const void**>(device);
    }
    table.host = std::move(flat);
    table.aligned = std::all_of(table.host.begin(), table.host.end(), aligned16);
    // From table.host, which stays alive and unchanged while the copy may be in flight.
    EPI_CUDA_CHECK(cudaMemcpyAsync(table.device, table.host.data(), num * sizeof(void*),
                                   cudaMemcpyHostToDevice, stream));
    return &table;
}

Status CudaMoeExperts::run(Backend& backend, const MoeExpertsArgs& a, cudaStream_t stream,
                           bool fp32_activations) {
    if (a.num_tokens == 0) return Status::ok();
    if (a.num_experts > kRouterMaxExperts) {
        return not_supported(fmt::format("moe_experts: num_experts {} exceeds the CUDA limit {}",
                                         a.num_experts, kRouterMaxExperts));
    }
    const bool grouped_sizes =
        !fp32_activations && a.weight_dtype == DType::kBF16 && a.hidden % 8 == 0 && a.intermediate % 8 == 0;
    if (grouped_sizes) {
        EPI_ASSIGN_OR_RETURN(const Table* table, table_of(a, stream));
        if (table->aligned) return run_grouped(backend, a, *table, stream);
    }
    return run_general(backend, a, stream);
}

Status CudaMoeExperts::run_grouped(Backend& backend, const MoeExpertsArgs& a, const Table& table,
                                   cudaStream_t stream) {
    const int64_t T = a.num_tokens, K = a.top_k, E = a.num_experts, H = a.hidden, I = a.intermediate;
    const int64_t picks = T * K;
    const CudaMoeTiling tiling = moe_step_tiling(T, K, E, 0, H, I, narrow_max_rows_, num_sms_);
    const int64_t tile_rows = tiling.tile_rows;

    MoePermuteArgs permute;
    permute.topk_ids = a.topk_ids;
    permute.first_expert = a.first_expert;
    permute.num_tokens = T;
    permute.top_k = K;
    permute.num_experts = E;
    permute.tile_rows = tile_rows;
    permute.shared_group = false;
    const size_t gate_up_partials =
        tiling.split_k_gate_up > 1 ? static_cast<size_t>(tiling.split_k_gate_up * picks * 2 * I) : 0;
    const size_t down_partials =
        tiling.split_k_down > 1 ? static_cast<size_t>(tiling.split_k_down * picks * H) : 0;

    // Decode sizes (the gemv tile) read the fp32 x and round it as they go; the others read a bf16 copy.
    const bool x_f32 = tiling.tile == MoeGemmTile::kGemv && aligned16(a.x);
    Pieces pieces;
    const size_t x_bf16 = pieces.add(x_f32 ? 0 : static_cast<size_t>(T * H) * 2);  // [T, H] bf16
    const PlanLayout plan = plan_layout(pieces, permute);
    const size_t partials = pieces.add(std::max(gate_up_partials, down_partials) * sizeof(float));
    MoeGroupedGemmArgs gemm;
    gemm.max_row_tiles = moe_gemm_max_row_tiles(picks, E, tile_rows);
    gemm.tile = tiling.tile;
    gemm.gemv_rows = static_cast<int>(tile_rows);
    if (tiling.picks) {
        gemm.picks.expert_ids = a.topk_ids;
        gemm.picks.first_expert = a.first_expert;
        gemm.picks.num_tokens = T;
        gemm.picks.top_k = K;
    }
    // Split-K tile counters (zeroed below; the kernels leave them zero), for the larger of the two launches.
    size_t num_counters = 0;
    if (tiling.split_k_gate_up > 1 || tiling.split_k_down > 1) {
        MoeGroupedGemmArgs shape = gemm;
        shape.epilogue = MoeGemmEpilogue::kSwiGlu;
        shape.out_features = I;
        const int64_t gate_up_tiles = moe_gemm_num_tiles(shape);
        shape.epilogue = MoeGemmEpilogue::kStore;
        shape.out_features = H;
        num_counters = static_cast<size_t>(std::max(gate_up_tiles, moe_gemm_num_tiles(shape)));
    }
    const size_t counters = pieces.add(num_counters * sizeof(int32_t));
    const size_t h = pieces.add(static_cast<size_t>(picks * I) * 2);  // [S ≤ T·K, I] bf16
    const size_t y = pieces.add(static_cast<size_t>(picks * H) * 2);  // [S ≤ T·K, H] bf16
    EPI_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::alloc(backend, pieces.total()));
    bind_plan(permute, plan, buffer);

    if (!x_f32) EPI_CUDA_CHECK(launch_f32_rows_to_bf16(a.x, H, T, H, at<void>(buffer, x_bf16), stream));
    if (!tiling.picks) {
        EPI_CUDA_CHECK(
            launch_moe_permute(permute, at<void>(buffer, plan.workspace), plan.workspace_bytes, stream));
    }

    gemm.num_weight_groups = E;
    gemm.weight_ptr_stride = 3;
    gemm.group_row_begin = permute.group_row_begin;
    gemm.group_row_end = permute.group_row_end;
    gemm.group_tile_offsets = permute.group_tile_offsets;
    gemm.num_groups = E;
    gemm.partials = at<float>(buffer, partials);
    gemm.partial_rows = picks;
    if (num_counters > 0) {
        gemm.tile_counters = at<int32_t>(buffer, counters);
        EPI_CUDA_CHECK(cudaMemsetAsync(gemm.tile_counters, 0, num_counters * sizeof(int32_t), stream));
    }

    MoeGroupedGemmArgs gate_up = gemm;  // h = silu(x·gateᵀ) · (x·upᵀ)
    gate_up.weight_ptrs = reinterpret_cast<const void* const*>(table.device);
    gate_up.x = x_f32 ? static_cast<const void*>(a.x) : at<void>(buffer, x_bf16);
    gate_up.x_f32 = x_f32;
    gate_up.x_row_of_row = tiling.picks ? nullptr : permute.token_of_row;
    gate_up.picks.x_per_token = true;
    gate_up.out_features = I;
    gate_up.in_features = H;
    gate_up.out = at<void>(buffer, h);
    gate_up.epilogue = MoeGemmEpilogue::kSwiGlu;
    gate_up.split_k = tiling.split_k_gate_up;
    EPI_CUDA_CHECK(launch_moe_grouped_gemm(gate_up, stream));

    MoeGroupedGemmArgs down = gemm;  // y = h·downᵀ
    down.weight_ptrs = reinterpret_cast<const void* const*>(table.device + 2);
    down.x = at<void>(buffer, h);
    down.out_features = H;
    down.in_features = I;
    down.out = at<void>(buffer, y);
    down.epilogue = MoeGemmEpilogue::kStore;
    down.split_k = tiling.split_k_down;
    EPI_CUDA_CHECK(launch_moe_grouped_gemm(down, stream));

    MoeCombineArgs combine;
    combine.y = at<void>(buffer, y);
    combine.topk_weights = a.topk_weights;
    combine.slot_of_token_k = tiling.picks ? nullptr : permute.slot_of_token_k;
    combine.topk_ids = a.topk_ids;
    combine.first_expert = a.first_expert;
    combine.num_experts = E;
    combine.out = a.out;
    combine.num_tokens = T;
    combine.top_k = K;
    combine.hidden = H;
    EPI_CUDA_CHECK(launch_moe_combine(combine, stream));
    return Status::ok();  // `buffer` is freed in stream order, after these kernels
}

Status CudaMoeExperts::run_general(Backend& backend, const MoeExpertsArgs& a, cudaStream_t stream) {
    const int64_t T = a.num_tokens, K = a.top_k, E = a.num_experts, H = a.hidden, I = a.intermediate;
    MoePermuteArgs permute;
    permute.topk_ids = a.topk_ids;
    permute.first_expert = a.first_expert;
    permute.num_tokens = T;
    permute.top_k = K;
    permute.num_experts = E;
    Pieces pieces;
    const PlanLayout plan = plan_layout(pieces, permute);
    EPI_ASSIGN_OR_RETURN(DeviceBuffer plan_buffer, DeviceBuffer::alloc(backend, pieces.total()));
    bind_plan(permute, plan, plan_buffer);
    EPI_CUDA_CHECK(
        launch_moe_permute(permute, at<void>(plan_buffer, plan.workspace), plan.workspace_bytes, stream));
    std::vector<int32_t> offsets(static_cast<size_t>(E + 1));  // [E + 1]
    EPI_RETURN_IF_ERROR(backend.copy_to_host(offsets.data(), permute.expert_offsets, offsets.size() * 4));
    const int64_t S = offsets.back();
    int64_t max_count = 0;
    for (int64_t e = 0; e < E; ++e) max_count = std::max<int64_t>(max_count, offsets[e + 1] - offsets[e]);

    EPI_ASSIGN_OR_RETURN(DeviceBuffer x_perm, DeviceBuffer::alloc_f32(backend, S * H));        // [S, H]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer y_perm, DeviceBuffer::alloc_f32(backend, S * H));        // [S, H]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer gate, DeviceBuffer::alloc_f32(backend, max_count * I));  // [count, I]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer up, DeviceBuffer::alloc_f32(backend, max_count * I));    // [count, I]
    EPI_CUDA_CHECK(launch_moe_gather_rows_f32(a.x, permute.token_of_row, S, H, x_perm.f32(), stream));
    for (int64_t e = 0; e < E; ++e) {
        const int64_t offset = offsets[e], count = offsets[e + 1] - offsets[e];
        if (count == 0) continue;
        MatmulArgs m;
        m.x = x_perm.f32() + offset * H;
        m.w_dtype = a.weight_dtype;
        m.num_rows = count;
        m.out_features = I;
        m.in_features = H;
        m.x_row_stride = H;
        m.y_row_stride = I;
        m.w = a.experts[e].gate;
        m.y = gate.f32();
        EPI_RETURN_IF_ERROR(backend.matmul(m));
        m.w = a.experts[e].up;
        m.y = up.f32();
        EPI_RETURN_IF_ERROR(backend.matmul(m));
        EPI_RETURN_IF_ERROR(backend.silu_mul(SiluMulArgs{gate.f32(), up.f32(), gate.f32(), count * I}));
        MatmulArgs d;
        d.x = gate.f32();
        d.w = a.experts[e].down;
        d.w_dtype = a.weight_dtype;
        d.y = y_perm.f32() + offset * H;
        d.num_rows = count;
        d.out_features = H;
        d.in_features = I;
        d.x_row_stride = I;
        d.y_row_stride = H;
        EPI_RETURN_IF_ERROR(backend.matmul(d));
    }
    EPI_CUDA_CHECK(launch_moe_combine_f32(y_perm.f32(), a.topk_weights, permute.slot_of_token_k, T, K, H,
                                          a.out, stream));
    return Status::ok();
}

}  // namespace epinfer::cuda
