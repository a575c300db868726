#include "backend/cuda/attention_dispatch.h"

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

AttentionDispatch plan_attention_dispatch(const AttentionArgs& args, int num_sms, bool latent_kernel_fits) {
    AttentionDispatch d;
    if (latent_kernel_fits && mla_attention_supports(args)) {
        d.kernel = AttentionKernel::kLatent;
        d.latent = plan_mla_attention(args, num_sms);
    } else if (flash_attention_supports(args)) {
        d.kernel = AttentionKernel::kFlash;
        d.flash = plan_flash_attention(args, num_sms);
    } else {
        d.cuda_cores = plan_attention(args, num_sms);
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
