#include "models/model_weights.h"

#include <fmt/format.h>

#include <string>

#include "checkpoint/weight_names.h"
#include "models/model_registry.h"
#include "models/rope_table.h"
#include "parallel/sharding.h"

namespace epinfer {

namespace {

// transformers builds DeepseekV3RMSNorm(q_lora_rank) and DeepseekV3RMSNorm(kv_lora_rank) without eps:
// the MLA latent norms use the class default, not rms_norm_eps.
constexpr float kMlaLatentNormEps = 1e-6f;

std::string layer_prefix(int64_t layer) {
    return "model.layers." + std::to_string(layer);
}

// The part of an nn.Linear a rank holds: rows (column parallel; the bias rows too), columns (row
// parallel; the bias is added by one rank only), or the whole.
struct LinearShard {
    int dim = -1;  // −1 whole, 0 rows, 1 columns
    ShardRange range;
    bool keep_bias = true;
};

LinearShard rows_shard(int64_t begin, int64_t size) {
    return {0, {begin, size}, true};
}
LinearShard cols_shard(int64_t begin, int64_t size, bool keep_bias) {
    return {1, {begin, size}, keep_bias};
}

// What the binder needs to know about this rank's place in the layout.
struct ShardPlan {
    int attn_tp = 1, attn_tp_rank = 0;
    int moe_tp = 1, moe_tp_rank = 0;
    int moe_ep_rank = 0;
    const ExpertPlacement* placement = nullptr;  // null: every expert local
    AttentionShard attention;
};

// Turns checkpoint tensors into device views: the mmap itself on host backends, uploaded copies otherwise.
class WeightBinder {
public:
    WeightBinder(const Checkpoint& checkpoint, Backend& backend, std::vector<DeviceBuffer>& owned)
        : checkpoint_(checkpoint), backend_(backend), owned_(owned) {}

    Result<Checkpoint::Entry> entry(const std::string& name) const {
        const Checkpoint::Entry e = checkpoint_.find(name);
        if (e.info == nullptr) return not_found(checkpoint_.dir() + ": tensor '" + name + "' is missing");
        return e;
    }

    int64_t bytes() const { return bytes_; }

    Result<const void*> device_data(const Checkpoint::Entry& e) {
        bytes_ += static_cast<int64_t>(e.info->num_bytes());
        if (backend_.host_accessible()) return e.data();
        EPI_ASSIGN_OR_RETURN(DeviceBuffer copy, DeviceBuffer::alloc(backend_, e.info->num_bytes()));
        EPI_RETURN_IF_ERROR(backend_.copy_to_device(copy.data(), e.data(), e.info->num_bytes()));
        owned_.push_back(std::move(copy));
        return static_cast<const void*>(owned_.back().data());
    }

    // `slice` of a tensor, copied out of the mmap (only the slice is read); the whole tensor when
    // slice.dim < 0.
    Result<const void*> slice_data(const Checkpoint::Entry& e, const TensorSlice& slice) {
        if (slice.dim < 0) return device_data(e);
        const std::vector<int64_t>& shape = e.info->shape;
        if (slice.range.end() > shape[static_cast<size_t>(slice.dim)]) {
            return invalid_argument(
                fmt::format("{}: '{}': slice [{}, {}) of dimension {} exceeds its size {}", checkpoint_.dir(),
                            e.info->name, slice.range.begin, slice.range.end(), slice.dim,
                            shape[static_cast<size_t>(slice.dim)]));
        }
        const size_t elem = dtype_size(e.info->dtype);
        const size_t bytes =
            static_cast<size_t>(e.info->numel() / shape[static_cast<size_t>(slice.dim)] * slice.range.size) *
            elem;
        std::vector<unsigned char> host(bytes);
        copy_tensor_slice(e.data(), shape, elem, slice, host.data());
        EPI_ASSIGN_OR_RETURN(DeviceBuffer copy, DeviceBuffer::alloc(backend_, bytes));
        EPI_RETURN_IF_ERROR(backend_.copy_to_device(copy.data(), host.data(), bytes));
        owned_.push_back(std::move(copy));
        bytes_ += static_cast<int64_t>(bytes);
        return static_cast<const void*>(owned_.back().data());
    }

