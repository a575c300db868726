#include "planner/memory_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "planner/layouts.h"

namespace epinfer::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// The stage's residual, normed input and branch output (models/model.cc run_stage) and the blocks' per-token
// [T, H] buffers; the attention block's own temporaries are the separate term below.
constexpr int64_t kHiddenBuffers = 8;

int64_t bytes_of(int64_t elems, WeightFormat format) {
    return static_cast<int64_t>(std::ceil(static_cast<double>(elems) * weight_bytes_per_element(format)));
}

}  // namespace

int64_t WeightBytes::total() const {
    return embedding + lm_head + attention + dense_mlp + shared_experts + routed_experts + router_and_norms;
}

int64_t StageMemory::non_kv_bytes() const {
    return weights.total() + ep_buffer_bytes + activation_bytes + cuda_graph_bytes;
}

MemoryPlan plan_memory(const ModelCosts& m, const ParallelLayout& l, const GpuSpec& gpu,
                       const MemoryOptions& o) {
    MemoryPlan plan;
    plan.device_bytes = static_cast<int64_t>(gpu.memory_bytes.value);
    plan.usable_bytes = gpu.usable_bytes();
    const RankShare share = rank_share(m, l);
    const int64_t H = m.hidden;
    const WeightFormat dense = o.weights.dense, experts = o.weights.routed_experts;
    const WeightFormat other = o.weights.other;
    const int64_t act_bytes = o.activation_bytes_per_element;

    // Activations and buffers are the same on every stage.
    const int64_t T = o.max_prefill_tokens;
    double moe_rows = m.n_experts > 0 ? static_cast<double>(T) * l.attn_dp * m.top_k * share.local_experts /
                                            static_cast<double>(m.n_experts)
                                      : 0.0;
    int64_t moe_act = static_cast<int64_t>(moe_rows) * (3 * m.expert_width / l.moe_tp + 2 * H) * act_bytes;
    int64_t mlp_width = std::max(m.dense_width, m.shared_width) / l.attn_tp;
    int64_t mlp_act = T * 3 * mlp_width * act_bytes;
    EngineAttentionTempArgs attn_args;
    attn_args.rows = T;
    attn_args.context_tokens = o.context_tokens;
    attn_args.attn_tp = l.attn_tp;
    attn_args.kv_heads_per_rank = share.kv_heads_per_rank;
    attn_args.act = static_cast<int>(act_bytes);
    attn_args.device = o.device;
    // The attention block frees its temporaries before the MoE or MLP block allocates: the larger counts.
    const int64_t attn_act = engine_attention_temp_bytes(m, attn_args);
    int64_t activation = T * kHiddenBuffers * H * act_bytes + std::max({moe_act, mlp_act, attn_act}) +
                         o.max_batch_requests_per_rank * share.vocab_slice * 4;
    int64_t ep_buffers = (l.attn_dp > 1 && m.n_experts > 0)
                             ? 2 * o.max_dispatch_tokens_per_rank * m.top_k * H * act_bytes
                             : 0;

    int64_t worst_margin = INT64_MAX;
    for (const PipelineStage& ps : layout_stages(m, l.pp)) {
        StageMemory s;
        s.stage = ps.stage;
        s.first_layer = ps.layers.begin;
        s.num_layers = ps.layers.size;
        for (int64_t i = ps.layers.begin; i < ps.layers.end(); ++i) {
            if (m.layer_is_moe[static_cast<size_t>(i)]) ++s.num_moe_layers;
        }
        const int64_t dense_layers = s.num_layers - s.num_moe_layers;
        WeightBytes& w = s.weights;
        if (ps.has_embedding) w.embedding = bytes_of(share.vocab_slice * H, other);
        if (ps.has_lm_head && !(m.tied_embeddings && ps.has_embedding))
            w.lm_head = bytes_of(share.vocab_slice * H, other);
        w.attention = s.num_layers * bytes_of(share.attn_params, dense);
        w.dense_mlp = dense_layers * bytes_of(share.dense_mlp_params, dense);
        w.shared_experts = s.num_moe_layers * bytes_of(share.shared_params, dense);
        w.routed_experts =
            s.num_moe_layers * share.local_experts * bytes_of(share.expert_slice_params, experts);
        w.router_and_norms = bytes_of(s.num_moe_layers * m.router_params + s.num_layers * m.layer_norm_params +
                                          (ps.has_lm_head ? H : 0),
                                      other);
        s.ep_buffer_bytes = ep_buffers;
        s.activation_bytes = activation;
        s.cuda_graph_bytes = o.cuda_graph_bytes;
        s.kv_bytes_per_token = s.num_layers * share.kv_elems_per_token * o.kv_bytes_per_element;
        s.kv_cache_bytes = plan.usable_bytes - s.non_kv_bytes();
        s.kv_tokens =
            (s.kv_cache_bytes > 0 && s.kv_bytes_per_token > 0) ? s.kv_cache_bytes / s.kv_bytes_per_token : 0;
        int64_t margin = s.kv_cache_bytes - o.context_tokens * s.kv_bytes_per_token;
        if (margin < worst_margin) {
            worst_margin = margin;
            plan.worst_stage = static_cast<int>(plan.stages.size());
        }
        plan.stages.push_back(s);
    }
    plan.margin_bytes = worst_margin;
    plan.fits = worst_margin >= 0;
    plan.kv_tokens_per_rank = INT64_MAX;
    for (const StageMemory& s : plan.stages)
        plan.kv_tokens_per_rank = std::min(plan.kv_tokens_per_rank, s.kv_tokens);
    plan.kv_tokens_total = plan.kv_tokens_per_rank * l.attn_dp;
    plan.max_requests = o.context_tokens > 0 ? plan.kv_tokens_per_rank / o.context_tokens * l.attn_dp : 0;

    const StageMemory& worst = plan.worst();
    const std::pair<const char*, int64_t> terms[] = {
        {"routed experts", worst.weights.routed_experts},
        {"attention weights", worst.weights.attention},
        {"shared experts", worst.weights.shared_experts},
        {"dense MLP weights", worst.weights.dense_mlp},
        {"embedding", worst.weights.embedding},
        {"LM head", worst.weights.lm_head},
        {"router and norms", worst.weights.router_and_norms},
        {"EP buffers", worst.ep_buffer_bytes},
        {"activations", worst.activation_bytes},
        {"CUDA graphs", worst.cuda_graph_bytes},
    };
    for (const auto& [name, bytes] : terms) {
        if (bytes > plan.largest_term_bytes) {
            plan.largest_term = name;
            plan.largest_term_bytes = bytes;
        }
    }
    return plan;
}

MemoryPlan plan_memory(const ModelConfig& config, const ParallelLayout& layout, const GpuSpec& gpu,
                       const MemoryOptions& options) {
    return plan_memory(model_costs(config), layout, gpu, options);
}

std::string format_gib(int64_t bytes) {
    return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / kGiB);
}

std::string format_bytes(int64_t bytes) {
    static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
    double value = std::fabs(static_cast<double>(bytes));
    if (value < 1024.0) return fmt::format("{} B", bytes);
    const char* unit = kUnits[0];
    for (const char* u : kUnits) {
        if (value < 1024.0) break;
        value /= 1024.0;
        unit = u;
    }
    return fmt::format("{}{:.1f} {}", bytes < 0 ? "-" : "", value, unit);
}

}  // namespace epinfer::planner
