// The kWide grouped expert GEMM on Hopper (sm_90a: wgmma), behind launch_moe_grouped_gemm, which calls it
// for kWide tiles when sm90a_available() (sm90a.cuh) (moe_grouped_gemm.cuh has the contract).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels/moe_grouped_gemm.cuh"

namespace epinfer::cuda {

// args.tile must be kWide and args.split_k 1 (the caller checks). Errors: launch errors.
cudaError_t launch_moe_grouped_gemm_sm90(const MoeGroupedGemmArgs& args, cudaStream_t stream);

}  // namespace epinfer::cuda
