#include "models/model_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
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

// The checkpoint as a tensor source: its mmap in place, slices copied out of it (only the slice is read).
class CheckpointSource final : public TensorSource {
public:
    CheckpointSource(const Checkpoint& checkpoint, Backend& backend)
        : checkpoint_(checkpoint), backend_(backend) {}
    const std::string& name() const override { return checkpoint_.dir(); }
    const TensorInfo* find(const std::string& name) const override { return checkpoint_.find(name).info; }
    const void* host_data(const TensorInfo& info) const override {
        return checkpoint_.find(info.name).data();
    }
    Status write_to_device(const TensorInfo& info, const TensorSlice& slice, void* dst) override {
        if (slice.dim < 0) return backend_.copy_to_device(dst, host_data(info), info.num_bytes());
        std::vector<unsigned char> host(tensor_slice_bytes(info, slice));
        EPI_RETURN_IF_ERROR(read_to_host(info, slice, host.data()));
        return backend_.copy_to_device(dst, host.data(), host.size());
    }
    Status read_to_host(const TensorInfo& info, const TensorSlice& slice, void* dst) override {
        if (slice.dim < 0) {
            std::memcpy(dst, host_data(info), info.num_bytes());
        } else {
            copy_tensor_slice(host_data(info), info.shape, dtype_size(info.dtype), slice, dst);
        }
        return Status::ok();
    }

private:
    const Checkpoint& checkpoint_;
    Backend& backend_;
};

// Turns source tensors into device views: the mmap itself on host backends, copies otherwise (always for
// random weights). A dry run only counts the bytes (for the progress total) and binds placeholders.
class WeightBinder {
public:
    WeightBinder(TensorSource& source, Backend& backend, std::vector<DeviceBuffer>& owned, bool dry_run,
                 const LoadProgress* progress, int64_t bytes_total)
        : source_(source),
          backend_(backend),
          owned_(owned),
          dry_run_(dry_run),
          progress_(dry_run ? nullptr : progress),
          bytes_total_(bytes_total) {}

    Result<const TensorInfo*> entry(const std::string& name) const {
        const TensorInfo* info = source_.find(name);
        if (info == nullptr) return not_found(source_.name() + ": tensor '" + name + "' is missing");
        return info;
    }

    int64_t bytes() const { return bytes_; }

    Result<const void*> device_data(const TensorInfo& info) { return slice_data(info, TensorSlice{}); }

    // `slice` of a tensor (the whole tensor when slice.dim < 0): in place when the source has it in host
    // memory and the backend reads host memory, else copied (only the slice is read).
    Result<const void*> slice_data(const TensorInfo& info, const TensorSlice& slice) {
        EPI_ASSIGN_OR_RETURN(std::vector<const void*> data, stacked_data({{&info, slice}}));
        return data[0];
    }

    // A part of a stack of linears: PREFIX.weight [N, K] and PREFIX.bias [N], the part `shard` of them.
    struct LinearPart {
        std::string prefix;
        LinearShard shard;
    };

    // PREFIX.weight [N, K] and, when with_bias, PREFIX.bias [N]; the part `shard` of them.
    Result<Linear> linear(const std::string& prefix, bool with_bias, const LinearShard& shard = {}) {
        EPI_ASSIGN_OR_RETURN(std::vector<Linear> one, linears({{prefix, shard}}, with_bias));
        return one[0];
    }

