// Decode steps as replayed op graphs (Model::set_decode_graphs): a step of n one-token sequences runs the
// graph of its (rows, width) bucket, with the inputs copied into the graph's own buffers first. Rows past
// n repeat the last sequence's row (same token, position and KV slot: they rewrite the same K/V bits,
// and their outputs are dropped), so a bucket serves every n up to its size.
#include <algorithm>
#include <numeric>
#include <vector>

#include "models/model_decode_graph.h"

namespace epinfer {

namespace {

// Sequences per step: a step of n sequences runs the smallest bucket ≥ n.
constexpr int64_t kRowBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256};
static_assert(kRowBuckets[std::size(kRowBuckets) - 1] == Model::kMaxGraphRows);
// Graphs kept at most; past it every graph is dropped and recaptured on demand.
constexpr size_t kMaxGraphs = 48;

int64_t row_bucket(int64_t n) {
    for (const int64_t b : kRowBuckets)
        if (b >= n) return b;
    return n;
}

// Block-table entries per sequence: a power of two ≥ 8.
int64_t width_bucket(int64_t n) {
    int64_t w = 8;
    while (w < n) w *= 2;
    return w;
}

}  // namespace

int64_t Model::num_decode_graphs() const {
    if (!decode_graphs_enabled_) return 0;
    return std::count_if(decode_graphs_.begin(), decode_graphs_.end(),
                         [](const auto& entry) { return entry.second->graph != nullptr; });
}

bool Model::decode_graph_fits(const ForwardArgs& args, std::span<const SequenceInput> seqs,
                              int64_t num_rows) const {
    return decode_graphs_enabled_ && backend_->supports_op_graphs() && parallel_ == nullptr &&
           (config_.attention != AttentionKind::kMla || mla_decode_absorbed()) && args.greedy_ids != nullptr && args.observer == nullptr &&
           num_rows > 0 && num_rows <= kMaxGraphRows && static_cast<int64_t>(seqs.size()) == num_rows;
}

