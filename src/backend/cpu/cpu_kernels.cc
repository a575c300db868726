// CPU reference kernels: plain loops, fp32 accumulation in a fixed order.
#include "backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace epinfer {

namespace {

// Σ a[i]·b[i] in fp32 with 8 interleaved partial sums, combined pairwise: a fixed order for every caller.
float dot_f32(const float* a, const float* b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

const uint8_t* byte_ptr(const void* p) {
    return static_cast<const uint8_t*>(p);
}

// Elements [index·count, (index+1)·count) of a F32/F16/BF16 array, as fp32.
void load_row_f32(DType dtype, const void* base, int64_t index, int64_t count, float* dst) {
    convert_to_f32(dtype, byte_ptr(base) + static_cast<size_t>(index * count) * dtype_size(dtype), dst,
                   static_cast<size_t>(count));
}

float sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}

// Work (multiply-adds or element updates) below which waking another thread costs more than it saves.
constexpr int64_t kMinWorkPerChunk = int64_t{1} << 17;

// Items per chunk so that a chunk holds at least kMinWorkPerChunk of work.
int64_t min_items(int64_t work_per_item) {
    return std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, work_per_item));
}

}  // namespace

Status cpu_embedding(const EmbeddingArgs& a, ThreadPool& pool) {
    for (int64_t t = 0; t < a.num_tokens; ++t) {
        if (a.token_ids[t] < 0 || a.token_ids[t] >= a.vocab_size) {
            return invalid_argument("embedding: token id " + std::to_string(a.token_ids[t]) + " at row " +
                                    std::to_string(t) + " is outside [0, " + std::to_string(a.vocab_size) +
                                    ")");
        }
    }
    pool.parallel_for(a.num_tokens, min_items(a.hidden_size), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            load_row_f32(a.table_dtype, a.table, a.token_ids[t], a.hidden_size, a.out + t * a.hidden_size);
    });
    return Status::ok();
}

void cpu_rms_norm(const RmsNormArgs& a, ThreadPool& pool) {
    const int64_t W = a.width;
    pool.parallel_for(a.num_rows, min_items(W), [&](int64_t r0, int64_t r1) {
        std::vector<float> weight(static_cast<size_t>(W));
        load_row_f32(a.weight_dtype, a.weight, 0, W, weight.data());
        for (int64_t r = r0; r < r1; ++r) {
            const float* x = a.x + r * a.x_row_stride;  // [W]
            float* out = a.out + r * a.out_row_stride;  // [W]
            if (a.residual != nullptr) {                // s = x + residual, then the norm of s
                const float* res = a.residual + r * a.x_row_stride;  // [W]
                float* sum = a.sum_out + r * a.x_row_stride;         // [W]
                for (int64_t i = 0; i < W; ++i) sum[i] = x[i] + res[i];
                x = sum;
            }
            const float mean_sq = dot_f32(x, x, W) / static_cast<float>(W);
            const float inv_rms = 1.0f / std::sqrt(mean_sq + a.eps);
            for (int64_t i = 0; i < W; ++i) out[i] = weight[i] * (x[i] * inv_rms);
        }
    });
}

void cpu_matmul(const MatmulArgs& a, ThreadPool& pool) {
    const int64_t T = a.num_rows, N = a.out_features, K = a.in_features;
    if (T == 0) return;
    pool.parallel_for(N, min_items(T * K), [&](int64_t n0, int64_t n1) {
        std::vector<float> w_row(static_cast<size_t>(K));  // [K]
        for (int64_t n = n0; n < n1; ++n) {
            load_row_f32(a.w_dtype, a.w, n, K, w_row.data());
            float bias = 0.0f;
            if (a.bias != nullptr) load_row_f32(a.bias_dtype, a.bias, n, 1, &bias);
            for (int64_t t = 0; t < T; ++t) {
                const float acc = dot_f32(a.x + t * a.x_row_stride, w_row.data(), K);
                a.y[t * a.y_row_stride + n] = a.bias != nullptr ? acc + bias : acc;
            }
        }
    });
}

void cpu_batched_matmul(const BatchedMatmulArgs& a, ThreadPool& pool) {
    const int64_t T = a.num_rows, B = a.num_batches, N = a.out_features, K = a.in_features;
    if (T == 0) return;
    pool.parallel_for(B, min_items(T * N * K), [&](int64_t b0, int64_t b1) {
        std::vector<float> w(static_cast<size_t>(N * K)), w_nk(static_cast<size_t>(N * K));  // W_b as [N, K]
        for (int64_t b = b0; b < b1; ++b) {
            load_row_f32(a.w_dtype, byte_ptr(a.w) + static_cast<size_t>(b * a.w_batch_stride) * dtype_size(a.w_dtype),
                         0, N * K, w.data());
            const float* rows = w.data();
            if (a.w_layout == BatchedWeightLayout::kKN) {
                for (int64_t k = 0; k < K; ++k)
                    for (int64_t n = 0; n < N; ++n) w_nk[n * K + k] = w[k * N + n];
                rows = w_nk.data();
            }
            for (int64_t t = 0; t < T; ++t) {
                const float* x = a.x + t * a.x_token_stride + b * a.x_batch_stride;  // [K]
                float* y = a.y + t * a.y_token_stride + b * a.y_batch_stride;        // [N]
                for (int64_t n = 0; n < N; ++n) y[n] = dot_f32(x, rows + n * K, K);
            }
        }
    });
}

