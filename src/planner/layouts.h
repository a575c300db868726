// The layouts the planner considers, named by the flags that start them (parallel/layout.h):
//   "tp8"          TP: attention and experts split 8 ways (attn_tp 8, moe_tp 8)
//   "ep8"          EP with TP attention (attn_tp 8, moe_ep 8)
//   "dp8-ep8"      EP with DP attention (attn_dp 8, moe_ep 8)
//   "tp8-ep4"      hybrid moe_tp 2 × moe_ep 4, TP attention
//   "tp8-dp4-ep4"  attn_tp 2 × attn_dp 4, moe_tp 2 × moe_ep 4
//   "pp2-tp4"      two pipeline stages of TP4
// and what each rank holds of the model (RankShare).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "parallel/layout.h"
#include "parallel/pipeline_stages.h"
#include "planner/model_costs.h"

namespace epinfer::planner {

// The shortest flag spec that layout_from_flags turns back into `layout`, tokens in the order pp, tp, dp,
// ep joined by '-'; "tp1" for one GPU.
std::string layout_spec(const ParallelLayout& layout);

// Parses a spec of tokens tpN, epN, dpN, ppN joined by '-' (case-insensitive), the value of plan's --layout.
// Errors: kInvalidArgument "--layout '<spec>': ..." naming what is wrong: an empty, unknown or repeated
// token, a degree that is not a positive integer of at most 6 digits right after its key ("tp-1": got
// '-1'), or flags layout_from_flags rejects.
Result<ParallelLayout> parse_layout_spec(const std::string& spec);

// The sizes validate_layout checks, from the model.
LayoutModelDims layout_model_dims(const ModelCosts& model);

// Every layout of `gpus` ranks the model admits (validate_layout), ordered by pp, then TP, EP with TP
// attention, EP with DP attention, then the hybrids by decreasing attn_tp and moe_tp.
std::vector<ParallelLayout> enumerate_layouts(int gpus, const ModelCosts& model);

// The pipeline stages of the model's layers under `pp`, clamped to [1, num_layers] (validate_layout
// already guarantees that range).
std::vector<PipelineStage> layout_stages(const ModelCosts& model, int pp);

// What one rank of a layout holds and computes per layer (elements; the busiest rank where they differ).
struct RankShare {
    int64_t attn_params = 0;          // attention weights on one attention-TP rank
    int64_t kv_elems_per_token = 0;   // KV cache elements per token per layer on one rank
    int64_t kv_heads_per_rank = 0;    // GQA KV heads a rank holds (0 for MLA)
    int64_t dense_mlp_params = 0;     // dense MLP, split across attention TP
    int64_t shared_params = 0;        // shared experts, split across attention TP
    int64_t local_experts = 0;        // ceil(E / moe_ep): the busiest EP rank (ExpertPlacement::contiguous)
    int64_t expert_slice_params = 0;  // one routed expert's part on one rank: 3·H·I / moe_tp
    int64_t vocab_slice = 0;          // V / attn_tp rows of the embedding and LM head (vocab parallel)
};
RankShare rank_share(const ModelCosts& model, const ParallelLayout& layout);

}  // namespace epinfer::planner
