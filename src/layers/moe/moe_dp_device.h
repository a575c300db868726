// DP attention's MoE block on device memory (GPU ranks): each attention-DP group owns its tokens; the
// experts are split over moe_ep. Per layer, on a rank whose share of its group's tokens is x[share]:
//   1. route (the [T, K] ids and weights come to the host) and dispatch the share (ep_device.h: the
//      bookkeeping over host_moe_ep, MPI; the rows over moe_ep, NCCL);
//   2. the owner runs its local experts on the received rows (one moe_experts op, local slot ids) and
//      all-reduces the partial sums over moe_tp;
//   3. combine them home (ep_device.h; the moe_tp lead writes them), + the shared slice, all-reduce over
//      attn_tp, as the host path (moe_block.cc).
// The same rows, experts and summation order as the host path; the floats differ from it only where the
// backend's ops do.
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
