#include "backend/cuda/kernels/attention.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/kv_cast.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kTileKeys = 32;  // keys per warp tile: one per lane
constexpr int kMaxGroup = 8;   // query heads per block sharing one KV head
constexpr int64_t kMinKeysPerSplit = 64;  // keys of one split over blocks, at least

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Shared memory: q [kMaxGroup, Dqk], then m, l [kWarps, kMaxGroup] and acc [kWarps, kMaxGroup, Dv].
size_t smem_bytes(const AttentionArgs& a) {
    return static_cast<size_t>(kMaxGroup * a.head_dim_qk + 2 * kWarps * kMaxGroup +
                               kWarps * kMaxGroup * a.head_dim_v) *
           sizeof(float);
}

__device__ __forceinline__ float load_kv(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_kv(const __nv_bfloat16* p) { return __bfloat162float(p[0]); }
// Four consecutive elements (16-byte aligned fp32, 8-byte aligned bf16).
__device__ __forceinline__ float4 load_kv4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 load_kv4(const __nv_bfloat16* p) {
    const uint2 raw = __ldg(reinterpret_cast<const uint2*>(p));
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// KV: float or __nv_bfloat16 (AttentionArgs::kv_dtype). kDimsPerLane: value dims per lane (Dv ≤ 32 ·
// kDimsPerLane). k_vec4: K rows are read four elements at a time.
template <typename KV, int kDimsPerLane>
__global__ void __launch_bounds__(kWarps * 32)
    attention_kernel(AttentionArgs a, int num_chunks, bool k_vec4, KeySplit split, int32_t* error_flag) {
    pdl_begin();
    extern __shared__ float smem[];
    const int64_t Dqk = a.head_dim_qk, Dv = a.head_dim_v;
    float* q_s = smem;                                // [kMaxGroup, Dqk]
    float* m_s = q_s + kMaxGroup * Dqk;               // [kWarps, kMaxGroup]
    float* l_s = m_s + kWarps * kMaxGroup;            // [kWarps, kMaxGroup]
    float* acc_s = l_s + kWarps * kMaxGroup;          // [kWarps, kMaxGroup, Dv]
    const int64_t group = a.num_heads / a.num_kv_heads;
    int64_t block = blockIdx.x;
    const int split_index = static_cast<int>(block % split.num_splits);
    block /= split.num_splits;
    const int chunk = static_cast<int>(block % num_chunks);
    block /= num_chunks;
    const int64_t kvh = block % a.num_kv_heads, t = block / a.num_kv_heads;
    const int64_t h0 = kvh * group + chunk * kMaxGroup;
    const int G = static_cast<int>(min(static_cast<int64_t>(kMaxGroup), group - chunk * kMaxGroup));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    const int32_t pos = a.positions[t];
    bool bad = pos < 0 || pos >= a.num_kv_tokens;
    const int32_t* table = nullptr;
    if (!bad && a.kv_block_tables != nullptr) {
        const int32_t seq = a.token_sequence != nullptr ? a.token_sequence[t] : 0;
        bad = seq < 0 || seq >= a.num_sequences;
        table = a.kv_block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
    }
    if (bad) {  // uniform over the block
        if (threadIdx.x == 0) *error_flag = 1;
        for (int64_t i = threadIdx.x; i < G * Dv; i += blockDim.x) {
            if (split.num_splits == 1) {
                a.out[t * a.out_token_stride + (h0 + i / Dv) * a.out_head_stride + i % Dv] = 0.0f;
            } else if (i % Dv == 0) {  // an empty partial: the combine writes zeros
                float* ml = split.partial_ml + ((t * a.num_heads + h0 + i / Dv) * split.num_splits + split_index) * 2;
                ml[0] = -INFINITY;
                ml[1] = 0.0f;
            }
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < G * Dqk; i += blockDim.x)
        q_s[i] = a.q[t * a.q_token_stride + (h0 + i / Dqk) * a.q_head_stride + i % Dqk];
    __syncthreads();

    float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][kDimsPerLane];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) acc[g][i] = 0.0f;
    }
    // Keys [key_begin, num_keys) of this split; causal: num_keys ≤ pos + 1.
    const int64_t key_begin = split_index * split.keys_per_split;
    const int64_t num_keys = min(static_cast<int64_t>(pos) + 1, key_begin + split.keys_per_split);
    for (int64_t j0 = key_begin + static_cast<int64_t>(warp) * kTileKeys; j0 < num_keys;
         j0 += kWarps * kTileKeys) {
        // Scores: lane = key j0 + lane.
        const int64_t j = j0 + lane;
        bool valid = j < num_keys;
        int64_t row = j;
        if (valid && table != nullptr) {
            const int32_t blk = table[j / a.kv_block_size];
            if (blk < 0) {
                *error_flag = 1;
                valid = false;
            } else {
                row = static_cast<int64_t>(blk) * a.kv_block_size + j % a.kv_block_size;
            }
        }
        float s[kMaxGroup];
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) s[g] = 0.0f;
        if (valid) {
            const KV* k = static_cast<const KV*>(a.k) + row * a.k_token_stride + kvh * a.k_head_stride;  // [Dqk]
            if (k_vec4) {
#pragma unroll 4
                for (int64_t d4 = 0; d4 < Dqk / 4; ++d4) {
                    const float4 kv = load_kv4(k + 4 * d4);
#pragma unroll
                    for (int g = 0; g < kMaxGroup; ++g) {
                        if (g >= G) break;
                        const float4 qv = reinterpret_cast<const float4*>(q_s + g * Dqk)[d4];
                        s[g] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                    }
                }
            } else {
                for (int64_t d = 0; d < Dqk; ++d) {
                    const float kd = load_kv(k + d);
#pragma unroll
                    for (int g = 0; g < kMaxGroup; ++g) {
                        if (g >= G) break;
                        s[g] += q_s[g * Dqk + d] * kd;
                    }
                }
            }
        }
        // Online softmax over the tile.
        float p[kMaxGroup];
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
            p[g] = 0.0f;
            if (g >= G) continue;
            const float score = valid ? s[g] * a.scale : -INFINITY;
            const float m_new = fmaxf(m[g], warp_max(score));
            const float corr = m[g] == -INFINITY ? 0.0f : expf(m[g] - m_new);
            p[g] = valid ? expf(score - m_new) : 0.0f;
            l[g] = l[g] * corr + warp_sum(p[g]);
            m[g] = m_new;
#pragma unroll
            for (int i = 0; i < kDimsPerLane; ++i) acc[g][i] *= corr;
        }
        // Values: every lane takes dims lane + 32·i of each key of the tile; the V rows of kBatch keys are
        // loaded before they are used, so their loads are in flight together.
        constexpr int kBatch = kDimsPerLane == 4 ? 8 : 16 / kDimsPerLane;  // no register spills
        const int n = static_cast<int>(min(static_cast<int64_t>(kTileKeys), num_keys - j0));
        for (int jj0 = 0; jj0 < n; jj0 += kBatch) {
            float vd[kBatch][kDimsPerLane];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
                const int64_t row_j = __shfl_sync(0xffffffffu, row, jj0 + u);
                const bool valid_j = __shfl_sync(0xffffffffu, static_cast<int>(valid), jj0 + u) != 0;
                const KV* v = static_cast<const KV*>(a.v) + row_j * a.v_token_stride + kvh * a.v_head_stride;  // [Dv]
#pragma unroll
                for (int i = 0; i < kDimsPerLane; ++i) {
                    const int64_t d = lane + 32 * i;
                    vd[u][i] = valid_j && d < Dv ? load_kv(v + d) : 0.0f;
                }
            }
