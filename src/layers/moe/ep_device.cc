#include "layers/moe/ep_device.h"

#include <fmt/format.h>

#include <vector>

namespace epinfer {
namespace {

// A backend copy of host values (a 1-byte buffer when empty).
template <typename T>
Result<DeviceBuffer> upload(Backend& backend, const std::vector<T>& host) {
    EPI_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::alloc(backend, host.size() * sizeof(T)));
    if (!host.empty()) EPI_RETURN_IF_ERROR(backend.copy_to_device(buffer.data(), host.data(), host.size() * sizeof(T)));
    return buffer;
}

// out[i] = table[rows[i]] for i < num_rows. table: [num_table_rows, H] fp32; rows: [num_rows] int32; both
// in the backend's memory.
Status gather_rows(Backend& backend, const float* table, int64_t num_table_rows, const int32_t* rows,
                   int64_t num_rows, int64_t hidden, float* out) {
    if (num_rows == 0) return Status::ok();
    EmbeddingArgs gather;
    gather.token_ids = rows;
    gather.table = table;
    gather.table_dtype = DType::kF32;
    gather.out = out;
    gather.num_tokens = num_rows;
    gather.vocab_size = num_table_rows;
    gather.hidden_size = hidden;
    return backend.embedding(gather);
}

// Element counts of row counts: rows · H.
std::vector<int64_t> times(const std::vector<int64_t>& rows, int64_t hidden) {
    std::vector<int64_t> elems(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) elems[i] = rows[i] * hidden;
    return elems;
}

}  // namespace

Result<EpDeviceDispatch> ep_dispatch_device(Backend& backend, Communicator& host_ep, Communicator& ep,
                                            const ExpertPlacement& placement, const EpDeviceDispatchArgs& args) {
    const int64_t H = args.hidden;
    EpDispatchArgs bookkeeping;
    bookkeeping.num_tokens = args.num_tokens;
    bookkeeping.row_bytes = 0;
    bookkeeping.topk_ids = args.topk_ids;
    bookkeeping.topk_weights = args.topk_weights;
    bookkeeping.top_k = args.top_k;
    EpDeviceDispatch out;
    EPI_ASSIGN_OR_RETURN(out.plan, ep_dispatch(host_ep, placement, bookkeeping));
    const EpDispatchHandle& h = out.plan.handle;
    const int64_t num_sent = static_cast<int64_t>(h.token_of_send.size());
    std::vector<int32_t> send_row(h.token_of_send.size());  // [num_sent] row of x
    for (size_t i = 0; i < send_row.size(); ++i)
        send_row[i] = static_cast<int32_t>(args.first_token) + h.token_of_send[i];
    EPI_ASSIGN_OR_RETURN(DeviceBuffer send_row_dev, upload(backend, send_row));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer send, DeviceBuffer::alloc_f32(backend, num_sent * H));  // [num_sent, H]
    EPI_RETURN_IF_ERROR(gather_rows(backend, args.x, args.num_rows, static_cast<const int32_t*>(send_row_dev.data()),
                                    num_sent, H, send.f32()));
    EPI_ASSIGN_OR_RETURN(out.rows, DeviceBuffer::alloc_f32(backend, out.plan.num_rows * H));
    EPI_RETURN_IF_ERROR_CTX(ep.all_to_all_v({send.data(), times(h.send_counts, H), times(h.send_displs, H),
                                             out.rows.data(), times(h.recv_counts, H), times(h.recv_displs, H),
                                             DType::kF32}),
                            "ep dispatch");
    return out;
}

Status ep_combine_device(Backend& backend, Communicator& ep, const EpDeviceCombineArgs& args) {
    if (args.handle == nullptr || args.handle->send_counts.size() != static_cast<size_t>(ep.size())) {
        return invalid_argument(fmt::format("ep_combine_device: the handle is for {} EP ranks, the group has {}",
                                            args.handle != nullptr ? args.handle->send_counts.size() : 0, ep.size()));
    }
    const EpDispatchHandle& h = *args.handle;
    const int64_t H = args.hidden, T = args.num_rows;
    const int64_t num_sent = static_cast<int64_t>(h.token_of_send.size());
    // home: the rows sent back, then one zero row (for tokens a rank returned nothing for).
    EPI_ASSIGN_OR_RETURN(DeviceBuffer home, DeviceBuffer::alloc_f32(backend, (num_sent + 1) * H));
    const std::vector<float> zero_row(static_cast<size_t>(H), 0.0f);
    EPI_RETURN_IF_ERROR(backend.copy_to_device(home.f32() + num_sent * H, zero_row.data(), zero_row.size() * 4));
    EPI_RETURN_IF_ERROR_CTX(ep.all_to_all_v({args.partial, times(h.recv_counts, H), times(h.recv_displs, H),
                                             home.data(), times(h.send_counts, H), times(h.send_displs, H),
                                             DType::kF32}),
                            "ep combine");
    if (T == 0) return Status::ok();
    // row_of[d · T + t]: the row of home that EP rank d returned for token t (the zero row when none).
    const size_t n = h.send_counts.size();
    std::vector<int32_t> row_of(n * static_cast<size_t>(T), static_cast<int32_t>(num_sent));  // [ep, T]
    if (args.write) {
        for (size_t d = 0; d < n; ++d) {
            for (int64_t i = 0; i < h.send_counts[d]; ++i) {
                const int64_t row = h.send_displs[d] + i;
                const int64_t t = args.first_token + h.token_of_send[static_cast<size_t>(row)];
                row_of[d * static_cast<size_t>(T) + static_cast<size_t>(t)] = static_cast<int32_t>(row);
            }
        }
    }
    EPI_ASSIGN_OR_RETURN(DeviceBuffer row_of_dev, upload(backend, row_of));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer term, DeviceBuffer::alloc_f32(backend, T * H));  // [T, H]
    for (size_t d = 0; d < n; ++d) {
        const int32_t* rows_d = static_cast<const int32_t*>(row_of_dev.data()) + d * static_cast<size_t>(T);
        EPI_RETURN_IF_ERROR(gather_rows(backend, home.f32(), num_sent + 1, rows_d, T, H, d == 0 ? args.out : term.f32()));
        if (d == 0) continue;
        AddArgs add;
        add.a = args.out;
        add.b = term.f32();
        add.out = args.out;
        add.num_elements = T * H;
        EPI_RETURN_IF_ERROR(backend.add(add));
    }
    return Status::ok();
}

}  // namespace epinfer
