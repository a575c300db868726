// The floors of drawn rows on the GPU (backend/sampling_floor.h; ArgmaxArgs::floor, which the argmax kernel
// then reads): one block per row — or, where few rows leave SMs idle, a cluster of 8 or 2 blocks per row on
// sm_90+ (argmax_blocks_per_row), each on a slice, their histograms summed through distributed shared
// memory; the row's maximum, then the top_k-th largest key and the top_p mass threshold by radix selection
// over the keys' order bits (three rounds of 11, 11 and 10 bits, each a shared-memory histogram of counts
// or fixed-point masses and a block scan). Integer sums: the result is the CPU reference
// cpu_sampling_floor bit for bit, in any summation order.
#pragma once

#include <cuda_runtime.h>

#include "backend/op_args.h"

namespace epinfer::cuda {

// Writes floor[r] for every row (−inf for greedy rows and rows without top-k / top-p, at once); R = 0
// launches nothing. Each filtered row reads its logits 4 times with top_k or top_p alone, 7 with both.
// @pre argmax_check(args) is OK, draws and floor non-null (device); num_sms: the current device's SM count.
cudaError_t launch_sampling_floor(const ArgmaxArgs& args, int num_sms, cudaStream_t stream);

}  // namespace epinfer::cuda
