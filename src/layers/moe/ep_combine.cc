#include "layers/moe/ep_combine.h"

#include <fmt/format.h>

#include <vector>

namespace epinfer {

void ep_combine_sum(const EpDispatchHandle& handle, const float* returned,
                    std::span<const int64_t> block_first_row, int64_t hidden, float* out) {
    for (int64_t i = 0; i < handle.num_tokens * hidden; ++i) out[i] = 0.0f;
    const size_t n = handle.send_counts.size();
    for (size_t d = 0; d < n; ++d) {
        const int64_t sent_first = handle.send_displs[d];
        for (int64_t i = 0; i < handle.send_counts[d]; ++i) {
            const int64_t t = handle.token_of_send[static_cast<size_t>(sent_first + i)];
            const float* src = returned + (block_first_row[d] + i) * hidden;  // [H]
            float* dst = out + t * hidden;                                    // [H]
            for (int64_t h = 0; h < hidden; ++h) dst[h] += src[h];
        }
    }
}

Status ep_combine(Communicator& ep_comm, const EpCombineArgs& args) {
    if (args.handle == nullptr || args.hidden < 1) {
        return invalid_argument(
            fmt::format("ep_combine: {} handle, hidden {}: need a dispatch handle and H ≥ 1",
                        args.handle ? "a" : "no", args.hidden));
    }
    const EpDispatchHandle& handle = *args.handle;
    const size_t n = static_cast<size_t>(ep_comm.size());
    if (handle.send_counts.size() != n || handle.recv_counts.size() != n) {
        return invalid_argument(fmt::format("ep_combine: the handle is for {} EP ranks, the group has {}",
                                            handle.send_counts.size(), n));
    }
    const int64_t num_returned =
        handle.recv_displs.back() + handle.recv_counts.back();                       // R: rows to send back
    const int64_t num_sent = handle.send_displs.back() + handle.send_counts.back();  // rows coming home
    if ((num_returned > 0 && args.partial == nullptr) || (handle.num_tokens > 0 && args.out == nullptr)) {
        return invalid_argument(
            fmt::format("ep_combine: null partial or out with {} rows to return and {} tokens", num_returned,
                        handle.num_tokens));
    }
    // The reverse all-to-all: what this rank received from d goes back to d, as H-wide fp32 rows.
    const auto in_elems = [&](const std::vector<int64_t>& rows) {
        std::vector<int64_t> elems(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) elems[i] = rows[i] * args.hidden;
        return elems;
    };
    std::vector<float> home(static_cast<size_t>(num_sent * args.hidden));  // [rows sent by ep_dispatch, H]
    EPI_RETURN_IF_ERROR_CTX(
        ep_comm.all_to_all_v({args.partial, in_elems(handle.recv_counts), in_elems(handle.recv_displs),
                              home.empty() ? nullptr : home.data(), in_elems(handle.send_counts),
                              in_elems(handle.send_displs), DType::kF32}),
        "ep_combine");
    ep_combine_sum(handle, home.data(), handle.send_displs, args.hidden, args.out);
    return Status::ok();
}

}  // namespace epinfer
