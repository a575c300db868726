#include "checkpoint/model_config.h"

#include <algorithm>

namespace epinfer {

const char* architecture_name(Architecture arch) {
    switch (arch) {
        case Architecture::kDeepseekV3:
            return "DeepseekV3ForCausalLM";
        case Architecture::kDeepseekV2:
            return "DeepseekV2ForCausalLM";
        case Architecture::kQwen3Moe:
            return "Qwen3MoeForCausalLM";
        case Architecture::kQwen2Moe:
            return "Qwen2MoeForCausalLM";
        case Architecture::kMixtral:
            return "MixtralForCausalLM";
        case Architecture::kOlmoe:
            return "OlmoeForCausalLM";
        case Architecture::kGlm4Moe:
            return "Glm4MoeForCausalLM";
        case Architecture::kGptOss:
            return "GptOssForCausalLM";
    }
    return "unknown";
}

int64_t ModelConfig::num_moe_layers() const {
    return static_cast<int64_t>(std::count(layer_is_moe.begin(), layer_is_moe.end(), true));
}

int64_t ModelConfig::kv_cache_elems_per_token_per_layer() const {
    if (attention == AttentionKind::kMla) return kv_lora_rank + qk_rope_head_dim;
    return 2 * num_key_value_heads * head_dim;
}

}  // namespace epinfer
