#include "layers/attention_gqa.h"

namespace epinfer {

namespace {

// q/k norm in place on x: [T, num_heads, D] fp32, token stride token_stride (0: num_heads·D; packed rows
// only for per-head norms).
Status apply_qk_norm(Backend& backend, const GqaAttentionParams& p, const RmsNormWeight& norm, float* x,
                     int64_t num_rows, int64_t num_heads, int64_t token_stride = 0) {
    switch (p.qk_norm) {
        case QkNormMode::kNone:
            return Status::ok();
        case QkNormMode::kPerHead:
            if (token_stride != 0 && token_stride != num_heads * p.head_dim)
                return internal_error("gqa attention: a per-head q/k norm over strided rows");
            return rms_norm_forward(backend, norm, x, num_rows * num_heads, x);
        case QkNormMode::kFullProjection:
            return rms_norm_forward(backend, norm, x, num_rows, x, token_stride);
    }
    return internal_error("gqa attention: unknown q/k norm mode");
}

// out = heads [begin, begin + num_heads) of norm(proj(x)) over all full_heads heads (kFullProjection norm
// under attention TP). out: [T, num_heads, D] fp32.
Status project_full_then_slice(Backend& backend, const GqaAttentionParams& p, const Linear& proj,
                               const RmsNormWeight& norm, const float* x, int64_t num_rows,
                               int64_t full_heads, int64_t begin, int64_t num_heads, float* out) {
    const int64_t D = p.head_dim;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer full,
                         DeviceBuffer::alloc_f32(backend, num_rows * full_heads * D));  // [T, full, D]
    EPI_RETURN_IF_ERROR(linear_forward(backend, proj, x, num_rows, full.f32()));
    EPI_RETURN_IF_ERROR(apply_qk_norm(backend, p, norm, full.f32(), num_rows, full_heads));
    constexpr size_t kF = sizeof(float);
    return backend.copy_rows_on_device(out, static_cast<size_t>(num_heads * D) * kF, full.f32() + begin * D,
                                       static_cast<size_t>(full_heads * D) * kF,
                                       static_cast<size_t>(num_heads * D) * kF,
                                       static_cast<size_t>(num_rows));
}

}  // namespace

