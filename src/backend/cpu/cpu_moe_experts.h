// The CPU reference of the routed-experts op (backend/moe_experts_args.h): permutation plan, rows gathered
// in slot order, per expert gate/up matmul → silu_mul → down matmul in fp32, weighted combine in k order.
#pragma once

#include "backend/cpu/thread_pool.h"
#include "backend/moe_experts_args.h"

namespace epinfer {

// @pre moe_experts_check(args) is OK; host memory throughout.
void cpu_moe_experts(const MoeExpertsArgs& args, ThreadPool& pool);

}  // namespace epinfer
