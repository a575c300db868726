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

// out[i] = float(table[rows[i]]) for i < num_rows. table: [num_table_rows, H] table_dtype (F32 or BF16);
// rows: [num_rows] int32; out: [num_rows, H] fp32; all in the backend's memory.
Status gather_rows(Backend& backend, const void* table, DType table_dtype, int64_t num_table_rows,
                   const int32_t* rows, int64_t num_rows, int64_t hidden, float* out) {
    if (num_rows == 0) return Status::ok();
    EmbeddingArgs gather;
    gather.token_ids = rows;
    gather.table = table;
    gather.table_dtype = table_dtype;
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

// kInvalidArgument naming a wire dtype other than F32 and BF16.
Status check_wire_dtype(const char* op, DType wire_dtype) {
    if (wire_dtype == DType::kF32 || wire_dtype == DType::kBF16) return Status::ok();
    return invalid_argument(fmt::format("{}: wire dtype {} (want F32 or BF16)", op, dtype_name(wire_dtype)));
}

// [n] bf16 in the backend's memory: src [n] fp32 rounded to nearest even.
Result<DeviceBuffer> to_bf16(Backend& backend, const float* src, int64_t n) {
    EPI_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::alloc(backend, static_cast<size_t>(n) * 2));
    EPI_RETURN_IF_ERROR(backend.cast({src, DType::kF32, out.data(), DType::kBF16, n}));
    return out;
}

}  // namespace

Result<EpDeviceDispatch> ep_dispatch_device(Backend& backend, Communicator& host_ep, Communicator& ep,
                                            const ExpertPlacement& placement, const EpDeviceDispatchArgs& args) {
    EPI_RETURN_IF_ERROR(check_wire_dtype("ep_dispatch_device", args.wire_dtype));
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
    EPI_RETURN_IF_ERROR(gather_rows(backend, args.x, DType::kF32, args.num_rows,
                                    static_cast<const int32_t*>(send_row_dev.data()), num_sent, H, send.f32()));
    const int64_t num_recv = out.plan.num_rows * H;
    EPI_ASSIGN_OR_RETURN(out.rows, DeviceBuffer::alloc_f32(backend, num_recv));
    // bf16 wire: send_wire [num_sent, H] and recv_wire [R, H] bf16; fp32: the rows themselves.
    const bool bf16 = args.wire_dtype == DType::kBF16;
    DeviceBuffer send_wire, recv_wire;
    if (bf16) {
        EPI_ASSIGN_OR_RETURN(send_wire, to_bf16(backend, send.f32(), num_sent * H));
        EPI_ASSIGN_OR_RETURN(recv_wire, DeviceBuffer::alloc(backend, static_cast<size_t>(num_recv) * 2));
    }
    EPI_RETURN_IF_ERROR_CTX(ep.all_to_all_v({bf16 ? send_wire.data() : send.data(), times(h.send_counts, H),
                                             times(h.send_displs, H), bf16 ? recv_wire.data() : out.rows.data(),
                                             times(h.recv_counts, H), times(h.recv_displs, H), args.wire_dtype}),
                            "ep dispatch");
    if (bf16) {
        EPI_RETURN_IF_ERROR(
            backend.cast({recv_wire.data(), DType::kBF16, out.rows.data(), DType::kF32, num_recv}));
    }
    return out;
}

Status ep_combine_device(Backend& backend, Communicator& ep, const EpDeviceCombineArgs& args) {
    if (args.handle == nullptr || args.handle->send_counts.size() != static_cast<size_t>(ep.size())) {
        return invalid_argument(fmt::format("ep_combine_device: the handle is for {} EP ranks, the group has {}",
                                            args.handle != nullptr ? args.handle->send_counts.size() : 0, ep.size()));
    }
    EPI_RETURN_IF_ERROR(check_wire_dtype("ep_combine_device", args.wire_dtype));
    const EpDispatchHandle& h = *args.handle;
    const int64_t H = args.hidden, T = args.num_rows;
    const int64_t num_sent = static_cast<int64_t>(h.token_of_send.size());
    const size_t elem = dtype_size(args.wire_dtype);
    // home [num_sent + 1, H] wire dtype: the rows sent back, then one zero row (for tokens a rank returned
    // nothing for); all-zero bytes are +0 in fp32 and bf16.
    EPI_ASSIGN_OR_RETURN(DeviceBuffer home,
                         DeviceBuffer::alloc(backend, static_cast<size_t>((num_sent + 1) * H) * elem));
    const std::vector<unsigned char> zero_row(static_cast<size_t>(H) * elem, 0);
    EPI_RETURN_IF_ERROR(backend.copy_to_device(static_cast<unsigned char*>(home.data()) + num_sent * H * elem,
                                               zero_row.data(), zero_row.size()));
    // bf16 wire: the partial rows [R, H] rounded to bf16.
    const bool bf16 = args.wire_dtype == DType::kBF16;
    DeviceBuffer partial_wire;
    if (bf16) {
        int64_t num_partial = 0;
        for (const int64_t c : h.recv_counts) num_partial += c;
        EPI_ASSIGN_OR_RETURN(partial_wire, to_bf16(backend, args.partial, num_partial * H));
    }
    EPI_RETURN_IF_ERROR_CTX(
        ep.all_to_all_v({bf16 ? partial_wire.data() : args.partial, times(h.recv_counts, H),
                         times(h.recv_displs, H), home.data(), times(h.send_counts, H), times(h.send_displs, H),
                         args.wire_dtype}),
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
        EPI_RETURN_IF_ERROR(gather_rows(backend, home.data(), args.wire_dtype, num_sent + 1, rows_d, T, H,
                                        d == 0 ? args.out : term.f32()));
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