    // PREFIX.weight [N, K] and, when with_bias, PREFIX.bias [N]; the part `shard` of them.
    Result<Linear> linear(const std::string& prefix, bool with_bias, const LinearShard& shard = {}) {
        EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry w, entry(prefix + ".weight"));
        if (w.info->shape.size() != 2)
            return invalid_argument(checkpoint_.dir() + ": '" + prefix + ".weight' is not 2-D");
        Linear lin;
        EPI_ASSIGN_OR_RETURN(lin.weight, slice_data(w, TensorSlice{shard.dim, shard.range}));
        lin.dtype = w.info->dtype;
        lin.out_features = shard.dim == 0 ? shard.range.size : w.info->shape[0];
        lin.in_features = shard.dim == 1 ? shard.range.size : w.info->shape[1];
        if (with_bias && shard.keep_bias) {
            EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry b, entry(prefix + ".bias"));
            const TensorSlice bias_slice = shard.dim == 0 ? TensorSlice{0, shard.range} : TensorSlice{};
            EPI_ASSIGN_OR_RETURN(lin.bias, slice_data(b, bias_slice));
            lin.bias_dtype = b.info->dtype;
        }
        return lin;
    }

    Result<RmsNormWeight> norm(const std::string& name, float eps) {
        EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry w, entry(name));
        RmsNormWeight norm;
        EPI_ASSIGN_OR_RETURN(norm.weight, device_data(w));
        norm.dtype = w.info->dtype;
        norm.width = w.info->numel();
        norm.eps = eps;
        return norm;
    }

    // A SwiGLU MLP whose intermediate dimension I is split into tp parts; this rank holds part tp_rank.
    Result<DenseFfnWeights> ffn(const std::string& prefix, int tp = 1, int tp_rank = 0) {
        return ffn_named(prefix + ".gate_proj", prefix + ".up_proj", prefix + ".down_proj", tp, tp_rank);
    }

    Result<DenseFfnWeights> ffn_named(const std::string& gate, const std::string& up, const std::string& down,
                                      int tp, int tp_rank) {
        DenseFfnWeights f;
        if (tp == 1) {
            EPI_ASSIGN_OR_RETURN(f.gate_proj, linear(gate, false));
            EPI_ASSIGN_OR_RETURN(f.up_proj, linear(up, false));
            EPI_ASSIGN_OR_RETURN(f.down_proj, linear(down, false));
            return f;
        }
        EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry g, entry(gate + ".weight"));
        const int64_t I = g.info->shape.empty() ? 0 : g.info->shape[0];
        if (I % tp != 0) {
            return invalid_argument(
                fmt::format("{}: '{}.weight': intermediate size {} does not split over TP {}",
                            checkpoint_.dir(), gate, I, tp));
        }
        const int64_t part = I / tp;
        EPI_ASSIGN_OR_RETURN(f.gate_proj, linear(gate, false, rows_shard(tp_rank * part, part)));
        EPI_ASSIGN_OR_RETURN(f.up_proj, linear(up, false, rows_shard(tp_rank * part, part)));
        EPI_ASSIGN_OR_RETURN(f.down_proj, linear(down, false, cols_shard(tp_rank * part, part, true)));
        return f;
    }

    // fp32 device copy of host values.
    Result<const float*> upload_f32(const std::vector<float>& values) {
        EPI_ASSIGN_OR_RETURN(DeviceBuffer buf,
                             DeviceBuffer::alloc_f32(backend_, static_cast<int64_t>(values.size())));
        EPI_RETURN_IF_ERROR(backend_.copy_to_device(buf.data(), values.data(), buf.num_bytes()));
        owned_.push_back(std::move(buf));
        return static_cast<const float*>(owned_.back().f32());
    }

    // A 1-D F32/F16/BF16 tensor converted to fp32 on the device.
    Result<const float*> vector_f32(const std::string& name) {
        EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry e, entry(name));
        bytes_ += static_cast<int64_t>(e.info->num_bytes());
        std::vector<float> host(static_cast<size_t>(e.info->numel()));
        convert_to_f32(e.info->dtype, e.data(), host.data(), host.size());
        return upload_f32(host);
    }

