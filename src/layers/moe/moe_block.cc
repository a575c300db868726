#include "layers/moe/moe_block.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "layers/moe/ep_combine.h"
#include "layers/moe/ep_dispatch.h"
#include "layers/moe/moe_dp_device.h"
#include "parallel/sharding.h"

namespace epinfer {

Result<MoeDeviceRouting> moe_route_on_device(Backend& backend, const MoeBlockWeights& w,
                                             const MoeRouterParams& p, const float* x, int64_t num_rows) {
    const int64_t T = num_rows, E = w.router.out_features, K = p.top_k;
    MoeDeviceRouting routing;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::alloc_f32(backend, T * E));  // [T, E]
    EPI_ASSIGN_OR_RETURN(routing.topk_ids,
                         DeviceBuffer::alloc(backend, static_cast<size_t>(T * K) * 4));           // [T, K]
    EPI_ASSIGN_OR_RETURN(routing.topk_weights, DeviceBuffer::alloc_f32(backend, T * K));  // [T, K]
    EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.router, x, T, logits.f32()), "router");

    MoeRouterTopkArgs args;
    args.router_logits = logits.f32();
    args.e_score_correction_bias = w.e_score_correction_bias;
    args.topk_ids = routing.ids();
    args.topk_weights = routing.topk_weights.f32();
    args.num_tokens = T;
    args.num_experts = E;
    args.top_k = K;
    args.scoring_func = p.scoring_func;
    args.topk_method = p.topk_method;
    args.n_group = p.n_group;
    args.topk_group = p.topk_group;
    args.norm_topk_prob = p.norm_topk_prob;
    args.routed_scaling_factor = p.routed_scaling_factor;
    EPI_RETURN_IF_ERROR(backend.moe_router_topk(args));
    return routing;
}

Result<MoeRouting> moe_route(Backend& backend, const MoeBlockWeights& w, const MoeRouterParams& p,
                             const float* x, int64_t num_rows) {
    const int64_t T = num_rows, E = w.router.out_features, K = p.top_k;
    EPI_ASSIGN_OR_RETURN(MoeDeviceRouting device, moe_route_on_device(backend, w, p, x, T));
    MoeRouting routing;
    routing.topk_ids.resize(static_cast<size_t>(T * K));
    routing.topk_weights.resize(static_cast<size_t>(T * K));
    EPI_RETURN_IF_ERROR(
        backend.copy_to_host(routing.topk_ids.data(), device.topk_ids.data(), device.topk_ids.num_bytes()));
    EPI_RETURN_IF_ERROR(backend.copy_to_host(routing.topk_weights.data(), device.topk_weights.data(),
                                             device.topk_weights.num_bytes()));
    routing.plan = moe_permute_plan(routing.topk_ids.data(), T, K, E);
    return routing;
}

Status moe_experts_forward(Backend& backend, const std::vector<DenseFfnWeights>& experts, int64_t first_expert,
                           const int32_t* topk_ids, const float* topk_weights, const float* x, int64_t num_rows,
                           int64_t hidden, int64_t top_k, float* out) {
    if (num_rows == 0) return Status::ok();
    if (experts.empty()) return invalid_argument("moe: no local expert to run");
    const Linear& first = experts.front().gate_proj;
    std::vector<MoeExpertWeights> table(experts.size());  // [E_loc]
    for (size_t e = 0; e < experts.size(); ++e) {
        const DenseFfnWeights& f = experts[e];
        const bool same_shape = f.gate_proj.out_features == first.out_features &&
                                f.up_proj.out_features == first.out_features &&
                                f.down_proj.in_features == first.out_features && f.gate_proj.in_features == hidden &&
                                f.up_proj.in_features == hidden && f.down_proj.out_features == hidden;
        const bool same_dtype = f.gate_proj.dtype == first.dtype && f.up_proj.dtype == first.dtype &&
                                f.down_proj.dtype == first.dtype;
        if (!same_shape || !same_dtype) {
            return invalid_argument("moe: expert " + std::to_string(e) +
                                    " differs from expert 0 in shape or dtype (the experts op takes one of each)");
        }
        table[e] = {f.gate_proj.weight, f.up_proj.weight, f.down_proj.weight};
    }
    MoeExpertsArgs args;
    args.x = x;
    args.topk_ids = topk_ids;
    args.topk_weights = topk_weights;
    args.experts = table.data();
    args.weight_dtype = first.dtype;
    args.out = out;
    args.num_tokens = num_rows;
    args.top_k = top_k;
    args.num_experts = static_cast<int64_t>(experts.size());
    args.first_expert = first_expert;
    args.hidden = hidden;
    args.intermediate = first.out_features;
    return backend.moe_experts(args);
}

