#include "models/model_weights.h"

#include <string>

#include "checkpoint/weight_names.h"
#include "models/model_registry.h"
#include "models/rope_table.h"

namespace epinfer {

namespace {

// transformers builds DeepseekV3RMSNorm(q_lora_rank) and DeepseekV3RMSNorm(kv_lora_rank) without eps:
// the MLA latent norms use the class default, not rms_norm_eps.
constexpr float kMlaLatentNormEps = 1e-6f;

std::string layer_prefix(int64_t layer) {
    return "model.layers." + std::to_string(layer);
}

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

    Result<const void*> device_data(const Checkpoint::Entry& e) {
        if (backend_.host_accessible()) return e.data();
        EPI_ASSIGN_OR_RETURN(DeviceBuffer copy, DeviceBuffer::alloc(backend_, e.info->num_bytes()));
        EPI_RETURN_IF_ERROR(backend_.copy_to_device(copy.data(), e.data(), e.info->num_bytes()));
        owned_.push_back(std::move(copy));
        return static_cast<const void*>(owned_.back().data());
    }

    // PREFIX.weight [N, K] and, when with_bias, PREFIX.bias [N].
    Result<Linear> linear(const std::string& prefix, bool with_bias) {
        EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry w, entry(prefix + ".weight"));
        if (w.info->shape.size() != 2)
            return invalid_argument(checkpoint_.dir() + ": '" + prefix + ".weight' is not 2-D");
        Linear lin;
        EPI_ASSIGN_OR_RETURN(lin.weight, device_data(w));
        lin.dtype = w.info->dtype;
        lin.out_features = w.info->shape[0];
        lin.in_features = w.info->shape[1];
        if (with_bias) {
            EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry b, entry(prefix + ".bias"));
            EPI_ASSIGN_OR_RETURN(lin.bias, device_data(b));
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

    Result<DenseFfnWeights> ffn(const std::string& prefix) {
        DenseFfnWeights f;
        EPI_ASSIGN_OR_RETURN(f.gate_proj, linear(prefix + ".gate_proj", false));
        EPI_ASSIGN_OR_RETURN(f.up_proj, linear(prefix + ".up_proj", false));
        EPI_ASSIGN_OR_RETURN(f.down_proj, linear(prefix + ".down_proj", false));
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
        std::vector<float> host(static_cast<size_t>(e.info->numel()));
        convert_to_f32(e.info->dtype, e.data(), host.data(), host.size());
        return upload_f32(host);
    }

private:
    const Checkpoint& checkpoint_;
    Backend& backend_;
    std::vector<DeviceBuffer>& owned_;
};

Status bind_gqa(WeightBinder& b, const ModelConfig& c, const std::string& p, GqaAttentionWeights& w) {
    EPI_ASSIGN_OR_RETURN(w.q_proj, b.linear(p + ".q_proj", c.attention_bias));
    EPI_ASSIGN_OR_RETURN(w.k_proj, b.linear(p + ".k_proj", c.attention_bias));
    EPI_ASSIGN_OR_RETURN(w.v_proj, b.linear(p + ".v_proj", c.attention_bias));
    EPI_ASSIGN_OR_RETURN(w.o_proj, b.linear(p + ".o_proj", c.attention_out_bias));
    if (c.qk_norm != QkNormKind::kNone) {
        const float eps = static_cast<float>(c.rms_norm_eps);
        EPI_ASSIGN_OR_RETURN(w.q_norm, b.norm(p + ".q_norm.weight", eps));
        EPI_ASSIGN_OR_RETURN(w.k_norm, b.norm(p + ".k_norm.weight", eps));
    }
    return Status::ok();
}

Status bind_mla(WeightBinder& b, const ModelConfig& c, const std::string& p, MlaAttentionWeights& w) {
    if (c.q_lora_rank > 0) {
        EPI_ASSIGN_OR_RETURN(w.q_a_proj, b.linear(p + ".q_a_proj", c.attention_bias));
        EPI_ASSIGN_OR_RETURN(w.q_a_layernorm, b.norm(p + ".q_a_layernorm.weight", kMlaLatentNormEps));
        EPI_ASSIGN_OR_RETURN(w.q_b_proj, b.linear(p + ".q_b_proj", false));
    } else {
        EPI_ASSIGN_OR_RETURN(w.q_proj, b.linear(p + ".q_proj", false));
    }
    EPI_ASSIGN_OR_RETURN(w.kv_a_proj_with_mqa, b.linear(p + ".kv_a_proj_with_mqa", c.attention_bias));
    EPI_ASSIGN_OR_RETURN(w.kv_a_layernorm, b.norm(p + ".kv_a_layernorm.weight", kMlaLatentNormEps));
    EPI_ASSIGN_OR_RETURN(w.kv_b_proj, b.linear(p + ".kv_b_proj", false));
    EPI_ASSIGN_OR_RETURN(w.o_proj, b.linear(p + ".o_proj", c.attention_out_bias));
    return Status::ok();
}

Status bind_moe(WeightBinder& b, const ModelConfig& c, int64_t layer, MoeBlockWeights& w) {
    const std::string prefix = moe_block_prefix(c, layer);
    EPI_ASSIGN_OR_RETURN(w.router, b.linear(prefix + ".gate", false));
    if (c.router.has_correction_bias) {
        EPI_ASSIGN_OR_RETURN(w.e_score_correction_bias,
                             b.vector_f32(prefix + ".gate.e_score_correction_bias"));
    }
    w.experts.resize(static_cast<size_t>(c.n_routed_experts));
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        DenseFfnWeights& f = w.experts[static_cast<size_t>(e)];
        const auto name = [&](ExpertProj proj) {
            std::string n = expert_tensor_name(c, layer, e, proj);
            return n.substr(0, n.size() - std::string(".weight").size());
        };
        EPI_ASSIGN_OR_RETURN(f.gate_proj, b.linear(name(ExpertProj::kGate), false));
        EPI_ASSIGN_OR_RETURN(f.up_proj, b.linear(name(ExpertProj::kUp), false));
        EPI_ASSIGN_OR_RETURN(f.down_proj, b.linear(name(ExpertProj::kDown), false));
    }
    const FamilySpec& family = family_spec(c.architecture);
    const bool has_shared = family.shared_mode == SharedExpertMode::kSigmoidGated
                                ? c.shared_expert_intermediate_size > 0
                                : c.n_shared_experts > 0;
    if (family.shared_mode == SharedExpertMode::kNone || !has_shared) return Status::ok();
    w.shared_mode = family.shared_mode;
    EPI_ASSIGN_OR_RETURN(w.shared, b.ffn(prefix + "." + family.shared_name));
    if (family.shared_mode == SharedExpertMode::kSigmoidGated) {
        EPI_ASSIGN_OR_RETURN(w.shared_gate, b.linear(prefix + "." + family.shared_gate_name, false));
    }
    return Status::ok();
}

