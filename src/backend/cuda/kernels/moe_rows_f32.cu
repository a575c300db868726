// fp32 gather and combine kernels (see moe_rows_f32.cuh).
#include "backend/cuda/kernels/moe_rows_f32.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const float* x, const int32_t* token_of_slot, int64_t hidden, float* x_perm) {
    pdl_begin();
    const int64_t s = blockIdx.x;
    const float* src = x + static_cast<int64_t>(token_of_slot[s]) * hidden;
    float* dst = x_perm + s * hidden;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = src[h];
}

__global__ void __launch_bounds__(kThreads)
    combine_f32_kernel(const float* y, const float* topk_weights, const int32_t* slot_of_token_k,
                       int64_t top_k, int64_t hidden, float* out) {
    pdl_begin();
    const int64_t t = blockIdx.x;
    const int32_t* slots = slot_of_token_k + t * top_k;  // [K]
    const float* weights = topk_weights + t * top_k;     // [K]
    float* out_row = out + t * hidden;                   // [H]
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
        float acc = 0.0f;
        for (int64_t k = 0; k < top_k; ++k) {
            const int32_t slot = slots[k];
            if (slot < 0) continue;
            acc = __fadd_rn(acc, __fmul_rn(weights[k], y[static_cast<int64_t>(slot) * hidden + h]));
        }
        out_row[h] = acc;
    }
}

}  // namespace

cudaError_t launch_moe_gather_rows_f32(const float* x, const int32_t* token_of_slot, int64_t num_slots,
                                       int64_t hidden, float* x_perm, cudaStream_t stream) {
    if (num_slots == 0 || hidden == 0) return cudaSuccess;
    return launch_pdl(gather_rows_kernel, dim3(static_cast<unsigned>(num_slots)), dim3(kThreads), 0, stream,
                      x, token_of_slot, hidden, x_perm);
}

cudaError_t launch_moe_combine_f32(const float* y, const float* topk_weights, const int32_t* slot_of_token_k,
                                   int64_t num_tokens, int64_t top_k, int64_t hidden, float* out,
                                   cudaStream_t stream) {
    if (num_tokens == 0 || hidden == 0) return cudaSuccess;
    return launch_pdl(combine_f32_kernel, dim3(static_cast<unsigned>(num_tokens)), dim3(kThreads), 0, stream,
                      y, topk_weights, slot_of_token_k, top_k, hidden, out);
}

}  // namespace epinfer::cuda
