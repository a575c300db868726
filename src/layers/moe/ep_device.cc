#include "layers/moe/ep_device.h"

#include <fmt/format.h>

#include <cstring>
#include <vector>

namespace epinfer {
namespace {

// Appends `values` (4-byte elements) to `words`; returns the word offset they start at.
template <typename T>
int64_t append_words(std::vector<int32_t>& words, const T* values, size_t n) {
    static_assert(sizeof(T) == sizeof(int32_t));
    const int64_t at = static_cast<int64_t>(words.size());
    words.resize(words.size() + n);
    if (n > 0) std::memcpy(words.data() + at, values, n * sizeof(T));
    return at;
}

// row_of[d · T + t]: the row of the combine's home buffer ([Σ send_counts + 1, H]: the rows EP ranks return,
// in send order, then a zero row) that EP rank d returns for token t of x; the zero row when d returns none
// for t, and for every (d, t) when !writes.
std::vector<int32_t> combine_row_of(const EpDispatchHandle& h, int64_t num_rows, int64_t first_token,
                                    bool writes) {
    const size_t n = h.send_counts.size(), T = static_cast<size_t>(num_rows);
    const int32_t zero_row = static_cast<int32_t>(h.token_of_send.size());
    std::vector<int32_t> row_of(n * T, zero_row);  // [ep, T]
    if (!writes) return row_of;
    for (size_t d = 0; d < n; ++d) {
        for (int64_t i = 0; i < h.send_counts[d]; ++i) {
            const int64_t row = h.send_displs[d] + i;
            const int64_t t = first_token + h.token_of_send[static_cast<size_t>(row)];
            row_of[d * T + static_cast<size_t>(t)] = static_cast<int32_t>(row);
        }
    }
    return row_of;
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
    out.num_rows = args.num_rows;

    // The index, in one upload: the send rows' x rows, the received rows' slots and weights, the combine's
    // row_of and a zero row.
    std::vector<int32_t> words(h.token_of_send.size());  // [num_sent] row of x first
    for (size_t i = 0; i < words.size(); ++i)
        words[i] = static_cast<int32_t>(args.first_token) + h.token_of_send[i];
    out.slots_at = append_words(words, out.plan.local_slots.data(), out.plan.local_slots.size());
    out.weights_at = append_words(words, out.plan.weights.data(), out.plan.weights.size());
    const std::vector<int32_t> row_of =
        combine_row_of(h, args.num_rows, args.first_token, args.combine_writes);
    out.row_of_at = append_words(words, row_of.data(), row_of.size());
    out.zero_at = static_cast<int64_t>(words.size());
    words.resize(words.size() + static_cast<size_t>(H), 0);  // +0.0f and bf16 +0 are all-zero bytes
    EPI_ASSIGN_OR_RETURN(out.index, DeviceBuffer::alloc(backend, words.size() * sizeof(int32_t)));
    EPI_RETURN_IF_ERROR(
        backend.copy_to_device(out.index.data(), words.data(), words.size() * sizeof(int32_t)));

    EPI_ASSIGN_OR_RETURN(DeviceBuffer send, DeviceBuffer::alloc_f32(backend, num_sent * H));  // [num_sent, H]
    EPI_RETURN_IF_ERROR(gather_rows(backend, args.x, DType::kF32, args.num_rows,
                                    static_cast<const int32_t*>(out.index.data()), num_sent, H, send.f32()));
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
    if (args.dispatch == nullptr) return invalid_argument("ep_combine_device: no dispatch");
    const EpDispatchHandle& h = args.dispatch->plan.handle;
    if (h.send_counts.size() != static_cast<size_t>(ep.size())) {
        return invalid_argument(
            fmt::format("ep_combine_device: the dispatch is for {} EP ranks, the group has {}",
                        h.send_counts.size(), ep.size()));
    }
    EPI_RETURN_IF_ERROR(check_wire_dtype("ep_combine_device", args.wire_dtype));
    const int64_t H = args.hidden, T = args.dispatch->num_rows;
    const int64_t num_sent = static_cast<int64_t>(h.token_of_send.size());
    const size_t elem = dtype_size(args.wire_dtype);
    // home [num_sent + 1, H] wire dtype: the rows sent back, then one zero row (for tokens a rank returned
    // nothing for), copied from the dispatch's index on the device.
    EPI_ASSIGN_OR_RETURN(DeviceBuffer home,
                         DeviceBuffer::alloc(backend, static_cast<size_t>((num_sent + 1) * H) * elem));
    EPI_RETURN_IF_ERROR(backend.copy_on_device(static_cast<unsigned char*>(home.data()) + num_sent * H * elem,
                                               args.dispatch->zero_row(), static_cast<size_t>(H) * elem));
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
    const size_t n = h.send_counts.size();
    EPI_ASSIGN_OR_RETURN(DeviceBuffer term, DeviceBuffer::alloc_f32(backend, T * H));  // [T, H]
    for (size_t d = 0; d < n; ++d) {
        const int32_t* rows_d = args.dispatch->row_of() + d * static_cast<size_t>(T);
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
