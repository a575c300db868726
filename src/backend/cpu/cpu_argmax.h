// The CPU reference of the token-choice op (op_args.h ArgmaxArgs): per row, the index of the largest logit
// (or, for a drawn row, of the largest Gumbel-max score among the logits ≥ the row's floor,
// backend/gumbel_noise.h and backend/sampling_floor.h), ties to the lower index, NaN skipped (an all-NaN
// row gives 0), and a flag for rows holding NaN or ±inf. The host sampler's greedy argmax_token and its
// draws are cpu_argmax_row (engine/sampler.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "backend/cpu/thread_pool.h"
#include "backend/op_args.h"

namespace epinfer {

// The floor of a drawn row of logits [V] fp32 host (backend/sampling_floor.h): −inf for a greedy row, one
// without top-k / top-p, or one whose largest key is not finite. Sorts the kept logits (O(V log V)).
float cpu_sampling_floor(std::span<const float> logits, const TokenDraw& draw);

// One row of the op: the chosen token of logits [V] fp32 host (V ≥ 1) — the argmax for a greedy draw, else
// the Gumbel-max draw over the logits ≥ `floor` — and, when non_finite is given, whether the row holds NaN
// or ±inf.
int32_t cpu_argmax_row(std::span<const float> logits, const TokenDraw& draw = {}, float floor = -INFINITY,
                       bool* non_finite = nullptr);

// @pre argmax_check(args) is OK; host memory throughout. Writes floor[r] when draws are given. Rows spread
// over the pool's threads (a top-p floor sorts its row's kept logits: ~15 ms on one core for 152k logits).
void cpu_argmax(const ArgmaxArgs& args, ThreadPool& pool);

}  // namespace epinfer
