#include "layers/attention_mla.h"

namespace epinfer {

namespace {

// RoPE on Dr elements at rot_offset of each of num_heads heads; rows of token_stride floats.
Status apply_rope(Backend& backend, const MlaAttentionParams& p, float* x, int64_t num_rows,
                  int64_t num_heads, int64_t token_stride, int64_t head_stride, int64_t rot_offset,
                  const int32_t* positions) {
    RopeArgs args;
    args.x = x;
    args.positions = positions;
    args.inv_freq = p.inv_freq;
    args.attention_scaling = p.rope_attention_scaling;
    args.num_tokens = num_rows;
    args.num_heads = num_heads;
    args.token_stride = token_stride;
    args.head_stride = head_stride;
    args.rot_offset = rot_offset;
    args.rotary_dim = p.qk_rope_head_dim;
    args.interleaved = p.rope_interleaved;
    return backend.rope(args);
}

// q: [T, Nh, Dn + Dr], RoPE not yet applied.
Status project_q(Backend& backend, const MlaAttentionWeights& w, const MlaAttentionParams& p, const float* x,
                 int64_t num_rows, float* q) {
    if (p.q_lora_rank == 0) return linear_forward(backend, w.q_proj, x, num_rows, q);
    EPI_ASSIGN_OR_RETURN(DeviceBuffer q_a,
                         DeviceBuffer::alloc_f32(backend, num_rows * p.q_lora_rank));  // [T, Rq]
    EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.q_a_proj, x, num_rows, q_a.f32()), "q_a_proj");
    EPI_RETURN_IF_ERROR_CTX(rms_norm_forward(backend, w.q_a_layernorm, q_a.f32(), num_rows, q_a.f32()),
                            "q_a_layernorm");
    return linear_forward(backend, w.q_b_proj, q_a.f32(), num_rows, q);
}

// Attention of one sequence's n query rows against its S cached latent rows.
Status attend_sequence(Backend& backend, const MlaAttentionWeights& w, const MlaAttentionParams& p,
                       const float* latent, int64_t num_kv_tokens, const float* q, const int32_t* positions,
                       int64_t num_rows, float* out) {
    const int64_t S = num_kv_tokens, Nh = p.num_heads, R = p.kv_lora_rank;
    const int64_t Dn = p.qk_nope_head_dim, Dr = p.qk_rope_head_dim, Dv = p.v_head_dim, Dqk = Dn + Dr;
    const int64_t latent_width = R + Dr;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer kv,
                         DeviceBuffer::alloc_f32(backend, S * Nh * (Dn + Dv)));  // [S, Nh, Dn+Dv]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer keys, DeviceBuffer::alloc_f32(backend, S * Nh * Dqk));  // [S, Nh, Dqk]
    EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.kv_b_proj, latent, S, kv.f32(), latent_width),
                            "kv_b_proj");

    // K = [k_nope | k_pe]: k_nope from kv_b_proj, k_pe (one shared head) copied to every head.
    constexpr size_t kF = sizeof(float);
    EPI_RETURN_IF_ERROR(backend.copy_rows_on_device(keys.data(), Dqk * kF, kv.data(), (Dn + Dv) * kF, Dn * kF,
                                                    static_cast<size_t>(S * Nh)));
    for (int64_t h = 0; h < Nh; ++h) {
        EPI_RETURN_IF_ERROR(backend.copy_rows_on_device(keys.f32() + h * Dqk + Dn, Nh * Dqk * kF, latent + R,
                                                        latent_width * kF, Dr * kF, static_cast<size_t>(S)));
    }
    AttentionArgs args;
    args.q = q;
    args.k = keys.f32();
    args.v = kv.f32() + Dn;  // V = the last Dv of each head's kv_b_proj row
    args.positions = positions;
    args.out = out;
    args.num_tokens = num_rows;
    args.num_kv_tokens = S;
    args.num_heads = Nh;
    args.num_kv_heads = Nh;
    args.head_dim_qk = Dqk;
    args.head_dim_v = Dv;
    args.q_token_stride = Nh * Dqk;
    args.q_head_stride = Dqk;
    args.k_token_stride = Nh * Dqk;
    args.k_head_stride = Dqk;
    args.v_token_stride = Nh * (Dn + Dv);
    args.v_head_stride = Dn + Dv;
    args.out_token_stride = Nh * Dv;
    args.out_head_stride = Dv;
    args.scale = p.softmax_scale;
    return backend.attention(args);
}

}  // namespace

Status mla_attention_forward(Backend& backend, const MlaAttentionWeights& w, const MlaAttentionParams& p,
                             const AttentionBatch& batch, const float* x, int64_t num_rows, float* y) {
    const int64_t T = num_rows, Nh = p.num_heads, R = p.kv_lora_rank;
    const int64_t Dn = p.qk_nope_head_dim, Dr = p.qk_rope_head_dim, Dv = p.v_head_dim, Dqk = Dn + Dr;
    const int64_t latent_width = R + Dr;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::alloc_f32(backend, T * Nh * Dqk));  // [T, Nh, Dqk]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer latent,
                         DeviceBuffer::alloc_f32(backend, T * latent_width));                // [T, R+Dr]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer attn, DeviceBuffer::alloc_f32(backend, T * Nh * Dv));  // [T, Nh, Dv]

    EPI_RETURN_IF_ERROR_CTX(project_q(backend, w, p, x, T, q.f32()), "q projection");
    EPI_RETURN_IF_ERROR(apply_rope(backend, p, q.f32(), T, Nh, Nh * Dqk, Dqk, Dn, batch.positions));
    EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.kv_a_proj_with_mqa, x, T, latent.f32()),
                            "kv_a_proj_with_mqa");
    EPI_RETURN_IF_ERROR_CTX(
        rms_norm_forward(backend, w.kv_a_layernorm, latent.f32(), T, latent.f32(), latent_width),
        "kv_a_layernorm");
    EPI_RETURN_IF_ERROR(
        apply_rope(backend, p, latent.f32(), T, 1, latent_width, latent_width, R, batch.positions));

    EPI_ASSIGN_OR_RETURN(const LayerKvCache* layer, batch_layer_cache(batch));
    EPI_RETURN_IF_ERROR(kv_cache_store_rows(backend, batch, *layer, layer->k_pool, latent_width, latent.f32()));
    for (const AttentionSequence& seq : batch.sequences) {
        const LayerKvCache& kv = *seq.kv;
        const int64_t n = seq.num_rows, r0 = seq.row_begin, S = kv.num_tokens + n;
        // The naive expansion reads the whole prefix: gather it out of the blocks (fp32; bf16 widened).
        EPI_ASSIGN_OR_RETURN(DeviceBuffer cached,
                             DeviceBuffer::alloc_f32(backend, S * latent_width));  // [S, R+Dr]
        EPI_RETURN_IF_ERROR(kv_cache_gather_rows(backend, kv, kv.k_pool, latent_width, S, cached.f32()));
        EPI_RETURN_IF_ERROR(attend_sequence(backend, w, p, cached.f32(), S, q.f32() + r0 * Nh * Dqk,
                                            batch.positions + r0, n, attn.f32() + r0 * Nh * Dv));
    }
    return linear_forward(backend, w.o_proj, attn.f32(), T, y);
}

}  // namespace epinfer