    // linear() of each part, their weights copied one right after another into one device allocation (and
    // their biases into another), so that a matmul_group of them may run as one matmul of the concatenated
    // weights (op_args.h MatmulGroupArgs; vLLM's QKVParallelLinear concatenates q, k and v at load too).
    Result<std::vector<Linear>> linears(const std::vector<LinearPart>& parts, bool with_bias) {
        std::vector<Piece> weights, biases;
        for (const LinearPart& part : parts) {
            EPI_ASSIGN_OR_RETURN(const TensorInfo* w, entry(part.prefix + ".weight"));
            if (w->shape.size() != 2)
                return invalid_argument(source_.name() + ": '" + part.prefix + ".weight' is not 2-D");
            weights.push_back({w, TensorSlice{part.shard.dim, part.shard.range}});
            if (with_bias && part.shard.keep_bias) {
                EPI_ASSIGN_OR_RETURN(const TensorInfo* b, entry(part.prefix + ".bias"));
                biases.push_back({b, part.shard.dim == 0 ? TensorSlice{0, part.shard.range} : TensorSlice{}});
            }
        }
        EPI_ASSIGN_OR_RETURN(std::vector<const void*> weight_data, stacked_data(weights));
        EPI_ASSIGN_OR_RETURN(std::vector<const void*> bias_data, stacked_data(biases));
        std::vector<Linear> out;
        size_t next_bias = 0;
        for (size_t i = 0; i < parts.size(); ++i) {
            const LinearShard& shard = parts[i].shard;
            const TensorInfo& w = *weights[i].info;
            Linear lin;
            lin.weight = weight_data[i];
            lin.dtype = w.dtype;
            lin.out_features = shard.dim == 0 ? shard.range.size : w.shape[0];
            lin.in_features = shard.dim == 1 ? shard.range.size : w.shape[1];
            if (with_bias && shard.keep_bias) {
                lin.bias = bias_data[next_bias];
                lin.bias_dtype = biases[next_bias++].info->dtype;
            }
            out.push_back(lin);
        }
        return out;
    }

    Result<RmsNormWeight> norm(const std::string& name, float eps) {
        EPI_ASSIGN_OR_RETURN(const TensorInfo* w, entry(name));
        RmsNormWeight norm;
        EPI_ASSIGN_OR_RETURN(norm.weight, device_data(*w));
        norm.dtype = w->dtype;
        norm.width = w->numel();
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
        EPI_ASSIGN_OR_RETURN(const TensorInfo* g, entry(gate + ".weight"));
        const int64_t I = g->shape.empty() ? 0 : g->shape[0];
        if (I % tp != 0) {
            return invalid_argument(
                fmt::format("{}: '{}.weight': intermediate size {} does not split over TP {}", source_.name(),
                            gate, I, tp));
        }
        const int64_t part = I / tp;
        EPI_ASSIGN_OR_RETURN(f.gate_proj, linear(gate, false, rows_shard(tp_rank * part, part)));
        EPI_ASSIGN_OR_RETURN(f.up_proj, linear(up, false, rows_shard(tp_rank * part, part)));
        EPI_ASSIGN_OR_RETURN(f.down_proj, linear(down, false, cols_shard(tp_rank * part, part, true)));
        return f;
    }

    // fp32 device copy of host values.
    Result<const float*> upload_f32(const std::vector<float>& values) {
        if (dry_run_) return reinterpret_cast<const float*>(&kPlaceholder);
        EPI_ASSIGN_OR_RETURN(DeviceBuffer buf,
                             DeviceBuffer::alloc_f32(backend_, static_cast<int64_t>(values.size())));
        EPI_RETURN_IF_ERROR(backend_.copy_to_device(buf.data(), values.data(), buf.num_bytes()));
        owned_.push_back(std::move(buf));
        return static_cast<const float*>(owned_.back().f32());
    }

    // A 1-D F32/F16/BF16 tensor converted to fp32 on the device.
    Result<const float*> vector_f32(const std::string& name) {
        EPI_ASSIGN_OR_RETURN(const TensorInfo* e, entry(name));
        if (dry_run_) {
            add_bytes(e->num_bytes());
            return reinterpret_cast<const float*>(&kPlaceholder);
        }
        std::vector<unsigned char> raw(e->num_bytes());
        EPI_RETURN_IF_ERROR(source_.read_to_host(*e, TensorSlice{}, raw.data()));
        std::vector<float> host(static_cast<size_t>(e->numel()));
        convert_to_f32(e->dtype, raw.data(), host.data(), host.size());
        EPI_ASSIGN_OR_RETURN(const float* dev, upload_f32(host));
        add_bytes(e->num_bytes());
        return dev;
    }

private:
    // Placeholder target of a dry run's views (never read).
    static constexpr float kPlaceholder = 0.0f;

    // `slice` of a tensor (the whole tensor when slice.dim < 0).
    struct Piece {
        const TensorInfo* info = nullptr;
        TensorSlice slice;
    };

