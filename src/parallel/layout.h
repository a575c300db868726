// ParallelLayout: how the ranks of a run split the model (ARCHITECTURE.md §5), rank ↔ coordinates, and
// the groups each rank belongs to. Pure arithmetic; nothing here communicates.
//
// Ranks = pp stages × W ranks per stage. Within a stage the same W ranks are viewed two ways:
//   attention:  attn_tp × attn_dp = W  (heads split across attn_tp; requests split across attn_dp)
//   MoE:        moe_tp  × moe_ep  = W  (experts split across moe_ep; each expert's I split across moe_tp)
// Rank order (SGLang's, with the pipeline outermost as in Megatron-LM):
//   world rank = pp_rank · W + local_rank
//   local_rank = attn_dp_rank · attn_tp + attn_tp_rank = moe_ep_rank · moe_tp + moe_tp_rank
// so attention-TP and MoE-TP groups are runs of consecutive ranks.
//
// Command-line flags (layout_from_flags): --tp A --ep B --dp D --pp C, as SGLang reads them
// (--tp-size, --ep-size, --dp-size with --enable-dp-attention), with --tp defaulting to what the other
// flags need:
//   W       = A when --tp is given, else max(B, D, 1)   (SGLang: tp_size is the ranks per stage)
//   moe_ep  = B (default 1), moe_tp  = W / B            (SGLang: moe_tp_size = tp_size // ep_size)
//   attn_dp = D (default 1), attn_tp = W / D            (SGLang: attn_tp_size = tp_size // dp_size)
//   pp      = C (default 1); ranks = C · W
// --dp here always means data-parallel attention inside a stage (SGLang's --enable-dp-attention); whole
// model replicas are separate epinfer processes, not a layout.
//   flags                ranks  attn_tp×attn_dp  moe_tp×moe_ep  layout (vLLM equivalent)
//   --tp 4               4      4×1              4×1            TP (-tp 4)
//   --ep 4               4      4×1              1×4            EP, TP attention (-tp 4 -ep on)
//   --dp 4 --ep 4        4      1×4              1×4            EP, DP attention (-dp 4 -ep on)
//   --tp 4 --ep 2        4      4×1              2×2            hybrid moe_tp × moe_ep
//   --tp 4 --dp 2 --ep 4 4      2×2              1×4            (-tp 2 -dp 2 -ep on)
//   --pp 2 --ep 2        4      2×1 per stage    1×2 per stage  PP × EP
// ("-ep on" is vLLM's --enable-expert-parallel.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace epinfer {

// The --tp/--ep/--dp/--pp flags as given; 0 = not given. A command line that gives one explicitly must
// give it ≥ 1: the CLI rejects "--tp 0" before it gets here (tools/epinfer/model_setup.h).
struct LayoutFlags {
    int tp = 0;
    int ep = 0;
    int dp = 0;
    int pp = 0;
};

// A rank's place in each dimension of the layout.
struct RankCoords {
    int pp_rank = 0;     // stage
    int local_rank = 0;  // rank within the stage, 0..W−1
    int attn_tp_rank = 0;
    int attn_dp_rank = 0;
    int moe_tp_rank = 0;
    int moe_ep_rank = 0;
    bool operator==(const RankCoords&) const = default;
};

enum class GroupKind {
    kStage,     // the W ranks of one pipeline stage
    kAttnTp,    // the attn_tp ranks that split one set of requests' attention heads
    kAttnDp,    // the attn_dp ranks with the same attention-TP rank
    kMoeTp,     // the moe_tp ranks that split the same experts' intermediate dimension
    kMoeEp,     // the moe_ep ranks that split the experts between them
    kPipeline,  // the pp ranks with the same local rank, one per stage (PP neighbours are adjacent)
};

// "stage", "attn_tp", "attn_dp", "moe_tp", "moe_ep", "pipeline".
const char* group_kind_name(GroupKind kind);

// Arguments for Communicator::split() that form a group of the layout: color picks the group, key
// orders its ranks by their rank within the group.
struct SplitKey {
    int color = 0;
    int key = 0;
};

struct ParallelLayout {
    int pp = 1;
    int attn_tp = 1;
    int attn_dp = 1;
    int moe_tp = 1;
    int moe_ep = 1;

    int stage_size() const { return attn_tp * attn_dp; }  // W
    int world_size() const { return pp * stage_size(); }

    // Requires 0 ≤ rank < world_size().
    RankCoords coords(int rank) const;
    int rank_of(int pp_rank, int local_rank) const { return pp_rank * stage_size() + local_rank; }
    // The world ranks of `rank`'s group of `kind`, in the order of their rank within the group.
    std::vector<int> group(GroupKind kind, int rank) const;
    // `rank`'s rank within its group of `kind`.
    int group_rank(GroupKind kind, int rank) const;
    SplitKey split_key(GroupKind kind, int rank) const;
    // The rank with the same local rank in the previous / next stage; −1 at the first / last stage.
    int prev_stage_rank(int rank) const;
    int next_stage_rank(int rank) const;
    // e.g. "8 ranks = pp 2 × 4 per stage (attn_tp 2 × attn_dp 2, moe_tp 1 × moe_ep 4)".
    std::string to_string() const;
    bool operator==(const ParallelLayout&) const = default;
};

// The layout the flags describe (see the table at the top of this file).
// Errors: kInvalidArgument, one message with the numbers, when a flag is negative ("--pp must be ≥ 1, got
// -1") or --ep / --dp does not divide the ranks per stage.
Result<ParallelLayout> layout_from_flags(const LayoutFlags& flags);

// The model sizes a layout must fit (from ModelConfig; kept here so that parallel/ depends on core only).
struct LayoutModelDims {
    int64_t num_hidden_layers = 0;
    int64_t num_attention_heads = 0;
    int64_t num_key_value_heads = 0;       // GQA; 0 for MLA (no separate KV heads)
    int64_t n_routed_experts = 0;          // E
    int64_t moe_intermediate_size = 0;     // I, split across moe_tp
    int64_t dense_intermediate_size = 0;   // dense MLP width, split across attn_tp; 0 = no dense layers
    int64_t shared_intermediate_size = 0;  // total shared-expert width, split across attn_tp; 0 = none
};

// Checks a layout against the world and the model before any weight is read. Every violation is
// reported, in one line separated by "; ", each with its numbers:
//   world size = pp × per-stage ranks; attn_tp × attn_dp = moe_tp × moe_ep (every size ≥ 1);
//   num_attention_heads divisible by attn_tp; num_key_value_heads divisible by attn_tp or dividing it
//   (replicated KV heads); ep ≤ n_routed_experts; moe_intermediate_size, the dense MLP and the shared
//   experts' widths divisible by their TP size; pp ≤ num_hidden_layers.
// Errors: kInvalidArgument.
Status validate_layout(const ParallelLayout& layout, const LayoutModelDims& dims, int world_size);

}  // namespace epinfer
