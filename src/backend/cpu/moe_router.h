// CPU reference of the router top-k op (semantics: backend/moe_router_args.h, ARCHITECTURE.md §4).
#pragma once

#include "backend/moe_router_args.h"
#include "core/status.h"

namespace epinfer {

// Routes every token row of args.router_logits ([T, E] fp32, host) to K experts: writes args.topk_ids
// ([T, K] int32, host; −1 = no expert) and args.topk_weights ([T, K] fp32, host), each row in descending
// choice score, ties by ascending id. Plain loops, fp32 throughout, single-threaded, deterministic.
// Errors: those of moe_router_topk_check (nothing is written then).
Status cpu_moe_router_topk(const MoeRouterTopkArgs& args);

}  // namespace epinfer