Status Model::forward_decode_graph(std::span<const SequenceInput> seqs, const std::vector<int32_t>& ids,
                                   const std::vector<int32_t>& positions, const MicroBatchOutput& out) {
    Backend& backend = *backend_;
    const int64_t n = static_cast<int64_t>(seqs.size());
    std::vector<AttentionSequence> views(seqs.size());  // layer 0's views (every layer has the same tables)
    int64_t longest = 1;
    for (int64_t s = 0; s < n; ++s) {
        views[static_cast<size_t>(s)] = {s, 1, &seqs[static_cast<size_t>(s)].kv[0]};
        longest = std::max(longest, static_cast<int64_t>(seqs[static_cast<size_t>(s)].kv[0].block_table.size()));
    }
    const int64_t rows = row_bucket(n), width = width_bucket(longest);
    EPI_ASSIGN_OR_RETURN(KvBatchHostMetadata host, kv_batch_host_metadata(views, n, width));
    std::vector<int32_t> ids_padded = ids, positions_padded = positions;
    ids_padded.resize(static_cast<size_t>(rows), ids.back());
    positions_padded.resize(static_cast<size_t>(rows), positions.back());
    host.slot_mapping.resize(static_cast<size_t>(rows), host.slot_mapping.back());
    host.token_sequence.resize(static_cast<size_t>(rows), host.token_sequence.back());

    const bool drawn = out.draws != nullptr;
    const auto bucket = std::make_tuple(rows, width, drawn);
    if (decode_graphs_.size() >= kMaxGraphs && decode_graphs_.count(bucket) == 0) decode_graphs_.clear();
    std::unique_ptr<DecodeGraph>& slot = decode_graphs_[bucket];
    if (slot == nullptr) {
        auto g = std::make_unique<DecodeGraph>();
        const size_t r = static_cast<size_t>(rows);
        EPI_ASSIGN_OR_RETURN(g->ids, DeviceBuffer::alloc(backend, r * sizeof(int32_t)));
        EPI_ASSIGN_OR_RETURN(g->positions, DeviceBuffer::alloc(backend, r * sizeof(int32_t)));
        EPI_ASSIGN_OR_RETURN(g->kv.slot_mapping, DeviceBuffer::alloc(backend, r * sizeof(int64_t)));
        EPI_ASSIGN_OR_RETURN(g->kv.token_sequence, DeviceBuffer::alloc(backend, r * sizeof(int32_t)));
        EPI_ASSIGN_OR_RETURN(g->kv.block_tables,
                             DeviceBuffer::alloc(backend, r * static_cast<size_t>(width) * sizeof(int32_t)));
        EPI_ASSIGN_OR_RETURN(g->greedy, DeviceBuffer::alloc(backend, 2 * r * sizeof(int32_t)));
        if (drawn) {
            EPI_ASSIGN_OR_RETURN(g->draws, DeviceBuffer::alloc(backend, r * sizeof(TokenDraw)));
            EPI_ASSIGN_OR_RETURN(g->floor, DeviceBuffer::alloc(backend, r * sizeof(float)));
        }
        g->kv.num_rows = rows;
        g->kv.num_sequences = rows;  // rows past n are never named by token_sequence
        g->kv.block_table_stride = width;
        slot = std::move(g);
    }
    DecodeGraph& g = *slot;
    const size_t r = static_cast<size_t>(rows);
    EPI_RETURN_IF_ERROR(backend.copy_to_device(g.ids.data(), ids_padded.data(), r * sizeof(int32_t)));
    EPI_RETURN_IF_ERROR(backend.copy_to_device(g.positions.data(), positions_padded.data(), r * sizeof(int32_t)));
    EPI_RETURN_IF_ERROR(backend.copy_to_device(g.kv.slot_mapping.data(), host.slot_mapping.data(), r * 8));
    EPI_RETURN_IF_ERROR(backend.copy_to_device(g.kv.token_sequence.data(), host.token_sequence.data(), r * 4));
    EPI_RETURN_IF_ERROR(
        backend.copy_to_device(g.kv.block_tables.data(), host.block_tables.data(), host.block_tables.size() * 4));
    if (drawn) {
        std::vector<TokenDraw> draws(r);  // padding rows greedy
        std::copy(out.draws, out.draws + n, draws.begin());
        EPI_RETURN_IF_ERROR(backend.copy_to_device(g.draws.data(), draws.data(), r * sizeof(TokenDraw)));
    }

    std::vector<int64_t> row_begin(seqs.size());
    std::iota(row_begin.begin(), row_begin.end(), int64_t{0});
    ForwardArgs args;  // greedy, no observer: run_stage reads only logits_mode
    const StageInputs in{seqs, row_begin, static_cast<const int32_t*>(g.ids.data()),
                         static_cast<const int32_t*>(g.positions.data()), &g.kv, rows};
    const StageOutput stage_out{nullptr, static_cast<int32_t*>(g.greedy.data()),
                                drawn ? static_cast<const TokenDraw*>(g.draws.data()) : nullptr,
                                drawn ? static_cast<float*>(g.floor.data()) : nullptr};
    if (g.graph != nullptr) {
        EPI_RETURN_IF_ERROR(g.graph->replay());
    } else {
        // First step of this bucket: run it directly (which also warms caches the ops keep, e.g. expert
        // pointer tables), then record the same ops for the next steps.
        EPI_RETURN_IF_ERROR(run_stage(args, in, stage_out));
        Status captured = backend.begin_capture();
        if (captured.is_ok()) {
            const Status ran = run_stage(args, in, stage_out);
            Result<std::unique_ptr<OpGraph>> graph = backend.end_capture();
            captured = !ran.is_ok() ? ran : graph.status();
            if (captured.is_ok()) g.graph = std::move(graph).value();
        }
        // A backend or op that cannot be recorded (e.g. the host-driven fp32-activation expert path): run
        // every later step directly.
        if (!captured.is_ok()) {
            decode_graphs_enabled_ = false;
            decode_graphs_status_ = captured.with_context("decode graph capture");
        }
    }
    const size_t out_bytes = static_cast<size_t>(n) * sizeof(int32_t);
    EPI_RETURN_IF_ERROR(backend.copy_to_host(out.greedy_ids, g.greedy.data(), out_bytes));
    return backend.copy_to_host(out.greedy_non_finite, static_cast<const int32_t*>(g.greedy.data()) + rows,
                                out_bytes);
}

}  // namespace epinfer