private:
    const Checkpoint& checkpoint_;
    Backend& backend_;
    std::vector<DeviceBuffer>& owned_;
    int64_t bytes_ = 0;
};

Status bind_gqa(WeightBinder& b, const ModelConfig& c, const ShardPlan& sp, const std::string& p,
                GqaAttentionWeights& w) {
    const AttentionShard& a = sp.attention;
    const int64_t D = c.head_dim;
    const bool split = sp.attn_tp > 1;
    const LinearShard q_rows =
        split && !a.full_qk_projection ? rows_shard(a.head_begin * D, a.num_heads * D) : LinearShard{};
    const LinearShard kv_rows = split ? rows_shard(a.kv_head_begin * D, a.num_kv_heads * D) : LinearShard{};
    const LinearShard k_rows = a.full_qk_projection ? LinearShard{} : kv_rows;
    EPI_ASSIGN_OR_RETURN(w.q_proj, b.linear(p + ".q_proj", c.attention_bias, q_rows));
    EPI_ASSIGN_OR_RETURN(w.k_proj, b.linear(p + ".k_proj", c.attention_bias, k_rows));
    EPI_ASSIGN_OR_RETURN(w.v_proj, b.linear(p + ".v_proj", c.attention_bias, kv_rows));
    const LinearShard o_cols =
        split ? cols_shard(a.head_begin * D, a.num_heads * D, sp.attn_tp_rank == 0) : LinearShard{};
    EPI_ASSIGN_OR_RETURN(w.o_proj, b.linear(p + ".o_proj", c.attention_out_bias, o_cols));
    if (c.qk_norm != QkNormKind::kNone) {
        const float eps = static_cast<float>(c.rms_norm_eps);
        EPI_ASSIGN_OR_RETURN(w.q_norm, b.norm(p + ".q_norm.weight", eps));
        EPI_ASSIGN_OR_RETURN(w.k_norm, b.norm(p + ".k_norm.weight", eps));
    }
    return Status::ok();
}

Status bind_mla(WeightBinder& b, const ModelConfig& c, const ShardPlan& sp, const std::string& p,
                MlaAttentionWeights& w) {
    const AttentionShard& a = sp.attention;
    const bool split = sp.attn_tp > 1;
    const int64_t Dqk = c.qk_nope_head_dim + c.qk_rope_head_dim, Dkv = c.qk_nope_head_dim + c.v_head_dim;
    const LinearShard q_rows = split ? rows_shard(a.head_begin * Dqk, a.num_heads * Dqk) : LinearShard{};
    if (c.q_lora_rank > 0) {
        EPI_ASSIGN_OR_RETURN(w.q_a_proj, b.linear(p + ".q_a_proj", c.attention_bias));
        EPI_ASSIGN_OR_RETURN(w.q_a_layernorm, b.norm(p + ".q_a_layernorm.weight", kMlaLatentNormEps));
        EPI_ASSIGN_OR_RETURN(w.q_b_proj, b.linear(p + ".q_b_proj", false, q_rows));
    } else {
        EPI_ASSIGN_OR_RETURN(w.q_proj, b.linear(p + ".q_proj", false, q_rows));
    }
    EPI_ASSIGN_OR_RETURN(w.kv_a_proj_with_mqa, b.linear(p + ".kv_a_proj_with_mqa", c.attention_bias));
    EPI_ASSIGN_OR_RETURN(w.kv_a_layernorm, b.norm(p + ".kv_a_layernorm.weight", kMlaLatentNormEps));
    const LinearShard kv_rows = split ? rows_shard(a.head_begin * Dkv, a.num_heads * Dkv) : LinearShard{};
    EPI_ASSIGN_OR_RETURN(w.kv_b_proj, b.linear(p + ".kv_b_proj", false, kv_rows));
    const LinearShard o_cols =
        split ? cols_shard(a.head_begin * c.v_head_dim, a.num_heads * c.v_head_dim, sp.attn_tp_rank == 0)
              : LinearShard{};
    EPI_ASSIGN_OR_RETURN(w.o_proj, b.linear(p + ".o_proj", c.attention_out_bias, o_cols));
    return Status::ok();
}

