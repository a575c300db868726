#include "backend/cuda/kernels/attention.cuh"

#include <cfloat>

namespace epinfer::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = static_cast<int>(kAttentionMaxHeadDimV / 32);

// Shared memory: q [Dqk], then per warp m, l [kWarps] and acc [kWarps, Dv].
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionArgs a, int32_t* error_flag) {
    extern __shared__ float smem[];
    float* q_s = smem;                             // [Dqk]
    float* m_s = q_s + a.head_dim_qk;              // [kWarps]
    float* l_s = m_s + kWarps;                     // [kWarps]
    float* acc_s = l_s + kWarps;                   // [kWarps, Dv]
    const int64_t t = blockIdx.x / a.num_heads, h = blockIdx.x % a.num_heads;
    const int64_t kvh = h / (a.num_heads / a.num_kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* out = a.out + t * a.out_token_stride + h * a.out_head_stride;  // [Dv]

    const int32_t pos = a.positions[t];
    if (pos < 0 || pos >= a.num_kv_tokens) {
        if (threadIdx.x == 0) *error_flag = 1;
        for (int64_t d = threadIdx.x; d < a.head_dim_v; d += blockDim.x) out[d] = 0.0f;
        return;
    }
    const float* q = a.q + t * a.q_token_stride + h * a.q_head_stride;
    for (int64_t d = threadIdx.x; d < a.head_dim_qk; d += blockDim.x) q_s[d] = q[d];
    __syncthreads();

    float m = -FLT_MAX, l = 0.0f;
    float acc[kMaxPerLane];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;
    for (int64_t j = warp; j <= pos; j += kWarps) {
        int64_t row = j;  // the K/V row of key j (through the block table when paged)
        if (a.kv_block_table != nullptr) {
            const int32_t block = a.kv_block_table[j / a.kv_block_size];
            if (block < 0) {  // a bad table: flag it and skip the key (the output is then meaningless)
                if (lane == 0) *error_flag = 1;
                continue;
            }
            row = static_cast<int64_t>(block) * a.kv_block_size + j % a.kv_block_size;
        }
        const float* k = a.k + row * a.k_token_stride + kvh * a.k_head_stride;  // [Dqk]
        float dot = 0.0f;
        for (int64_t d = lane; d < a.head_dim_qk; d += 32) dot += q_s[d] * k[d];
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float s = dot * a.scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        m = m_new;
        const float* v = a.v + row * a.v_token_stride + kvh * a.v_head_stride;  // [Dv]
#pragma unroll
        for (int i = 0; i < kMaxPerLane; ++i) {
            const int64_t d = lane + 32 * i;
            if (d < a.head_dim_v) acc[i] = acc[i] * corr + p * v[d];
        }
    }
    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < a.head_dim_v) acc_s[warp * a.head_dim_v + d] = acc[i];
    }
    __syncthreads();
    float m_all = -FLT_MAX;
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, m_s[w]);
    float l_all = 0.0f, factor[kWarps];
    for (int w = 0; w < kWarps; ++w) {
        factor[w] = l_s[w] > 0.0f ? expf(m_s[w] - m_all) : 0.0f;  // a warp that saw no key adds nothing
        l_all += l_s[w] * factor[w];
    }
    for (int64_t d = threadIdx.x; d < a.head_dim_v; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < kWarps; ++w) sum += acc_s[w * a.head_dim_v + d] * factor[w];
        out[d] = sum / l_all;
    }
}

}  // namespace

cudaError_t launch_attention(const AttentionArgs& args, int32_t* error_flag, cudaStream_t stream) {
    if (args.num_tokens == 0 || args.num_heads == 0) return cudaSuccess;
    const size_t smem = static_cast<size_t>(args.head_dim_qk + 2 * kWarps + kWarps * args.head_dim_v) * sizeof(float);
    if (smem > 48 * 1024) {
        const cudaError_t err =
            cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        if (err != cudaSuccess) return err;
    }
    attention_kernel<<<static_cast<unsigned>(args.num_tokens * args.num_heads), kWarps * 32, smem, stream>>>(
        args, error_flag);
    return cudaGetLastError();
}

}  // namespace epinfer::cuda
