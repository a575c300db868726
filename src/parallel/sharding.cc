#include "parallel/sharding.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

namespace epinfer {

ShardRange split_evenly(int64_t total, int num_parts, int part_idx) {
    const int64_t base = total / num_parts;
    const int64_t extra = total % num_parts;
    const int64_t idx = part_idx;
    return {idx * base + std::min(idx, extra), base + (idx < extra ? 1 : 0)};
}

Result<TensorSlice> tp_slice(const std::string& name, std::span<const int64_t> shape, TpSplit split,
                             int tp_size, int tp_rank) {
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
        return invalid_argument(
            fmt::format("tensor '{}': tp rank {} is outside a TP group of {}", name, tp_rank, tp_size));
    }
    if (split == TpSplit::kReplicated) return TensorSlice{};
    if (shape.empty() || (split == TpSplit::kRow && shape.size() < 2)) {
        return invalid_argument(
            fmt::format("tensor '{}' [{}]: a {} split needs {}", name, fmt::join(shape, ", "),
                        split == TpSplit::kRow ? "row" : "column",
                        split == TpSplit::kRow ? "2 or more dimensions" : "1 or more dimensions"));
    }
    const int dim = split == TpSplit::kColumn ? 0 : static_cast<int>(shape.size()) - 1;
    const int64_t extent = shape[static_cast<size_t>(dim)];
    if (extent % tp_size != 0) {
        return invalid_argument(
            fmt::format("tensor '{}' [{}]: dimension {} of size {} does not split into {} equal "
                        "TP shards",
                        name, fmt::join(shape, ", "), dim, extent, tp_size));
    }
    const int64_t size = extent / tp_size;
    return TensorSlice{dim, {tp_rank * size, size}};
}

void copy_tensor_slice(const void* src, std::span<const int64_t> shape, size_t elem_bytes,
                       const TensorSlice& slice, void* dst) {
    int64_t total = 1;
    for (int64_t d : shape) total *= d;
    if (slice.dim < 0) {
        std::memcpy(dst, src, static_cast<size_t>(total) * elem_bytes);
        return;
    }
    // View the tensor as [outer, extent, inner]; copy the [outer, range.size, inner] box.
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < slice.dim; ++d) outer *= shape[static_cast<size_t>(d)];
    for (size_t d = static_cast<size_t>(slice.dim) + 1; d < shape.size(); ++d) inner *= shape[d];
    const int64_t extent = shape[static_cast<size_t>(slice.dim)];
    const size_t run_bytes = static_cast<size_t>(slice.range.size * inner) * elem_bytes;
    const auto* from = static_cast<const char*>(src);
    auto* to = static_cast<char*>(dst);
    for (int64_t o = 0; o < outer; ++o) {
        const size_t src_offset = static_cast<size_t>((o * extent + slice.range.begin) * inner) * elem_bytes;
        std::memcpy(to + static_cast<size_t>(o) * run_bytes, from + src_offset, run_bytes);
    }
}

Result<ShardRange> kv_heads_of_tp_rank(int64_t num_kv_heads, int tp_size, int tp_rank) {
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
        return invalid_argument(
            fmt::format("KV heads: tp rank {} is outside a TP group of {}", tp_rank, tp_size));
    }
    if (num_kv_heads >= tp_size && num_kv_heads % tp_size == 0) {
        const int64_t per_rank = num_kv_heads / tp_size;
        return ShardRange{tp_rank * per_rank, per_rank};
    }
    if (num_kv_heads > 0 && num_kv_heads < tp_size && tp_size % num_kv_heads == 0) {
        return ShardRange{tp_rank / (tp_size / num_kv_heads), 1};
    }
    return invalid_argument(
        fmt::format("num_key_value_heads {} and attention TP {}: the heads neither split evenly "
                    "nor replicate evenly (one must divide the other)",
                    num_kv_heads, tp_size));
}

}  // namespace epinfer
