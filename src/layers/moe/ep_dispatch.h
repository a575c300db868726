// Expert-parallel dispatch (EP with DP attention, ARCHITECTURE.md §1 and §5): every rank of the EP group
// owns its own tokens; each token's row goes ONCE to every EP rank that owns at least one of its K
// experts, together with the local slots and routing weights of the picks that live there.
//
//   home rank                                  owner rank
//   x [T, row_bytes], topk_ids/weights [T, K] ─► rows [R, row_bytes], local_slots/weights [R, K]
//                                               ─► moe_permute_plan(local_slots, R, K, num_local_slots)
//                                               ─► grouped expert FFN ─► moe_combine_rows(..., weights)
//                                               ─► partial [R, H] fp32 ─► ep_combine (ep_combine.h)
//
// Two collectives over the EP communicator: an all-to-all of (rows, K, row_bytes) per peer (which also
// checks that every rank agrees on K and the row size), then one all_to_all_v of packed records
// [row bytes | K int32 local slots | K fp32 weights]. Volume: Σ_t (distinct owner ranks of t) rows.
// Order on every rank: received rows are grouped by source rank (ascending) and, within a source, by the
// source's token index (ascending); a row's picks keep the token's k order, packed to the front
// (slot −1, weight 0 after them). Only bookkeeping and byte copies: bit-exact and deterministic.
// Experts go to their primary replica (ExpertPlacement::primary).
// Bookkeeping only (row_bytes 0, x null): the records carry the slots and weights alone and `rows` stays
// empty; the caller moves the rows itself in the handle's order (GPU ranks: one all_to_all_v of device rows
// over NCCL, the rows packed by gathering x at token_of_send).
// Source of the scheme: DeepEP's dispatch layout (get_dispatch_layout → dispatch → handle → combine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "parallel/expert_placement.h"

namespace epinfer {

struct EpDispatchArgs {
    const void* x = nullptr;              // [T, row_bytes] host: this rank's token rows (any dtype)
    int64_t num_tokens = 0;               // T (0 allowed)
    size_t row_bytes = 0;                 // bytes per token row, e.g. H·4 for fp32; 0: bookkeeping only
    const int32_t* topk_ids = nullptr;    // [T, K] int32 host: global expert ids; −1 = no expert
    const float* topk_weights = nullptr;  // [T, K] fp32 host
    int64_t top_k = 0;                    // K ≥ 1
};

// What ep_combine needs to send the partial sums home and sum them there.
struct EpDispatchHandle {
    int64_t num_tokens = 0;              // T of this (home) rank
    std::vector<int64_t> send_counts;    // [ep] rows this rank sent to each rank
    std::vector<int64_t> send_displs;    // [ep] first row of each rank's block in send order
    std::vector<int32_t> token_of_send;  // [Σ send_counts] home token index of each sent row
    std::vector<int64_t> recv_counts;    // [ep] rows this rank received from each rank
    std::vector<int64_t> recv_displs;    // [ep] first row of each source's block in EpDispatchOutput::rows
};

struct EpDispatchOutput {
    EpDispatchHandle handle;
    int64_t num_rows = 0;              // R: rows received from every rank
    int64_t top_k = 0;                 // K
    std::vector<unsigned char> rows;   // [R, row_bytes] host
    std::vector<int32_t> local_slots;  // [R, K] int32: local expert slot; −1 = unused
    std::vector<float> weights;        // [R, K] fp32: routing weight of each slot; 0 where unused
    std::vector<int32_t> source_rank;  // [R] EP rank each row came from (its home)
};

// Dispatches this rank's tokens over `ep_comm` (the EP group; ep_comm.size() == placement.ep_size()).
// Every rank of the group must call it, also with T = 0.
// Errors: kInvalidArgument when the group and the placement disagree, an id is outside [−1, E), a
// pointer is null with T > 0, or ranks disagree on K or row_bytes (named with the ranks); errors of the
// communicator (kTimeout, kCommFailure).
Result<EpDispatchOutput> ep_dispatch(Communicator& ep_comm, const ExpertPlacement& placement,
                                     const EpDispatchArgs& args);

}  // namespace epinfer