void cpu_rope(const RopeArgs& a, ThreadPool& pool) {
    const int64_t half = a.rotary_dim / 2;
    pool.parallel_for(a.num_tokens, min_items(a.num_heads * a.rotary_dim), [&](int64_t t0, int64_t t1) {
        std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
        std::vector<float> tmp(static_cast<size_t>(a.rotary_dim));
        for (int64_t t = t0; t < t1; ++t) {
            const float pos = static_cast<float>(a.positions[t]);
            for (int64_t i = 0; i < half; ++i) {
                const float angle = pos * a.inv_freq[i];  // fp32, as transformers' inv_freq @ position_ids
                cos_v[i] = std::cos(angle) * a.attention_scaling;
                sin_v[i] = std::sin(angle) * a.attention_scaling;
            }
            for (int64_t h = 0; h < a.num_heads; ++h) {
                float* x = a.x + t * a.token_stride + h * a.head_stride + a.rot_offset;  // [rotary_dim]
                for (int64_t i = 0; i < a.rotary_dim; ++i) tmp[i] = x[i];
                for (int64_t i = 0; i < half; ++i) {
                    const float x1 = a.interleaved ? tmp[2 * i] : tmp[i];
                    const float x2 = a.interleaved ? tmp[2 * i + 1] : tmp[i + half];
                    x[i] = x1 * cos_v[i] - x2 * sin_v[i];
                    x[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
                }
            }
        }
    });
}

Status cpu_attention(const AttentionArgs& a, ThreadPool& pool) {
    for (int64_t t = 0; t < a.num_tokens; ++t) {
        if (a.positions[t] < 0 || a.positions[t] >= a.num_kv_tokens) {
            return invalid_argument("attention: position " + std::to_string(a.positions[t]) + " of query " +
                                    std::to_string(t) + " is outside the " + std::to_string(a.num_kv_tokens) +
                                    " cached tokens");
        }
        const int32_t seq = a.token_sequence != nullptr ? a.token_sequence[t] : 0;
        if (a.kv_block_tables != nullptr && (seq < 0 || seq >= a.num_sequences)) {
            return invalid_argument("attention: token_sequence[" + std::to_string(t) + "] = " +
                                    std::to_string(seq) + " is outside [0, " + std::to_string(a.num_sequences) +
                                    ")");
        }
    }
    // The block table row of query t (nullptr for contiguous K/V), and the K/V row of its key j.
    const auto table_of = [&](int64_t t) -> const int32_t* {
        if (a.kv_block_tables == nullptr) return nullptr;
        const int64_t seq = a.token_sequence != nullptr ? a.token_sequence[t] : 0;
        return a.kv_block_tables + seq * a.block_table_stride;
    };
    const auto kv_row = [&](const int32_t* table, int64_t j) -> int64_t {
        if (table == nullptr) return j;
        return int64_t{table[j / a.kv_block_size]} * a.kv_block_size + j % a.kv_block_size;
    };
    for (int64_t t = 0; t < a.num_tokens && a.kv_block_tables != nullptr; ++t) {
        const int32_t* table = table_of(t);
        for (int64_t b = 0; b <= a.positions[t] / a.kv_block_size; ++b) {
            if (table[b] < 0) {
                return invalid_argument("attention: block table entry " + std::to_string(b) + " of query " +
                                        std::to_string(t) + " is " + std::to_string(table[b]));
            }
        }
    }
    const int64_t group = a.num_heads / a.num_kv_heads;
    const int64_t work_per_item = a.num_kv_tokens * (a.head_dim_qk + a.head_dim_v);  // at most
    pool.parallel_for(a.num_tokens * a.num_heads, min_items(work_per_item), [&](int64_t i0, int64_t i1) {
        std::vector<float> probs(static_cast<size_t>(a.num_kv_tokens));  // [S]
        std::vector<float> acc(static_cast<size_t>(a.head_dim_v));       // [Dv]
        std::vector<float> k_row, v_row;  // [Dqk], [Dv]: a bf16 head widened to fp32
        if (a.kv_dtype == DType::kBF16) {
            k_row.resize(static_cast<size_t>(a.head_dim_qk));
            v_row.resize(static_cast<size_t>(a.head_dim_v));
        }
        // Head kvh of K/V row `row` as fp32: fp32 rows in place, bf16 rows widened into `widened`.
        const auto head_f32 = [&](const void* base, int64_t row, int64_t token_stride, int64_t head_stride,
                                  int64_t kvh, int64_t dim, std::vector<float>& widened) -> const float* {
            const int64_t offset = row * token_stride + kvh * head_stride;
            if (a.kv_dtype == DType::kF32) return static_cast<const float*>(base) + offset;
            const uint16_t* head = static_cast<const uint16_t*>(base) + offset;
            for (int64_t d = 0; d < dim; ++d) widened[static_cast<size_t>(d)] = bf16_to_f32(head[d]);
            return widened.data();
        };
        for (int64_t item = i0; item < i1; ++item) {
            const int64_t t = item / a.num_heads, h = item % a.num_heads, kvh = h / group;
            const int64_t num_keys = a.positions[t] + 1;                        // causal
            const int32_t* table = table_of(t);
            const float* q = a.q + t * a.q_token_stride + h * a.q_head_stride;  // [Dqk]
            float max_score = -INFINITY;
            for (int64_t j = 0; j < num_keys; ++j) {
                const float* k = head_f32(a.k, kv_row(table, j), a.k_token_stride, a.k_head_stride, kvh,
                                          a.head_dim_qk, k_row);  // [Dqk]
                probs[j] = dot_f32(q, k, a.head_dim_qk) * a.scale;
                max_score = std::max(max_score, probs[j]);
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < num_keys; ++j) {
                probs[j] = std::exp(probs[j] - max_score);
                sum += probs[j];
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t j = 0; j < num_keys; ++j) {
                const float p = probs[j] / sum;
                const float* v = head_f32(a.v, kv_row(table, j), a.v_token_stride, a.v_head_stride, kvh,
                                          a.head_dim_v, v_row);  // [Dv]
                for (int64_t d = 0; d < a.head_dim_v; ++d) acc[d] += p * v[d];
            }
            float* out = a.out + t * a.out_token_stride + h * a.out_head_stride;  // [Dv]
            for (int64_t d = 0; d < a.head_dim_v; ++d) out[d] = acc[d];
        }
    });
    return Status::ok();
}

Status cpu_kv_cache_store(const KvCacheStoreArgs& a) {
    for (int64_t t = 0; t < a.num_tokens; ++t) {
        const int64_t slot = a.slot_mapping[t];
        if (slot < 0 || slot >= a.num_pool_rows) {
            return invalid_argument("kv_cache_store: slot_mapping[" + std::to_string(t) + "] = " +
                                    std::to_string(slot) + " is outside the pool's " +
                                    std::to_string(a.num_pool_rows) + " rows");
        }
    }
    for (int64_t t = 0; t < a.num_tokens; ++t) {
        const float* src = a.src + t * a.src_row_stride;  // [width]
        const int64_t offset = a.slot_mapping[t] * a.width;
        if (a.pool_dtype == DType::kF32) {
            float* dst = static_cast<float*>(a.pool) + offset;
            std::memcpy(dst, src, static_cast<size_t>(a.width) * sizeof(float));
        } else {
            uint16_t* dst = static_cast<uint16_t*>(a.pool) + offset;
            for (int64_t i = 0; i < a.width; ++i) dst[i] = f32_to_bf16(src[i]);
        }
    }
    return Status::ok();
}

void cpu_silu_mul(const SiluMulArgs& a) {
    for (int64_t i = 0; i < a.num_elements; ++i) {
        const float g = a.gate[i];
        a.out[i] = g / (1.0f + std::exp(-g)) * a.up[i];
    }
}

void cpu_add(const AddArgs& a) {
    for (int64_t i = 0; i < a.num_elements; ++i) a.out[i] = a.a[i] + a.b[i];
}

void cpu_add_sigmoid_gated(const AddSigmoidGatedArgs& a) {
    for (int64_t t = 0; t < a.num_rows; ++t) {
        const float g = sigmoid(a.gate[t]);
        for (int64_t i = 0; i < a.width; ++i) {
            const int64_t idx = t * a.width + i;
            a.out[idx] = a.a[idx] + g * a.b[idx];
        }
    }
}

void cpu_cast(const CastArgs& a) {
    if (a.dst_dtype == DType::kBF16) {
        const auto* src = static_cast<const float*>(a.src);
        auto* dst = static_cast<uint16_t*>(a.dst);
        for (int64_t i = 0; i < a.num_elements; ++i) dst[i] = f32_to_bf16(src[i]);
    } else {
        convert_to_f32(a.src_dtype, a.src, static_cast<float*>(a.dst), static_cast<size_t>(a.num_elements));
    }
}

}  // namespace epinfer
