// SwiGLU MLP: y = down(silu(gate(x)) · up(x)). Used for dense layers, every routed expert and the shared
// experts. Source: transformers 5.17 DeepseekV3MLP, Qwen3MoeMLP (hidden_act "silu").
#pragma once

#include <cstdint>

#include "layers/linear.h"

namespace epinfer {

struct DenseFfnWeights {
    Linear gate_proj;  // [I, H]
    Linear up_proj;    // [I, H]
    Linear down_proj;  // [H, I]
};

// x: [T, H] fp32 device; y: [T, H] fp32 device (must not overlap x).
Status dense_ffn_forward(Backend& backend, const DenseFfnWeights& weights, const float* x, int64_t num_rows,
                         float* y);

}  // namespace epinfer
