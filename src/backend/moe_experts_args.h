// Routed-experts op: the MoE block's work between the router and the shared expert, on one backend.
//
// Semantics (every backend), per token row t:
//   out[t] = Σ_{k = 0..K−1} w[t, k] · down_e(silu(gate_e(x[t])) · up_e(x[t])),  e = topk_ids[t, k] − first_expert,
//   summed in fp32 from 0 in that fixed k order; a pick whose e is outside [0, E) (−1 = no expert, or an
//   expert another EP rank holds) is skipped, and a token with no valid pick gets a zero row.
// Under expert parallelism the ids stay global and `experts` is this rank's contiguous block
// [first_expert, first_expert + E) (parallel/expert_placement.h), as vLLM's fused MoE takes global ids
// with a per-rank expert map; no host pass renumbers them.
// Reference (CPU backend): the permutation plan of backend/moe_permute_plan.h; x rows gathered in slot
// order; per expert with slots: matmul gate and up (fp32 accumulation), silu_mul, matmul down, all in fp32;
// moe_combine_rows. That is the MoE block's host path bit for bit (the goldens check it).
// Other backends may round activations where they say so (CUDA: cuda_backend.h).
// Source of the expert MLP: transformers 5.17 DeepseekV3MLP / Qwen3MoeMLP (hidden_act "silu").
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace epinfer {

// One routed expert's SwiGLU weights (nn.Linear layout, no bias).
struct MoeExpertWeights {
    const void* gate = nullptr;  // [I, H] weight_dtype, device (gate_proj.weight)
    const void* up = nullptr;    // [I, H] weight_dtype, device (up_proj.weight)
    const void* down = nullptr;  // [H, I] weight_dtype, device (down_proj.weight)
};

struct MoeExpertsArgs {
    const float* x = nullptr;                   // [T, H] fp32, device
    const int32_t* topk_ids = nullptr;          // [T, K] int32, device; global expert ids (see first_expert)
    const float* topk_weights = nullptr;        // [T, K] fp32, device
    const MoeExpertWeights* experts = nullptr;  // [E] host array of device pointers, one entry per expert id
    DType weight_dtype = DType::kBF16;          // of every gate/up/down (F32, F16 or BF16)
    float* out = nullptr;                       // [T, H] fp32, device; must not overlap x
    int64_t num_tokens = 0;                     // T (0 allowed)
    int64_t top_k = 0;                          // K ≥ 1, T·K < 2^31
    int64_t num_experts = 0;                    // E ≥ 1
    int64_t first_expert = 0;                   // global id of experts[0] (≥ 0); picks outside the block drop
    int64_t hidden = 0;                         // H
    int64_t intermediate = 0;                   // I
};

// Validates sizes, the dtype and pointers (null allowed only when T = 0; every expert's three pointers
// must be set). Errors: kInvalidArgument naming the field and its value, e.g.
// "moe_experts: expert 3 has a null down pointer"; kNotSupported for a non-float weight dtype.
Status moe_experts_check(const MoeExpertsArgs& args);

}  // namespace epinfer
