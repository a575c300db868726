// Router top-k kernel (semantics: backend/moe_router_args.h; CPU reference: backend/cpu/moe_router.cc).
//
// One warp per token row. The row's scores p [E] and choice scores c [E] live in shared memory; lanes own
// experts e ≡ lane (mod 32). The softmax sum is sequential on lane 0 and the renormalisation's sum runs over
// the K choices (lane k holds choice k) in k order, both as the CPU reference adds, so the only difference
// from the CPU is exp itself (moe_common.cuh exp_nearest).
#include <cmath>

#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/moe_router.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr size_t kMaxRouterSmemBytes = 48 * 1024;

// The CPU reference's ordering: higher value first, NaN below everything, ties to the lower index.
__device__ __forceinline__ bool ranks_before(float a, int a_idx, float b, int b_idx) {
    const bool a_nan = isnan(a);
    const bool b_nan = isnan(b);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && a != b) return a > b;
    return a_idx < b_idx;
}

// All lanes end with the best (value, index) of the warp.
__device__ __forceinline__ void warp_best(float& value, int& idx) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
        const int other_idx = __shfl_xor_sync(0xffffffffu, idx, offset);
        if (ranks_before(other_value, other_idx, value, idx)) {
            value = other_value;
            idx = other_idx;
        }
    }
}

