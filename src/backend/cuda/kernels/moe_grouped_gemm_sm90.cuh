// The kWide grouped expert GEMM on Hopper (sm_90a: wgmma), behind launch_moe_grouped_gemm, which calls it
// for kWide tiles when moe_grouped_gemm_sm90_available() (moe_grouped_gemm.cuh has the contract).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels/moe_grouped_gemm.cuh"

namespace epinfer::cuda {

// True when this build carries sm_90a code (CMAKE_CUDA_ARCHITECTURES has 90a) and `device` is compute
// capability 9.0 (H100, H200), the one device family that code runs on.
bool moe_grouped_gemm_sm90_available(int device);

// args.tile must be kWide and args.split_k 1 (the caller checks). Errors: launch errors.
cudaError_t launch_moe_grouped_gemm_sm90(const MoeGroupedGemmArgs& args, cudaStream_t stream);

}  // namespace epinfer::cuda
