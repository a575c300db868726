// Router top-k op: logits → (expert ids, weights) per token, exactly as ARCHITECTURE.md §4.
//
// Semantics (every backend, every layout), per token row t, all in fp32:
//   score:    softmax: p = softmax(logits[t]);  sigmoid: p = 1 / (1 + exp(−logits[t])).
//   choice:   c = p + e_score_correction_bias when a bias is given, else c = p (the bias only chooses,
//             it never weighs).
//   groups:   greedy: every expert is allowed (n_group, topk_group are only validated).
//             group_limited_greedy (DeepSeek-V2): group score = max c of the group.
//             noaux_tc (DeepSeek-V3): group score = sum of the top-2 c of the group.
//             The best topk_group of the n_group equal, contiguous groups are kept; experts of the other
//             groups are never chosen (transformers masks them with −inf, or with 0 for V2).
//   top-K:    the K allowed experts with the highest c.
//   weights:  w = p at the chosen experts; if norm_topk_prob: w /= (Σw + 1e-20), Σ over k = 0..K−1 in
//             output order; then w *= routed_scaling_factor (exactly once).
//   Ties go to the lower expert id (and lower group id). Output row order: descending c, ties ascending
//   id. Rows are independent and deterministic.
//   NaN: a NaN logit (or NaN c) ranks below −inf, so it is never chosen; a row with fewer than K
//   choosable experts in its kept groups yields id −1, weight 0 in the trailing positions. NaN logits
//   are left out of the softmax max and sum and get p = 0 (PyTorch would turn the whole row to NaN). In a
//   group score a NaN c counts as −inf. +inf logits (softmax) share the mass equally: e = 1 where the
//   logit equals the row max, exp(logit − max) elsewhere.
// Families (transformers 5.17): Mixtral renormalises always (norm_topk_prob = true); Qwen2-MoE, Qwen3-MoE,
// OLMoE renormalise iff config norm_topk_prob (default false); DeepSeek-V2 (DeepseekV2TopkRouter) never
// renormalises and multiplies by routed_scaling_factor; DeepSeek-V3, Kimi K2, GLM-4.5 renormalise iff
// norm_topk_prob, then scale. transformers adds no 1e-20 for softmax families: Σw ≥ max p ≥ 1/E there,
// so the term is below one ulp and the results are identical.
// Sources: transformers DeepseekV3TopkRouter, DeepseekV2TopkRouter, Glm4MoeTopkRouter, Qwen3MoeTopKRouter,
// MixtralTopKRouter (5.17); DeepSeek-V3 technical report §2.1.2.
#pragma once

#include <cstdint>

#include "core/router_types.h"
#include "core/status.h"

namespace epinfer {

struct MoeRouterTopkArgs {
    const float* router_logits = nullptr;            // [T, E] fp32, host or device (per backend)
    const float* e_score_correction_bias = nullptr;  // [E] fp32, or nullptr (no bias)
    int32_t* topk_ids = nullptr;                     // [T, K] int32 out; −1 = no expert
    float* topk_weights = nullptr;                   // [T, K] fp32 out; 0 where id is −1
    int64_t num_tokens = 0;                          // T (0 allowed)
    int64_t num_experts = 0;                         // E, 1 ≤ E ≤ INT32_MAX
    int64_t top_k = 0;                               // K, 1 ≤ K ≤ E
    ScoringFunc scoring_func = ScoringFunc::kSoftmax;
    TopkMethod topk_method = TopkMethod::kGreedy;
    int64_t n_group = 1;     // divides E; noaux_tc with n_group > 1: E/n_group ≥ 2
    int64_t topk_group = 1;  // 1 ≤ topk_group ≤ n_group, topk_group·E/n_group ≥ K
    bool norm_topk_prob = false;
    float routed_scaling_factor = 1.0f;  // finite
};

// Validates shapes, group settings and pointers (null allowed only when T = 0).
// Errors: kInvalidArgument naming the bad field and its value, e.g.
// "moe_router_topk: top_k 9 outside [1, num_experts 8]".
Status moe_router_topk_check(const MoeRouterTopkArgs& args);

}  // namespace epinfer
