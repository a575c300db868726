#include "planner/model_costs.h"

namespace epinfer::planner {

int64_t ModelCosts::total_params() const {
    int64_t per_layer = attn_split_params + attn_kv_head_params + attn_replicated_params + layer_norm_params;
    int64_t moe = shared_expert_params + router_params + n_experts * expert_params;
    int64_t head = tied_embeddings ? 0 : lm_head_params;
    return embedding_params + head + hidden /* final norm */ + num_layers * per_layer + num_moe_layers * moe +
           num_dense_layers * dense_mlp_params;
}

ModelCosts model_costs(const ModelConfig& c) {
    ModelCosts m;
    const int64_t H = c.hidden_size;
    m.num_layers = c.num_hidden_layers;
    if (c.layer_is_moe.empty()) {
        m.num_moe_layers = c.n_routed_experts > 0 ? c.num_hidden_layers : 0;
    } else {
        m.num_moe_layers = c.num_moe_layers();
    }
    m.num_dense_layers = m.num_layers - m.num_moe_layers;
    m.layer_is_moe = c.layer_is_moe;
    if (m.layer_is_moe.size() != static_cast<size_t>(m.num_layers)) {
        m.layer_is_moe.assign(static_cast<size_t>(m.num_layers), m.num_moe_layers > 0);
    }
    m.hidden = H;
    m.vocab = c.vocab_size;
    m.max_position_embeddings = c.max_position_embeddings;
    m.num_heads = c.num_attention_heads;
    m.n_experts = c.n_routed_experts;
    m.top_k = c.router.num_experts_per_tok;
    m.expert_width = c.moe_intermediate_size;
    m.dense_width = m.num_dense_layers > 0 ? c.intermediate_size : 0;
    m.mla = c.attention == AttentionKind::kMla;

    m.embedding_params = c.vocab_size * H;
    m.lm_head_params = c.vocab_size * H;
    m.tied_embeddings = c.tie_word_embeddings;

    const int64_t Nh = c.num_attention_heads;
    if (m.mla) {
        const int64_t qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
        int64_t q_split = 0, q_replicated = 0;
        if (c.q_lora_rank > 0) {
            q_replicated = H * c.q_lora_rank + c.q_lora_rank;  // q_a_proj + q_a_layernorm
            q_split = c.q_lora_rank * Nh * qk_head;            // q_b_proj
        } else {
            q_split = H * Nh * qk_head;  // q_proj
        }
        const int64_t kv_a = H * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank;  // + kv_a_layernorm
        const int64_t kv_b = c.kv_lora_rank * Nh * (c.qk_nope_head_dim + c.v_head_dim);
        const int64_t o = Nh * c.v_head_dim * H;
        m.attn_split_params = q_split + kv_b + o;
        m.attn_replicated_params = q_replicated + kv_a;
        m.head_dim = qk_head;
        m.v_head_dim = c.v_head_dim;
        m.q_lora_rank = c.q_lora_rank;
        m.kv_lora_rank = c.kv_lora_rank;
        m.qk_rope_dim = c.qk_rope_head_dim;
        m.kv_elems_per_token_per_layer = c.kv_lora_rank + c.qk_rope_head_dim;
        m.score_flops_per_ctx = 2.0 * Nh * (2.0 * c.kv_lora_rank + c.qk_rope_head_dim);
    } else {
        const int64_t D = c.head_dim;
        m.num_kv_heads = c.num_key_value_heads;
        m.head_dim = D;
        m.v_head_dim = D;
        m.qk_norm_full_projection = c.qk_norm == QkNormKind::kFullProjection;
        m.attn_split_params = 2 * H * Nh * D;  // q_proj, o_proj
        m.attn_kv_head_params = 2 * H * c.num_key_value_heads * D;
        m.attn_replicated_params = c.qk_norm == QkNormKind::kPerHead ? 2 * D : 0;
        if (c.qk_norm == QkNormKind::kFullProjection)
            m.attn_replicated_params = H + c.num_key_value_heads * D;
        m.kv_elems_per_token_per_layer = 2 * c.num_key_value_heads * D;
        m.score_flops_per_ctx = 2.0 * Nh * 2.0 * D;
    }
    m.layer_norm_params = 2 * H;

    m.dense_mlp_params = 3 * H * m.dense_width;
    if (c.n_shared_experts > 0) {
        m.shared_width = c.n_shared_experts * c.moe_intermediate_size;
        m.shared_expert_params = 3 * H * m.shared_width;
    } else if (c.shared_expert_intermediate_size > 0) {
        m.shared_width = c.shared_expert_intermediate_size;
        m.shared_expert_params = 3 * H * m.shared_width + H;  // + shared_expert_gate
        m.shared_expert_gate = true;
    }
    m.router_params =
        c.n_routed_experts * H + (c.router.has_correction_bias || c.router_bias ? c.n_routed_experts : 0);
    m.expert_params = 3 * H * c.moe_intermediate_size;
    return m;
}

}  // namespace epinfer::planner
