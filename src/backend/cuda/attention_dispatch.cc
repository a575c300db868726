#include "backend/cuda/attention_dispatch.h"

#include "backend/cuda/kernels/sm90a.cuh"

namespace epinfer::cuda {

const char* attention_kernel_name(AttentionKernel kernel) {
    switch (kernel) {
        case AttentionKernel::kLatent: return "mla";
        case AttentionKernel::kFlash: return "flash";
        default: return "cuda_cores";
    }
}

const KeySplitPlan& AttentionDispatch::split() const {
    switch (kernel) {
        case AttentionKernel::kLatent: return latent.split;
        case AttentionKernel::kFlash: return flash.split;
        default: return cuda_cores.split;
    }
}

cudaError_t query_attention_device(int device, AttentionDevice* out) {
    int num_sms = 0, smem_optin = 0;
    cudaError_t err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    out->num_sms = num_sms;
    // The latent kernel's 160 KiB fit sm_80 and sm_90 but not e.g. sm_120's 99 KiB: there MLA's absorbed
    // attention runs on the CUDA-core kernel and the layer keeps the expanded form for long chunks.
    out->latent_kernel = static_cast<size_t>(smem_optin) >= kMlaAttentionSmemBytes;
    out->sm90a = sm90a_available(device);
    return cudaSuccess;
}

AttentionDispatch plan_attention_dispatch(const AttentionArgs& args, const AttentionDevice& device) {
    AttentionDispatch d;
    if (device.latent_kernel && mla_attention_supports(args)) {
        d.kernel = AttentionKernel::kLatent;
        d.latent = plan_mla_attention(args, device.num_sms, device.sm90a);
    } else if (flash_attention_supports(args)) {
        d.kernel = AttentionKernel::kFlash;
        d.flash = plan_flash_attention(args, device.num_sms, device.sm90a);
    } else {
        d.cuda_cores = plan_attention(args, device.num_sms);
    }
    return d;
}

cudaError_t launch_attention_dispatch(const AttentionArgs& args, const AttentionDispatch& d, void* workspace,
                                      int32_t* error_flag, cudaStream_t stream) {
    switch (d.kernel) {
        case AttentionKernel::kLatent: return launch_mla_attention(args, d.latent, workspace, error_flag, stream);
        case AttentionKernel::kFlash: return launch_flash_attention(args, d.flash, workspace, error_flag, stream);
        default: return launch_attention(args, d.cuda_cores, workspace, error_flag, stream);
    }
}

}  // namespace epinfer::cuda
