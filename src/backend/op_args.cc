#include "backend/op_args.h"

#include <cmath>
#include <string>

namespace epinfer {

namespace {

Status bad(const char* op, const std::string& what) {
    return invalid_argument(std::string(op) + ": " + what);
}

Status check_positive(const char* op, const char* field, int64_t value) {
    if (value <= 0) return bad(op, std::string(field) + " must be > 0, got " + std::to_string(value));
    return Status::ok();
}

Status check_not_null(const char* op, const char* field, const void* ptr) {
    if (ptr == nullptr) return bad(op, std::string(field) + " is null");
    return Status::ok();
}

Status check_stride(const char* op, const char* field, int64_t stride, int64_t min_value) {
    if (stride < min_value) {
        return bad(
            op, std::string(field) + " " + std::to_string(stride) + " is below " + std::to_string(min_value));
    }
    return Status::ok();
}

Status check_weight_dtype(const char* op, const char* field, DType dtype) {
    if (!dtype_is_float_weight(dtype)) {
        return {StatusCode::kNotSupported,
                std::string(op) + ": " + field + " dtype " + dtype_name(dtype) + " (want F32, F16 or BF16)"};
    }
    return Status::ok();
}

Status check_count(const char* op, const char* field, int64_t value) {
    if (value < 0) return bad(op, std::string(field) + " must be ≥ 0, got " + std::to_string(value));
    return Status::ok();
}

// The KV cache's element type: F32 or BF16.
Status check_kv_dtype(const char* op, const char* field, DType dtype) {
    if (dtype != DType::kF32 && dtype != DType::kBF16) {
        return {StatusCode::kNotSupported, std::string(op) + ": " + field + " " + dtype_name(dtype) +
                                               " is not supported (F32 or BF16)"};
    }
    return Status::ok();
}

}  // namespace

Status embedding_check(const EmbeddingArgs& a) {
    const char* op = "embedding";
    EPI_RETURN_IF_ERROR(check_count(op, "num_tokens", a.num_tokens));
    EPI_RETURN_IF_ERROR(check_positive(op, "vocab_size", a.vocab_size));
    EPI_RETURN_IF_ERROR(check_positive(op, "hidden_size", a.hidden_size));
    EPI_RETURN_IF_ERROR(check_weight_dtype(op, "table", a.table_dtype));
    if (a.num_tokens == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "token_ids", a.token_ids));
    EPI_RETURN_IF_ERROR(check_not_null(op, "table", a.table));
    return check_not_null(op, "out", a.out);
}

Status rms_norm_check(const RmsNormArgs& a) {
    const char* op = "rms_norm";
    EPI_RETURN_IF_ERROR(check_count(op, "num_rows", a.num_rows));
    EPI_RETURN_IF_ERROR(check_positive(op, "width", a.width));
    EPI_RETURN_IF_ERROR(check_stride(op, "x_row_stride", a.x_row_stride, a.width));
    EPI_RETURN_IF_ERROR(check_stride(op, "out_row_stride", a.out_row_stride, a.width));
    EPI_RETURN_IF_ERROR(check_weight_dtype(op, "weight", a.weight_dtype));
    if (!(a.eps >= 0.0f)) return bad(op, "eps must be ≥ 0, got " + std::to_string(a.eps));
    if (a.num_rows == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "x", a.x));
    EPI_RETURN_IF_ERROR(check_not_null(op, "weight", a.weight));
    EPI_RETURN_IF_ERROR(check_not_null(op, "out", a.out));
    if (a.residual == nullptr) {
        if (a.sum_out != nullptr) return bad(op, "sum_out is set without residual");
        return Status::ok();
    }
    EPI_RETURN_IF_ERROR(check_not_null(op, "sum_out", a.sum_out));
    if (a.out == a.x || a.out == a.residual || a.out == a.sum_out)
        return bad(op, "with residual, out must not be x, residual or sum_out");
    return Status::ok();
}

