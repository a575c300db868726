// The CPU reference of the token-choice op (op_args.h ArgmaxArgs): per row, the index of the largest logit
// (or, for a sampled row, of the largest Gumbel-max score, backend/gumbel_noise.h), ties to the lower index,
// NaN skipped (an all-NaN row gives 0), and a flag for rows holding NaN or ±inf. The greedy rule is the host
// sampler's argmax_token (engine/sampler.h).
#pragma once

#include "backend/op_args.h"

namespace epinfer {

// @pre argmax_check(args) is OK; host memory throughout.
void cpu_argmax(const ArgmaxArgs& args);

}  // namespace epinfer
