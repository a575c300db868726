// DP attention's MoE block on device memory (GPU ranks): each attention-DP group owns its tokens; the
// experts are split over moe_ep. Per layer, on a rank whose share of its group's tokens is x[share]:
//   1. the host plans the dispatch from the routing (downloaded [T, K] ids and weights): ep_dispatch's
//      bookkeeping over host_moe_ep (MPI; row_bytes 0): which token row goes to which EP rank, and the local
//      slots and weights of the picks that live there;
//   2. the rows, gathered from x at the plan's token_of_send (an embedding lookup into x), go as device
//      memory over moe_ep (NCCL all_to_all_v, fp32), in the plan's order;
//   3. the owner runs its local experts on the received rows (one moe_experts op, local slot ids) and
//      all-reduces the partial sums over moe_tp;
//   4. the partial rows go home by the reverse all_to_all_v; home sums them per token in EP-rank order
//      (out = row from rank 0 + row from rank 1 + ...; a zero row where a rank got nothing), the moe_tp lead
//      only; then + the shared slice and the all-reduce over attn_tp, as the host path (moe_block.cc).
// The same rows, experts and summation order as the host path (ep_dispatch.h, ep_combine.h); the floats
// differ from it only where the backend's ops do. Source of the scheme: DeepEP's dispatch → expert →
// combine with a host-side layout (its "normal" mode computes the layout on the GPU).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/status.h"
#include "layers/moe/moe_block.h"

namespace epinfer {

// x: [T, H] fp32 device (this rank's DP group's tokens; T may be 0); out: [T, H] fp32 device. Every rank of
// the stage calls it. par: moe_ep and moe_tp and attn_tp in device memory, host_moe_ep over MPI; moe_tp
// must divide attn_tp.
// Errors: ep_dispatch's (a bad id, ranks disagreeing on K); op and communicator errors.
Status moe_dp_forward_device(Backend& backend, const MoeBlockWeights& weights, const MoeRouterParams& params,
                             const MoeParallel& par, const float* x, int64_t num_rows, int64_t hidden, float* out);

}  // namespace epinfer