Status moe_grouped_ffn(Backend& backend, const std::vector<DenseFfnWeights>& experts,
                       const MoeRoutePlan& plan, const float* x_perm, int64_t hidden, float* y_perm) {
    for (size_t e = 0; e < experts.size(); ++e) {
        const int64_t count = plan.expert_counts[e], offset = plan.expert_offsets[e];
        if (count == 0) continue;
        EPI_RETURN_IF_ERROR_CTX(
            dense_ffn_forward(backend, experts[e], x_perm + offset * hidden, count, y_perm + offset * hidden),
            "expert " + std::to_string(e));
    }
    return Status::ok();
}

namespace {

// The picks of `topk_ids` ([n, K] global ids) that live on this rank, as local slots (−1 elsewhere).
std::vector<int32_t> local_slots_of(const MoeBlockWeights& w, const std::vector<int32_t>& topk_ids) {
    const int64_t first = w.first_local_expert, count = static_cast<int64_t>(w.experts.size());
    std::vector<int32_t> slots(topk_ids.size());
    for (size_t i = 0; i < topk_ids.size(); ++i) {
        const int64_t slot = int64_t{topk_ids[i]} - first;
        slots[i] = topk_ids[i] >= 0 && slot >= 0 && slot < count ? static_cast<int32_t>(slot) : -1;
    }
    return slots;
}

// out = Σ over each row's picks of weight · expert(x) for the local experts, through `plan`.
// x: [n, H] fp32 host; topk_weights: [n, K] fp32 host; out: [n, H] fp32 host.
Status run_local_experts(Backend& backend, const MoeBlockWeights& w, const MoeRoutePlan& plan,
                         const float* topk_weights, const float* x, int64_t hidden, float* out) {
    const int64_t S = plan.num_slots(), H = hidden;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer x_perm, DeviceBuffer::alloc_f32(backend, S * H));  // [S, H]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer y_perm, DeviceBuffer::alloc_f32(backend, S * H));  // [S, H]
    moe_permute_rows(plan, x, static_cast<size_t>(H) * sizeof(float), x_perm.data());
    EPI_RETURN_IF_ERROR(moe_grouped_ffn(backend, w.experts, plan, x_perm.f32(), H, y_perm.f32()));
    moe_combine_rows(plan, y_perm.f32(), topk_weights, H, out);
    return Status::ok();
}

}  // namespace

Status moe_add_shared_experts(Backend& backend, const MoeBlockWeights& w, const float* x, int64_t num_rows,
                              int64_t hidden, float* out) {
    const int64_t T = num_rows, H = hidden;
    if (w.shared_mode == SharedExpertMode::kNone || T == 0) return Status::ok();
    EPI_ASSIGN_OR_RETURN(DeviceBuffer shared, DeviceBuffer::alloc_f32(backend, T * H));  // [T, H]
    EPI_RETURN_IF_ERROR_CTX(dense_ffn_forward(backend, w.shared, x, T, shared.f32()), "shared expert");
    if (w.shared_mode == SharedExpertMode::kUnweighted) {
        AddArgs add;
        add.a = out;
        add.b = shared.f32();
        add.out = out;
        add.num_elements = T * H;
        return backend.add(add);
    }
    EPI_ASSIGN_OR_RETURN(DeviceBuffer gate, DeviceBuffer::alloc_f32(backend, T));  // [T, 1]
    EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.shared_gate, x, T, gate.f32()), "shared_expert_gate");
    AddSigmoidGatedArgs gated;
    gated.a = out;
    gated.gate = gate.f32();
    gated.b = shared.f32();
    gated.out = out;
    gated.num_rows = T;
    gated.width = H;
    return backend.add_sigmoid_gated(gated);
}

