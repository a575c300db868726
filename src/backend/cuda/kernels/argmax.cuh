// Token choice on the GPU (op_args.h ArgmaxArgs: the argmax of each row's logits, or of a drawn row's
// Gumbel-max scores over the logits ≥ its floor, backend/gumbel_noise.h; the floors come from
// sampling_floor.cuh, launched before it): one block per row of logits — or, where few rows leave
// SMs idle, a cluster of 8 or 2 blocks per row on sm_90+, reduced through distributed shared memory — float4
// reads where the row is 16-byte aligned, a block reduction of (value, index) pairs. The result is exact and
// independent of the reduction order: the largest non-NaN value, ties to the lower index (+0 and −0 tie), an
// all-NaN row gives 0 — the CPU reference cpu_argmax and the host sampler's argmax_token bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_args.h"

namespace epinfer::cuda {

// Blocks per row on a GPU of num_sms SMs (sm_90+): 8 while the rows' blocks are at most one per SM, else 2
// while they are, else 1. Per kernel on the H200 (132 SMs, rows of 129280 logits, docs/benchmarks/serving.md):
// the earlier one-block kernel took 27–30 µs at every row count from 1 to 128; this one 10–11 µs at 1–8 rows,
// 12–13 at 16–32, 15–16 at 64 and 128. Clusters of 4 at 32 rows measured slower (30.5 µs), so 4 is not used.
int argmax_blocks_per_row(int64_t num_rows, int num_sms);

// Writes out_ids[r] and out_non_finite[r] (1 when row r holds NaN or ±inf, else 0) for every row; R = 0
// launches nothing. Drawn rows read floor[r] (launch_sampling_floor writes it).
// @pre argmax_check(args) is OK (device pointers); num_sms: the current device's SM count.
cudaError_t launch_argmax(const ArgmaxArgs& args, int num_sms, cudaStream_t stream);

}  // namespace epinfer::cuda
