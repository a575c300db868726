// Which attention kernel runs an AttentionArgs on the CUDA backend, and its launch: the one choice that
// CudaBackend::attention makes and `epinfer bench attention` reports.
//   latent      kernels/mla_attention.cuh (MLA's absorbed attention over a bf16 latent cache), when the
//               device fits its shared memory (AttentionDevice::latent_kernel) and mla_attention_supports(args);
//   flash       kernels/flash_attention.cuh, when flash_attention_supports(args);
//   cuda_cores  kernels/attention.cuh otherwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/flash_attention.cuh"
#include "backend/cuda/kernels/mla_attention.cuh"
#include "backend/op_args.h"

namespace epinfer::cuda {

enum class AttentionKernel { kLatent, kFlash, kCudaCores };
const char* attention_kernel_name(AttentionKernel kernel);  // "mla", "flash" or "cuda_cores"

struct AttentionDispatch {
    AttentionKernel kernel = AttentionKernel::kCudaCores;
    MlaAttentionPlan latent;    // set for kLatent
    FlashAttentionPlan flash;   // set for kFlash
    AttentionPlan cuda_cores;   // set for kCudaCores
    const KeySplitPlan& split() const;  // the chosen plan's key splits (and workspace_bytes)
};

// What the choice reads of the GPU.
struct AttentionDevice {
    int num_sms = 0;
    bool latent_kernel = false;  // the MLA latent kernel's shared memory fits (kMlaAttentionSmemBytes)
    bool sm90a = false;          // the wgmma kernels run (sm90a.cuh): GQA prefill on flash_prefill_sm90.cuh,
                                 // MLA on mla_attention_sm90.cuh
};
// The properties of CUDA device `device`.
cudaError_t query_attention_device(int device, AttentionDevice* out);

// @pre attention_check(args) is OK, head_dim_v ≤ kAttentionMaxHeadDimV. Reads only sizes, dtype and
// the K/V pointers' alignment.
AttentionDispatch plan_attention_dispatch(const AttentionArgs& args, const AttentionDevice& device);

// Runs the chosen kernel (and the key splits' combine). workspace: dispatch.split().workspace_bytes,
// device; error_flag: [1] int32, device (as each kernel's launch says).
cudaError_t launch_attention_dispatch(const AttentionArgs& args, const AttentionDispatch& dispatch, void* workspace,
                                      int32_t* error_flag, cudaStream_t stream);

}  // namespace epinfer::cuda