    // The pieces' data: in place where the source has a whole tensor in host memory and the backend reads
    // host memory; else copies (only the slices are read), one right after another in one allocation when
    // every piece is copied and all share a dtype (one allocation each otherwise). A dry run only counts the
    // bytes.
    Result<std::vector<const void*>> stacked_data(const std::vector<Piece>& pieces) {
        size_t total = 0;
        for (const Piece& p : pieces) {
            const std::vector<int64_t>& shape = p.info->shape;
            const TensorSlice& slice = p.slice;
            if (slice.dim >= 0 && slice.range.end() > shape[static_cast<size_t>(slice.dim)]) {
                return invalid_argument(
                    fmt::format("{}: '{}': slice [{}, {}) of dimension {} exceeds its size {}",
                                source_.name(), p.info->name, slice.range.begin, slice.range.end(), slice.dim,
                                shape[static_cast<size_t>(slice.dim)]));
            }
            total += tensor_slice_bytes(*p.info, slice);
        }
        const auto in_place = [&](const Piece& p) -> const void* {
            return p.slice.dim < 0 && backend_.host_accessible() ? source_.host_data(*p.info) : nullptr;
        };
        const bool stackable =
            !dry_run_ && pieces.size() > 1 && std::all_of(pieces.begin(), pieces.end(), [&](const Piece& p) {
                return p.info->dtype == pieces[0].info->dtype && in_place(p) == nullptr;
            });
        unsigned char* stack = nullptr;
        if (stackable) {
            EPI_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::alloc(backend_, total));
            stack = static_cast<unsigned char*>(buffer.data());
            owned_.push_back(std::move(buffer));
        }
        std::vector<const void*> out;
        for (const Piece& p : pieces) {
            const size_t bytes = tensor_slice_bytes(*p.info, p.slice);
            if (dry_run_) {
                out.push_back(&kPlaceholder);
            } else if (in_place(p) != nullptr) {
                out.push_back(in_place(p));
            } else if (stack != nullptr) {
                EPI_RETURN_IF_ERROR(source_.write_to_device(*p.info, p.slice, stack));
                out.push_back(stack);
                stack += bytes;
            } else {
                EPI_ASSIGN_OR_RETURN(DeviceBuffer copy, DeviceBuffer::alloc(backend_, bytes));
                EPI_RETURN_IF_ERROR(source_.write_to_device(*p.info, p.slice, copy.data()));
                owned_.push_back(std::move(copy));
                out.push_back(owned_.back().data());
            }
            add_bytes(bytes);
        }
        return out;
    }

    void add_bytes(size_t bytes) {
        bytes_ += static_cast<int64_t>(bytes);
        if (progress_ != nullptr && *progress_) (*progress_)(std::min(bytes_, bytes_total_), bytes_total_);
    }

    TensorSource& source_;
    Backend& backend_;
    std::vector<DeviceBuffer>& owned_;
    bool dry_run_;
    const LoadProgress* progress_;
    int64_t bytes_total_;
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
    // Stacked, so that the projections run as one matmul (attention_gqa.cc).
    EPI_ASSIGN_OR_RETURN(
        std::vector<Linear> qkv,
        b.linears({{p + ".q_proj", q_rows}, {p + ".k_proj", k_rows}, {p + ".v_proj", kv_rows}},
                  c.attention_bias));
    w.q_proj = qkv[0];
    w.k_proj = qkv[1];
    w.v_proj = qkv[2];
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
        w.first_local_expert = local_experts.empty() ? 0 : local_experts.front();
        for (size_t slot = 0; slot < local_experts.size(); ++slot) {
            if (local_experts[slot] != w.first_local_expert + static_cast<int64_t>(slot))
                return internal_error("moe: the expert placement of ep rank " + std::to_string(sp.moe_ep_rank) +
                                      " is not one contiguous block (the experts op takes one)");
        }
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

