// The model registry: per-architecture facts the shared decoder (models/model.cc) needs beyond
// ModelConfig, keyed by Architecture. Every supported family is one explicit row of the table in
// model_registry.cc.
//
// All families share one decoder layer (transformers 5.17 <Family>DecoderLayer):
//   h += attention(input_layernorm(h));  h += mlp(post_attention_layernorm(h));  logits = lm_head(norm(h))
// where attention is MLA or GQA (config.attention) and mlp is a dense SwiGLU MLP or the MoE block
// (config.layer_is_moe). Tensor names: checkpoint/weight_names.h.
#pragma once

#include "checkpoint/model_config.h"
#include "core/status.h"
#include "layers/moe/moe_block.h"

namespace epinfer {

struct FamilySpec {
    Architecture architecture;
    SharedExpertMode shared_mode;  // how the MoE block's shared expert is added, when the config has one
    const char* shared_name;       // "mlp.<shared_name>.{gate,up,down}_proj.weight", or nullptr
    const char* shared_gate_name;  // "mlp.<shared_gate_name>.weight" [1, H] (kSigmoidGated), or nullptr
    // False for a family whose config parses (so `epinfer plan` and `inspect` read it) but whose decoder
    // the runtime does not have (gpt_oss: sliding-window layers, attention sinks, biased clamped experts).
    bool runs = true;
};

// The row of `arch` (every Architecture has one).
const FamilySpec& family_spec(Architecture arch);

// OK when the runtime runs models of config.architecture; otherwise kNotSupported, one line naming the
// architecture and model_type. Model::load and Model::create_random call it first.
Status check_runtime_support(const ModelConfig& config);

}  // namespace epinfer