Status matmul_check(const MatmulArgs& a) {
    const char* op = "matmul";
    EPI_RETURN_IF_ERROR(check_count(op, "num_rows", a.num_rows));
    EPI_RETURN_IF_ERROR(check_positive(op, "out_features", a.out_features));
    EPI_RETURN_IF_ERROR(check_positive(op, "in_features", a.in_features));
    EPI_RETURN_IF_ERROR(check_stride(op, "x_row_stride", a.x_row_stride, a.in_features));
    EPI_RETURN_IF_ERROR(check_stride(op, "y_row_stride", a.y_row_stride, a.out_features));
    EPI_RETURN_IF_ERROR(check_weight_dtype(op, "w", a.w_dtype));
    if (a.bias != nullptr) EPI_RETURN_IF_ERROR(check_weight_dtype(op, "bias", a.bias_dtype));
    if (a.num_rows == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "x", a.x));
    EPI_RETURN_IF_ERROR(check_not_null(op, "w", a.w));
    return check_not_null(op, "y", a.y);
}

Status matmul_group_check(const MatmulGroupArgs& a) {
    const char* op = "matmul_group";
    if (a.num_matmuls < 1 || a.num_matmuls > MatmulGroupArgs::kMaxMatmuls) {
        return bad(op, "num_matmuls must be in [1, " + std::to_string(MatmulGroupArgs::kMaxMatmuls) +
                           "], got " + std::to_string(a.num_matmuls));
    }
    const MatmulArgs& first = a.matmuls[0];
    for (int i = 0; i < a.num_matmuls; ++i) {
        const MatmulArgs& m = a.matmuls[i];
        EPI_RETURN_IF_ERROR(matmul_check(m));
        if (m.x != first.x || m.x_row_stride != first.x_row_stride || m.num_rows != first.num_rows ||
            m.in_features != first.in_features) {
            return bad(op, "entry " + std::to_string(i) +
                               " has another x, x_row_stride, num_rows or in_features than entry 0");
        }
    }
    return Status::ok();
}

namespace {

// Rows (t, b) of `width` elements at t·token_stride + b·batch_stride, t < T and b < B, do not overlap: one
// stride is ≥ width and the other ≥ that one times its count.
Status check_batched_rows(const char* op, const char* name, int64_t token_stride, int64_t batch_stride,
                          int64_t num_rows, int64_t num_batches, int64_t width) {
    const bool batch_inner = batch_stride >= width && token_stride >= batch_stride * num_batches;
    const bool token_inner = token_stride >= width && batch_stride >= token_stride * num_rows;
    if (batch_inner || token_inner || (num_rows <= 1 && batch_stride >= width) ||
        (num_batches == 1 && token_stride >= width)) {
        return Status::ok();
    }
    return bad(op, std::string(name) + " rows overlap: token stride " + std::to_string(token_stride) +
                       ", batch stride " + std::to_string(batch_stride) + " for " + std::to_string(num_rows) +
                       " x " + std::to_string(num_batches) + " rows of " + std::to_string(width));
}

}  // namespace

Status batched_matmul_check(const BatchedMatmulArgs& a) {
    const char* op = "batched_matmul";
    EPI_RETURN_IF_ERROR(check_count(op, "num_rows", a.num_rows));
    EPI_RETURN_IF_ERROR(check_positive(op, "num_batches", a.num_batches));
    EPI_RETURN_IF_ERROR(check_positive(op, "out_features", a.out_features));
    EPI_RETURN_IF_ERROR(check_positive(op, "in_features", a.in_features));
    EPI_RETURN_IF_ERROR(check_weight_dtype(op, "w", a.w_dtype));
    EPI_RETURN_IF_ERROR(check_stride(op, "w_batch_stride", a.w_batch_stride, a.out_features * a.in_features));
    EPI_RETURN_IF_ERROR(check_count(op, "x_token_stride", a.x_token_stride));
    EPI_RETURN_IF_ERROR(check_count(op, "x_batch_stride", a.x_batch_stride));
    EPI_RETURN_IF_ERROR(check_count(op, "y_token_stride", a.y_token_stride));
    EPI_RETURN_IF_ERROR(check_count(op, "y_batch_stride", a.y_batch_stride));
    EPI_RETURN_IF_ERROR(check_batched_rows(op, "y", a.y_token_stride, a.y_batch_stride, a.num_rows,
                                           a.num_batches, a.out_features));
    if (a.num_rows == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "x", a.x));
    EPI_RETURN_IF_ERROR(check_not_null(op, "w", a.w));
    return check_not_null(op, "y", a.y);
}