namespace {

// DP attention: dispatch this rank's share of its tokens to the EP ranks of their experts, run the
// local experts there, bring the weighted sums home; shared slice and the attn_tp all-reduce.
Status moe_dp_forward(Backend& backend, const MoeBlockWeights& w, const MoeRouterParams& p,
                      const MoeParallel& par, const float* x, int64_t num_rows, int64_t hidden, float* out) {
    const int64_t T = num_rows, H = hidden, K = p.top_k;
    MoeRouting routing;
    if (T > 0) {
        EPI_ASSIGN_OR_RETURN(routing, moe_route(backend, w, p, x, T));
    }
    // The attn_tp ranks of one DP group hold the same tokens: attn_tp / moe_tp of them (one per moe_tp
    // group) each dispatch a share, so every token is dispatched once per moe_tp rank.
    const int num_shares = par.attn_tp_size / par.moe_tp_size;
    const ShardRange share = split_evenly(T, num_shares, par.attn_tp_rank / par.moe_tp_size);
    EpDispatchArgs dispatch;
    dispatch.x = x + share.begin * H;
    dispatch.num_tokens = share.size;
    dispatch.row_bytes = static_cast<size_t>(H) * sizeof(float);
    dispatch.topk_ids = routing.topk_ids.data() + share.begin * K;
    dispatch.topk_weights = routing.topk_weights.data() + share.begin * K;
    dispatch.top_k = K;
    EPI_ASSIGN_OR_RETURN(EpDispatchOutput received, ep_dispatch(*par.moe_ep, *par.placement, dispatch));

    const int64_t R = received.num_rows;
    const MoeRoutePlan plan =
        moe_permute_plan(received.local_slots.data(), R, K, static_cast<int64_t>(w.experts.size()));
    std::vector<float> partial(static_cast<size_t>(R * H));  // [R, H]
    EPI_RETURN_IF_ERROR(run_local_experts(backend, w, plan, received.weights.data(),
                                          reinterpret_cast<const float*>(received.rows.data()), H,
                                          partial.data()));
    EPI_RETURN_IF_ERROR(all_reduce_sum_f32(par.moe_tp, partial.data(), R * H));
    std::vector<float> share_out(static_cast<size_t>(share.size * H));  // [share, H]
    EpCombineArgs combine;
    combine.handle = &received.handle;
    combine.partial = partial.data();
    combine.hidden = H;
    combine.out = share_out.data();
    EPI_RETURN_IF_ERROR(ep_combine(*par.moe_ep, combine));

    std::fill(out, out + T * H, 0.0f);
    if (par.moe_tp_rank == 0) std::copy(share_out.begin(), share_out.end(), out + share.begin * H);
    EPI_RETURN_IF_ERROR(moe_add_shared_experts(backend, w, x, T, H, out));
    return all_reduce_sum_f32(par.attn_tp, out, T * H);
}

// DP attention where a moe_tp group spans several DP groups (moe_tp does not divide attn_tp): every rank
// gathers the tokens of the whole stage (DP groups in order), runs its local experts on all of them and its
// shared slice on its own rows, all-reduce over the stage, and keeps its own rows.
Status moe_gathered_forward(Backend& backend, const MoeBlockWeights& w, const MoeRouterParams& p,
                            const MoeParallel& par, const float* x, int64_t num_rows, int64_t hidden,
                            float* out) {
    const int64_t T = num_rows, H = hidden;
    Communicator& stage = *par.stage;
    const auto W = static_cast<size_t>(stage.size());
    std::vector<int64_t> counts(W);  // [W] tokens of each rank of the stage
    EPI_RETURN_IF_ERROR(stage.all_gather(&T, counts.data(), 1, DType::kI64));
    const int64_t max_rows = *std::max_element(counts.begin(), counts.end());
    if (max_rows == 0) return Status::ok();
    std::vector<float> padded(static_cast<size_t>(max_rows * H), 0.0f);  // [max_rows, H]
    std::copy(x, x + T * H, padded.begin());
    std::vector<float> gathered(W * static_cast<size_t>(max_rows * H));  // [W, max_rows, H]
    EPI_RETURN_IF_ERROR(stage.all_gather(padded.data(), gathered.data(), max_rows * H, DType::kF32));
    // The rows of DP group d come from its first rank (local rank d · attn_tp).
    std::vector<float> all_x;  // [T_all, H]
    int64_t own_begin = 0;
    for (int d = 0; d < par.attn_dp_size; ++d) {
        const size_t src = static_cast<size_t>(d * par.attn_tp_size);
        if (d == par.attn_dp_rank) own_begin = static_cast<int64_t>(all_x.size()) / H;
        const auto first = gathered.begin() + static_cast<int64_t>(src) * max_rows * H;
        all_x.insert(all_x.end(), first, first + counts[src] * H);
    }
    const int64_t T_all = static_cast<int64_t>(all_x.size()) / H;
    EPI_ASSIGN_OR_RETURN(MoeRouting routing, moe_route(backend, w, p, all_x.data(), T_all));
    const std::vector<int32_t> slots = local_slots_of(w, routing.topk_ids);
    routing.plan = moe_permute_plan(slots.data(), T_all, p.top_k, static_cast<int64_t>(w.experts.size()));
    std::vector<float> all_out(static_cast<size_t>(T_all * H));  // [T_all, H]
    EPI_RETURN_IF_ERROR(run_local_experts(backend, w, routing.plan, routing.topk_weights.data(), all_x.data(),
                                          H, all_out.data()));
    EPI_RETURN_IF_ERROR(moe_add_shared_experts(backend, w, x, T, H, all_out.data() + own_begin * H));
    EPI_RETURN_IF_ERROR(all_reduce_sum_f32(&stage, all_out.data(), T_all * H));
    std::copy(all_out.begin() + own_begin * H, all_out.begin() + (own_begin + T) * H, out);
    return Status::ok();
}

}  // namespace

