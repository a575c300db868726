// RoPE inverse frequencies and scalings from a RopeConfig, exactly as transformers 5.17 computes them
// (modeling_rope_utils ROPE_INIT_FUNCTIONS: default, linear, yarn, llama3), in fp32 like its tensors.
#pragma once

#include <vector>

#include "checkpoint/model_config.h"
#include "core/status.h"

namespace epinfer {

struct RopeTable {
    std::vector<float> inv_freq;     // [rotary_dim / 2] fp32, host
    float attention_scaling = 1.0f;  // multiplies cos and sin (YaRN attention_factor; 1 otherwise)
};

// default: inv_freq[i] = 1 / theta^(2i / d), d = rotary_dim.
// linear:  inv_freq / factor.
// yarn:    blend of inv_freq (extrapolation) and inv_freq / factor (interpolation) by a linear ramp over
//          the correction range of beta_fast/beta_slow rotations within original_max_position_embeddings
//          (floor/ceil when truncate); attention_scaling = attention_factor, or when 0:
//          get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if both are set, else
//          get_mscale(factor), get_mscale(s, m) = 0.1·m·ln(s) + 1 (1 when s ≤ 1).
// llama3:  wavelengths above original/low_freq_factor divided by factor, below original/high_freq_factor
//          kept, smooth interpolation between.
// Errors: kInvalidArgument for rotary_dim < 2 or odd, a non-positive theta or factor.
Result<RopeTable> compute_rope_table(const RopeConfig& rope);

// MLA softmax scale (DeepSeek yarn_apply_mscale): (qk_nope_head_dim + qk_rope_head_dim)^-0.5, times
// mscale² with mscale = get_mscale(factor, mscale_all_dim) when the RoPE type is not default and
// mscale_all_dim ≠ 0.
float mla_softmax_scale(const ModelConfig& config);

}  // namespace epinfer
