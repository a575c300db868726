// Expert-parallel dispatch and combine of rows in the backend's memory (GPU ranks: NCCL; the same code runs
// on CPU ranks over MPI). The bookkeeping is ep_dispatch's (ep_dispatch.h), computed on the host from host
// routing and exchanged over a host (MPI) group; only the rows move in the backend's memory:
//   dispatch: rows of x gathered at the plan's token_of_send (an embedding lookup), one all_to_all_v of
//             the rows in the wire dtype over `ep`; the owner receives [R, H] fp32 in the plan's order (by
//             source rank, then source token), with the local slots and weights of each row's picks (host
//             and backend memory). Everything the backend needs of the plan — the send rows' token index,
//             the received rows' slots and weights, the combine's row index and a zero row — goes up in
//             one copy (one host round trip; it was five);
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
    bool combine_writes = true;           // false: this dispatch's combine writes zeros (a moe_tp rank other
                                          // than the lead)
};

struct EpDeviceDispatch {
    EpDispatchOutput plan;  // host: handle, num_rows R, local_slots [R, K], weights [R, K] (rows empty)
    DeviceBuffer rows;      // [R, H] fp32, backend memory: the received rows in plan order
    // Backend memory, one upload of int32 words: the send rows' x rows [Σ send_counts], the received rows'
    // local slots [R, K] and weights [R, K] (fp32 bits), the combine's row_of [ep, T] (the row of its home
    // buffer that EP rank d returns for token t: the zero row when none, or always when !combine_writes) and
    // a zero row of H fp32.
    DeviceBuffer index;
    int64_t num_rows = 0;  // T: rows of x, and of the combine's out
    int64_t slots_at = 0, weights_at = 0, row_of_at = 0, zero_at = 0;  // word offsets in index

    const int32_t* local_slots() const { return word(slots_at); }                              // [R, K]
    const float* weights() const { return reinterpret_cast<const float*>(word(weights_at)); }  // [R, K]
    const int32_t* row_of() const { return word(row_of_at); }                                  // [ep, T]
    const void* zero_row() const { return word(zero_at); }                                     // [H] fp32 0

private:
    const int32_t* word(int64_t at) const { return static_cast<const int32_t*>(index.data()) + at; }
};

// Collective over host_ep and ep (the same EP group: MPI for the bookkeeping, the backend's memory for the
// rows). Errors: kInvalidArgument naming a wire dtype other than F32 and BF16 (before any collective);
// ep_dispatch's; op and communicator errors.
Result<EpDeviceDispatch> ep_dispatch_device(Backend& backend, Communicator& host_ep, Communicator& ep,
                                            const ExpertPlacement& placement, const EpDeviceDispatchArgs& args);

struct EpDeviceCombineArgs {
    const EpDeviceDispatch* dispatch = nullptr;  // the dispatch being answered (its plan and index)
    const float* partial = nullptr;              // [R, H] fp32, backend memory: a row per received row
    int64_t hidden = 0;                          // H
    float* out = nullptr;            // [T, H] fp32, backend memory (T: the dispatch's num_rows); rows
                                     // outside the share, and every row when !combine_writes: 0
    DType wire_dtype = DType::kF32;  // partial rows on the wire: F32 or BF16 (nearest even)
};

// Collective over ep. Errors: kInvalidArgument for a missing dispatch, a dispatch of another group size or
// a wire dtype other than F32 and BF16 (before any collective); op and communicator errors.
Status ep_combine_device(Backend& backend, Communicator& ep, const EpDeviceCombineArgs& args);

}  // namespace epinfer
