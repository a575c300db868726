// The CPU reference of the token-choice op (op_args.h ArgmaxArgs): per row, the index of the largest logit
// (or, for a sampled row, of the largest Gumbel-max score, backend/gumbel_noise.h), ties to the lower index,
// NaN skipped (an all-NaN row gives 0), and a flag for rows holding NaN or ±inf. The host sampler's greedy
// argmax_token and its temperature-only draws are cpu_argmax_row (engine/sampler.h).
#pragma once

#include <cstdint>
#include <span>

#include "backend/op_args.h"

namespace epinfer {

// One row of the op: the chosen token of logits [V] fp32 host (V ≥ 1) — the argmax for inv_temperature 0,
// else the Gumbel-max draw keyed noise_key — and, when non_finite is given, whether the row holds NaN or
// ±inf.
int32_t cpu_argmax_row(std::span<const float> logits, float inv_temperature = 0.0f, uint64_t noise_key = 0,
                       bool* non_finite = nullptr);

// @pre argmax_check(args) is OK; host memory throughout.
void cpu_argmax(const ArgmaxArgs& args);

}  // namespace epinfer
