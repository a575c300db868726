// The MoE block: router → permute → grouped expert FFN → weighted combine → + shared expert(s).
//
//   logits = x · W_gᵀ in fp32 [T, E]; (ids, w) = moe_router_topk (backend/moe_router_args.h)
//   plan = moe_permute_plan(ids); x_perm[s] = x[token_of_slot[s]]              (layers/moe/permute.h)
//   y_perm[rows of expert e] = SwiGLU_e(x_perm[rows of expert e]) for every local expert
//   out[t] = Σ_k w[t, k] · y_perm[slot_of_token_k[t, k]] in fp32, fixed k order
//   DeepSeek/GLM: out += shared_experts(x);  Qwen2-MoE: out += sigmoid(x · g) · shared_expert(x)
// The stages are separate functions so expert-parallel dispatch/combine sit between them. Under a
// parallel layout (MoeParallel, layers/parallel_context.h) each rank holds only its local experts, each
// sliced to its moe_tp part of I, and its attn_tp slice of the shared expert:
//   tokens replicated in the stage (attn_dp 1): route all tokens, run the local experts on the picks that
//     live here, add the shared slice, all-reduce over the stage;
//   DP attention (attn_dp > 1): this rank dispatches its share of its group's tokens over moe_ep
//     (ep_dispatch), runs the local experts, all-reduces the partials over moe_tp, combines them home
//     (ep_combine); the moe_tp lead writes them, every attn_tp rank adds its shared slice, all-reduce over
//     attn_tp. When moe_tp does not divide attn_tp (a moe_tp group spans DP groups) every rank gathers the
//     stage's tokens instead, runs its local experts on all of them and all-reduces over the stage. A rank
//     with zero tokens still joins every collective.
// The one-rank / attn_dp 1 path runs on any backend (the moe_experts op). DP attention on host memory (CPU
// ranks) permutes and combines on the host; on device memory (GPU ranks) it is moe_dp_device.h. The
// gathered variant (moe_tp not dividing attn_tp) runs on host memory only.
// Source: transformers 5.17 DeepseekV3MoE, Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock,
// MixtralSparseMoeBlock (the routing weight scales each expert's output; shared experts are added after).
#pragma once

#include <cstdint>
#include <vector>

#include "core/router_types.h"
#include "layers/dense_ffn.h"
#include "layers/moe/permute.h"
#include "layers/parallel_context.h"

