#include "backend/moe_router_args.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace epinfer {

Status moe_router_topk_check(const MoeRouterTopkArgs& args) {
    const int64_t num_experts = args.num_experts;
    if (args.num_tokens < 0) {
        return invalid_argument(fmt::format("moe_router_topk: num_tokens {} < 0", args.num_tokens));
    }
    if (num_experts < 1 || num_experts > std::numeric_limits<int32_t>::max()) {
        return invalid_argument(
            fmt::format("moe_router_topk: num_experts {} outside [1, 2^31)", num_experts));
    }
    if (args.top_k < 1 || args.top_k > num_experts) {
        return invalid_argument(
            fmt::format("moe_router_topk: top_k {} outside [1, num_experts {}]", args.top_k, num_experts));
    }
    if (args.n_group < 1 || num_experts % args.n_group != 0) {
        return invalid_argument(fmt::format("moe_router_topk: n_group {} does not divide num_experts {}",
                                            args.n_group, num_experts));
    }
    if (args.topk_group < 1 || args.topk_group > args.n_group) {
        return invalid_argument(fmt::format("moe_router_topk: topk_group {} outside [1, n_group {}]",
                                            args.topk_group, args.n_group));
    }
    const int64_t group_size = num_experts / args.n_group;
    if (args.topk_group * group_size < args.top_k) {
        return invalid_argument(
            fmt::format("moe_router_topk: topk_group {} × experts per group {} < top_k {}", args.topk_group,
                        group_size, args.top_k));
    }
    if (args.topk_method == TopkMethod::kNoauxTc && args.n_group > 1 && group_size < 2) {
        return invalid_argument(fmt::format(
            "moe_router_topk: noaux_tc needs ≥ 2 experts per group for its top-2 group score, got {}",
            group_size));
    }
    if (!std::isfinite(args.routed_scaling_factor)) {
        return invalid_argument(fmt::format("moe_router_topk: routed_scaling_factor {} is not finite",
                                            args.routed_scaling_factor));
    }
    if (args.num_tokens > 0 &&
        (args.router_logits == nullptr || args.topk_ids == nullptr || args.topk_weights == nullptr)) {
        return invalid_argument("moe_router_topk: router_logits, topk_ids and topk_weights must be non-null");
    }
    return Status::ok();
}

}  // namespace epinfer
