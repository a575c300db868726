#include "layers/moe/moe_dp_device.h"

#include <vector>

#include "layers/moe/ep_device.h"
#include "layers/parallel_context.h"
#include "parallel/sharding.h"

namespace epinfer {

Status moe_dp_forward_device(Backend& backend, const MoeBlockWeights& w, const MoeRouterParams& p,
                             const MoeParallel& par, const float* x, int64_t num_rows, int64_t hidden, float* out) {
    const int64_t T = num_rows, H = hidden, K = p.top_k;
    MoeRouting routing;  // host ids and weights
    if (T > 0) {
        EPI_ASSIGN_OR_RETURN(routing, moe_route(backend, w, p, x, T));
    }
    // The attn_tp ranks of one DP group hold the same tokens: each moe_tp group dispatches its share, so
    // every token goes out once per moe_tp rank (as moe_dp_forward).
    const int num_shares = par.attn_tp_size / par.moe_tp_size;
    const ShardRange share = split_evenly(T, num_shares, par.attn_tp_rank / par.moe_tp_size);
    EpDeviceDispatchArgs dispatch;
    dispatch.x = x;
    dispatch.num_rows = T;
    dispatch.hidden = H;
    dispatch.first_token = share.begin;
    dispatch.num_tokens = share.size;
    dispatch.topk_ids = routing.topk_ids.data() + share.begin * K;
    dispatch.topk_weights = routing.topk_weights.data() + share.begin * K;
    dispatch.top_k = K;
    dispatch.combine_writes = par.moe_tp_rank == 0;
    EPI_ASSIGN_OR_RETURN(EpDeviceDispatch received,
                         ep_dispatch_device(backend, *par.host_moe_ep, *par.moe_ep, *par.placement, dispatch));
    const int64_t R = received.plan.num_rows;

    // The local experts on the received rows (local slot ids), summed over moe_tp.
    EPI_ASSIGN_OR_RETURN(DeviceBuffer partial, DeviceBuffer::alloc_f32(backend, R * H));  // [R, H]
    if (R > 0) {
        EPI_RETURN_IF_ERROR(moe_experts_forward(backend, w.experts, /*first_expert=*/0,
                                                received.local_slots(), received.weights(),
                                                received.rows.f32(), R, H, K, partial.f32()));
    }
    EPI_RETURN_IF_ERROR(all_reduce_sum_f32(par.moe_tp, partial.f32(), R * H));

    EpDeviceCombineArgs combine;
    combine.dispatch = &received;
    combine.partial = partial.f32();
    combine.hidden = H;
    combine.out = out;
    EPI_RETURN_IF_ERROR(ep_combine_device(backend, *par.moe_ep, combine));
    EPI_RETURN_IF_ERROR(moe_add_shared_experts(backend, w, x, T, H, out));
    return all_reduce_sum_f32(par.attn_tp, out, T * H);
}

}  // namespace epinfer