namespace epinfer {

enum class SharedExpertMode {
    kNone,
    kUnweighted,    // DeepSeek, Kimi, GLM: one MLP of width n_shared_experts·I, added as is
    kSigmoidGated,  // Qwen2-MoE: shared_expert scaled by sigmoid(shared_expert_gate(x))
};

struct MoeBlockWeights {
    Linear router;                                   // [E, H]
    const float* e_score_correction_bias = nullptr;  // [E] fp32 device, or nullptr
    std::vector<DenseFfnWeights> experts;            // [local slots]: gate/up [I, H], down [H, I] (I/moe_tp)
    // Global id of experts[0]: this rank holds the contiguous block [first_local_expert,
    // first_local_expert + experts.size()) of the E routed experts (all of them without EP).
    int64_t first_local_expert = 0;
    SharedExpertMode shared_mode = SharedExpertMode::kNone;
    DenseFfnWeights shared;  // shared expert(s)
    Linear shared_gate;      // [1, H] (kSigmoidGated)
};

// Router semantics of ARCHITECTURE.md §4 (the fields of MoeRouterTopkArgs that come from the config).
struct MoeRouterParams {
    int64_t top_k = 1;  // K
    ScoringFunc scoring_func = ScoringFunc::kSoftmax;
    TopkMethod topk_method = TopkMethod::kGreedy;
    int64_t n_group = 1;
    int64_t topk_group = 1;
    bool norm_topk_prob = false;
    float routed_scaling_factor = 1.0f;
};

// The router's choice for T tokens, on the host, with its permutation plan.
struct MoeRouting {
    std::vector<int32_t> topk_ids;    // [T, K] int32; −1 = no expert
    std::vector<float> topk_weights;  // [T, K] fp32
    MoeRoutePlan plan;
};

// The router's choice for T tokens, left on the device.
struct MoeDeviceRouting {
    DeviceBuffer topk_ids;      // [T, K] int32, device; −1 = no expert
    DeviceBuffer topk_weights;  // [T, K] fp32, device
    int32_t* ids() const { return static_cast<int32_t*>(topk_ids.data()); }
};

// Router logits and top-k, on the device. x: [T, H] fp32 device.
Result<MoeDeviceRouting> moe_route_on_device(Backend& backend, const MoeBlockWeights& weights,
                                             const MoeRouterParams& params, const float* x, int64_t num_rows);

// Router logits, top-k and plan, copied to the host. x: [T, H] fp32 device.
Result<MoeRouting> moe_route(Backend& backend, const MoeBlockWeights& weights, const MoeRouterParams& params,
                             const float* x, int64_t num_rows);

// The routed experts through the backend's moe_experts op (backend/moe_experts_args.h): out = Σ_k w ·
// expert(x) in k order. experts: [E_loc], all of one shape and dtype, global ids [first_expert,
// first_expert + E_loc); topk_ids: [T, K] int32 device, global ids (picks outside the block are dropped);
// topk_weights: [T, K] fp32 device; x, out: [T, H] fp32 device.
// Errors: kInvalidArgument when there is no expert or the experts differ in shape or dtype; op errors.
Status moe_experts_forward(Backend& backend, const std::vector<DenseFfnWeights>& experts, int64_t first_expert,
                           const int32_t* topk_ids, const float* topk_weights, const float* x, int64_t num_rows,
                           int64_t hidden, int64_t top_k, float* out);

// y_perm = SwiGLU_e(x_perm) over the slots of every expert e with at least one slot.
// x_perm, y_perm: [S, H] fp32 device, in plan slot order.
Status moe_grouped_ffn(Backend& backend, const std::vector<DenseFfnWeights>& experts,
                       const MoeRoutePlan& plan, const float* x_perm, int64_t hidden, float* y_perm);

// The groups of a parallel layout the MoE block reduces over (layers/parallel_context.h).
struct MoeParallel {
    Communicator* stage = nullptr;    // all-reduce when tokens are replicated in the stage
    Communicator* attn_tp = nullptr;  // all-reduce of the DP-attention path
    Communicator* moe_tp = nullptr;   // all-reduce of the dispatched rows' partial sums
    Communicator* moe_ep = nullptr;   // ep_dispatch / ep_combine (the rows, in the backend's memory)
    Communicator* host_moe_ep = nullptr;  // the moe_ep group over host memory (the dispatch bookkeeping)
    const ExpertPlacement* placement = nullptr;
    bool dp_attention = false;
    int attn_tp_rank = 0;
    int moe_tp_size = 1;
    int moe_tp_rank = 0;
    int attn_tp_size = 1;
    int attn_dp_rank = 0;
    int attn_dp_size = 1;
};

// The MoE view of a rank's ParallelContext.
MoeParallel moe_parallel_of(const ParallelContext& context);

// out += the shared expert(s) of x (this rank's attn_tp slice). x, out: [T, H] fp32 device.
Status moe_add_shared_experts(Backend& backend, const MoeBlockWeights& weights, const float* x, int64_t num_rows,
                              int64_t hidden, float* out);

// The whole block. x: [T, H] fp32 device; out: [T, H] fp32 device (must not overlap x). T may be 0 under
// DP attention (the rank still joins every collective). `parallel` null = one rank.
// Errors: kNotSupported for DP attention where moe_tp does not divide attn_tp on a backend whose memory
// is not host memory; op and communicator errors.
Status moe_block_forward(Backend& backend, const MoeBlockWeights& weights, const MoeRouterParams& params,
                         const float* x, int64_t num_rows, int64_t hidden, float* out,
                         const MoeParallel* parallel = nullptr);

}  // namespace epinfer