#pragma unroll
            for (int g = 0; g < kMaxGroup; ++g) {
                if (g >= G) break;
#pragma unroll
                for (int u = 0; u < kBatch; ++u) {
                    const float pj = __shfl_sync(0xffffffffu, p[g], jj0 + u);  // 0 for keys past the tile
#pragma unroll
                    for (int i = 0; i < kDimsPerLane; ++i) acc[g][i] += pj * vd[u][i];
                }
            }
        }
    }
    // Merge the warps.
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= G) break;
        if (lane == 0) {
            m_s[warp * kMaxGroup + g] = m[g];
            l_s[warp * kMaxGroup + g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) {
            const int64_t d = lane + 32 * i;
            if (d < Dv) acc_s[(warp * kMaxGroup + g) * Dv + d] = acc[g][i];
        }
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < G * Dv; i += blockDim.x) {
        const int64_t g = i / Dv, d = i % Dv;
        float m_all = -INFINITY;
        for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, m_s[w * kMaxGroup + g]);
        float l_all = 0.0f, sum = 0.0f;
        for (int w = 0; w < kWarps; ++w) {
            const float lw = l_s[w * kMaxGroup + g];
            if (lw == 0.0f) continue;  // a warp that saw no key adds nothing
            const float f = expf(m_s[w * kMaxGroup + g] - m_all);
            l_all += lw * f;
            sum += acc_s[(w * kMaxGroup + g) * Dv + d] * f;
        }
        if (split.num_splits == 1) {
            a.out[t * a.out_token_stride + (h0 + g) * a.out_head_stride + d] = l_all > 0.0f ? sum / l_all : 0.0f;
            continue;
        }
        const int64_t part = (t * a.num_heads + h0 + g) * split.num_splits + split_index;
        split.partial_acc[part * Dv + d] = sum;
        if (d == 0) {
            split.partial_ml[part * 2] = m_all;
            split.partial_ml[part * 2 + 1] = l_all;
        }
    }
}