MoeParallel moe_parallel_of(const ParallelContext& par) {
    MoeParallel m;
    m.stage = par.stage.get();
    m.attn_tp = par.attn_tp.get();
    m.moe_tp = par.moe_tp.get();
    m.moe_ep = par.moe_ep.get();
    m.host_moe_ep = par.host_moe_ep.get();
    m.placement = &par.placement;
    m.dp_attention = par.dp_attention();
    m.attn_tp_rank = par.coords.attn_tp_rank;
    m.attn_tp_size = par.layout.attn_tp;
    m.moe_tp_rank = par.coords.moe_tp_rank;
    m.moe_tp_size = par.layout.moe_tp;
    m.attn_dp_rank = par.coords.attn_dp_rank;
    m.attn_dp_size = par.layout.attn_dp;
    return m;
}

Status moe_block_forward(Backend& backend, const MoeBlockWeights& w, const MoeRouterParams& p, const float* x,
                         int64_t num_rows, int64_t hidden, float* out, const MoeParallel* parallel) {
    const int64_t T = num_rows, H = hidden;
    if (parallel != nullptr && parallel->dp_attention) {
        const bool shares = parallel->attn_tp_size % parallel->moe_tp_size == 0;
        if (backend.host_accessible())
            return shares ? moe_dp_forward(backend, w, p, *parallel, x, T, H, out)
                          : moe_gathered_forward(backend, w, p, *parallel, x, T, H, out);
        if (!shares) {
            return not_supported(fmt::format("moe: DP attention with moe_tp {} not dividing attn_tp {} gathers "
                                             "tokens on host memory; backend {} is not host-accessible",
                                             parallel->moe_tp_size, parallel->attn_tp_size, backend.name()));
        }
        return moe_dp_forward_device(backend, w, p, *parallel, x, T, H, out);
    }
    if (T == 0) return Status::ok();
    EPI_ASSIGN_OR_RETURN(MoeDeviceRouting routing, moe_route_on_device(backend, w, p, x, T));
    // Global ids: the op runs the picks of this rank's block [first_local_expert, +experts.size()).
    EPI_RETURN_IF_ERROR(moe_experts_forward(backend, w.experts, w.first_local_expert, routing.ids(),
                                            routing.topk_weights.f32(), x, T, H, p.top_k, out));
    EPI_RETURN_IF_ERROR(moe_add_shared_experts(backend, w, x, T, H, out));
    return all_reduce_sum_f32(parallel != nullptr ? parallel->stage : nullptr, out, T * H);
}

}  // namespace epinfer
