// Which part of a tensor, a layer range or an expert list a rank owns: the arithmetic of sharding.
//
// Tensor-parallel (TP) splits of a Hugging Face nn.Linear weight [out, in] (Megatron-LM terms):
//  - column parallel: each TP rank owns out/tp consecutive rows (q/k/v, gate_proj, up_proj; their bias
//    too); the rank's output is a slice of the features.
//  - row parallel: each TP rank owns in/tp consecutive columns (o_proj, down_proj); the rank's output is
//    a partial sum, completed by the all-reduce after attention and after the MLP/MoE. Its bias (if any)
//    is replicated and must be added once.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace epinfer {

// A contiguous range [begin, begin + size).
struct ShardRange {
    int64_t begin = 0;
    int64_t size = 0;
    int64_t end() const { return begin + size; }
    bool operator==(const ShardRange&) const = default;
};

// Part `part_idx` of `total` items cut into `num_parts` contiguous parts as evenly as possible: sizes
// differ by at most one, and the first total % num_parts parts hold the extra item (16 over 3: 6, 5, 5).
// Requires total ≥ 0, num_parts ≥ 1, 0 ≤ part_idx < num_parts; parts may be empty when total < num_parts.
ShardRange split_evenly(int64_t total, int num_parts, int part_idx);

enum class TpSplit {
    kReplicated,  // every rank holds the whole tensor
    kColumn,      // dim 0 split: column-parallel weight [out, in] or its bias [out]
    kRow,         // last dim split: row-parallel weight [out, in]
};

// The part of a tensor a TP rank owns: `range` along dimension `dim`, every other dimension whole.
// dim = -1 means the whole tensor (kReplicated).
struct TensorSlice {
    int dim = -1;
    ShardRange range;
    bool operator==(const TensorSlice&) const = default;
};

// The slice of tensor `name` (shape `shape`) that TP rank `tp_rank` of `tp_size` owns under `split`.
// Errors: kInvalidArgument naming the tensor when the split dimension does not divide into tp_size
// equal parts, when a row split is asked of a 1-D tensor, or when tp_rank is out of range.
Result<TensorSlice> tp_slice(const std::string& name, std::span<const int64_t> shape, TpSplit split,
                             int tp_size, int tp_rank);

// Copies `slice` of a row-major tensor out of `src` into `dst` (row-major, the slice's own shape).
// src: [shape...] elements of elem_bytes; dst: [shape with shape[slice.dim] = slice.range.size].
void copy_tensor_slice(const void* src, std::span<const int64_t> shape, size_t elem_bytes,
                       const TensorSlice& slice, void* dst);

// The KV heads attention TP rank `tp_rank` of `tp_size` owns, out of num_kv_heads (GQA). When
// tp_size ≤ num_kv_heads the heads are split (num_kv_heads must divide evenly); when num_kv_heads
// divides tp_size each head is replicated on tp_size / num_kv_heads consecutive ranks (vLLM, SGLang).
// Errors: kInvalidArgument when neither divides the other.
Result<ShardRange> kv_heads_of_tp_rank(int64_t num_kv_heads, int tp_size, int tp_rank);

}  // namespace epinfer
