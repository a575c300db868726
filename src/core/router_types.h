// Router semantics shared by ModelConfig (checkpoint/) and the router op (backend/): ARCHITECTURE.md §4.
#pragma once

namespace epinfer {

enum class ScoringFunc {
    kSoftmax,  // p = softmax(logits) over all E, then top-K (Qwen2/3-MoE, OLMoE, Mixtral, DeepSeek-V2)
    kSigmoid,  // s = sigmoid(logits); choice by s + e_score_correction_bias (DeepSeek-V3, Kimi K2, GLM-4.5)
};

enum class TopkMethod {
    kGreedy,              // top-K over all experts
    kGroupLimitedGreedy,  // DeepSeek-V2: group score = max score in group; keep topk_group groups
    kNoauxTc,             // DeepSeek-V3: group score = sum of the top-2 (s + bias) in group
};

}  // namespace epinfer
