// Router top-k op: logits → (expert ids, weights) per token, exactly as ARCHITECTURE.md §4.
//
// Semantics (every backend, every layout):
//   softmax:  p = softmax(logits[t]); greedy: top-K of p; group_limited_greedy: group score = max p in
//             group, keep topk_group groups (others masked to 0), top-K of the masked p;
//             w = p at the chosen; if norm_topk_prob: w /= Σw (+1e-20); w *= routed_scaling_factor.
//   sigmoid (noaux_tc): s = sigmoid(logits[t]); c = s + bias (bias only chooses); group score = sum of the
//             top-2 c of each of n_group equal groups; keep topk_group groups (others −inf); top-K of c;
//             w = s at the chosen; if norm_topk_prob: w /= (Σw + 1e-20); w *= routed_scaling_factor.
//   Ties go to the lower expert (and group) id. A NaN logit never selects while a non-NaN expert remains
//   in an allowed group; a row with fewer than K selectable experts yields id −1, weight 0 for the rest.
//   Output row order: descending choice score (c or p), ties by ascending id.
// Sources: transformers DeepseekV3TopkRouter, DeepseekV2TopkRouter, Qwen3MoeSparseMoeBlock,
// MixtralSparseMoeBlock (5.17); DeepSeek-V3 technical report §2.1.2.
#pragma once

#include <cstdint>

#include "core/router_types.h"
#include "core/status.h"

namespace epinfer {

struct MoeRouterTopkArgs {
    const float* router_logits = nullptr;            // [T, E] fp32
    const float* e_score_correction_bias = nullptr;  // [E] fp32, or nullptr (sigmoid only)
    int32_t* topk_ids = nullptr;                     // [T, K] int32 out; −1 = no expert
    float* topk_weights = nullptr;                   // [T, K] fp32 out
    int64_t num_tokens = 0;                          // T (0 allowed)
    int64_t num_experts = 0;                         // E
    int64_t top_k = 0;                               // K, 1 ≤ K ≤ E
    ScoringFunc scoring_func = ScoringFunc::kSoftmax;
    TopkMethod topk_method = TopkMethod::kGreedy;
    int64_t n_group = 1;                             // divides E
    int64_t topk_group = 1;                          // 1 ≤ topk_group ≤ n_group
    bool norm_topk_prob = false;
    float routed_scaling_factor = 1.0f;
};

// kInvalidArgument naming the bad field (K out of range, E not divisible by n_group, ...).
Status moe_router_topk_check(const MoeRouterTopkArgs& args);

}  // namespace epinfer
