// The CPU reference of the greedy-decoding op (op_args.h ArgmaxArgs): per row, the index of the largest
// logit, ties to the lower index, NaN skipped (an all-NaN row gives 0), and a flag for rows holding NaN or
// ±inf. The same rule as the host sampler's argmax_token (engine/sampler.h).
#pragma once

#include "backend/op_args.h"

namespace epinfer {

// @pre argmax_check(args) is OK; host memory throughout.
void cpu_argmax(const ArgmaxArgs& args);

}  // namespace epinfer
