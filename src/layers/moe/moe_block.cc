#include "layers/moe/moe_block.h"

#include <string>

namespace epinfer {

Result<MoeRouting> moe_route(Backend& backend, const MoeBlockWeights& w, const MoeRouterParams& p,
                             const float* x, int64_t num_rows) {
    const int64_t T = num_rows, E = w.router.out_features, K = p.top_k;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::alloc_f32(backend, T * E));  // [T, E]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer ids,
                         DeviceBuffer::alloc(backend, static_cast<size_t>(T * K) * 4));   // [T, K]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer weights, DeviceBuffer::alloc_f32(backend, T * K));  // [T, K]
    EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.router, x, T, logits.f32()), "router");

    MoeRouterTopkArgs args;
    args.router_logits = logits.f32();
    args.e_score_correction_bias = w.e_score_correction_bias;
    args.topk_ids = static_cast<int32_t*>(ids.data());
    args.topk_weights = weights.f32();
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

    MoeRouting routing;
    routing.topk_ids.resize(static_cast<size_t>(T * K));
    routing.topk_weights.resize(static_cast<size_t>(T * K));
    EPI_RETURN_IF_ERROR(backend.copy_to_host(routing.topk_ids.data(), ids.data(), ids.num_bytes()));
    EPI_RETURN_IF_ERROR(
        backend.copy_to_host(routing.topk_weights.data(), weights.data(), weights.num_bytes()));
    routing.plan = moe_permute_plan(routing.topk_ids.data(), T, K, E);
    return routing;
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

Status moe_block_forward(Backend& backend, const MoeBlockWeights& w, const MoeRouterParams& p, const float* x,
                         int64_t num_rows, int64_t hidden, float* out) {
    if (!backend.host_accessible()) {
        return not_supported(std::string("moe: permute and combine run on host memory; backend ") +
                             backend.name() + " is not host-accessible");
    }
    const int64_t T = num_rows, H = hidden;
    EPI_ASSIGN_OR_RETURN(MoeRouting routing, moe_route(backend, w, p, x, T));
    const int64_t S = routing.plan.num_slots();
    EPI_ASSIGN_OR_RETURN(DeviceBuffer x_perm, DeviceBuffer::alloc_f32(backend, S * H));  // [S, H]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer y_perm, DeviceBuffer::alloc_f32(backend, S * H));  // [S, H]
    moe_permute_rows(routing.plan, x, static_cast<size_t>(H) * sizeof(float), x_perm.data());
    EPI_RETURN_IF_ERROR(moe_grouped_ffn(backend, w.experts, routing.plan, x_perm.f32(), H, y_perm.f32()));
    moe_combine_rows(routing.plan, y_perm.f32(), routing.topk_weights.data(), H, out);

    if (w.shared_mode == SharedExpertMode::kNone) return Status::ok();
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

}  // namespace epinfer
