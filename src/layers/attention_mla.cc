#include "layers/attention_mla.h"

#include <cstdint>
#include <limits>
#include <span>

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

// Absorbed attention of rows [r0, r0 + n) (whole sequences of the batch) over the paged latent cache:
// q_abs = [q_nope · W_UK_h | q_pe] per head, attention with one KV head of width R + Dr (V = its first R),
// then · W_UV_hᵀ into out [n, Nh, Dv].
Status attend_absorbed(Backend& backend, const MlaAttentionWeights& w, const MlaAttentionParams& p,
                       const AttentionBatch& batch, const LayerKvCache& layer, const float* q, int64_t r0,
                       int64_t n, float* out) {
    const int64_t Nh = p.num_heads, R = p.kv_lora_rank;
    const int64_t Dn = p.qk_nope_head_dim, Dr = p.qk_rope_head_dim, Dv = p.v_head_dim, Dqk = Dn + Dr;
    const int64_t latent_width = R + Dr, head_rows = (Dn + Dv) * R;  // kv_b_proj elements per head
    EPI_ASSIGN_OR_RETURN(DeviceBuffer q_abs, DeviceBuffer::alloc_f32(backend, n * Nh * latent_width));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer attn_latent, DeviceBuffer::alloc_f32(backend, n * Nh * R));  // [n, Nh, R]

    BatchedMatmulArgs absorb;  // q_latent[t, h, :] = q_nope[t, h, :] · W_UK_h, W_UK_h: [Dn, R]
    absorb.x = q;
    absorb.x_token_stride = Nh * Dqk;
    absorb.x_batch_stride = Dqk;
    absorb.w = w.kv_b_proj.weight;
    absorb.w_dtype = w.kv_b_proj.dtype;
    absorb.w_layout = BatchedWeightLayout::kKN;
    absorb.w_batch_stride = head_rows;
    absorb.y = q_abs.f32();
    absorb.y_token_stride = Nh * latent_width;
    absorb.y_batch_stride = latent_width;
    absorb.num_rows = n;
    absorb.num_batches = Nh;
    absorb.out_features = R;
    absorb.in_features = Dn;
    EPI_RETURN_IF_ERROR_CTX(backend.batched_matmul(absorb), "kv_b_proj W_UK absorption");
    constexpr size_t kF = sizeof(float);
    EPI_RETURN_IF_ERROR(backend.copy_rows_on_device(q_abs.f32() + R, latent_width * kF, q + Dn, Dqk * kF, Dr * kF,
                                                    static_cast<size_t>(n * Nh)));

    AttentionArgs args;
    args.q = q_abs.f32();
    args.k = layer.k_pool;  // [num_blocks·block_size, 1, R + Dr]: c_kv | k_pe
    args.v = layer.k_pool;  // the first R of the same rows: c_kv
    set_paged_attention(batch, layer, &args);
    args.token_sequence += r0;
    args.positions = batch.positions + r0;
    args.out = attn_latent.f32();
    args.num_tokens = n;
    args.num_heads = Nh;
    args.num_kv_heads = 1;
    args.head_dim_qk = latent_width;
    args.head_dim_v = R;
    args.q_token_stride = Nh * latent_width;
    args.q_head_stride = latent_width;
    args.k_token_stride = args.k_head_stride = latent_width;
    args.v_token_stride = args.v_head_stride = latent_width;
    args.out_token_stride = Nh * R;
    args.out_head_stride = R;
    args.scale = p.softmax_scale;
    EPI_RETURN_IF_ERROR(backend.attention(args));

    BatchedMatmulArgs expand;  // out[t, h, :] = attn_latent[t, h, :] · W_UV_hᵀ, W_UV_h: [Dv, R]
    expand.x = attn_latent.f32();
    expand.x_token_stride = Nh * R;
    expand.x_batch_stride = R;
    expand.w = static_cast<const uint8_t*>(w.kv_b_proj.weight) +
               static_cast<size_t>(Dn * R) * dtype_size(w.kv_b_proj.dtype);
    expand.w_dtype = w.kv_b_proj.dtype;
    expand.w_layout = BatchedWeightLayout::kNK;
    expand.w_batch_stride = head_rows;
    expand.y = out;
    expand.y_token_stride = Nh * Dv;
    expand.y_batch_stride = Dv;
    expand.num_rows = n;
    expand.num_batches = Nh;
    expand.out_features = Dv;
    expand.in_features = R;
    EPI_RETURN_IF_ERROR_CTX(backend.batched_matmul(expand), "kv_b_proj W_UV");
    return Status::ok();
}

}  // namespace

int64_t mla_absorb_max_rows(const MlaAttentionParams& p) {
    const int64_t R = p.kv_lora_rank, expanded_per_key = p.qk_nope_head_dim + p.v_head_dim;
    const int64_t extra_per_row = 2 * R - expanded_per_key;  // absorbed − expanded, per (row, key)
    if (extra_per_row <= 0) return std::numeric_limits<int64_t>::max();
    return (R * expanded_per_key - 1) / extra_per_row;  // the largest n with n · extra < R · (Dn + Dv)
}

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
    const auto absorbed = [&](const AttentionSequence& seq) {
        return w.kv_b_proj.bias == nullptr && seq.num_rows <= p.absorb_max_rows;
    };
    const std::span<const AttentionSequence> seqs = batch.sequences;
    for (size_t i = 0; i < seqs.size();) {
        if (!absorbed(seqs[i])) {
            ++i;
            continue;
        }
        size_t j = i + 1;  // one absorbed call per run of consecutive absorbed sequences
        while (j < seqs.size() && absorbed(seqs[j])) ++j;
        // A run ending with the batch takes its padding rows too (a decode graph's bucket; each repeats
        // its sequence's last row), so a recorded step covers every row a later replay may fill.
        const int64_t r0 = seqs[i].row_begin;
        const int64_t n = (j == seqs.size() ? T : seqs[j - 1].row_begin + seqs[j - 1].num_rows) - r0;
        EPI_RETURN_IF_ERROR(attend_absorbed(backend, w, p, batch, *layer, q.f32() + r0 * Nh * Dqk, r0, n,
                                            attn.f32() + r0 * Nh * Dv));
        i = j;
    }
    for (const AttentionSequence& seq : batch.sequences) {
        if (absorbed(seq)) continue;
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
