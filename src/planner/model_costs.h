// Model costs from ModelConfig: parameter counts by part and how they shard, KV cache elements per token,
// and FLOPs per token by part. Pure arithmetic on the config; layouts and dtypes are applied by the memory
// and cost models.
//
// Formulas (H hidden, Nh heads, Nkv KV heads, D head_dim, I expert width, E experts, K top-k, V vocab):
//   routed expert      3·H·I (gate, up, down; biases ignored)                     FACTS.md A.6
//   MLA attention      q_a H·q_lora, kv_a H·(kv_lora + rope) [replicated under attention TP];
//                      q_b q_lora·Nh·(nope + rope) (or q_proj H·Nh·(nope + rope)),
//                      kv_b kv_lora·Nh·(nope + v), o Nh·v·H [split across attention TP]
//   GQA attention      q H·Nh·D, o Nh·D·H [split]; k, v 2·H·Nkv·D [split by KV head, replicated past Nkv]
//   KV per token/layer MLA kv_lora + rope (the latent, one copy per attention-TP rank); GQA 2·Nkv·D
//                      ARCHITECTURE.md §7, FACTS.md A.6
//   score FLOPs per query token per context token, all heads, decode rows and prompt rows alike:
//                      MLA 2·Nh·(2·kv_lora + rope), the absorbed form (scores over the latent, output in
//                      the latent), which a GPU with the latent-attention kernel runs for every prompt
//                      chunk too (engine_facts.h kEngineMlaAbsorbAllRows; the expanded form's
//                      2·Nh·(nope + rope + v) runs only on the CPU backend and sm_86/89/120, not priced);
//                      GQA 2·Nh·2·D
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/model_config.h"

namespace epinfer::planner {

struct ModelCosts {
    int64_t num_layers = 0;
    int64_t num_moe_layers = 0;
    int64_t num_dense_layers = 0;
    std::vector<bool> layer_is_moe;  // [num_layers]
    int64_t hidden = 0;              // H
    int64_t vocab = 0;               // V
    int64_t max_position_embeddings = 0;  // tokens of one sequence at most (the engine refuses more); 0: any
    int64_t num_heads = 0;           // Nh
    int64_t num_kv_heads = 0;        // GQA Nkv; 0 for MLA
    int64_t n_experts = 0;           // E
    int64_t top_k = 0;               // K
    int64_t expert_width = 0;        // I
    int64_t dense_width = 0;         // dense MLP intermediate size (0 = no dense layers)
    int64_t shared_width = 0;        // total shared-expert width per MoE layer (0 = none)
    bool mla = false;
    // Attention widths the engine's activation traffic needs (engine_facts.h).
    int64_t head_dim = 0;             // GQA D; MLA qk_nope + qk_rope
    int64_t v_head_dim = 0;           // GQA D; MLA v_head_dim
    int64_t q_lora_rank = 0;          // MLA (0 = q_proj)
    int64_t kv_lora_rank = 0;         // MLA
    int64_t qk_rope_dim = 0;          // MLA
    // OLMoE: q/k RMSNorms over the whole projection (TP computes every head; two kernels of their own:
    // per-head ones, Qwen3-MoE's and GLM-4.5's, run inside qk_norm_rope_kv_store, engine_facts.h).
    bool qk_norm_full_projection = false;
    bool shared_expert_gate = false;  // a sigmoid gate on the shared expert (Qwen2-MoE)

    // Parameters (elements).
    int64_t embedding_params = 0;  // V·H
    int64_t lm_head_params = 0;    // V·H (tied: the embedding, counted again only on another stage)
    bool tied_embeddings = false;
    int64_t attn_split_params = 0;       // per layer, split evenly across attention TP
    int64_t attn_kv_head_params = 0;     // per layer, GQA k/v: split by KV head (Nkv heads of 2·H·D)
    int64_t attn_replicated_params = 0;  // per layer, on every attention-TP rank (MLA q_a/kv_a, norms)
    int64_t dense_mlp_params = 0;        // per dense layer, 3·H·dense_width
    int64_t shared_expert_params = 0;    // per MoE layer, 3·H·shared_width (+ H for a sigmoid gate)
    int64_t router_params = 0;           // per MoE layer, E·H (+ E correction bias or gpt-oss router bias)
    int64_t expert_params = 0;           // one routed expert, 3·H·I
    int64_t layer_norm_params = 0;       // per layer, the two RMSNorm weights

    // KV cache elements per token per layer (whole model, before any split).
    int64_t kv_elems_per_token_per_layer = 0;
    // Attention score FLOPs per query token per context token per layer (all heads).
    double score_flops_per_ctx = 0.0;

    // Every parameter of the model (each routed expert once).
    int64_t total_params() const;
};

// Errors are impossible: the config was validated by parse_hf_config. An empty layer_is_moe means every
// layer is MoE when the model has routed experts.
ModelCosts model_costs(const ModelConfig& config);

}  // namespace epinfer::planner
