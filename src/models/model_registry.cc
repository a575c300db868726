#include "models/model_registry.h"

#include <string>

namespace epinfer {

namespace {

constexpr FamilySpec kFamilies[] = {
    // DeepseekV3ForCausalLM (deepseek_v3, kimi_k2): MLA, sigmoid router with bias, shared_experts.
    {Architecture::kDeepseekV3, SharedExpertMode::kUnweighted, "shared_experts", nullptr},
    // DeepseekV2ForCausalLM: MLA (complex-pair RoPE), softmax router, shared_experts.
    {Architecture::kDeepseekV2, SharedExpertMode::kUnweighted, "shared_experts", nullptr},
    // Qwen3MoeForCausalLM: GQA with per-head q/k norm, softmax router, no shared expert.
    {Architecture::kQwen3Moe, SharedExpertMode::kNone, nullptr, nullptr},
    // Qwen2MoeForCausalLM: GQA with q/k/v bias, softmax router, sigmoid-gated shared_expert.
    {Architecture::kQwen2Moe, SharedExpertMode::kSigmoidGated, "shared_expert", "shared_expert_gate"},
    // MixtralForCausalLM: GQA, block_sparse_moe with w1/w3/w2 experts, no shared expert.
    {Architecture::kMixtral, SharedExpertMode::kNone, nullptr, nullptr},
    // OlmoeForCausalLM: GQA with q/k norm over the whole projection, no shared expert.
    {Architecture::kOlmoe, SharedExpertMode::kNone, nullptr, nullptr},
    // Glm4MoeForCausalLM: GQA with bias, partial rotary, optional per-head q/k norm, sigmoid router
    // with bias, shared_experts.
    {Architecture::kGlm4Moe, SharedExpertMode::kUnweighted, "shared_experts", nullptr},
    // GptOssForCausalLM: parsed for planning only (see FamilySpec::runs).
    {Architecture::kGptOss, SharedExpertMode::kNone, nullptr, nullptr, false},
};

}  // namespace

const FamilySpec& family_spec(Architecture arch) {
    for (const FamilySpec& f : kFamilies)
        if (f.architecture == arch) return f;
    return kFamilies[0];  // unreachable: every Architecture has a row
}

Status check_runtime_support(const ModelConfig& config) {
    if (family_spec(config.architecture).runs) return Status::ok();
    return not_supported(std::string(architecture_name(config.architecture)) + " (model_type " +
                         config.model_type +
                         ") is not supported by the runtime: its config is read for planning only (epinfer plan)");
}

}  // namespace epinfer
