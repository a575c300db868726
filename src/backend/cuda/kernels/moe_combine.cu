// Weighted combine kernel (see moe_combine.cuh).
#include "backend/cuda/kernels/moe_combine.cuh"
#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {
namespace {

constexpr int kThreads = 128;  // 8 columns each: a block covers 1024 columns of one token
constexpr int kLoadBatch = 8;  // picks whose rows are in flight together
constexpr int kMaxTopK = 64;  // picks cached in shared memory; larger K reads them from global memory

__device__ __forceinline__ void load8(const bf16* src, float (&v)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
    #pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(p2[e]);
        v[2 * e] = f.x;
        v[2 * e + 1] = f.y;
    }
}

// Pick mode: the y row of pick (t, k), or −1 when it is not one of this rank's experts.
__device__ __forceinline__ int32_t pick_slot(const MoeCombineArgs& args, int64_t t, int64_t k) {
    const int64_t pick = t * args.top_k + k;
    return local_expert(args.topk_ids[pick], args.first_expert, args.num_experts) >= 0 ? static_cast<int32_t>(pick)
                                                                                      : -1;
}

__global__ void __launch_bounds__(kThreads) moe_combine_kernel(MoeCombineArgs args) {
    pdl_begin();
    __shared__ int32_t slots[kMaxTopK];
    __shared__ float weights[kMaxTopK];
    const int64_t t = blockIdx.x;
    const int64_t top_k = args.top_k;
    const int32_t* slot_row = args.slot_of_token_k + t * top_k;  // [K]
    const float* weight_row = args.topk_weights + t * top_k;     // [K]
    const bool cached = top_k <= kMaxTopK;  // always in pick mode (launch_moe_combine)
    if (cached) {
        for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
            slots[k] = args.slot_of_token_k != nullptr ? slot_row[k] : pick_slot(args, t, k);
            weights[k] = weight_row[k];
        }
        __syncthreads();
    }
    const bf16* y = static_cast<const bf16*>(args.y);                // [S_cap, H]
    const bf16* shared_y = static_cast<const bf16*>(args.shared_y);  // [T, H] or nullptr
    float* out = args.out + t * args.hidden;                         // [H]
    const int64_t h = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
    if (h < args.hidden) {
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        // kLoadBatch picks' rows are loaded before any is added, so their latencies overlap (one global
        // round trip per batch, not per pick); the adds stay in k order.
        for (int64_t k0 = 0; k0 < top_k; k0 += kLoadBatch) {
            int32_t slot[kLoadBatch];
            float v[kLoadBatch][8];
            #pragma unroll
            for (int i = 0; i < kLoadBatch; ++i) {
                const int64_t k = k0 + i;
                slot[i] = k < top_k ? (cached ? slots[k] : slot_row[k]) : -1;
                if (slot[i] >= 0) load8(y + static_cast<int64_t>(slot[i]) * args.hidden + h, v[i]);
            }
            #pragma unroll
            for (int i = 0; i < kLoadBatch; ++i) {
                if (slot[i] < 0) continue;
                const float w = cached ? weights[k0 + i] : weight_row[k0 + i];
                #pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], __fmul_rn(w, v[i][e]));
            }
        }
        if (shared_y != nullptr) {
            float v[8];
            load8(shared_y + t * args.hidden + h, v);
            #pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], v[e]);
        }
        reinterpret_cast<float4*>(out + h)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        reinterpret_cast<float4*>(out + h)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
}

}  // namespace

cudaError_t launch_moe_combine(const MoeCombineArgs& args, cudaStream_t stream) {
    if (args.hidden % 8 != 0) return cudaErrorInvalidValue;
    if (args.slot_of_token_k == nullptr && (args.topk_ids == nullptr || args.top_k > kMaxTopK)) {
        return cudaErrorInvalidValue;
    }
    if (args.num_tokens == 0) return cudaSuccess;
    const dim3 grid(static_cast<unsigned>(args.num_tokens),
                    static_cast<unsigned>(ceil_div<int64_t>(args.hidden, int64_t{kThreads} * 8)));
    return launch_pdl(moe_combine_kernel, grid, dim3(kThreads), 0, stream, args);
}

}  // namespace epinfer::cuda