Status rope_check(const RopeArgs& a) {
    const char* op = "rope";
    EPI_RETURN_IF_ERROR(check_count(op, "num_tokens", a.num_tokens));
    EPI_RETURN_IF_ERROR(check_positive(op, "num_heads", a.num_heads));
    EPI_RETURN_IF_ERROR(check_positive(op, "rotary_dim", a.rotary_dim));
    if (a.rotary_dim % 2 != 0) return bad(op, "rotary_dim must be even, got " + std::to_string(a.rotary_dim));
    EPI_RETURN_IF_ERROR(check_count(op, "rot_offset", a.rot_offset));
    EPI_RETURN_IF_ERROR(check_count(op, "head_stride", a.head_stride));
    EPI_RETURN_IF_ERROR(check_count(op, "token_stride", a.token_stride));
    if (a.num_tokens == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "x", a.x));
    EPI_RETURN_IF_ERROR(check_not_null(op, "positions", a.positions));
    return check_not_null(op, "inv_freq", a.inv_freq);
}

Status attention_check(const AttentionArgs& a) {
    const char* op = "attention";
    EPI_RETURN_IF_ERROR(check_count(op, "num_tokens", a.num_tokens));
    EPI_RETURN_IF_ERROR(check_positive(op, "num_kv_tokens", a.num_kv_tokens));
    EPI_RETURN_IF_ERROR(check_positive(op, "num_heads", a.num_heads));
    EPI_RETURN_IF_ERROR(check_positive(op, "num_kv_heads", a.num_kv_heads));
    EPI_RETURN_IF_ERROR(check_positive(op, "head_dim_qk", a.head_dim_qk));
    EPI_RETURN_IF_ERROR(check_positive(op, "head_dim_v", a.head_dim_v));
    EPI_RETURN_IF_ERROR(check_kv_dtype(op, "kv_dtype", a.kv_dtype));
    if (!(a.scale > 0.0f) || std::isinf(a.scale)) {  // the GPU kernels take the scores' max before scaling
        return bad(op, "scale " + std::to_string(a.scale) + " must be positive and finite");
    }
    if (a.num_heads % a.num_kv_heads != 0) {
        return bad(op, "num_kv_heads " + std::to_string(a.num_kv_heads) + " does not divide num_heads " +
                           std::to_string(a.num_heads));
    }
    if (a.kv_block_tables != nullptr) {
        EPI_RETURN_IF_ERROR(check_positive(op, "kv_block_size", a.kv_block_size));
        EPI_RETURN_IF_ERROR(check_positive(op, "num_sequences", a.num_sequences));
        EPI_RETURN_IF_ERROR(check_positive(op, "block_table_stride", a.block_table_stride));
        if (a.num_kv_tokens > a.block_table_stride * a.kv_block_size) {
            return bad(op, "num_kv_tokens " + std::to_string(a.num_kv_tokens) + " exceeds block_table_stride " +
                               std::to_string(a.block_table_stride) + " × kv_block_size " +
                               std::to_string(a.kv_block_size));
        }
    } else if (a.kv_block_size != 0 || a.num_sequences != 0 || a.block_table_stride != 0 ||
               a.token_sequence != nullptr) {
        return bad(op, "kv_block_size, num_sequences, block_table_stride and token_sequence need kv_block_tables");
    }
    if (a.num_tokens == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "q", a.q));
    EPI_RETURN_IF_ERROR(check_not_null(op, "k", a.k));
    EPI_RETURN_IF_ERROR(check_not_null(op, "v", a.v));
    EPI_RETURN_IF_ERROR(check_not_null(op, "positions", a.positions));
    return check_not_null(op, "out", a.out);
}

