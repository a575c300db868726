#include "layers/attention_gqa.h"

namespace epinfer {

namespace {

// RoPE on the first rotary_dim of each of `num_heads` heads of x: [T, num_heads, D] fp32.
Status apply_rope(Backend& backend, const GqaAttentionParams& p, float* x, int64_t num_rows,
                  int64_t num_heads, const int32_t* positions) {
    RopeArgs args;
    args.x = x;
    args.positions = positions;
    args.inv_freq = p.inv_freq;
    args.attention_scaling = p.rope_attention_scaling;
    args.num_tokens = num_rows;
    args.num_heads = num_heads;
    args.token_stride = num_heads * p.head_dim;
    args.head_stride = p.head_dim;
    args.rot_offset = 0;
    args.rotary_dim = p.rotary_dim;
    args.interleaved = p.rope_interleaved;
    return backend.rope(args);
}

// q/k norm in place on x: [T, num_heads, D] fp32.
Status apply_qk_norm(Backend& backend, const GqaAttentionParams& p, const RmsNormWeight& norm, float* x,
                     int64_t num_rows, int64_t num_heads) {
    switch (p.qk_norm) {
        case QkNormMode::kNone:
            return Status::ok();
        case QkNormMode::kPerHead:
            return rms_norm_forward(backend, norm, x, num_rows * num_heads, x);
        case QkNormMode::kFullProjection:
            return rms_norm_forward(backend, norm, x, num_rows, x);
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
    EPI_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::alloc_f32(backend, T * Nh * D));     // [T, Nh, D]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::alloc_f32(backend, T * Nkv * D));    // [T, Nkv, D]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::alloc_f32(backend, T * Nkv * D));    // [T, Nkv, D]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer attn, DeviceBuffer::alloc_f32(backend, T * Nh * D));  // [T, Nh, D]

    if (p.full_num_heads > 0) {
        EPI_RETURN_IF_ERROR_CTX(project_full_then_slice(backend, p, w.q_proj, w.q_norm, x, T,
                                                        p.full_num_heads, p.head_begin, Nh, q.f32()),
                                "q_proj");
        EPI_RETURN_IF_ERROR_CTX(project_full_then_slice(backend, p, w.k_proj, w.k_norm, x, T,
                                                        p.full_num_kv_heads, p.kv_head_begin, Nkv, k.f32()),
                                "k_proj");
    } else {
        EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.q_proj, x, T, q.f32()), "q_proj");
        EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.k_proj, x, T, k.f32()), "k_proj");
        EPI_RETURN_IF_ERROR_CTX(apply_qk_norm(backend, p, w.q_norm, q.f32(), T, Nh), "q_norm");
        EPI_RETURN_IF_ERROR_CTX(apply_qk_norm(backend, p, w.k_norm, k.f32(), T, Nkv), "k_norm");
    }
    EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.v_proj, x, T, v.f32()), "v_proj");
    EPI_RETURN_IF_ERROR(apply_rope(backend, p, q.f32(), T, Nh, batch.positions));
    EPI_RETURN_IF_ERROR(apply_rope(backend, p, k.f32(), T, Nkv, batch.positions));

    EPI_ASSIGN_OR_RETURN(const LayerKvCache* layer, batch_layer_cache(batch));
    const int64_t kv_row = Nkv * D;
    EPI_RETURN_IF_ERROR(kv_cache_store_rows(backend, batch, *layer, layer->k_pool, kv_row, k.f32()));
    EPI_RETURN_IF_ERROR(kv_cache_store_rows(backend, batch, *layer, layer->v_pool, kv_row, v.f32()));

    AttentionArgs args;
    args.q = q.f32();
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
    args.q_token_stride = args.out_token_stride = Nh * D;
    args.k_token_stride = args.v_token_stride = Nkv * D;
    args.q_head_stride = args.k_head_stride = args.v_head_stride = args.out_head_stride = D;
    args.scale = p.softmax_scale;
    EPI_RETURN_IF_ERROR(backend.attention(args));
    return linear_forward(backend, w.o_proj, attn.f32(), T, y);
}

}  // namespace epinfer