// The order key of a choice score, so that ranks_before is a larger key, then a lower index: NaN (not
// choosable) → 0, below every number's key; −0 as +0 (equal scores tie by index, as a != b is false).
__device__ __forceinline__ uint32_t order_key(float v) {
    if (isnan(v)) return 0u;
    const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (bits & 0x80000000u) != 0u ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float nan_to_neg_inf(float v) {
    return isnan(v) ? -INFINITY : v;
}

// Per-warp shared memory: p [E] fp32, c [E] fp32, group_scores [G] fp32, group_kept [G] uint8.
__host__ __device__ inline size_t router_warp_smem_bytes(int64_t num_experts, int64_t n_group) {
    const size_t bytes = (2 * num_experts + n_group) * sizeof(float) + n_group;
    return (bytes + 15) / 16 * 16;
}

__global__ void moe_router_topk_kernel(MoeRouterTopkArgs args, int warps_per_block) {
    pdl_begin();
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * warps_per_block + warp;
    if (t >= args.num_tokens) return;

    const int num_experts = static_cast<int>(args.num_experts);
    const int n_group = static_cast<int>(args.n_group);
    const int top_k = static_cast<int>(args.top_k);
    unsigned char* warp_smem = smem + warp * router_warp_smem_bytes(num_experts, n_group);
    float* p = reinterpret_cast<float*>(warp_smem);               // [E]
    float* c = p + num_experts;                                   // [E]
    float* group_scores = c + num_experts;                        // [G]
    unsigned char* group_kept = reinterpret_cast<unsigned char*>(group_scores + n_group);  // [G]
    const float* logits = args.router_logits + t * num_experts;   // [E]
    int32_t* ids = args.topk_ids + t * top_k;                     // [K]
    float* weights = args.topk_weights + t * top_k;               // [K]

    // Scores p.
    if (args.scoring_func == ScoringFunc::kSigmoid) {
        for (int e = lane; e < num_experts; e += kWarpSize) {
            p[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_nearest(-logits[e])));
        }
    } else {
        float max_logit = -INFINITY;
        for (int e = lane; e < num_experts; e += kWarpSize) {
            const float v = logits[e];
            if (!isnan(v) && v > max_logit) max_logit = v;
        }
        for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
            max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffffu, max_logit, offset));
        }
        for (int e = lane; e < num_experts; e += kWarpSize) {
            const float v = logits[e];
            // Equal to the max gives exactly 1, also for ±inf (where v − max would be NaN).
            p[e] = isnan(v) ? 0.0f : (v == max_logit ? 1.0f : exp_nearest(__fsub_rn(v, max_logit)));
        }
        __syncwarp();
        float sum = 0.0f;
        if (lane == 0) {
            for (int e = 0; e < num_experts; ++e) sum = __fadd_rn(sum, p[e]);  // NaN logits add p = 0
        }
        sum = __shfl_sync(0xffffffffu, sum, 0);
        if (sum > 0.0f) {
            for (int e = lane; e < num_experts; e += kWarpSize) p[e] = __fdiv_rn(p[e], sum);
        }
    }
    // Choice scores c (NaN = not choosable).
    for (int e = lane; e < num_experts; e += kWarpSize) {
        const float bias = args.e_score_correction_bias ? args.e_score_correction_bias[e] : 0.0f;
        c[e] = isnan(logits[e]) ? NAN : __fadd_rn(p[e], bias);
    }
    __syncwarp();

    // Group limiting: keep the best topk_group groups.
    if (args.topk_method != TopkMethod::kGreedy && args.topk_group < args.n_group) {
        const int group_size = num_experts / n_group;
        for (int g = lane; g < n_group; g += kWarpSize) {
            float best = -INFINITY;
            float second = -INFINITY;
            for (int i = 0; i < group_size; ++i) {
                const float v = nan_to_neg_inf(c[g * group_size + i]);
                if (v > best) {
                    second = best;
                    best = v;
                } else if (v > second) {
                    second = v;
                }
            }
            group_scores[g] = args.topk_method == TopkMethod::kNoauxTc ? __fadd_rn(best, second) : best;
            group_kept[g] = 0;
        }
        __syncwarp();
        for (int round = 0; round < args.topk_group; ++round) {
            float best = NAN;
            int best_idx = INT_MAX;
            for (int g = lane; g < n_group; g += kWarpSize) {
                if (!group_kept[g] && ranks_before(group_scores[g], g, best, best_idx)) {
                    best = group_scores[g];
                    best_idx = g;
                }
            }
            warp_best(best, best_idx);
            if (lane == 0) group_kept[best_idx] = 1;  // always a real group: topk_group ≤ n_group
            __syncwarp();
        }
        for (int e = lane; e < num_experts; e += kWarpSize) {
            if (!group_kept[e / group_size]) c[e] = NAN;
        }
        __syncwarp();
    }

    // Top-K by c, in output order (descending c, ties to the lower id), over the scores' order keys (in
    // place of c): a round is each lane's best key, then the warp's largest key and the lowest id holding
    // it, two redux instructions (it was a five-step shuffle tree of ranks_before; the Qwen3-30B-A3B layer
    // at one token took 40.5 µs with it, 38.3 without, on the H200). Lane k keeps the k-th choice's id and
    // weight in registers (top_k ≤ 32), so the renormalisation reads no memory back.
    uint32_t* key = reinterpret_cast<uint32_t*>(c);  // [E]
    for (int e = lane; e < num_experts; e += kWarpSize) key[e] = order_key(c[e]);
    __syncwarp();
    int my_id = -1;
    float my_weight = 0.0f;
    for (int k = 0; k < top_k; ++k) {
        uint32_t best = 0u;
        int best_idx = INT_MAX;
        for (int e = lane; e < num_experts; e += kWarpSize) {  // e ascending: a tie keeps the lower id
            if (key[e] > best) {
                best = key[e];
                best_idx = e;
            }
        }
        const uint32_t warp_key = __reduce_max_sync(0xffffffffu, best);
        if (warp_key == 0u) break;  // fewer than K choosable experts: the rest stay −1 with weight 0
        best_idx = __reduce_min_sync(0xffffffffu, best == warp_key ? best_idx : INT_MAX);
        if (lane == k) {
            my_id = best_idx;
            my_weight = p[best_idx];
        }
        if (lane == 0) key[best_idx] = 0u;
        __syncwarp();
    }
    if (args.norm_topk_prob) {
        float sum = 0.0f;  // in k order, as the CPU reference
        for (int k = 0; k < top_k; ++k) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, my_weight, k));
        my_weight = __fdiv_rn(my_weight, __fadd_rn(sum, 1e-20f));
    }
    if (lane < top_k) {
        ids[lane] = my_id;
        weights[lane] = __fmul_rn(my_weight, args.routed_scaling_factor);
    }
}

}  // namespace

cudaError_t launch_moe_router_topk(const MoeRouterTopkArgs& args, cudaStream_t stream) {
    if (args.num_tokens == 0) return cudaSuccess;
    if (args.num_experts > kRouterMaxExperts || args.top_k > kRouterMaxTopK) return cudaErrorInvalidValue;
    const size_t warp_bytes = router_warp_smem_bytes(args.num_experts, args.n_group);
    int warps_per_block = static_cast<int>(kMaxRouterSmemBytes / warp_bytes);
    warps_per_block = warps_per_block < 1 ? 1 : (warps_per_block > 4 ? 4 : warps_per_block);
    const int64_t num_blocks = ceil_div<int64_t>(args.num_tokens, warps_per_block);
    return launch_pdl(moe_router_topk_kernel, dim3(static_cast<unsigned>(num_blocks)),
                      dim3(warps_per_block * kWarpSize), warps_per_block * warp_bytes, stream, args,
                      warps_per_block);
}

}  // namespace epinfer::cuda
