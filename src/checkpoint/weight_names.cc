// Tensor tables per family, as the transformers 5.17 modules declare them (<Family>Attention, <Family>MLP,
// <Family>TopkRouter, <Family>Experts, shared experts) under the Hub's per-expert names.
#include "checkpoint/weight_names.h"

#include <unordered_map>
#include <unordered_set>

namespace epinfer {

std::string shape_to_string(const std::vector<int64_t>& shape) {
    std::string out = "[";
    for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
}

namespace {

std::string layer_prefix(int64_t layer) {
    return "model.layers." + std::to_string(layer);
}

class TableBuilder {
public:
    explicit TableBuilder(std::vector<ExpectedTensor>& out) : out_(out) {}
    void add(std::string name, std::vector<int64_t> shape, ParamGroup group, int64_t layer = -1,
             int64_t expert = -1) {
        out_.push_back({std::move(name), std::move(shape), group, layer, expert});
    }
    // gate_proj/up_proj [width, H], down_proj [H, width] under `prefix`.
    void add_mlp(const std::string& prefix, int64_t hidden, int64_t width, ParamGroup group, int64_t layer,
                 int64_t expert = -1) {
        add(prefix + ".gate_proj.weight", {width, hidden}, group, layer, expert);
        add(prefix + ".up_proj.weight", {width, hidden}, group, layer, expert);
        add(prefix + ".down_proj.weight", {hidden, width}, group, layer, expert);
    }

private:
    std::vector<ExpectedTensor>& out_;
};

// DeepseekV3Attention / DeepseekV2Attention (MLA).
void add_mla(TableBuilder& t, const ModelConfig& c, int64_t l) {
    const std::string p = layer_prefix(l) + ".self_attn";
    const int64_t h = c.hidden_size, nh = c.num_attention_heads;
    const int64_t qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
    const auto g = ParamGroup::kAttention;
    if (c.q_lora_rank > 0) {
        t.add(p + ".q_a_proj.weight", {c.q_lora_rank, h}, g, l);
        if (c.attention_bias) t.add(p + ".q_a_proj.bias", {c.q_lora_rank}, g, l);
        t.add(p + ".q_a_layernorm.weight", {c.q_lora_rank}, g, l);
        t.add(p + ".q_b_proj.weight", {nh * qk_head_dim, c.q_lora_rank}, g, l);
    } else {
        t.add(p + ".q_proj.weight", {nh * qk_head_dim, h}, g, l);
    }
    t.add(p + ".kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h}, g, l);
    if (c.attention_bias) t.add(p + ".kv_a_proj_with_mqa.bias", {c.kv_lora_rank + c.qk_rope_head_dim}, g, l);
    t.add(p + ".kv_a_layernorm.weight", {c.kv_lora_rank}, g, l);
    t.add(p + ".kv_b_proj.weight", {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, g, l);
    t.add(p + ".o_proj.weight", {h, nh * c.v_head_dim}, g, l);
    if (c.attention_out_bias) t.add(p + ".o_proj.bias", {h}, g, l);
}

// <Family>Attention with q/k/v/o projections (GQA).
void add_gqa(TableBuilder& t, const ModelConfig& c, int64_t l) {
    const std::string p = layer_prefix(l) + ".self_attn";
    const int64_t h = c.hidden_size, q_dim = c.num_attention_heads * c.head_dim;
    const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
    const auto g = ParamGroup::kAttention;
    t.add(p + ".q_proj.weight", {q_dim, h}, g, l);
    if (c.attention_bias) t.add(p + ".q_proj.bias", {q_dim}, g, l);
    t.add(p + ".k_proj.weight", {kv_dim, h}, g, l);
    if (c.attention_bias) t.add(p + ".k_proj.bias", {kv_dim}, g, l);
    t.add(p + ".v_proj.weight", {kv_dim, h}, g, l);
    if (c.attention_bias) t.add(p + ".v_proj.bias", {kv_dim}, g, l);
    t.add(p + ".o_proj.weight", {h, q_dim}, g, l);
    if (c.attention_out_bias) t.add(p + ".o_proj.bias", {h}, g, l);
    if (c.attention_sinks) t.add(p + ".sinks", {c.num_attention_heads}, g, l);  // gpt-oss
    if (c.qk_norm == QkNormKind::kPerHead) {
        t.add(p + ".q_norm.weight", {c.head_dim}, g, l);
        t.add(p + ".k_norm.weight", {c.head_dim}, g, l);
    } else if (c.qk_norm == QkNormKind::kFullProjection) {  // OLMoE: [H] and [(H / Nh)·Nkv]
        t.add(p + ".q_norm.weight", {q_dim}, g, l);
        t.add(p + ".k_norm.weight", {kv_dim}, g, l);
    }
}

// GptOssMLP: router with bias, every expert fused along dim 0 with biases, as transformers holds them
// (the dequantized BF16 checkpoints; the published MXFP4 one stores *_blocks/*_scales instead).
void add_gpt_oss_moe(TableBuilder& t, const ModelConfig& c, int64_t l) {
    const std::string p = moe_block_prefix(c, l);
    const int64_t h = c.hidden_size, e_count = c.n_routed_experts, inter = c.moe_intermediate_size;
    const auto g = ParamGroup::kRoutedExpert;
    t.add(p + ".router.weight", {e_count, h}, ParamGroup::kRouter, l);
    t.add(p + ".router.bias", {e_count}, ParamGroup::kRouter, l);
    t.add(p + ".experts.gate_up_proj", {e_count, h, 2 * inter}, g, l);
    t.add(p + ".experts.gate_up_proj_bias", {e_count, 2 * inter}, g, l);
    t.add(p + ".experts.down_proj", {e_count, inter, h}, g, l);
    t.add(p + ".experts.down_proj_bias", {e_count, h}, g, l);
}

void add_moe(TableBuilder& t, const ModelConfig& c, int64_t l) {
    if (c.architecture == Architecture::kGptOss) return add_gpt_oss_moe(t, c, l);
    const std::string p = moe_block_prefix(c, l);
    const int64_t h = c.hidden_size, e_count = c.n_routed_experts, inter = c.moe_intermediate_size;
    t.add(p + ".gate.weight", {e_count, h}, ParamGroup::kRouter, l);
    if (c.router.has_correction_bias)
        t.add(p + ".gate.e_score_correction_bias", {e_count}, ParamGroup::kRouter, l);
    for (int64_t e = 0; e < e_count; ++e) {
        t.add(expert_tensor_name(c, l, e, ExpertProj::kGate), {inter, h}, ParamGroup::kRoutedExpert, l, e);
        t.add(expert_tensor_name(c, l, e, ExpertProj::kUp), {inter, h}, ParamGroup::kRoutedExpert, l, e);
        t.add(expert_tensor_name(c, l, e, ExpertProj::kDown), {h, inter}, ParamGroup::kRoutedExpert, l, e);
    }
    if (c.n_shared_experts > 0)  // DeepSeek/GLM: one MLP n_shared_experts·I wide
        t.add_mlp(p + ".shared_experts", h, c.n_shared_experts * inter, ParamGroup::kSharedExpert, l);
    if (c.shared_expert_intermediate_size >
        0) {  // Qwen2-MoE: sigmoid(shared_expert_gate(x))·shared_expert(x)
        t.add_mlp(p + ".shared_expert", h, c.shared_expert_intermediate_size, ParamGroup::kSharedExpert, l);
        t.add(p + ".shared_expert_gate.weight", {1, h}, ParamGroup::kSharedExpert, l);
    }
}

// The layer n of a tensor model.layers.{n}.*, or -1 for any other name.
int64_t layer_of(const std::string& name) {
    static const std::string kPrefix = "model.layers.";
    if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
    const size_t dot = name.find('.', kPrefix.size());
    if (dot == std::string::npos || dot == kPrefix.size() || dot - kPrefix.size() > 9) return -1;
    int64_t layer = 0;
    for (size_t i = kPrefix.size(); i < dot; ++i) {
        if (name[i] < '0' || name[i] > '9') return -1;
        layer = layer * 10 + (name[i] - '0');
    }
    return layer;
}

// The MTP projection of layer n: every MTP module of DeepSeek-V3 and GLM-4.5 holds it (beside enorm,
// hnorm, shared_head and a decoder block), no decoder layer does.
std::string mtp_marker_name(int64_t layer) {
    return layer_prefix(layer) + ".eh_proj.weight";
}

// Tensors of an MTP layer model.layers.{n}.*: L ≤ n < L + num_nextn_predict_layers and the checkpoint holds
// that layer's eh_proj. Without it, layer n is a decoder layer that config.json does not count (e.g.
// num_hidden_layers lowered below the checkpoint's layers): its tensors are unexpected, not ignored.
bool is_mtp_tensor(const ModelConfig& c, const std::string& name,
                   const std::unordered_set<std::string>& present) {
    const int64_t layer = layer_of(name);
    return layer >= c.num_hidden_layers && layer < c.num_hidden_layers + c.num_nextn_predict_layers &&
           present.count(mtp_marker_name(layer)) > 0;
}

// Why a tensor of a layer ≥ num_hidden_layers is not expected, for its issue: " (layer 2 >= num_hidden_layers
// 2)", with the MTP marker it lacks when its layer is in the MTP range; "" for a tensor of no such layer.
std::string extra_layer_note(const ModelConfig& c, const std::string& name) {
    const int64_t layer = layer_of(name);
    if (layer < c.num_hidden_layers) return "";
    std::string note =
        " (layer " + std::to_string(layer) + " >= num_hidden_layers " + std::to_string(c.num_hidden_layers);
    if (layer < c.num_hidden_layers + c.num_nextn_predict_layers)
        note += "; not an MTP layer: no " + mtp_marker_name(layer);
    return note + ")";
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

}  // namespace

std::string moe_block_prefix(const ModelConfig& config, int64_t layer) {
    return layer_prefix(layer) +
           (config.architecture == Architecture::kMixtral ? ".block_sparse_moe" : ".mlp");
}

std::string expert_tensor_name(const ModelConfig& config, int64_t layer, int64_t expert, ExpertProj proj) {
    const std::string p = moe_block_prefix(config, layer) + ".experts." + std::to_string(expert);
    if (config.architecture == Architecture::kMixtral) {
        switch (proj) {
            case ExpertProj::kGate:
                return p + ".w1.weight";
            case ExpertProj::kUp:
                return p + ".w3.weight";
            case ExpertProj::kDown:
                return p + ".w2.weight";
        }
    }
    switch (proj) {
        case ExpertProj::kGate:
            return p + ".gate_proj.weight";
        case ExpertProj::kUp:
            return p + ".up_proj.weight";
        case ExpertProj::kDown:
            return p + ".down_proj.weight";
    }
    return p;
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config) {
    const ModelConfig& c = config;
    std::vector<ExpectedTensor> out;
    TableBuilder t(out);
    const int64_t h = c.hidden_size;
    t.add("model.embed_tokens.weight", {c.vocab_size, h}, ParamGroup::kEmbedding);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        t.add(layer_prefix(l) + ".input_layernorm.weight", {h}, ParamGroup::kNorm, l);
        if (c.attention == AttentionKind::kMla)
            add_mla(t, c, l);
        else
            add_gqa(t, c, l);
        t.add(layer_prefix(l) + ".post_attention_layernorm.weight", {h}, ParamGroup::kNorm, l);
        if (c.layer_is_moe[l])
            add_moe(t, c, l);
        else
            t.add_mlp(layer_prefix(l) + ".mlp", h, c.intermediate_size, ParamGroup::kDenseMlp, l);
    }
    t.add("model.norm.weight", {h}, ParamGroup::kNorm);
    if (!c.tie_word_embeddings) t.add("lm_head.weight", {c.vocab_size, h}, ParamGroup::kLmHead);
    return out;
}

ParameterCounts count_parameters(const ModelConfig& config) {
    ParameterCounts n;
    for (const ExpectedTensor& t : expected_tensors(config)) {
        const int64_t count = numel(t.shape);
        n.total += count;
        // A token runs K experts per MoE layer; all experts of a layer have the same size. A fused tensor
        // of all E experts (expert −1, gpt-oss) counts K/E of itself.
        if (t.group == ParamGroup::kRoutedExpert && t.expert < 0) {
            n.active += count / config.n_routed_experts * config.router.num_experts_per_tok;
        } else if (t.expert < config.router.num_experts_per_tok) {
            n.active += count;
        }
        switch (t.group) {
            case ParamGroup::kEmbedding:
                n.embedding += count;
                break;
            case ParamGroup::kLmHead:
                n.lm_head += count;
                break;
            case ParamGroup::kNorm:
                n.norms += count;
                break;
            case ParamGroup::kAttention:
                n.attention += count;
                break;
            case ParamGroup::kDenseMlp:
                n.dense_mlp += count;
                break;
            case ParamGroup::kRouter:
                n.router += count;
                break;
            case ParamGroup::kSharedExpert:
                n.shared_experts += count;
                break;
            case ParamGroup::kRoutedExpert:
                n.routed_experts += count;
                break;
        }
    }
    return n;
}

std::vector<TensorIssue> check_checkpoint_tensors(const ModelConfig& config,
                                                  const std::vector<TensorInfo>& tensors) {
    using Kind = TensorIssue::Kind;
    const std::vector<ExpectedTensor> expected = expected_tensors(config);
    std::unordered_map<std::string, const ExpectedTensor*> by_name;
    by_name.reserve(expected.size());
    for (const ExpectedTensor& t : expected) by_name.emplace(t.name, &t);
    std::unordered_set<std::string> present;
    present.reserve(tensors.size());
    for (const TensorInfo& t : tensors) present.insert(t.name);

    std::vector<TensorIssue> issues;
    for (const ExpectedTensor& t : expected) {
        if (present.count(t.name) == 0)
            issues.push_back({Kind::kMissing, t.name,
                              t.name + ": missing (expected shape " + shape_to_string(t.shape) + ")"});
    }
    const std::vector<int64_t> lm_head_shape = {config.vocab_size, config.hidden_size};
    for (const TensorInfo& t : tensors) {
        const auto it = by_name.find(t.name);
        const bool tied_lm_head =
            it == by_name.end() && config.tie_word_embeddings && t.name == "lm_head.weight";
        if (it == by_name.end() && !tied_lm_head) {
            if (is_mtp_tensor(config, t.name, present) || ends_with(t.name, ".inv_freq")) continue;
            issues.push_back({Kind::kUnexpected, t.name,
                              t.name + ": unexpected tensor (shape " + shape_to_string(t.shape) + ", " +
                                  dtype_name(t.dtype) + ") not in the " +
                                  architecture_name(config.architecture) + " layout of config.json" +
                                  extra_layer_note(config, t.name)});
            continue;
        }
        const std::vector<int64_t>& want = tied_lm_head ? lm_head_shape : it->second->shape;
        if (t.shape != want) {
            issues.push_back(
                {Kind::kWrongShape, t.name,
                 t.name + ": shape " + shape_to_string(t.shape) + ", expected " + shape_to_string(want)});
        } else if (!dtype_is_float_weight(t.dtype)) {
            issues.push_back(
                {Kind::kWrongDtype, t.name,
                 t.name + ": dtype " + dtype_name(t.dtype) + " is not supported (F32, F16 or BF16)"});
        }
    }
    return issues;
}

Status validate_checkpoint_tensors(const ModelConfig& config, const std::vector<TensorInfo>& tensors) {
    const std::vector<TensorIssue> issues = check_checkpoint_tensors(config, tensors);
    if (issues.empty()) return Status::ok();
    const TensorIssue& first = issues.front();
    std::string message = first.message;
    if (issues.size() == 2) message += " (and 1 more tensor issue)";
    if (issues.size() > 2) message += " (and " + std::to_string(issues.size() - 1) + " more tensor issues)";
    switch (first.kind) {
        case TensorIssue::Kind::kMissing:
            return not_found(message);
        case TensorIssue::Kind::kWrongDtype:
            return not_supported(message);
        default:
            return invalid_argument(message);
    }
}

}  // namespace epinfer
