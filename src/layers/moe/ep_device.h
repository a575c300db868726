// Expert-parallel dispatch and combine of rows in the backend's memory (GPU ranks: NCCL; the same code runs
// on CPU ranks over MPI). The bookkeeping is ep_dispatch's (ep_dispatch.h), computed on the host from host
// routing and exchanged over a host (MPI) group; only the rows move in the backend's memory:
//   dispatch: rows of x gathered at the plan's token_of_send (an embedding lookup), one all_to_all_v of
//             the rows in the wire dtype over `ep`; the owner receives [R, H] fp32 in the plan's order (by
//             source rank, then source token), with the local slots and weights of each row's picks (host);
//   combine:  the owner's partial rows [R, H] go home by the reverse all_to_all_v in the wire dtype; home
//             sums them per token in fp32 in EP-rank order (row from rank 0 + row from rank 1 + ...), as
//             ep_combine_sum does on the host.
// Wire dtype: F32 (the default; bit-exact with ep_dispatch / ep_combine on CPU ranks: the same rows, picks
// and summation order) or BF16: rows are rounded to bf16 (nearest even, Backend::cast) before each
// all_to_all_v and widened to fp32 on arrival, so dispatch gives bf16(x) rows and combine sums
// bf16(partial) rows in fp32 — half the bytes. BF16 on the wire with fp32 accumulation in combine is
// DeepEP's scheme.
// Source of the scheme: DeepEP's dispatch → experts → combine, with the layout computed on the host.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/status.h"
#include "layers/moe/ep_dispatch.h"
#include "parallel/expert_placement.h"

namespace epinfer {

struct EpDeviceDispatchArgs {
    const float* x = nullptr;             // [num_rows, H] fp32, backend memory: the tokens the share is in
    int64_t num_rows = 0;                 // rows of x
    int64_t hidden = 0;                   // H
    int64_t first_token = 0;              // the share: x rows [first_token, first_token + num_tokens)
    int64_t num_tokens = 0;               // tokens this rank dispatches (0 allowed)
    const int32_t* topk_ids = nullptr;    // [num_tokens, K] int32 host: global expert ids; −1 = none
    const float* topk_weights = nullptr;  // [num_tokens, K] fp32 host
    int64_t top_k = 0;                    // K
    DType wire_dtype = DType::kF32;       // rows on the wire: F32 or BF16 (rounded to nearest even)
};

struct EpDeviceDispatch {
    EpDispatchOutput plan;  // host: handle, num_rows R, local_slots [R, K], weights [R, K] (rows empty)
    DeviceBuffer rows;      // [R, H] fp32, backend memory: the received rows in plan order
};

// Collective over host_ep and ep (the same EP group: MPI for the bookkeeping, the backend's memory for the
// rows). Errors: kInvalidArgument naming a wire dtype other than F32 and BF16 (before any collective);
// ep_dispatch's; op and communicator errors.
Result<EpDeviceDispatch> ep_dispatch_device(Backend& backend, Communicator& host_ep, Communicator& ep,
                                            const ExpertPlacement& placement, const EpDeviceDispatchArgs& args);

struct EpDeviceCombineArgs {
    const EpDispatchHandle* handle = nullptr;  // of the dispatch
    const float* partial = nullptr;            // [R, H] fp32, backend memory: a row per received row
    int64_t hidden = 0;                        // H
    int64_t num_rows = 0;                      // rows of out
    int64_t first_token = 0;                   // the share's first row in out (as dispatched)
    bool write = true;                         // false: out is all zeros (a moe_tp rank other than the lead)
    float* out = nullptr;                      // [num_rows, H] fp32, backend memory; rows outside the share: 0
    DType wire_dtype = DType::kF32;            // partial rows on the wire: F32 or BF16 (nearest even)
};

// Collective over ep. Errors: kInvalidArgument for a handle of another group size or a wire dtype other than
// F32 and BF16 (before any collective); op and communicator errors.
Status ep_combine_device(Backend& backend, Communicator& ep, const EpDeviceCombineArgs& args);

}  // namespace epinfer
