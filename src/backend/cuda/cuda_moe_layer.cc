#include "backend/cuda/cuda_moe_layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "backend/cuda/kernels/moe_combine.cuh"
#include "backend/cuda/kernels/moe_grouped_gemm.cuh"
#include "backend/cuda/kernels/moe_grouped_gemv.cuh"
#include "backend/cuda/kernels/moe_permute.cuh"
#include "backend/cuda/kernels/moe_router.cuh"
#include "backend/cuda/kernels/sm90a.cuh"
#include "backend/moe_router_args.h"

namespace epinfer::cuda {
namespace {

Status check_config(const CudaMoeLayerConfig& c) {
    if (c.hidden <= 0 || c.hidden % 8 != 0) {
        return not_supported(fmt::format("cuda moe: hidden {} must be a positive multiple of 8", c.hidden));
    }
    if (c.intermediate <= 0 || c.intermediate % 8 != 0) {
        return not_supported(
            fmt::format("cuda moe: intermediate {} must be a positive multiple of 8", c.intermediate));
    }
    if (c.num_experts < 1 || c.num_experts > kRouterMaxExperts) {
        return not_supported(
            fmt::format("cuda moe: num_experts {} outside [1, {}]", c.num_experts, kRouterMaxExperts));
    }
    if (c.top_k > kRouterMaxTopK) {
        return not_supported(fmt::format("cuda moe: top_k {} exceeds the router kernel's {}", c.top_k, kRouterMaxTopK));
    }
    if (c.shared_intermediate != 0 && c.shared_intermediate != c.intermediate) {
        return not_supported(fmt::format("cuda moe: shared expert width {} ≠ expert width {} is not supported yet",
                                         c.shared_intermediate, c.intermediate));
    }
    if (c.max_tokens < 1) return invalid_argument(fmt::format("cuda moe: max_tokens {} < 1", c.max_tokens));
    if (c.narrow_max_rows_per_expert < -1) {
        return invalid_argument(
            fmt::format("cuda moe: narrow_max_rows_per_expert {} < −1 (the default)", c.narrow_max_rows_per_expert));
    }
    MoeRouterTopkArgs router;  // T = 0: validates K and the group settings only
    router.num_experts = c.num_experts;
    router.top_k = c.top_k;
    router.scoring_func = c.scoring_func;
    router.topk_method = c.topk_method;
    router.n_group = c.n_group;
    router.topk_group = c.topk_group;
    router.routed_scaling_factor = c.routed_scaling_factor;
    EPI_RETURN_IF_ERROR(moe_router_topk_check(router));
    if ((c.top_k + 1) * c.max_tokens >= std::numeric_limits<int32_t>::max()) {
        return invalid_argument(fmt::format("cuda moe: max_tokens {} × (top_k {} + 1) must stay below 2^31",
                                            c.max_tokens, c.top_k));
    }
    return Status::ok();
}

}  // namespace

Result<std::unique_ptr<CudaMoeLayer>> CudaMoeLayer::create(const CudaMoeLayerConfig& config) {
    EPI_RETURN_IF_ERROR(check_config(config));
    EPI_RETURN_IF_ERROR(cuda_require_device());
    std::unique_ptr<CudaMoeLayer> layer(new CudaMoeLayer(config));
    int device = 0;
    EPI_CUDA_CHECK(cudaGetDevice(&device));
    EPI_CUDA_CHECK(cudaDeviceGetAttribute(&layer->num_sms_, cudaDevAttrMultiProcessorCount, device));
    if (layer->config_.narrow_max_rows_per_expert < 0) {
        layer->config_.narrow_max_rows_per_expert = moe_default_narrow_max_rows(device);
    }

    const int64_t t_max = config.max_tokens;
    const int64_t e = config.num_experts;
    const size_t picks = static_cast<size_t>(t_max * config.top_k);
    const size_t rows = picks + static_cast<size_t>(t_max);
    const size_t groups = static_cast<size_t>(e + 1);
    CudaMoeLayer& l = *layer;
    EPI_ASSIGN_OR_RETURN(l.topk_ids_, CudaBuffer::alloc(picks * 4));
    EPI_ASSIGN_OR_RETURN(l.topk_weights_, CudaBuffer::alloc(picks * 4));
    EPI_ASSIGN_OR_RETURN(l.expert_counts_, CudaBuffer::alloc(static_cast<size_t>(e) * 4));
    EPI_ASSIGN_OR_RETURN(l.expert_offsets_, CudaBuffer::alloc(static_cast<size_t>(e + 1) * 4));
    EPI_ASSIGN_OR_RETURN(l.token_of_row_, CudaBuffer::alloc(rows * 4));
    EPI_ASSIGN_OR_RETURN(l.k_of_slot_, CudaBuffer::alloc(picks * 4));
    EPI_ASSIGN_OR_RETURN(l.slot_of_token_k_, CudaBuffer::alloc(picks * 4));
    EPI_ASSIGN_OR_RETURN(l.group_row_begin_, CudaBuffer::alloc(groups * 4));
    EPI_ASSIGN_OR_RETURN(l.group_row_end_, CudaBuffer::alloc(groups * 4));
    EPI_ASSIGN_OR_RETURN(l.group_tile_offsets_, CudaBuffer::alloc((groups + 1) * 4));
    MoePermuteArgs permute;
    permute.num_tokens = t_max;
    permute.top_k = config.top_k;
    permute.num_experts = e;
    EPI_ASSIGN_OR_RETURN(l.permute_workspace_, CudaBuffer::alloc(moe_permute_workspace_bytes(permute)));
    size_t partials = 0;
    for (int64_t t = 1; t <= t_max; ++t) {  // split-K partials peak somewhere in the narrow range
        if (t * config.top_k > l.config_.narrow_max_rows_per_expert * e) break;
        partials = std::max(partials, l.partial_floats(t));
    }
    EPI_ASSIGN_OR_RETURN(l.partials_, CudaBuffer::alloc(partials * sizeof(float)));
    // Split-K tile counters for any launch up to T_max, zero (the kernels leave them zero).
    MoeGroupedGemmArgs largest;
    largest.max_row_tiles = moe_gemm_max_row_tiles(static_cast<int64_t>(rows), static_cast<int64_t>(groups),
                                                   moe_gemm_tile_rows(MoeGemmTile::kNarrow));
    largest.epilogue = MoeGemmEpilogue::kSwiGlu;
    largest.out_features = config.intermediate;
    const int64_t gate_up_tiles = moe_gemm_num_tiles(largest);
    largest.epilogue = MoeGemmEpilogue::kStore;
    largest.out_features = config.hidden;
    const size_t counters = static_cast<size_t>(std::max(gate_up_tiles, moe_gemm_num_tiles(largest)));
    EPI_ASSIGN_OR_RETURN(l.tile_counters_, CudaBuffer::alloc(counters * sizeof(int32_t)));
    EPI_CUDA_CHECK(cudaMemset(l.tile_counters_.data(), 0, counters * sizeof(int32_t)));
    EPI_ASSIGN_OR_RETURN(l.h_, CudaBuffer::alloc(rows * static_cast<size_t>(config.intermediate) * 2));
    EPI_ASSIGN_OR_RETURN(l.y_, CudaBuffer::alloc(rows * static_cast<size_t>(config.hidden) * 2));
    return layer;
}

int64_t moe_default_narrow_max_rows(int device) {
    return sm90a_available(device) ? 16 : 64;
}

CudaMoeTiling moe_step_tiling(int64_t num_tokens, int64_t top_k, int64_t num_experts, int64_t num_extra_groups,
                              int64_t hidden, int64_t intermediate, int64_t narrow_max_rows_per_expert,
                              int num_sms) {
    CudaMoeTiling tiling;
    if (num_tokens <= kGemvMaxRows) {  // every group (an expert, the shared expert) has ≤ num_tokens rows
        tiling.tile = MoeGemmTile::kGemv;
        tiling.tile_rows = moe_gemv_tile_rows(num_tokens);
        tiling.picks = num_tokens == 1;  // K distinct experts: no weights read twice
        return tiling;
    }
    if (num_tokens * top_k > narrow_max_rows_per_expert * num_experts) {
        tiling.tile = MoeGemmTile::kWide;
        tiling.tile_rows = moe_gemm_tile_rows(MoeGemmTile::kWide);
        return tiling;
    }
    tiling.tile_rows = moe_gemm_tile_rows(MoeGemmTile::kNarrow);
    // Touched groups: at most min(E, T·K), plus the extra groups.
    const int64_t groups = std::min(num_experts, num_tokens * top_k) + num_extra_groups;
    const int64_t features = moe_gemm_tile_features(MoeGemmTile::kNarrow);
    const int64_t gate_up_tiles = groups * ((intermediate + features / 2 - 1) / (features / 2));
    const int64_t down_tiles = groups * ((hidden + features - 1) / features);
    tiling.split_k_gate_up = moe_gemm_pick_split_k(gate_up_tiles, hidden, num_sms);
    tiling.split_k_down = moe_gemm_pick_split_k(down_tiles, intermediate, num_sms);
    return tiling;
}

CudaMoeTiling CudaMoeLayer::tiling(int64_t num_tokens) const {
    const CudaMoeLayerConfig& c = config_;
    return moe_step_tiling(num_tokens, c.top_k, c.num_experts, c.shared_intermediate > 0 ? 1 : 0, c.hidden,
                           c.intermediate, c.narrow_max_rows_per_expert, num_sms_);
}

size_t CudaMoeLayer::partial_floats(int64_t num_tokens) const {
    const CudaMoeTiling t = tiling(num_tokens);
    const size_t rows = static_cast<size_t>(num_tokens * (config_.top_k + 1));
    const size_t gate_up = t.split_k_gate_up > 1 ? t.split_k_gate_up * rows * 2 * config_.intermediate : 0;
    const size_t down = t.split_k_down > 1 ? t.split_k_down * rows * config_.hidden : 0;
    return std::max(gate_up, down);
}

Status CudaMoeLayer::set_routing(const int32_t* topk_ids, const float* topk_weights, int64_t num_tokens) {
    if (num_tokens < 0 || num_tokens > config_.max_tokens) {
        return invalid_argument(
            fmt::format("cuda moe: {} tokens outside [0, max_tokens {}]", num_tokens, config_.max_tokens));
    }
    const size_t bytes = static_cast<size_t>(num_tokens * config_.top_k) * 4;
    EPI_CUDA_CHECK(cudaMemcpy(topk_ids_.data(), topk_ids, bytes, cudaMemcpyHostToDevice));
    EPI_CUDA_CHECK(cudaMemcpy(topk_weights_.data(), topk_weights, bytes, cudaMemcpyHostToDevice));
    // A pageable cudaMemcpy may return before its DMA lands; later work on a non-blocking stream would
    // not wait for it.
    EPI_CUDA_CHECK(cudaDeviceSynchronize());
    return Status::ok();
}

Status CudaMoeLayer::forward(const CudaMoeWeights& weights, const float* logits, const void* x,
                             int64_t num_tokens, float* out, cudaStream_t stream, CudaMoeStepOptions options) {
    const CudaMoeLayerConfig& c = config_;
    if (num_tokens < 0 || num_tokens > c.max_tokens) {
        return invalid_argument(fmt::format("cuda moe: {} tokens outside [0, max_tokens {}]", num_tokens, c.max_tokens));
    }
    if (num_tokens == 0) return Status::ok();
    const bool shared = options.shared && c.shared_intermediate > 0;
    if (weights.gate_up == nullptr || weights.down == nullptr || x == nullptr || out == nullptr ||
        (options.route && logits == nullptr) ||
        (shared && (weights.shared_gate_up == nullptr || weights.shared_down == nullptr))) {
        return invalid_argument("cuda moe: a weight, logits, x or out pointer is null");
    }
    const int64_t t = num_tokens;
    const int64_t picks = t * c.top_k;

    if (options.route) {
        MoeRouterTopkArgs router;
        router.router_logits = logits;
        router.e_score_correction_bias = weights.e_score_correction_bias;
        router.topk_ids = topk_ids_.as<int32_t>();
        router.topk_weights = topk_weights_.as<float>();
        router.num_tokens = t;
        router.num_experts = c.num_experts;
        router.top_k = c.top_k;
        router.scoring_func = c.scoring_func;
        router.topk_method = c.topk_method;
        router.n_group = c.n_group;
        router.topk_group = c.topk_group;
        router.norm_topk_prob = c.norm_topk_prob;
        router.routed_scaling_factor = c.routed_scaling_factor;
        EPI_CUDA_CHECK(launch_moe_router_topk(router, stream));
    }

    const CudaMoeTiling tiling = this->tiling(t);
    const int64_t tile_rows = tiling.tile_rows;
    MoePermuteArgs permute;
    permute.topk_ids = topk_ids_.as<int32_t>();
    permute.num_tokens = t;
    permute.top_k = c.top_k;
    permute.num_experts = c.num_experts;
    permute.expert_counts = expert_counts_.as<int32_t>();
    permute.expert_offsets = expert_offsets_.as<int32_t>();
    permute.token_of_row = token_of_row_.as<int32_t>();
    permute.k_of_slot = k_of_slot_.as<int32_t>();
    permute.slot_of_token_k = slot_of_token_k_.as<int32_t>();
    permute.group_row_begin = group_row_begin_.as<int32_t>();
    permute.group_row_end = group_row_end_.as<int32_t>();
    permute.group_tile_offsets = group_tile_offsets_.as<int32_t>();
    permute.tile_rows = tile_rows;
    permute.shared_group = shared;
    if (!tiling.picks) {
        EPI_CUDA_CHECK(
            launch_moe_permute(permute, permute_workspace_.data(), permute_workspace_.num_bytes(), stream));
    }

    const int64_t num_groups = c.num_experts + (shared ? 1 : 0);
    const int64_t rows = picks + (shared ? t : 0);
    MoeGroupedGemmArgs gemm;
    gemm.num_weight_groups = c.num_experts;
    gemm.group_row_begin = group_row_begin_.as<int32_t>();
    gemm.group_row_end = group_row_end_.as<int32_t>();
    gemm.group_tile_offsets = group_tile_offsets_.as<int32_t>();
    gemm.num_groups = num_groups;
    gemm.max_row_tiles = moe_gemm_max_row_tiles(rows, num_groups, tile_rows);
    gemm.tile = tiling.tile;
    gemm.gemv_rows = static_cast<int>(tile_rows);
    if (tiling.picks) {
        gemm.picks.expert_ids = topk_ids_.as<int32_t>();
        gemm.picks.num_tokens = t;
        gemm.picks.top_k = c.top_k;
    }
    gemm.partials = partials_.as<float>();
    gemm.tile_counters = tile_counters_.as<int32_t>();
    gemm.partial_rows = picks + t;

    MoeGroupedGemmArgs gate_up = gemm;  // h = silu(x·gateᵀ) · (x·upᵀ)
    gate_up.weights = weights.gate_up;
    gate_up.weight_group_stride = 2 * c.intermediate * c.hidden;
    gate_up.extra_weights = shared ? weights.shared_gate_up : nullptr;
    gate_up.x = x;
    gate_up.x_row_of_row = tiling.picks ? nullptr : token_of_row_.as<int32_t>();
    gate_up.picks.x_per_token = true;
    gate_up.out_features = c.intermediate;
    gate_up.in_features = c.hidden;
    gate_up.out = h_.data();
    gate_up.epilogue = MoeGemmEpilogue::kSwiGlu;
    gate_up.split_k = tiling.split_k_gate_up;
    EPI_CUDA_CHECK(launch_moe_grouped_gemm(gate_up, stream));

    MoeGroupedGemmArgs down = gemm;  // y = h·downᵀ
    down.weights = weights.down;
    down.weight_group_stride = c.hidden * c.intermediate;
    down.extra_weights = shared ? weights.shared_down : nullptr;
    down.x = h_.data();
    down.out_features = c.hidden;
    down.in_features = c.intermediate;
    down.out = y_.data();
    down.epilogue = MoeGemmEpilogue::kStore;
    down.split_k = tiling.split_k_down;
    EPI_CUDA_CHECK(launch_moe_grouped_gemm(down, stream));

    MoeCombineArgs combine;
    combine.y = y_.data();
    combine.topk_weights = topk_weights_.as<float>();
    combine.slot_of_token_k = tiling.picks ? nullptr : slot_of_token_k_.as<int32_t>();
    combine.topk_ids = topk_ids_.as<int32_t>();
    combine.num_experts = c.num_experts;
    combine.shared_y = shared ? y_.as<unsigned char>() + picks * c.hidden * 2 : nullptr;
    combine.out = out;
    combine.num_tokens = t;
    combine.top_k = c.top_k;
    combine.hidden = c.hidden;
    EPI_CUDA_CHECK(launch_moe_combine(combine, stream));
    return Status::ok();
}

CudaMoePlanView CudaMoeLayer::plan() const {
    CudaMoePlanView v;
    v.topk_ids = topk_ids_.as<int32_t>();
    v.topk_weights = topk_weights_.as<float>();
    v.expert_counts = expert_counts_.as<int32_t>();
    v.expert_offsets = expert_offsets_.as<int32_t>();
    v.token_of_row = token_of_row_.as<int32_t>();
    v.k_of_slot = k_of_slot_.as<int32_t>();
    v.slot_of_token_k = slot_of_token_k_.as<int32_t>();
    v.h = h_.data();
    v.y = y_.data();
    return v;
}

}  // namespace epinfer::cuda