// out[t, h] = Σ_s acc_s · e^(m_s − m) / Σ_s l_s · e^(m_s − m), m = max_s m_s over splits that saw a key.
__global__ void attention_combine_kernel(AttentionArgs a, KeySplit split) {
    pdl_begin();
    const int64_t t = blockIdx.x / a.num_heads, h = blockIdx.x % a.num_heads, Dv = a.head_dim_v;
    const int64_t first = (t * a.num_heads + h) * split.num_splits;
    float m = -INFINITY;
    for (int s = 0; s < split.num_splits; ++s)
        if (split.partial_ml[(first + s) * 2 + 1] > 0.0f) m = fmaxf(m, split.partial_ml[(first + s) * 2]);
    for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) {
        float l = 0.0f, acc = 0.0f;
        for (int s = 0; s < split.num_splits; ++s) {
            const float ls = split.partial_ml[(first + s) * 2 + 1];
            if (ls == 0.0f) continue;
            const float f = expf(split.partial_ml[(first + s) * 2] - m);
            l += ls * f;
            acc += split.partial_acc[(first + s) * Dv + d] * f;
        }
        a.out[t * a.out_token_stride + h * a.out_head_stride + d] = l > 0.0f ? acc / l : 0.0f;
    }
}

template <typename KV, int kDimsPerLane>
cudaError_t launch(const AttentionArgs& a, const KeySplit& split, int num_chunks, int32_t* error_flag,
                   cudaStream_t stream) {
    const bool k_vec4 = a.head_dim_qk % 4 == 0 && a.k_token_stride % 4 == 0 && a.k_head_stride % 4 == 0 &&
                        reinterpret_cast<uintptr_t>(a.k) % (4 * sizeof(KV)) == 0;
    const size_t smem = smem_bytes(a);
    if (smem > 48 * 1024) {
        const cudaError_t err = cudaFuncSetAttribute(attention_kernel<KV, kDimsPerLane>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(smem));
        if (err != cudaSuccess) return err;
    }
    const int64_t num_blocks = a.num_tokens * a.num_kv_heads * num_chunks * split.num_splits;
    return launch_pdl(attention_kernel<KV, kDimsPerLane>, dim3(static_cast<unsigned>(num_blocks)),
                      dim3(kWarps * 32), smem, stream, a, num_chunks, k_vec4, split, error_flag);
}

template <typename KV>
__global__ void kv_cache_store_kernel(KvCacheStoreArgs a, int32_t* error_flag) {
    pdl_begin();
    const int64_t t = blockIdx.x;
    const int64_t slot = a.slot_mapping[t];
    if (slot < 0 || slot >= a.num_pool_rows) {
        if (threadIdx.x == 0) *error_flag = 1;
        return;
    }
    const float* src = a.src + t * a.src_row_stride;
    KV* dst = static_cast<KV*>(a.pool) + slot * a.width;
    for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x) dst[i] = to_kv<KV>(src[i]);
}

}  // namespace

AttentionPlan plan_attention(const AttentionArgs& a, int num_sms) {
    AttentionPlan plan;
    const int64_t group = a.num_heads / a.num_kv_heads;
    plan.num_chunks = static_cast<int>((group + kMaxGroup - 1) / kMaxGroup);
    const int64_t blocks = a.num_tokens * a.num_kv_heads * plan.num_chunks;
    // Split the keys until the grid covers the GPU twice, unless it already covers it once.
    plan.split =
        plan_key_splits(a, blocks, {num_sms, 2 * static_cast<int64_t>(num_sms), kMinKeysPerSplit, kTileKeys});
    return plan;
}