Status bind_moe(WeightBinder& b, const ModelConfig& c, const ShardPlan& sp, int64_t layer,
                MoeBlockWeights& w) {
    const std::string prefix = moe_block_prefix(c, layer);
    EPI_ASSIGN_OR_RETURN(w.router, b.linear(prefix + ".gate", false));
    if (c.router.has_correction_bias) {
        EPI_ASSIGN_OR_RETURN(w.e_score_correction_bias,
                             b.vector_f32(prefix + ".gate.e_score_correction_bias"));
    }
    std::vector<int32_t> local_experts;
    if (sp.placement != nullptr) {
        const std::span<const int32_t> held = sp.placement->local_experts(sp.moe_ep_rank);
        local_experts.assign(held.begin(), held.end());
        w.local_slot_of_expert.assign(static_cast<size_t>(c.n_routed_experts), -1);
        for (size_t slot = 0; slot < local_experts.size(); ++slot)
            w.local_slot_of_expert[static_cast<size_t>(local_experts[slot])] = static_cast<int32_t>(slot);
    } else {
        for (int64_t e = 0; e < c.n_routed_experts; ++e) local_experts.push_back(static_cast<int32_t>(e));
    }
    for (const int32_t e : local_experts) {
        const auto name = [&](ExpertProj proj) {
            std::string n = expert_tensor_name(c, layer, e, proj);
            return n.substr(0, n.size() - std::string(".weight").size());
        };
        EPI_ASSIGN_OR_RETURN(DenseFfnWeights f,
                             b.ffn_named(name(ExpertProj::kGate), name(ExpertProj::kUp),
                                         name(ExpertProj::kDown), sp.moe_tp, sp.moe_tp_rank));
        w.experts.push_back(f);
    }
    const FamilySpec& family = family_spec(c.architecture);
    const bool has_shared = family.shared_mode == SharedExpertMode::kSigmoidGated
                                ? c.shared_expert_intermediate_size > 0
                                : c.n_shared_experts > 0;
    if (family.shared_mode == SharedExpertMode::kNone || !has_shared) return Status::ok();
    w.shared_mode = family.shared_mode;
    EPI_ASSIGN_OR_RETURN(w.shared, b.ffn(prefix + "." + family.shared_name, sp.attn_tp, sp.attn_tp_rank));
    if (family.shared_mode == SharedExpertMode::kSigmoidGated) {
        EPI_ASSIGN_OR_RETURN(w.shared_gate, b.linear(prefix + "." + family.shared_gate_name, false));
    }
    return Status::ok();
}

Status bind_layer(WeightBinder& b, const ModelConfig& c, const ShardPlan& sp, int64_t layer,
                  DecoderLayerWeights& w) {
    const std::string p = layer_prefix(layer);
    const float eps = static_cast<float>(c.rms_norm_eps);
    EPI_ASSIGN_OR_RETURN(w.input_layernorm, b.norm(p + ".input_layernorm.weight", eps));
    EPI_ASSIGN_OR_RETURN(w.post_attention_layernorm, b.norm(p + ".post_attention_layernorm.weight", eps));
    if (c.attention == AttentionKind::kMla) {
        EPI_RETURN_IF_ERROR(bind_mla(b, c, sp, p + ".self_attn", w.mla));
    } else {
        EPI_RETURN_IF_ERROR(bind_gqa(b, c, sp, p + ".self_attn", w.gqa));
    }
    w.is_moe = c.layer_is_moe[static_cast<size_t>(layer)];
    if (w.is_moe) return bind_moe(b, c, sp, layer, w.moe);
    EPI_ASSIGN_OR_RETURN(w.mlp, b.ffn(p + ".mlp", sp.attn_tp, sp.attn_tp_rank));
    return Status::ok();
}

