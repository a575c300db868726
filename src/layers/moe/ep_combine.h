// Expert-parallel combine: the inverse of ep_dispatch (ep_dispatch.h). Each owner rank returns one
// partial sum per received row, partial[r] = Σ over the row's local picks (in k order) of
// weight · expert output, computed in fp32 (moe_combine_rows over the local plan does exactly this);
// the home rank then sums, for each of its tokens, the partials in ascending EP rank order, from 0, in
// fp32:
//   out[t] = ((0 + partial from the lowest owner rank) + partial from the next owner rank) + ...
// The order depends only on the routing and the placement, never on when or in which order the rows
// arrive, so the output is bit-identical run to run. With one EP rank it equals the single-rank
// moe_combine_rows bit for bit; with more, only the grouping of the fp32 sum differs.
#pragma once

#include <cstdint>
#include <span>

#include "comm/communicator.h"
#include "core/status.h"
#include "layers/moe/ep_dispatch.h"

namespace epinfer {

struct EpCombineArgs {
    const EpDispatchHandle* handle = nullptr;  // from this rank's ep_dispatch
    const float* partial = nullptr;  // [R, H] fp32 host: one partial sum per received row, dispatch order
    int64_t hidden = 0;              // H
    float* out = nullptr;            // [T, H] fp32 host; tokens with no expert get a zero row
};

// Returns the partial sums to their home ranks over `ep_comm` (the communicator ep_dispatch used) and
// sums them into out. Every rank of the group must call it.
// Errors: kInvalidArgument for a missing handle, H < 1, or null buffers with rows to move; errors of the
// communicator.
Status ep_combine(Communicator& ep_comm, const EpCombineArgs& args);

// The home-rank sum alone: out[t] = Σ over owner ranks d ascending of returned[block_first_row[d] + i],
// where i is the position of token t in the rows this rank sent to d (handle.token_of_send). `returned`
// may hold the blocks in any memory order (block_first_row says where each rank's block starts): the
// result is the same bits.
// returned: [Σ handle.send_counts, H] fp32 host; block_first_row: [ep]; out: [T, H] fp32 host.
void ep_combine_sum(const EpDispatchHandle& handle, const float* returned,
                    std::span<const int64_t> block_first_row, int64_t hidden, float* out);

}  // namespace epinfer
