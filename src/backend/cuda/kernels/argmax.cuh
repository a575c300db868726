// Greedy decoding on the GPU (op_args.h ArgmaxArgs): one block per row of logits, float4 reads where the
// row is 16-byte aligned, a block reduction of (value, index) pairs. The result is exact and independent of
// the reduction order: the largest non-NaN value, ties to the lower index (+0 and −0 tie), an all-NaN row
// gives 0 — the CPU reference cpu_argmax and the host sampler's argmax_token bit for bit.
#pragma once

#include <cuda_runtime.h>

#include "backend/op_args.h"

namespace epinfer::cuda {

// Writes out_ids[r] and out_non_finite[r] (1 when row r holds NaN or ±inf, else 0) for every row; R = 0
// launches nothing. No workspace.
// @pre argmax_check(args) is OK (device pointers).
cudaError_t launch_argmax(const ArgmaxArgs& args, cudaStream_t stream);

}  // namespace epinfer::cuda