// This rank's place in the layout, as the binder needs it.
Result<ShardPlan> shard_plan(const ModelConfig& c, const ParallelContext* par) {
    ShardPlan sp;
    sp.attention.num_heads = c.num_attention_heads;
    sp.attention.num_kv_heads = c.attention == AttentionKind::kMla ? 0 : c.num_key_value_heads;
    if (par == nullptr) return sp;
    sp.attn_tp = par->layout.attn_tp;
    sp.attn_tp_rank = par->coords.attn_tp_rank;
    sp.moe_tp = par->layout.moe_tp;
    sp.moe_tp_rank = par->coords.moe_tp_rank;
    sp.moe_ep_rank = par->coords.moe_ep_rank;
    if (c.n_routed_experts > 0) sp.placement = &par->placement;
    sp.attention.num_heads = c.num_attention_heads / sp.attn_tp;
    sp.attention.head_begin = sp.attn_tp_rank * sp.attention.num_heads;
    if (c.attention != AttentionKind::kMla) {
        EPI_ASSIGN_OR_RETURN(const ShardRange kv,
                             kv_heads_of_tp_rank(c.num_key_value_heads, sp.attn_tp, sp.attn_tp_rank));
        sp.attention.kv_head_begin = kv.begin;
        sp.attention.num_kv_heads = kv.size;
        sp.attention.full_qk_projection = sp.attn_tp > 1 && c.qk_norm == QkNormKind::kFullProjection;
    }
    return sp;
}

std::vector<TensorInfo> tensor_infos(const Checkpoint& checkpoint) {
    std::vector<TensorInfo> infos;
    for (const std::string& name : checkpoint.names()) infos.push_back(*checkpoint.find(name).info);
    return infos;
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> load_model_weights(const ModelConfig& c, const std::string& model_dir,
                                                         Backend& backend, const ParallelContext* parallel) {
    auto weights = std::make_unique<ModelWeights>();
    EPI_ASSIGN_OR_RETURN(weights->checkpoint, Checkpoint::open(model_dir));
    EPI_RETURN_IF_ERROR_CTX(validate_checkpoint_tensors(c, tensor_infos(*weights->checkpoint)), model_dir);
    EPI_ASSIGN_OR_RETURN(const ShardPlan sp, shard_plan(c, parallel));
    weights->attention_shard = sp.attention;
    PipelineStage stage{0, {0, c.num_hidden_layers}, true, true};
    if (parallel != nullptr) stage = parallel->pipeline_stage;

    WeightBinder b(*weights->checkpoint, backend, weights->owned);
    if (stage.has_embedding || (stage.has_lm_head && c.tie_word_embeddings)) {
        EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry embed, b.entry("model.embed_tokens.weight"));
        EPI_ASSIGN_OR_RETURN(weights->embed_tokens, b.device_data(embed));
        weights->embed_dtype = embed.info->dtype;
    }
    weights->layers.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t l = stage.layers.begin; l < stage.layers.end(); ++l) {
        EPI_RETURN_IF_ERROR_CTX(bind_layer(b, c, sp, l, weights->layers[static_cast<size_t>(l)]),
                                "layer " + std::to_string(l));
    }
    if (stage.has_lm_head) {
        EPI_ASSIGN_OR_RETURN(weights->norm, b.norm("model.norm.weight", static_cast<float>(c.rms_norm_eps)));
        if (c.tie_word_embeddings) {
            weights->lm_head = {weights->embed_tokens, weights->embed_dtype, nullptr,
                                DType::kBF16,          c.vocab_size,         c.hidden_size};
        } else {
            EPI_ASSIGN_OR_RETURN(weights->lm_head, b.linear("lm_head", false));
        }
    }
    EPI_ASSIGN_OR_RETURN(const RopeTable rope, compute_rope_table(c.rope));
    EPI_ASSIGN_OR_RETURN(weights->inv_freq, b.upload_f32(rope.inv_freq));
    weights->rope_attention_scaling = rope.attention_scaling;
    weights->weight_bytes = b.bytes();
    return weights;
}

}  // namespace epinfer