Status kv_cache_store_check(const KvCacheStoreArgs& a) {
    const char* op = "kv_cache_store";
    EPI_RETURN_IF_ERROR(check_count(op, "num_tokens", a.num_tokens));
    EPI_RETURN_IF_ERROR(check_positive(op, "width", a.width));
    EPI_RETURN_IF_ERROR(check_positive(op, "num_pool_rows", a.num_pool_rows));
    EPI_RETURN_IF_ERROR(check_kv_dtype(op, "pool_dtype", a.pool_dtype));
    if (a.src_row_stride < a.width) {
        return bad(op, "src_row_stride " + std::to_string(a.src_row_stride) + " < width " + std::to_string(a.width));
    }
    if (a.num_tokens == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "src", a.src));
    EPI_RETURN_IF_ERROR(check_not_null(op, "pool", a.pool));
    return check_not_null(op, "slot_mapping", a.slot_mapping);
}

QkvTokenStrides qkv_token_strides(const QkNormRopeKvStoreArgs& a) {
    const int64_t q_row = a.num_heads * a.head_dim, kv_row = a.num_kv_heads * a.head_dim;
    return {a.q_token_stride != 0 ? a.q_token_stride : q_row,
            a.k_token_stride != 0 ? a.k_token_stride : kv_row,
            a.v_token_stride != 0 ? a.v_token_stride : kv_row};
}

QkNormRopeKvStoreParts qk_norm_rope_kv_store_parts(const QkNormRopeKvStoreArgs& a) {
    const int64_t D = a.head_dim, kv_row = a.num_kv_heads * D;
    const QkvTokenStrides strides = qkv_token_strides(a);
    QkNormRopeKvStoreParts p;
    const auto norm = [&](RmsNormArgs& n, float* x, const void* weight, int64_t heads) {
        n.x = n.out = x;
        n.weight = weight;
        n.weight_dtype = a.norm_dtype;
        n.num_rows = weight != nullptr ? a.num_tokens * heads : 0;
        n.width = n.x_row_stride = n.out_row_stride = D;
        n.eps = a.norm_eps;
    };
    norm(p.q_norm, a.q, a.q_norm, a.num_heads);
    norm(p.k_norm, a.k, a.k_norm, a.num_kv_heads);
    const auto rope = [&](RopeArgs& r, float* x, int64_t heads, int64_t token_stride) {
        r.x = x;
        r.positions = a.positions;
        r.inv_freq = a.inv_freq;
        r.attention_scaling = a.attention_scaling;
        r.num_tokens = a.num_tokens;
        r.num_heads = heads;
        r.token_stride = token_stride;
        r.head_stride = D;
        r.rotary_dim = a.rotary_dim;
        r.interleaved = a.interleaved;
    };
    rope(p.q_rope, a.q, a.num_heads, strides.q);
    rope(p.k_rope, a.k, a.num_kv_heads, strides.k);
    const auto store = [&](KvCacheStoreArgs& s, const float* src, void* pool, int64_t token_stride) {
        s.src = src;
        s.pool = pool;
        s.pool_dtype = a.pool_dtype;
        s.slot_mapping = a.slot_mapping;
        s.num_tokens = a.num_tokens;
        s.width = kv_row;
        s.src_row_stride = token_stride;
        s.num_pool_rows = a.num_pool_rows;
    };
    store(p.k_store, a.k, a.k_pool, strides.k);
    store(p.v_store, a.v, a.v_pool, strides.v);
    return p;
}