// Binds every weight this rank holds into `weights` (everything but checkpoint and attention_shard).
Status bind_weights(WeightBinder& b, const ModelConfig& c, const ShardPlan& sp, const PipelineStage& stage,
                    ModelWeights& weights) {
    if (stage.layers.end() > c.num_hidden_layers) {
        return invalid_argument(fmt::format("pipeline stage layers [{}, {}) exceed the config's {} layers",
                                            stage.layers.begin, stage.layers.end(), c.num_hidden_layers));
    }
    if (stage.has_embedding || (stage.has_lm_head && c.tie_word_embeddings)) {
        EPI_ASSIGN_OR_RETURN(const TensorInfo* embed, b.entry("model.embed_tokens.weight"));
        EPI_ASSIGN_OR_RETURN(weights.embed_tokens, b.device_data(*embed));
        weights.embed_dtype = embed->dtype;
    }
    weights.layers.assign(static_cast<size_t>(c.num_hidden_layers), DecoderLayerWeights{});
    for (int64_t l = stage.layers.begin; l < stage.layers.end(); ++l) {
        EPI_RETURN_IF_ERROR_CTX(bind_layer(b, c, sp, l, weights.layers[static_cast<size_t>(l)]),
                                "layer " + std::to_string(l));
    }
    if (stage.has_lm_head) {
        EPI_ASSIGN_OR_RETURN(weights.norm, b.norm("model.norm.weight", static_cast<float>(c.rms_norm_eps)));
        if (c.tie_word_embeddings) {
            weights.lm_head = {weights.embed_tokens, weights.embed_dtype, nullptr,
                               DType::kBF16,         c.vocab_size,        c.hidden_size};
        } else {
            EPI_ASSIGN_OR_RETURN(weights.lm_head, b.linear("lm_head", false));
        }
    }
    EPI_ASSIGN_OR_RETURN(const RopeTable rope, compute_rope_table(c.rope));
    EPI_ASSIGN_OR_RETURN(weights.inv_freq, b.upload_f32(rope.inv_freq));
    weights.rope_attention_scaling = rope.attention_scaling;
    weights.weight_bytes = b.bytes();
    return Status::ok();
}

// Binds the weights from `source`: a dry run for the byte total, then the real one with progress.
Status bind_from_source(TensorSource& source, const ModelConfig& c, Backend& backend,
                        const ParallelContext* parallel, const LoadProgress* progress,
                        ModelWeights& weights) {
    EPI_ASSIGN_OR_RETURN(const ShardPlan sp, shard_plan(c, parallel));
    weights.attention_shard = sp.attention;
    PipelineStage stage{0, {0, c.num_hidden_layers}, true, true};
    if (parallel != nullptr) stage = parallel->pipeline_stage;
    int64_t bytes_total = 0;
    if (progress != nullptr && *progress) {
        ModelWeights scratch;
        WeightBinder dry(source, backend, scratch.owned, /*dry_run=*/true, nullptr, 0);
        EPI_RETURN_IF_ERROR(bind_weights(dry, c, sp, stage, scratch));
        bytes_total = scratch.weight_bytes;
        (*progress)(0, bytes_total);
    }
    WeightBinder b(source, backend, weights.owned, /*dry_run=*/false, progress, bytes_total);
    EPI_RETURN_IF_ERROR(bind_weights(b, c, sp, stage, weights));
    if (progress != nullptr && *progress) (*progress)(bytes_total, bytes_total);
    return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> load_model_weights(const ModelConfig& c, const std::string& model_dir,
                                                         Backend& backend, const ParallelContext* parallel,
                                                         const LoadProgress* progress) {
    auto weights = std::make_unique<ModelWeights>();
    EPI_ASSIGN_OR_RETURN(weights->checkpoint, Checkpoint::open(model_dir));
    EPI_RETURN_IF_ERROR_CTX(validate_checkpoint_tensors(c, tensor_infos(*weights->checkpoint)), model_dir);
    CheckpointSource source(*weights->checkpoint, backend);
    EPI_RETURN_IF_ERROR(bind_from_source(source, c, backend, parallel, progress, *weights));
    return weights;
}

Result<std::unique_ptr<ModelWeights>> bind_model_weights(TensorSource& source, const ModelConfig& c,
                                                         Backend& backend, const ParallelContext* parallel,
                                                         const LoadProgress* progress) {
    auto weights = std::make_unique<ModelWeights>();
    EPI_RETURN_IF_ERROR(bind_from_source(source, c, backend, parallel, progress, *weights));
    return weights;
}

}  // namespace epinfer
