// ModelConfig: the typed hyper-parameters of one Hugging Face MoE checkpoint (its config.json).
//
// Field names follow the HF config keys; comments give the key(s) each field is read from.
// Produced by parse_hf_config() (hf_config.h); consumed by models/, parallel/, planner/ and engine/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/router_types.h"

namespace epinfer {

enum class Architecture {
    kDeepseekV3,  // DeepseekV3ForCausalLM: model_type deepseek_v3 and kimi_k2
    kDeepseekV2,  // DeepseekV2ForCausalLM: model_type deepseek_v2
    kQwen3Moe,    // Qwen3MoeForCausalLM
    kQwen2Moe,    // Qwen2MoeForCausalLM
    kMixtral,     // MixtralForCausalLM
    kOlmoe,       // OlmoeForCausalLM
    kGlm4Moe,     // Glm4MoeForCausalLM
    kGptOss,      // GptOssForCausalLM: parsed for planning; the runtime does not run it (model_registry.h)
};

// HF class name of an architecture, e.g. "DeepseekV3ForCausalLM".
const char* architecture_name(Architecture arch);

enum class AttentionKind {
    kGqa,  // q/k/v/o projections, num_key_value_heads ≤ num_attention_heads
    kMla,  // DeepSeek multi-head latent attention (kv_lora_rank, optional q_lora_rank)
};

enum class QkNormKind {
    kNone,
    kPerHead,         // RMSNorm over head_dim of each q/k head (Qwen3-MoE; GLM-4.5 with use_qk_norm)
    kFullProjection,  // RMSNorm over the whole q/k projection, before the head split (OLMoE)
};

enum class RopeType { kDefault, kYarn, kLinear, kLlama3 };

// rope_theta/rope_scaling (published checkpoints) or rope_parameters (transformers 5).
struct RopeConfig {
    RopeType type = RopeType::kDefault;
    double theta = 10000.0;              // rope_theta
    int64_t rotary_dim = 0;              // dims rotated per head: head_dim·partial_rotary_factor, or qk_rope_head_dim
    bool interleaved = false;            // pairs (2i, 2i+1) instead of (i, i+d/2): DeepSeek rope_interleave
    double factor = 1.0;                 // rope_scaling.factor (yarn, linear, llama3)
    int64_t original_max_position_embeddings = 0;
    double beta_fast = 32.0, beta_slow = 1.0;  // yarn
    double mscale = 0.0, mscale_all_dim = 0.0; // yarn, DeepSeek: 0 = absent
    double attention_factor = 0.0;       // yarn attention_factor; 0 = derived from factor/mscale as HF does
    bool truncate = true;                // yarn: round the correction range to integers (HF default)
    double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
};

// Router semantics of ARCHITECTURE.md §4 (enums in core/router_types.h).
struct RouterConfig {
    ScoringFunc scoring_func = ScoringFunc::kSoftmax;
    TopkMethod topk_method = TopkMethod::kGreedy;
    bool has_correction_bias = false;    // mlp.gate.e_score_correction_bias present
    int64_t n_group = 1;                 // n_group
    int64_t topk_group = 1;              // topk_group
    int64_t num_experts_per_tok = 1;     // K
    bool norm_topk_prob = false;         // renormalise the K weights (Mixtral: always)
    double routed_scaling_factor = 1.0;  // applied exactly once, after renormalisation
};

struct ModelConfig {
    Architecture architecture = Architecture::kDeepseekV3;
    std::string model_type;  // as in config.json, e.g. "kimi_k2"

    int64_t vocab_size = 0;
    int64_t hidden_size = 0;                // H
    int64_t num_hidden_layers = 0;          // L: decoder layers, MTP layers excluded
    int64_t num_nextn_predict_layers = 0;   // DeepSeek-V3/GLM-4.5 MTP layers model.layers.{L+i}: not used
    int64_t max_position_embeddings = 0;
    double rms_norm_eps = 1e-6;
    bool tie_word_embeddings = false;

    // Attention.
    AttentionKind attention = AttentionKind::kGqa;
    int64_t num_attention_heads = 0;        // Nh
    int64_t num_key_value_heads = 0;        // Nkv (GQA)
    int64_t head_dim = 0;                   // D (GQA); MLA: qk_nope_head_dim + qk_rope_head_dim
    // Input projections carry a bias: GQA q/k/v (Qwen2-MoE qkv_bias; attention_bias of GLM-4.5, Qwen3-MoE,
    // OLMoE); MLA q_a_proj and kv_a_proj_with_mqa (DeepSeek attention_bias).
    bool attention_bias = false;
    bool attention_out_bias = false;        // o_proj bias (attention_bias of Qwen3-MoE, OLMoE, DeepSeek)
    QkNormKind qk_norm = QkNormKind::kNone;
    int64_t q_lora_rank = 0;                // MLA; 0 = no q compression (DeepSeek-V2-Lite)
    int64_t kv_lora_rank = 0;               // MLA
    int64_t qk_nope_head_dim = 0;           // MLA
    int64_t qk_rope_head_dim = 0;           // MLA
    int64_t v_head_dim = 0;                 // MLA
    RopeConfig rope;
    // Sliding-window attention (gpt-oss layer_types): a layer with layer_is_sliding[l] attends over the last
    // sliding_window positions only. Empty layer_is_sliding: every layer attends over the whole context.
    int64_t sliding_window = 0;
    std::vector<bool> layer_is_sliding;     // [num_hidden_layers] or empty
    bool attention_sinks = false;           // gpt-oss: one learned logit per head joins each softmax
                                            // (self_attn.sinks [Nh])

    // Dense MLP (dense layers) and MoE.
    int64_t intermediate_size = 0;          // dense MLP width (as read; Mixtral/OLMoE have no dense layer)
    int64_t n_routed_experts = 0;           // E (num_experts, num_local_experts)
    int64_t moe_intermediate_size = 0;      // I (Mixtral, OLMoE: intermediate_size)
    int64_t n_shared_experts = 0;           // DeepSeek/GLM: one shared MLP of width n_shared_experts·I
    int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE: sigmoid-gated shared_expert width; 0 = none
    RouterConfig router;
    bool router_bias = false;               // gpt-oss: the router linear has a bias [E] (mlp.router.bias)
    bool expert_bias = false;               // gpt-oss: each expert's gate_up [2I] and down [H] projections
                                            // have biases
    double swiglu_limit = 0.0;              // gpt-oss swiglu_limit: gate clamped above, up on both sides; 0 = none
    double swiglu_alpha = 0.0;              // gpt-oss swiglu_alpha: glu = gate·sigmoid(alpha·gate); 0 = plain silu
    std::vector<bool> layer_is_moe;         // [num_hidden_layers]: first_k_dense_replace, mlp_only_layers, ...

    // quantization_config.quant_method, e.g. "fp8" (DeepSeek-V3 block-scaled weights), "mxfp4" (gpt-oss
    // experts); empty = none.
    std::string quant_method;

    // Generation: eos_token_id of config.json and generation_config.json (merged, deduplicated).
    std::vector<int64_t> eos_token_ids;

    // Convenience.
    int64_t num_moe_layers() const;
    // Per-token K and V cache elements per layer: MLA caches kv_lora_rank + qk_rope_head_dim.
    int64_t kv_cache_elems_per_token_per_layer() const;
};

}  // namespace epinfer
