#include "layers/moe/moe_dp_device.h"

#include <vector>

#include "layers/moe/ep_dispatch.h"
#include "layers/parallel_context.h"
#include "parallel/sharding.h"

namespace epinfer {
namespace {

// A device copy of host int32 or fp32 values (a 1-byte buffer when empty).
template <typename T>
Result<DeviceBuffer> upload(Backend& backend, const std::vector<T>& host) {
    EPI_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::alloc(backend, host.size() * sizeof(T)));
    if (!host.empty()) EPI_RETURN_IF_ERROR(backend.copy_to_device(buffer.data(), host.data(), host.size() * sizeof(T)));
    return buffer;
}

// out[i] = table[rows[i]] for i < rows.size(). table: [num_table_rows, H] fp32 device; out: [rows, H].
Status gather_rows(Backend& backend, const float* table, int64_t num_table_rows, const DeviceBuffer& rows,
                   int64_t num_rows, int64_t hidden, float* out) {
    if (num_rows == 0) return Status::ok();
    EmbeddingArgs gather;
    gather.token_ids = static_cast<const int32_t*>(rows.data());
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

Status moe_dp_forward_device(Backend& backend, const MoeBlockWeights& w, const MoeRouterParams& p,
                             const MoeParallel& par, const float* x, int64_t num_rows, int64_t hidden, float* out) {
    const int64_t T = num_rows, H = hidden, K = p.top_k;
    MoeRouting routing;  // host ids and weights
    if (T > 0) {
        EPI_ASSIGN_OR_RETURN(routing, moe_route(backend, w, p, x, T));
    }
    // 1. The plan, on the host. The attn_tp ranks of one DP group hold the same tokens: each moe_tp group
    //    dispatches its share, so every token goes out once per moe_tp rank (as moe_dp_forward).
    const int num_shares = par.attn_tp_size / par.moe_tp_size;
    const ShardRange share = split_evenly(T, num_shares, par.attn_tp_rank / par.moe_tp_size);
    EpDispatchArgs dispatch;
    dispatch.num_tokens = share.size;
    dispatch.row_bytes = 0;
    dispatch.topk_ids = routing.topk_ids.data() + share.begin * K;
    dispatch.topk_weights = routing.topk_weights.data() + share.begin * K;
    dispatch.top_k = K;
    EPI_ASSIGN_OR_RETURN(EpDispatchOutput plan, ep_dispatch(*par.host_moe_ep, *par.placement, dispatch));
    const EpDispatchHandle& h = plan.handle;
    const int64_t num_sent = static_cast<int64_t>(h.token_of_send.size()), R = plan.num_rows;

    // 2. The rows out.
    std::vector<int32_t> send_token(h.token_of_send.size());  // [num_sent] row of x
    for (size_t i = 0; i < send_token.size(); ++i)
        send_token[i] = static_cast<int32_t>(share.begin) + h.token_of_send[i];
    EPI_ASSIGN_OR_RETURN(DeviceBuffer send_token_dev, upload(backend, send_token));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer send_rows, DeviceBuffer::alloc_f32(backend, num_sent * H));  // [num_sent, H]
    EPI_RETURN_IF_ERROR(gather_rows(backend, x, T, send_token_dev, num_sent, H, send_rows.f32()));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer recv_rows, DeviceBuffer::alloc_f32(backend, R * H));  // [R, H]
    EPI_RETURN_IF_ERROR_CTX(par.moe_ep->all_to_all_v({send_rows.data(), times(h.send_counts, H),
                                                      times(h.send_displs, H), recv_rows.data(),
                                                      times(h.recv_counts, H), times(h.recv_displs, H),
                                                      DType::kF32}),
                            "ep dispatch");

    // 3. The local experts on the received rows (local slot ids), summed over moe_tp.
    EPI_ASSIGN_OR_RETURN(DeviceBuffer partial, DeviceBuffer::alloc_f32(backend, R * H));  // [R, H]
    if (R > 0) {
        EPI_ASSIGN_OR_RETURN(DeviceBuffer slots, upload(backend, plan.local_slots));  // [R, K]
        EPI_ASSIGN_OR_RETURN(DeviceBuffer weights, upload(backend, plan.weights));    // [R, K]
        EPI_RETURN_IF_ERROR(moe_experts_forward(backend, w.experts, /*first_expert=*/0,
                                                static_cast<const int32_t*>(slots.data()), weights.f32(),
                                                recv_rows.f32(), R, H, K, partial.f32()));
    }
    EPI_RETURN_IF_ERROR(all_reduce_sum_f32(par.moe_tp, partial.f32(), R * H));

    // 4. Home, then the sum per token in EP-rank order over [num_sent + 1, H] (the last row zero).
    EPI_ASSIGN_OR_RETURN(DeviceBuffer home, DeviceBuffer::alloc_f32(backend, (num_sent + 1) * H));
    const std::vector<float> zero_row(static_cast<size_t>(H), 0.0f);
    EPI_RETURN_IF_ERROR(backend.copy_to_device(home.f32() + num_sent * H, zero_row.data(), zero_row.size() * 4));
    EPI_RETURN_IF_ERROR_CTX(par.moe_ep->all_to_all_v({partial.data(), times(h.recv_counts, H),
                                                      times(h.recv_displs, H), home.data(),
                                                      times(h.send_counts, H), times(h.send_displs, H),
                                                      DType::kF32}),
                            "ep combine");
    const size_t n = h.send_counts.size();
    // row_of[d][t]: the row of `home` that EP rank d sent back for token t (the zero row when none).
    std::vector<std::vector<int32_t>> row_of(n, std::vector<int32_t>(static_cast<size_t>(T),
                                                                     static_cast<int32_t>(num_sent)));
    if (par.moe_tp_rank == 0) {
        for (size_t d = 0; d < n; ++d) {
            for (int64_t i = 0; i < h.send_counts[d]; ++i) {
                const int64_t row = h.send_displs[d] + i;
                const int64_t t = share.begin + h.token_of_send[static_cast<size_t>(row)];
                row_of[d][static_cast<size_t>(t)] = static_cast<int32_t>(row);
            }
        }
    }
    EPI_ASSIGN_OR_RETURN(DeviceBuffer term, DeviceBuffer::alloc_f32(backend, T * H));  // [T, H]
    for (size_t d = 0; d < n && T > 0; ++d) {
        EPI_ASSIGN_OR_RETURN(DeviceBuffer rows_d, upload(backend, row_of[d]));
        float* dst = d == 0 ? out : term.f32();
        EPI_RETURN_IF_ERROR(gather_rows(backend, home.f32(), num_sent + 1, rows_d, T, H, dst));
        if (d == 0) continue;
        AddArgs add;
        add.a = out;
        add.b = term.f32();
        add.out = out;
        add.num_elements = T * H;
        EPI_RETURN_IF_ERROR(backend.add(add));
    }
    EPI_RETURN_IF_ERROR(moe_add_shared_experts(backend, w, x, T, H, out));
    return all_reduce_sum_f32(par.attn_tp, out, T * H);
}

}  // namespace epinfer
