// The memory model: what one GPU of a layout holds, and how many KV-cache tokens fit in the rest.
//
// Per GPU, for each pipeline stage (parallel/pipeline_stages.h), in bytes:
//   weights       by part (weight_format.h bytes/element; RankShare for the split); the embedding on the
//                 first stage and the LM head on the last, both vocab-parallel across attention TP, in
//                 WeightFormats::other (bf16) as the routers and norms
//   EP buffers    when tokens move by all-to-all (attn_dp > 1): a dispatch and a combine buffer of
//                 max_dispatch_tokens_per_rank · K · H activations each
//   activations   max_prefill_tokens · 8 · H hidden-state buffers
//                 + max(MoE rows · (3·I/moe_tp + 2·H), max_prefill_tokens · 3 · width/attn_tp,
//                       attention temporaries),
//                   MoE rows = max_prefill_tokens · attn_dp · K · local_experts / E, width the larger of
//                   the dense MLP and the shared experts, all at activation_bytes_per_element (the
//                   engine's fp32 by default, engine_facts.h); attention temporaries =
//                   engine_attention_temp_bytes (engine_facts.h) of max_prefill_tokens rows and Nh/attn_tp
//                   heads on `device`: q, the latent and the output, plus MLA's absorbed form's
//                   T·Nh/attn_tp·(2·kv_lora + rope) fp32 (1.63 GiB in all for DeepSeek-V3 at tp1, T 2048)
//                   or, only where the device does not absorb every chunk, its expanded form's
//                   S·Nh/attn_tp·(2·nope + rope + v) fp32 for S = min(context_tokens,
//                   max_position_embeddings) keys. A max, not a sum: the attention block frees its buffers
//                   before the MoE or MLP block allocates (the CUDA backend's stream-ordered pool reuses
//                   them)
//                 + max_batch_requests_per_rank · V/attn_tp fp32 logits
//   CUDA graphs   a fixed reserve (cuda_graph_bytes)
//   KV cache      the rest of usable = memory · usable fraction; per token: layers of the stage ·
//                 RankShare::kv_elems_per_token · kv_bytes_per_element
// A layout fits when every stage holds its non-KV terms plus the KV of one request of context_tokens.
// `epinfer plan` calls plan_memory; the runtime's start-up (tools/epinfer/model_setup.h) calls it through
// check_fits (planner/fit_check.h) before allocating anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "parallel/layout.h"
#include "planner/engine_facts.h"
#include "planner/hardware_profile.h"
#include "planner/model_costs.h"
#include "planner/weight_format.h"

namespace epinfer::planner {

struct MemoryOptions {
    WeightFormats weights;
    int64_t context_tokens = 4096;                        // KV tokens one request holds (prompt + output)
    int kv_bytes_per_element = kEngineKvBytesPerElement;  // 2 = the engine's bf16 cache; 4 fp32, 1 fp8
    int activation_bytes_per_element = kEngineActivationBytesPerElement;  // 4 = the engine's fp32; 2 bf16
    int64_t max_prefill_tokens = kEngineMaxStepTokens;            // tokens per attention-DP rank per forward
    int64_t max_dispatch_tokens_per_rank = kEngineMaxStepTokens;  // EP dispatch/combine buffer rows (× K)
    int64_t max_batch_requests_per_rank = 1024;                   // decode rows per rank (logits buffer)
    int64_t cuda_graph_bytes = int64_t{1} << 30;                  // estimate: captured graphs and their pools
    // How attention runs (MLA absorbed or expanded, GEMM input copies): by default on a GPU with the
    // latent-attention kernel; the runtime's check (tools/epinfer/model_setup.cc) sets its backend's.
    EngineDevice device;
};

struct WeightBytes {
    int64_t embedding = 0;
    int64_t lm_head = 0;
    int64_t attention = 0;
    int64_t dense_mlp = 0;
    int64_t shared_experts = 0;
    int64_t routed_experts = 0;
    int64_t router_and_norms = 0;
    int64_t total() const;
};

// One GPU of one pipeline stage.
struct StageMemory {
    int stage = 0;
    int64_t first_layer = 0;
    int64_t num_layers = 0;
    int64_t num_moe_layers = 0;
    WeightBytes weights;
    int64_t ep_buffer_bytes = 0;
    int64_t activation_bytes = 0;
    int64_t cuda_graph_bytes = 0;
    int64_t kv_bytes_per_token = 0;  // this GPU's share of one token's KV over the stage's layers
    // usable − non-KV terms, negative when those alone do not fit (under `plan --kv-cache-tokens N`: the
    // pool of N tokens the engine would allocate, planner.cc engine_fit)
    int64_t kv_cache_bytes = 0;
    int64_t kv_tokens = 0;  // kv_cache_bytes / kv_bytes_per_token (0 when negative)
    int64_t non_kv_bytes() const;
};

struct MemoryPlan {
    int64_t device_bytes = 0;
    int64_t usable_bytes = 0;
    std::vector<StageMemory> stages;
    int worst_stage = 0;             // the stage with the least room (smallest margin)
    int64_t kv_tokens_per_rank = 0;  // min over stages: KV tokens one attention-DP rank can hold
    int64_t kv_tokens_total = 0;     // kv_tokens_per_rank · attn_dp: tokens the whole layout can hold
    int64_t max_requests = 0;  // requests of context_tokens: ⌊kv_tokens_per_rank/context⌋ · attn_dp
    bool fits = false;         // every stage: non-KV + context_tokens of KV ≤ usable
    int64_t margin_bytes = 0;  // worst stage: usable − non-KV − one request's KV (negative: over by)
    std::string largest_term;  // the largest term of the worst stage, e.g. "routed experts" (or "KV cache"
                               // for a fixed pool, engine_fit)
    int64_t largest_term_bytes = 0;

    const StageMemory& worst() const { return stages[static_cast<size_t>(worst_stage)]; }
};

// The memory plan of `layout` on `gpu`. Requires a layout validate_layout accepts for this model.
MemoryPlan plan_memory(const ModelCosts& model, const ParallelLayout& layout, const GpuSpec& gpu,
                       const MemoryOptions& options);
MemoryPlan plan_memory(const ModelConfig& config, const ParallelLayout& layout, const GpuSpec& gpu,
                       const MemoryOptions& options);

// "1.5 GiB" style, one decimal; negative values keep their sign.
std::string format_gib(int64_t bytes);
// The largest binary unit that keeps the value ≥ 1, one decimal: "512 B", "2.1 MiB", "1.5 GiB", "1.2 TiB";
// negative values keep their sign.
std::string format_bytes(int64_t bytes);

}  // namespace epinfer::planner