Status qk_norm_rope_kv_store_check(const QkNormRopeKvStoreArgs& a) {
    const char* op = "qk_norm_rope_kv_store";
    EPI_RETURN_IF_ERROR(check_positive(op, "head_dim", a.head_dim));
    if (a.rotary_dim > a.head_dim) {
        return bad(
            op, "rotary_dim " + std::to_string(a.rotary_dim) + " > head_dim " + std::to_string(a.head_dim));
    }
    if ((a.q_norm == nullptr) != (a.k_norm == nullptr))
        return bad(op, "q_norm and k_norm must both be set or both null");
    const QkvTokenStrides strides = qkv_token_strides(a);
    EPI_RETURN_IF_ERROR(check_stride(op, "q_token_stride", strides.q, a.num_heads * a.head_dim));
    EPI_RETURN_IF_ERROR(check_stride(op, "k_token_stride", strides.k, a.num_kv_heads * a.head_dim));
    EPI_RETURN_IF_ERROR(check_stride(op, "v_token_stride", strides.v, a.num_kv_heads * a.head_dim));
    const QkNormRopeKvStoreParts p = qk_norm_rope_kv_store_parts(a);
    EPI_RETURN_IF_ERROR(rms_norm_check(p.q_norm));
    EPI_RETURN_IF_ERROR(rms_norm_check(p.k_norm));
    EPI_RETURN_IF_ERROR(rope_check(p.q_rope));
    EPI_RETURN_IF_ERROR(rope_check(p.k_rope));
    EPI_RETURN_IF_ERROR(kv_cache_store_check(p.k_store));
    return kv_cache_store_check(p.v_store);
}

Status argmax_check(const ArgmaxArgs& a) {
    const char* op = "argmax";
    EPI_RETURN_IF_ERROR(check_count(op, "num_rows", a.num_rows));
    EPI_RETURN_IF_ERROR(check_positive(op, "vocab_size", a.vocab_size));
    if (a.vocab_size > INT32_MAX) {
        return bad(op, "vocab_size " + std::to_string(a.vocab_size) + " exceeds the int32 ids' limit " +
                           std::to_string(INT32_MAX));
    }
    EPI_RETURN_IF_ERROR(check_stride(op, "row_stride", a.row_stride, a.vocab_size));
    if (a.draws != nullptr && a.floor == nullptr && a.num_rows > 0)
        return bad(op, "draws need the floor workspace ([num_rows] fp32)");
    if (a.num_rows == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "logits", a.logits));
    EPI_RETURN_IF_ERROR(check_not_null(op, "out_ids", a.out_ids));
    return check_not_null(op, "out_non_finite", a.out_non_finite);
}

Status silu_mul_check(const SiluMulArgs& a) {
    const char* op = "silu_mul";
    EPI_RETURN_IF_ERROR(check_count(op, "num_elements", a.num_elements));
    if (a.num_elements == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "gate", a.gate));
    EPI_RETURN_IF_ERROR(check_not_null(op, "up", a.up));
    return check_not_null(op, "out", a.out);
}

Status add_check(const AddArgs& a) {
    const char* op = "add";
    EPI_RETURN_IF_ERROR(check_count(op, "num_elements", a.num_elements));
    if (a.num_elements == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "a", a.a));
    EPI_RETURN_IF_ERROR(check_not_null(op, "b", a.b));
    return check_not_null(op, "out", a.out);
}

Status add_sigmoid_gated_check(const AddSigmoidGatedArgs& a) {
    const char* op = "add_sigmoid_gated";
    EPI_RETURN_IF_ERROR(check_count(op, "num_rows", a.num_rows));
    EPI_RETURN_IF_ERROR(check_positive(op, "width", a.width));
    if (a.num_rows == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "a", a.a));
    EPI_RETURN_IF_ERROR(check_not_null(op, "gate", a.gate));
    EPI_RETURN_IF_ERROR(check_not_null(op, "b", a.b));
    return check_not_null(op, "out", a.out);
}

Status cast_check(const CastArgs& a) {
    const char* op = "cast";
    const bool narrow = a.src_dtype == DType::kF32 && a.dst_dtype == DType::kBF16;
    const bool widen = a.src_dtype == DType::kBF16 && a.dst_dtype == DType::kF32;
    if (!narrow && !widen) {
        return {StatusCode::kNotSupported, std::string(op) + ": " + dtype_name(a.src_dtype) + " → " +
                                               dtype_name(a.dst_dtype) + " (want F32 → BF16 or BF16 → F32)"};
    }
    EPI_RETURN_IF_ERROR(check_count(op, "num_elements", a.num_elements));
    if (a.num_elements == 0) return Status::ok();
    EPI_RETURN_IF_ERROR(check_not_null(op, "src", a.src));
    return check_not_null(op, "dst", a.dst);
}

}  // namespace epinfer
