// Router top-k on the GPU: every variant of backend/moe_router_args.h, fused in one kernel, one warp per
// token. Ids and their order are those of the CPU reference (cpu_moe_router_topk) for the same fp32
// logits; every fp32 operation runs in the CPU code's order (sequential softmax sum, renormalisation in
// k order), so weights differ only where exp differs: glibc's expf vs a double-precision exp rounded to
// fp32 here (≤ 4 ulp after the softmax sum and renormalisation; tests/common/tolerances.h
// "moe_router_weights").
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/moe_router_args.h"

namespace epinfer::cuda {

// Largest E the kernel takes (its per-warp scores live in shared memory).
inline constexpr int64_t kRouterMaxExperts = 4096;
// Largest K (one lane of the token's warp holds each choice).
inline constexpr int64_t kRouterMaxTopK = 32;

// Runs the router on args (device pointers; T = 0 launches nothing). No workspace.
// @pre moe_router_topk_check(args) is OK, args.num_experts ≤ kRouterMaxExperts, args.top_k ≤ kRouterMaxTopK.
cudaError_t launch_moe_router_topk(const MoeRouterTopkArgs& args, cudaStream_t stream);

}  // namespace epinfer::cuda
