#include "layers/moe/ep_dispatch.h"

#include <fmt/format.h>

#include <cstring>

namespace epinfer {
namespace {

// Per-peer header of the first all-to-all.
struct DispatchHeader {
    int64_t num_rows;
    int64_t top_k;
    int64_t row_bytes;
};

Status check_args(const Communicator& comm, const ExpertPlacement& placement, const EpDispatchArgs& args) {
    if (comm.size() != placement.ep_size()) {
        return invalid_argument(
            fmt::format("ep_dispatch: the EP group has {} ranks but the expert placement {}", comm.size(),
                        placement.ep_size()));
    }
    if (args.num_tokens < 0 || args.top_k < 1) {
        return invalid_argument(fmt::format("ep_dispatch: num_tokens {}, top_k {}: need T ≥ 0, K ≥ 1",
                                            args.num_tokens, args.top_k));
    }
    if (args.num_tokens > 0 && ((args.x == nullptr && args.row_bytes > 0) || args.topk_ids == nullptr ||
                                args.topk_weights == nullptr)) {
        return invalid_argument(
            fmt::format("ep_dispatch: null x, topk_ids or topk_weights with {} tokens", args.num_tokens));
    }
    const int64_t num_experts = placement.num_experts();
    for (int64_t i = 0; i < args.num_tokens * args.top_k; ++i) {
        const int32_t id = args.topk_ids[i];
        if (id < -1 || id >= num_experts) {
            return invalid_argument(
                fmt::format("ep_dispatch: token {} pick {}: expert id {} is outside [−1, {})", i / args.top_k,
                            i % args.top_k, id, num_experts));
        }
    }
    return Status::ok();
}

}  // namespace

Result<EpDispatchOutput> ep_dispatch(Communicator& ep_comm, const ExpertPlacement& placement,
                                     const EpDispatchArgs& args) {
    EPI_RETURN_IF_ERROR(check_args(ep_comm, placement, args));
    const int n = ep_comm.size();
    const int64_t num_tokens = args.num_tokens, top_k = args.top_k;
    const size_t row_bytes = args.row_bytes;
    // One record per (token, owner rank): the row, then K local slots, then K weights.
    const size_t record_bytes = row_bytes + static_cast<size_t>(top_k) * (sizeof(int32_t) + sizeof(float));

    // Rows per destination: token t goes to rank d once iff one of its experts lives on d.
    EpDispatchOutput out;
    EpDispatchHandle& handle = out.handle;
    handle.num_tokens = num_tokens;
    handle.send_counts.assign(static_cast<size_t>(n), 0);
    std::vector<int64_t> last_token(static_cast<size_t>(n), -1);  // [ep] last token counted for each rank
    for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t k = 0; k < top_k; ++k) {
            const int32_t id = args.topk_ids[t * top_k + k];
            if (id < 0) continue;
            const size_t d = static_cast<size_t>(placement.primary(id).ep_rank);
            if (last_token[d] == t) continue;
            last_token[d] = t;
            ++handle.send_counts[d];
        }
    }
    handle.send_displs.assign(static_cast<size_t>(n), 0);
    for (size_t d = 1; d < static_cast<size_t>(n); ++d) {
        handle.send_displs[d] = handle.send_displs[d - 1] + handle.send_counts[d - 1];
    }
    const int64_t num_send = handle.send_displs.back() + handle.send_counts.back();

    // Fill each destination's block in token order; a record's picks in k order, packed to the front.
    handle.token_of_send.assign(static_cast<size_t>(num_send), -1);
    std::vector<int32_t> send_slots(static_cast<size_t>(num_send * top_k), -1);    // [num_send, K]
    std::vector<float> send_weights(static_cast<size_t>(num_send * top_k), 0.0f);  // [num_send, K]
    std::vector<int64_t> num_picks(static_cast<size_t>(num_send), 0);              // [num_send]
    std::vector<int64_t> next_row(handle.send_displs), row_of_dest(static_cast<size_t>(n), -1);
    last_token.assign(static_cast<size_t>(n), -1);
    for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t k = 0; k < top_k; ++k) {
            const int32_t id = args.topk_ids[t * top_k + k];
            if (id < 0) continue;
            const ExpertReplica& replica = placement.primary(id);
            const size_t d = static_cast<size_t>(replica.ep_rank);
            if (last_token[d] != t) {
                last_token[d] = t;
                row_of_dest[d] = next_row[d]++;
                handle.token_of_send[static_cast<size_t>(row_of_dest[d])] = static_cast<int32_t>(t);
            }
            const int64_t row = row_of_dest[d];
            const size_t pick = static_cast<size_t>(row * top_k + num_picks[static_cast<size_t>(row)]++);
            send_slots[pick] = replica.local_slot;
            send_weights[pick] = args.topk_weights[t * top_k + k];
        }
    }
    static_assert(sizeof(float) == sizeof(int32_t));
    const size_t picks_bytes = static_cast<size_t>(top_k) * sizeof(int32_t);  // K slots, or K weights
    std::vector<unsigned char> send(static_cast<size_t>(num_send) * record_bytes);
    const auto* x = static_cast<const unsigned char*>(args.x);
    for (int64_t row = 0; row < num_send; ++row) {
        unsigned char* rec = send.data() + static_cast<size_t>(row) * record_bytes;
        if (row_bytes > 0) {
            std::memcpy(rec, x + static_cast<size_t>(handle.token_of_send[static_cast<size_t>(row)]) * row_bytes,
                        row_bytes);
        }
        std::memcpy(rec + row_bytes, send_slots.data() + row * top_k, picks_bytes);
        std::memcpy(rec + row_bytes + picks_bytes, send_weights.data() + row * top_k, picks_bytes);
    }

    // Exchange (rows, K, row_bytes) with every peer.
    std::vector<DispatchHeader> send_headers(static_cast<size_t>(n)), recv_headers(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) {
        send_headers[static_cast<size_t>(d)] = {handle.send_counts[static_cast<size_t>(d)], top_k,
                                                static_cast<int64_t>(row_bytes)};
    }
    std::vector<int64_t> header_counts(static_cast<size_t>(n), 3), header_displs(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) header_displs[static_cast<size_t>(d)] = 3 * d;
    EPI_RETURN_IF_ERROR_CTX(
        ep_comm.all_to_all_v({send_headers.data(), header_counts, header_displs, recv_headers.data(),
                              header_counts, header_displs, DType::kI64}),
        "ep_dispatch");
    for (int s = 0; s < n; ++s) {
        const DispatchHeader& h = recv_headers[static_cast<size_t>(s)];
        if (h.top_k != top_k || h.row_bytes != static_cast<int64_t>(row_bytes)) {
            return invalid_argument(
                fmt::format("ep_dispatch: EP rank {} dispatches K {} with rows of {} bytes, EP "
                            "rank {} K {} with rows of {} bytes",
                            s, h.top_k, h.row_bytes, ep_comm.rank(), top_k, row_bytes));
        }
    }
    handle.recv_counts.assign(static_cast<size_t>(n), 0);
    handle.recv_displs.assign(static_cast<size_t>(n), 0);
    for (int s = 0; s < n; ++s) {
        handle.recv_counts[static_cast<size_t>(s)] = recv_headers[static_cast<size_t>(s)].num_rows;
        if (s > 0) {
            handle.recv_displs[static_cast<size_t>(s)] = handle.recv_displs[static_cast<size_t>(s - 1)] +
                                                         handle.recv_counts[static_cast<size_t>(s - 1)];
        }
    }
    const int64_t num_recv = handle.recv_displs.back() + handle.recv_counts.back();

    // The records, as bytes.
    std::vector<unsigned char> recv(static_cast<size_t>(num_recv) * record_bytes);
    const auto in_bytes = [&](const std::vector<int64_t>& rows) {
        std::vector<int64_t> bytes(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) bytes[i] = rows[i] * static_cast<int64_t>(record_bytes);
        return bytes;
    };
    const std::vector<int64_t> sc = in_bytes(handle.send_counts), sd = in_bytes(handle.send_displs);
    const std::vector<int64_t> rc = in_bytes(handle.recv_counts), rd = in_bytes(handle.recv_displs);
    EPI_RETURN_IF_ERROR_CTX(ep_comm.all_to_all_v({send.empty() ? nullptr : send.data(), sc, sd,
                                                  recv.empty() ? nullptr : recv.data(), rc, rd, DType::kU8}),
                            "ep_dispatch");

    // Unpack.
    out.num_rows = num_recv;
    out.top_k = top_k;
    out.rows.resize(static_cast<size_t>(num_recv) * row_bytes);
    out.local_slots.resize(static_cast<size_t>(num_recv * top_k));
    out.weights.resize(static_cast<size_t>(num_recv * top_k));
    out.source_rank.resize(static_cast<size_t>(num_recv));
    for (int s = 0; s < n; ++s) {
        const int64_t first = handle.recv_displs[static_cast<size_t>(s)];
        for (int64_t i = 0; i < handle.recv_counts[static_cast<size_t>(s)]; ++i) {
            out.source_rank[static_cast<size_t>(first + i)] = s;
        }
    }
    for (int64_t r = 0; r < num_recv; ++r) {
        const unsigned char* rec = recv.data() + static_cast<size_t>(r) * record_bytes;
        if (row_bytes > 0) std::memcpy(out.rows.data() + static_cast<size_t>(r) * row_bytes, rec, row_bytes);
        std::memcpy(out.local_slots.data() + r * top_k, rec + row_bytes, picks_bytes);
        std::memcpy(out.weights.data() + r * top_k, rec + row_bytes + picks_bytes, picks_bytes);
    }
    return out;
}

}  // namespace epinfer