Status gqa_attention_forward(Backend& backend, const GqaAttentionWeights& w, const GqaAttentionParams& p,
                             const AttentionBatch& batch, const float* x, int64_t num_rows, float* y) {
    const int64_t T = num_rows, Nh = p.num_heads, Nkv = p.num_kv_heads, D = p.head_dim;
    // Per-head q/k norms run inside qk_norm_rope_kv_store when their weights share a dtype and eps (they do
    // in every checkpoint seen); otherwise, and for whole-projection norms, as ops of their own.
    const bool fuse_norms = p.full_num_heads == 0 && p.qk_norm == QkNormMode::kPerHead &&
                            w.q_norm.dtype == w.k_norm.dtype && w.q_norm.eps == w.k_norm.eps;
    // q, k and v as column blocks of one [T, (Nh + 2·Nkv)·D] buffer, so that the three projections run as one
    // matmul where their weights are stacked (bind_gqa; vLLM's QKVParallelLinear); as packed [T, Nh·D],
    // [T, Nkv·D], [T, Nkv·D] blocks of it where a per-head norm runs as an op of its own (its rows are
    // packed) or the projections are split under attention TP.
    const bool stacked = p.full_num_heads == 0 && (p.qk_norm != QkNormMode::kPerHead || fuse_norms);
    const int64_t qkv_row = (Nh + 2 * Nkv) * D;
    const int64_t q_stride = stacked ? qkv_row : Nh * D, kv_stride = stacked ? qkv_row : Nkv * D;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer qkv, DeviceBuffer::alloc_f32(backend, T * qkv_row));
    float* q = qkv.f32();                                // [T, Nh, D], token stride q_stride
    float* k = stacked ? q + Nh * D : q + T * Nh * D;    // [T, Nkv, D], token stride kv_stride
    float* v = stacked ? k + Nkv * D : k + T * Nkv * D;  // [T, Nkv, D], token stride kv_stride
    EPI_ASSIGN_OR_RETURN(DeviceBuffer attn, DeviceBuffer::alloc_f32(backend, T * Nh * D));  // [T, Nh, D]

    if (p.full_num_heads > 0) {
        EPI_RETURN_IF_ERROR_CTX(project_full_then_slice(backend, p, w.q_proj, w.q_norm, x, T,
                                                        p.full_num_heads, p.head_begin, Nh, q),
                                "q_proj");
        EPI_RETURN_IF_ERROR_CTX(project_full_then_slice(backend, p, w.k_proj, w.k_norm, x, T,
                                                        p.full_num_kv_heads, p.kv_head_begin, Nkv, k),
                                "k_proj");
        EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.v_proj, x, T, v), "v_proj");
    } else {
        EPI_RETURN_IF_ERROR_CTX(
            linear_group_forward(
                backend, {{&w.q_proj, q, q_stride}, {&w.k_proj, k, kv_stride}, {&w.v_proj, v, kv_stride}}, x,
                T),
            "q_proj, k_proj, v_proj");
    }
    if (p.full_num_heads == 0 && !fuse_norms) {
        EPI_RETURN_IF_ERROR_CTX(apply_qk_norm(backend, p, w.q_norm, q, T, Nh, q_stride), "q_norm");
        EPI_RETURN_IF_ERROR_CTX(apply_qk_norm(backend, p, w.k_norm, k, T, Nkv, kv_stride), "k_norm");
    }

    EPI_ASSIGN_OR_RETURN(const LayerKvCache* layer, batch_layer_cache(batch));
    QkNormRopeKvStoreArgs prep;
    prep.q = q;
    prep.k = k;
    prep.v = v;
    prep.q_token_stride = q_stride;
    prep.k_token_stride = prep.v_token_stride = kv_stride;
    prep.num_tokens = T;
    prep.num_heads = Nh;
    prep.num_kv_heads = Nkv;
    prep.head_dim = D;
    if (fuse_norms) {
        prep.q_norm = w.q_norm.weight;
        prep.k_norm = w.k_norm.weight;
        prep.norm_dtype = w.q_norm.dtype;
        prep.norm_eps = w.q_norm.eps;
    }
    prep.positions = batch.positions;
    prep.inv_freq = p.inv_freq;
    prep.attention_scaling = p.rope_attention_scaling;
    prep.rotary_dim = p.rotary_dim;
    prep.interleaved = p.rope_interleaved;
    prep.k_pool = layer->k_pool;
    prep.v_pool = layer->v_pool;
    prep.pool_dtype = layer->dtype;
    prep.slot_mapping = static_cast<const int64_t*>(batch.kv_metadata->slot_mapping.data());
    prep.num_pool_rows = layer->num_blocks * layer->block_size;
    EPI_RETURN_IF_ERROR(backend.qk_norm_rope_kv_store(prep));

    AttentionArgs args;
    args.q = q;
    args.k = layer->k_pool;  // [num_blocks·block_size, Nkv, D] layer->dtype, rows through the block tables
    args.v = layer->v_pool;
    set_paged_attention(batch, *layer, &args);  // and kv_dtype
    args.positions = batch.positions;
    args.out = attn.f32();
    args.num_tokens = T;
    args.num_heads = Nh;
    args.num_kv_heads = Nkv;
    args.head_dim_qk = D;
    args.head_dim_v = D;
    args.q_token_stride = q_stride;
    args.out_token_stride = Nh * D;
    args.k_token_stride = args.v_token_stride = Nkv * D;
    args.q_head_stride = args.k_head_stride = args.v_head_stride = args.out_head_stride = D;
    args.scale = p.softmax_scale;
    EPI_RETURN_IF_ERROR(backend.attention(args));
    return linear_forward(backend, w.o_proj, attn.f32(), T, y);
}

}  // namespace epinfer