KeySplitPlan plan_key_splits(const AttentionArgs& a, int64_t blocks, const KeySplitTarget& target) {
    KeySplitPlan plan;
    const int64_t want =
        blocks >= target.enough_blocks ? 1 : (target.target_blocks + blocks - 1) / std::max<int64_t>(blocks, 1);
    const int64_t most = (a.num_kv_tokens + target.min_keys - 1) / target.min_keys;
    plan.num_splits = static_cast<int>(std::max<int64_t>(1, std::min(want, most)));
    const int64_t per_split = (a.num_kv_tokens + plan.num_splits - 1) / plan.num_splits;
    plan.keys_per_split = (per_split + target.tile_keys - 1) / target.tile_keys * target.tile_keys;
    if (plan.num_splits > 1) {
        plan.workspace_bytes = static_cast<size_t>(a.num_tokens * a.num_heads * plan.num_splits) *
                               static_cast<size_t>(a.head_dim_v + 2) * sizeof(float);
    }
    return plan;
}

KeySplitPlan plan_whole_wave_splits(const AttentionArgs& a, int64_t blocks, const WholeWaveTarget& t) {
    const int64_t keys = a.num_kv_tokens;
    const int64_t most = std::min(kMaxKeySplits, std::max<int64_t>(1, (keys + t.min_keys - 1) / t.min_keys));
    int64_t best = 1, best_cost = INT64_MAX;
    for (int64_t s = 1; s <= most; ++s) {
        const int64_t per_split = ((keys + s - 1) / s + t.tile_keys - 1) / t.tile_keys * t.tile_keys;
        const int64_t splits = (keys + per_split - 1) / per_split;
        const int64_t cost = (blocks * splits + t.wave - 1) / t.wave * (per_split + t.overhead_keys);
        if (cost < best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    return plan_key_splits(a, blocks, {blocks + 1, best * blocks, t.min_keys, t.tile_keys});
}

cudaError_t launch_attention(const AttentionArgs& args, const AttentionPlan& plan, void* workspace,
                             int32_t* error_flag, cudaStream_t stream) {
    if (args.num_tokens == 0 || args.num_heads == 0) return cudaSuccess;
    const KeySplit split = key_split_in(args, plan.split, workspace);
    const bool bf16_kv = args.kv_dtype == DType::kBF16;
    cudaError_t err;
    if (args.head_dim_v <= 128) {
        err = bf16_kv ? launch<__nv_bfloat16, 4>(args, split, plan.num_chunks, error_flag, stream)
                      : launch<float, 4>(args, split, plan.num_chunks, error_flag, stream);
    } else if (args.head_dim_v <= 256) {
        err = bf16_kv ? launch<__nv_bfloat16, 8>(args, split, plan.num_chunks, error_flag, stream)
                      : launch<float, 8>(args, split, plan.num_chunks, error_flag, stream);
    } else {
        err = bf16_kv ? launch<__nv_bfloat16, 16>(args, split, plan.num_chunks, error_flag, stream)
                      : launch<float, 16>(args, split, plan.num_chunks, error_flag, stream);
    }
    if (err != cudaSuccess || split.num_splits == 1) return err;
    return launch_attention_combine(args, split, stream);
}

KeySplit key_split_in(const AttentionArgs& args, const KeySplitPlan& plan, void* workspace) {
    KeySplit split;
    split.num_splits = plan.num_splits;
    split.keys_per_split = plan.keys_per_split;
    if (plan.num_splits > 1) {
        split.partial_acc = static_cast<float*>(workspace);
        split.partial_ml = split.partial_acc + args.num_tokens * args.num_heads * plan.num_splits * args.head_dim_v;
    }
    return split;
}

cudaError_t launch_attention_combine(const AttentionArgs& args, const KeySplit& split, cudaStream_t stream) {
    return launch_pdl(attention_combine_kernel, dim3(static_cast<unsigned>(args.num_tokens * args.num_heads)),
                      dim3(128), 0, stream, args, split);
}

cudaError_t launch_kv_cache_store(const KvCacheStoreArgs& args, int32_t* error_flag, cudaStream_t stream) {
    if (args.num_tokens == 0) return cudaSuccess;
    const int threads = static_cast<int>(std::min<int64_t>(256, (args.width + 31) / 32 * 32));
    if (args.pool_dtype == DType::kBF16) {
        return launch_pdl(kv_cache_store_kernel<__nv_bfloat16>, dim3(static_cast<unsigned>(args.num_tokens)),
                          dim3(threads), 0, stream, args, error_flag);
    } else {
        return launch_pdl(kv_cache_store_kernel<float>, dim3(static_cast<unsigned>(args.num_tokens)),
                          dim3(threads), 0, stream, args, error_flag);
    }
}

}  // namespace epinfer::cuda