Status bind_layer(WeightBinder& b, const ModelConfig& c, int64_t layer, DecoderLayerWeights& w) {
    const std::string p = layer_prefix(layer);
    const float eps = static_cast<float>(c.rms_norm_eps);
    EPI_ASSIGN_OR_RETURN(w.input_layernorm, b.norm(p + ".input_layernorm.weight", eps));
    EPI_ASSIGN_OR_RETURN(w.post_attention_layernorm, b.norm(p + ".post_attention_layernorm.weight", eps));
    if (c.attention == AttentionKind::kMla) {
        EPI_RETURN_IF_ERROR(bind_mla(b, c, p + ".self_attn", w.mla));
    } else {
        EPI_RETURN_IF_ERROR(bind_gqa(b, c, p + ".self_attn", w.gqa));
    }
    w.is_moe = c.layer_is_moe[static_cast<size_t>(layer)];
    if (w.is_moe) return bind_moe(b, c, layer, w.moe);
    EPI_ASSIGN_OR_RETURN(w.mlp, b.ffn(p + ".mlp"));
    return Status::ok();
}

std::vector<TensorInfo> tensor_infos(const Checkpoint& checkpoint) {
    std::vector<TensorInfo> infos;
    for (const std::string& name : checkpoint.names()) infos.push_back(*checkpoint.find(name).info);
    return infos;
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> load_model_weights(const ModelConfig& c, const std::string& model_dir,
                                                         Backend& backend) {
    auto weights = std::make_unique<ModelWeights>();
    EPI_ASSIGN_OR_RETURN(weights->checkpoint, Checkpoint::open(model_dir));
    EPI_RETURN_IF_ERROR_CTX(validate_checkpoint_tensors(c, tensor_infos(*weights->checkpoint)), model_dir);

    WeightBinder b(*weights->checkpoint, backend, weights->owned);
    EPI_ASSIGN_OR_RETURN(const Checkpoint::Entry embed, b.entry("model.embed_tokens.weight"));
    EPI_ASSIGN_OR_RETURN(weights->embed_tokens, b.device_data(embed));
    weights->embed_dtype = embed.info->dtype;
    weights->layers.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        EPI_RETURN_IF_ERROR_CTX(bind_layer(b, c, l, weights->layers[static_cast<size_t>(l)]),
                                "layer " + std::to_string(l));
    }
    EPI_ASSIGN_OR_RETURN(weights->norm, b.norm("model.norm.weight", static_cast<float>(c.rms_norm_eps)));
    if (c.tie_word_embeddings) {
        weights->lm_head = {weights->embed_tokens, weights->embed_dtype, nullptr,
                            DType::kBF16,          c.vocab_size,         c.hidden_size};
    } else {
        EPI_ASSIGN_OR_RETURN(weights->lm_head, b.linear("lm_head", false));
    }
    EPI_ASSIGN_OR_RETURN(const RopeTable rope, compute_rope_table(c.rope));
    EPI_ASSIGN_OR_RETURN(weights->inv_freq, b.upload_f32(rope.inv_freq));
    weights->rope_attention_scaling = rope.attention_scaling;
    return weights;
}

}  // namespace epinfer
