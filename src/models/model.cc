#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "models/model_decode_graph.h"
#include "models/model_registry.h"
#include "models/model_weights.h"
#include "models/random_weights.h"
#include "models/rope_table.h"
#include "parallel/sharding.h"

namespace epinfer {

namespace {

// DP attention where a moe_tp group spans DP groups (moe_tp not dividing attn_tp) gathers the stage's tokens
// on host memory (layers/moe/moe_block.h).
Status check_parallel_backend(const ParallelContext* parallel, const Backend& backend) {
    if (parallel == nullptr || !parallel->dp_attention() || backend.host_accessible()) return Status::ok();
    const ParallelLayout& l = parallel->layout;
    if (l.attn_tp % l.moe_tp == 0) return Status::ok();
    return not_supported("DP attention (--dp " + std::to_string(l.attn_dp) + ") with MoE TP " +
                         std::to_string(l.moe_tp) + " not dividing attention TP " + std::to_string(l.attn_tp) +
                         " gathers tokens on host memory; backend " + backend.name() +
                         " needs --ep so that MoE TP divides attention TP");
}

GqaAttentionParams gqa_params(const ModelConfig& c, const ModelWeights& w) {
    const AttentionShard& shard = w.attention_shard;
    GqaAttentionParams p;
    p.num_heads = shard.num_heads;
    p.num_kv_heads = shard.num_kv_heads;
    p.head_dim = c.head_dim;
    p.qk_norm = c.qk_norm == QkNormKind::kPerHead          ? QkNormMode::kPerHead
                : c.qk_norm == QkNormKind::kFullProjection ? QkNormMode::kFullProjection
                                                           : QkNormMode::kNone;
    p.rotary_dim = c.rope.rotary_dim;
    p.rope_interleaved = c.rope.interleaved;
    p.inv_freq = w.inv_freq;
    p.rope_attention_scaling = w.rope_attention_scaling;
    p.softmax_scale = static_cast<float>(std::pow(static_cast<double>(c.head_dim), -0.5));
    if (shard.full_qk_projection) {
        p.full_num_heads = c.num_attention_heads;
        p.full_num_kv_heads = c.num_key_value_heads;
        p.head_begin = shard.head_begin;
        p.kv_head_begin = shard.kv_head_begin;
    }
    return p;
}

MlaAttentionParams mla_params(const ModelConfig& c, const ModelWeights& w, const Backend& backend) {
    MlaAttentionParams p;
    p.num_heads = w.attention_shard.num_heads;
    p.q_lora_rank = c.q_lora_rank;
    p.kv_lora_rank = c.kv_lora_rank;
    p.qk_nope_head_dim = c.qk_nope_head_dim;
    p.qk_rope_head_dim = c.qk_rope_head_dim;
    p.v_head_dim = c.v_head_dim;
    p.rope_interleaved = c.rope.interleaved;
    p.inv_freq = w.inv_freq;
    p.rope_attention_scaling = w.rope_attention_scaling;
    p.softmax_scale = mla_softmax_scale(c);
    p.absorb_max_rows = mla_absorb_max_rows(c, backend);
    return p;
}

MoeRouterParams router_params(const ModelConfig& c) {
    MoeRouterParams p;
    p.top_k = c.router.num_experts_per_tok;
    p.scoring_func = c.router.scoring_func;
    p.topk_method = c.router.topk_method;
    p.n_group = c.router.n_group;
    p.topk_group = c.router.topk_group;
    p.norm_topk_prob = c.router.norm_topk_prob;
    p.routed_scaling_factor = static_cast<float>(c.router.routed_scaling_factor);
    return p;
}

Status add_in_place(Backend& backend, float* acc, const float* x, int64_t num_elements) {
    AddArgs args;
    args.a = acc;
    args.b = x;
    args.out = acc;
    args.num_elements = num_elements;
    return backend.add(args);
}

// Runs `observer` on a host copy of rows [T, H] of device memory.
Status observe(Backend& backend, const LayerObserver* observer, std::string_view what, int64_t layer,
               const float* rows, int64_t num_rows, int64_t hidden) {
    if (observer == nullptr) return Status::ok();
    std::vector<float> host(static_cast<size_t>(num_rows * hidden));
    EPI_RETURN_IF_ERROR(backend.copy_to_host(host.data(), rows, host.size() * sizeof(float)));
    (*observer)(what, layer, host.data(), num_rows);
    return Status::ok();
}

}  // namespace

LayoutModelDims layout_model_dims(const ModelConfig& c) {
    LayoutModelDims d;
    d.num_hidden_layers = c.num_hidden_layers;
    d.num_attention_heads = c.num_attention_heads;
    d.num_key_value_heads = c.attention == AttentionKind::kMla ? 0 : c.num_key_value_heads;
    d.n_routed_experts = c.n_routed_experts;
    d.moe_intermediate_size = c.moe_intermediate_size;
    const bool has_dense =
        std::find(c.layer_is_moe.begin(), c.layer_is_moe.end(), false) != c.layer_is_moe.end();
    d.dense_intermediate_size = has_dense ? c.intermediate_size : 0;
    const SharedExpertMode mode = family_spec(c.architecture).shared_mode;
    if (mode == SharedExpertMode::kSigmoidGated) {
        d.shared_intermediate_size = c.shared_expert_intermediate_size;
    } else if (mode == SharedExpertMode::kUnweighted) {
        d.shared_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
    }
    return d;
}

int64_t mla_absorb_max_rows(const ModelConfig& c, const Backend& backend) {
    // Every chunk absorbed where the backend's latent kernel is the faster one, else by multiply-adds.
    if (backend.has_latent_attention_kernel()) return std::numeric_limits<int64_t>::max();
    MlaAttentionParams p;
    p.kv_lora_rank = c.kv_lora_rank;
    p.qk_nope_head_dim = c.qk_nope_head_dim;
    p.v_head_dim = c.v_head_dim;
    return mla_absorb_max_rows(p);
}

Model::~Model() = default;

int64_t Model::weight_bytes() const {
    return weights_->weight_bytes;
}

Result<ModelConfig> config_first_layers(const ModelConfig& config, int64_t num_layers) {
    if (num_layers < 0 || num_layers > config.num_hidden_layers) {
        return invalid_argument("num_layers " + std::to_string(num_layers) + ": must be in [0, " +
                                std::to_string(config.num_hidden_layers) +
                                "] (num_hidden_layers of the config)");
    }
    ModelConfig c = config;
    if (num_layers == 0) return c;
    c.num_hidden_layers = num_layers;
    c.layer_is_moe.resize(static_cast<size_t>(num_layers));
    return c;
}

Result<std::unique_ptr<Model>> Model::create_random(const ModelConfig& config, Backend& backend,
                                                    const RandomWeightsOptions& options,
                                                    const ParallelContext* parallel,
                                                    const LoadProgress* progress) {
    EPI_RETURN_IF_ERROR(check_parallel_backend(parallel, backend));
    EPI_RETURN_IF_ERROR(check_runtime_support(config));
    std::unique_ptr<Model> model(new Model());
    EPI_ASSIGN_OR_RETURN(model->config_, config_first_layers(config, options.num_layers));
    model->backend_ = &backend;
    model->parallel_ = parallel;
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> source,
                         make_random_tensor_source(model->config_, options, backend));
    EPI_ASSIGN_OR_RETURN(model->weights_,
                         bind_model_weights(*source, model->config_, backend, parallel, progress));
    return model;
}

Result<std::unique_ptr<Model>> Model::load(const std::string& model_dir, Backend& backend,
                                           const ParallelContext* parallel, const LoadProgress* progress) {
    EPI_RETURN_IF_ERROR(check_parallel_backend(parallel, backend));
    std::error_code ec;
    if (!std::filesystem::is_directory(model_dir, ec)) {
        return not_found(model_dir + (std::filesystem::exists(model_dir, ec) ? ": not a directory"
                                                                             : ": no such directory"));
    }
    std::unique_ptr<Model> model(new Model());
    EPI_ASSIGN_OR_RETURN(model->config_, load_hf_config(model_dir));
    EPI_RETURN_IF_ERROR(check_runtime_support(model->config_));
    model->backend_ = &backend;
    model->parallel_ = parallel;
    EPI_ASSIGN_OR_RETURN(model->weights_,
                         load_model_weights(model->config_, model_dir, backend, parallel, progress));
    return model;
}

int64_t Model::kv_k_width() const {
    if (config_.attention == AttentionKind::kMla) return config_.kv_lora_rank + config_.qk_rope_head_dim;
    return weights_->attention_shard.num_kv_heads * config_.head_dim;
}

int64_t Model::kv_v_width() const {
    return config_.attention == AttentionKind::kMla
               ? 0
               : weights_->attention_shard.num_kv_heads * config_.head_dim;
}

Status Model::check_inputs(const ForwardArgs& args) const {
    // Under DP attention a rank may own no sequence and still joins the collectives.
    const bool may_be_empty = parallel_ != nullptr && parallel_->dp_attention();
    if (args.sequences.empty() && !may_be_empty) return invalid_argument("forward: no sequence");
    const bool greedy = args.greedy_ids != nullptr || args.greedy_non_finite != nullptr;
    if (greedy && (args.greedy_ids == nullptr || args.greedy_non_finite == nullptr || args.logits != nullptr ||
                   args.logits_mode != LogitsMode::kLastRowPerSequence)) {
        return invalid_argument(
            "forward: greedy output needs greedy_ids and greedy_non_finite, no logits, and kLastRowPerSequence");
    }
    if (args.sample_draws != nullptr && !greedy)
        return invalid_argument("forward: sample_draws need greedy_ids");
    if (!greedy && args.logits == nullptr && !args.sequences.empty())
        return invalid_argument("forward: logits is null");
    for (size_t s = 0; s < args.sequences.size(); ++s) {
        const SequenceInput& seq = args.sequences[s];
        const std::string name = "forward: sequence " + std::to_string(s);
        if (seq.token_ids.empty()) return invalid_argument(name + " has no tokens");
        if (static_cast<int64_t>(seq.kv.size()) != config_.num_hidden_layers) {
            return invalid_argument(name + " has a KV cache of " + std::to_string(seq.kv.size()) +
                                    " layers, not " + std::to_string(config_.num_hidden_layers));
        }
        const int64_t cached = seq.kv[0].num_tokens;
        for (const LayerKvCache& kv : seq.kv) {
            if (kv.num_tokens != cached) return internal_error(name + ": layers of its KV cache disagree");
        }
        const int64_t end = cached + static_cast<int64_t>(seq.token_ids.size());
        if (end > config_.max_position_embeddings) {
            return invalid_argument(name + " reaches position " + std::to_string(end - 1) +
                                    " beyond max_position_embeddings " +
                                    std::to_string(config_.max_position_embeddings));
        }
    }
    return Status::ok();
}

Status Model::forward(const ForwardArgs& args) {
    EPI_RETURN_IF_ERROR(check_inputs(args));
    const int64_t V = config_.vocab_size;
    const size_t num_seqs = args.sequences.size();
    std::vector<int64_t> logits_row_begin(num_seqs + 1, 0);  // first logits row of each sequence
    for (size_t s = 0; s < num_seqs; ++s) {
        const int64_t n = args.logits_mode == LogitsMode::kAllRows
                              ? static_cast<int64_t>(args.sequences[s].token_ids.size())
                              : 1;
        logits_row_begin[s + 1] = logits_row_begin[s] + n;
    }
    const int pp = parallel_ != nullptr ? parallel_->layout.pp : 1;
    const bool greedy = args.greedy_ids != nullptr;
    for (int m = 0; m < pp; ++m) {
        const ShardRange mb = split_evenly(static_cast<int64_t>(num_seqs), pp, m);
        MicroBatchOutput out;
        if (greedy) {
            out.greedy_ids = args.greedy_ids + mb.begin;
            out.greedy_non_finite = args.greedy_non_finite + mb.begin;
            if (args.sample_draws != nullptr) out.draws = args.sample_draws + mb.begin;
        } else {
            out.logits = args.logits + logits_row_begin[static_cast<size_t>(mb.begin)] * V;
        }
        const Status st =
            forward_micro_batch(args, static_cast<size_t>(mb.begin), static_cast<size_t>(mb.end()), out);
        if (!st.is_ok()) return pp > 1 ? st.with_context("micro-batch " + std::to_string(m)) : st;
    }
    // NCCL operations return once queued: one that failed or timed out on the GPU is reported here, before
    // any output of the step is used.
    if (parallel_ != nullptr && parallel_->device_world != nullptr)
        EPI_RETURN_IF_ERROR_CTX(parallel_->device_world->synchronize(), "forward");
    if (pp > 1 && greedy && num_seqs > 0) {
        const int64_t n = static_cast<int64_t>(num_seqs);
        Communicator& pipeline = *parallel_->host_pipeline;  // the outputs are host memory
        EPI_RETURN_IF_ERROR(pipeline.broadcast(args.greedy_ids, n, DType::kI32, pp - 1));
        EPI_RETURN_IF_ERROR(pipeline.broadcast(args.greedy_non_finite, n, DType::kI32, pp - 1));
    } else if (pp > 1 && logits_row_begin.back() > 0) {
        EPI_RETURN_IF_ERROR(
            parallel_->host_pipeline->broadcast(args.logits, logits_row_begin.back() * V, DType::kF32, pp - 1));
    }
    for (const SequenceInput& seq : args.sequences)
        for (LayerKvCache& kv : seq.kv) kv.num_tokens += static_cast<int64_t>(seq.token_ids.size());
    return Status::ok();
}

Status Model::forward_micro_batch(const ForwardArgs& args, size_t seq_begin, size_t seq_end,
                                  const MicroBatchOutput& out) {
    Backend& backend = *backend_;
    const int64_t V = config_.vocab_size;
    const std::span<const SequenceInput> seqs = args.sequences.subspan(seq_begin, seq_end - seq_begin);
    const ParallelContext* par = parallel_;
    const PipelineStage stage =
        par != nullptr ? par->pipeline_stage : PipelineStage{0, {0, config_.num_hidden_layers}, true, true};

    std::vector<int32_t> ids, positions;  // [T] host
    std::vector<int64_t> row_begin;       // [num_sequences]
    for (const SequenceInput& seq : seqs) {
        row_begin.push_back(static_cast<int64_t>(ids.size()));
        const int64_t cached = seq.kv[0].num_tokens;
        for (size_t i = 0; i < seq.token_ids.size(); ++i) {
            ids.push_back(seq.token_ids[i]);
            positions.push_back(static_cast<int32_t>(cached + static_cast<int64_t>(i)));
        }
    }
    const int64_t T = static_cast<int64_t>(ids.size());
    // Without DP attention every rank of the stage has the same T, and T = 0 skips the micro-batch on every
    // rank alike; with DP attention the MoE collectives must run even for T = 0.
    const bool join_collectives = par != nullptr && par->dp_attention();
    if (T == 0 && !join_collectives) return Status::ok();
    if (decode_graph_fits(args, seqs, T)) return forward_decode_graph(seqs, ids, positions, out);

    const size_t id_bytes = ids.size() * sizeof(int32_t);
    EPI_ASSIGN_OR_RETURN(DeviceBuffer ids_dev, DeviceBuffer::alloc(backend, id_bytes));  // [T] int32
    EPI_ASSIGN_OR_RETURN(DeviceBuffer pos_dev, DeviceBuffer::alloc(backend, id_bytes));  // [T] int32
    if (T > 0) {
        EPI_RETURN_IF_ERROR(backend.copy_to_device(ids_dev.data(), ids.data(), id_bytes));
        EPI_RETURN_IF_ERROR(backend.copy_to_device(pos_dev.data(), positions.data(), id_bytes));
    }
    // Block ids are the same in every layer: one paged-attention metadata for the whole stage.
    KvBatchMetadata kv_metadata;
    if (T > 0 && stage.layers.size > 0) {
        std::vector<AttentionSequence> first_layer(seqs.size());
        for (size_t s = 0; s < seqs.size(); ++s) {
            first_layer[s] = {row_begin[s], static_cast<int64_t>(seqs[s].token_ids.size()),
                              &seqs[s].kv[static_cast<size_t>(stage.layers.begin)]};
        }
        EPI_ASSIGN_OR_RETURN(kv_metadata, build_kv_batch_metadata(backend, first_layer, T));
    }
    const StageInputs in{seqs, row_begin, static_cast<const int32_t*>(ids_dev.data()),
                         static_cast<const int32_t*>(pos_dev.data()), &kv_metadata, T};
    if (T == 0 || !stage.has_lm_head) return run_stage(args, in, StageOutput{});

    const int64_t num_out = args.logits_mode == LogitsMode::kAllRows ? T : static_cast<int64_t>(seqs.size());
    if (out.greedy_ids == nullptr) {
        EPI_ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::alloc_f32(backend, num_out * V));  // [rows, V]
        EPI_RETURN_IF_ERROR(run_stage(args, in, StageOutput{logits.f32(), nullptr}));
        return backend.copy_to_host(out.logits, logits.data(), logits.num_bytes());
    }
    const size_t out_bytes = static_cast<size_t>(num_out) * sizeof(int32_t);
    EPI_ASSIGN_OR_RETURN(DeviceBuffer greedy, DeviceBuffer::alloc(backend, 2 * out_bytes));  // [2, rows]
    StageOutput stage_out{nullptr, static_cast<int32_t*>(greedy.data())};
    DeviceBuffer draws_dev, floor_dev;  // [rows] TokenDraw, [rows] fp32
    if (out.draws != nullptr) {
        const size_t n = static_cast<size_t>(num_out);
        EPI_ASSIGN_OR_RETURN(draws_dev, DeviceBuffer::alloc(backend, n * sizeof(TokenDraw)));
        EPI_ASSIGN_OR_RETURN(floor_dev, DeviceBuffer::alloc(backend, n * sizeof(float)));
        EPI_RETURN_IF_ERROR(backend.copy_to_device(draws_dev.data(), out.draws, n * sizeof(TokenDraw)));
        stage_out.draws = static_cast<const TokenDraw*>(draws_dev.data());
        stage_out.floor = static_cast<float*>(floor_dev.data());
    }
    EPI_RETURN_IF_ERROR(run_stage(args, in, stage_out));
    EPI_RETURN_IF_ERROR(backend.copy_to_host(out.greedy_ids, greedy.data(), out_bytes));
    return backend.copy_to_host(out.greedy_non_finite, static_cast<int32_t*>(greedy.data()) + num_out, out_bytes);
}

bool Model::mla_decode_absorbed() const {
    if (config_.attention != AttentionKind::kMla) return false;
    if (mla_params(config_, *weights_, *backend_).absorb_max_rows < 1) return false;
    return std::none_of(weights_->layers.begin(), weights_->layers.end(),
                        [](const DecoderLayerWeights& l) { return l.mla.kv_b_proj.bias != nullptr; });
}

Status Model::run_stage(const ForwardArgs& args, const StageInputs& in, const StageOutput& out) {
    Backend& backend = *backend_;
    const ModelConfig& c = config_;
    const ModelWeights& w = *weights_;
    const int64_t H = c.hidden_size, V = c.vocab_size, T = in.num_rows;
    const std::span<const SequenceInput> seqs = in.sequences;
    const ParallelContext* par = parallel_;
    const PipelineStage stage =
        par != nullptr ? par->pipeline_stage : PipelineStage{0, {0, c.num_hidden_layers}, true, true};
    Communicator* attn_tp = par != nullptr ? par->attn_tp.get() : nullptr;
    const MoeParallel moe_par = par != nullptr ? moe_parallel_of(*par) : MoeParallel{};
    EPI_ASSIGN_OR_RETURN(DeviceBuffer hidden, DeviceBuffer::alloc_f32(backend, T * H));  // [T, H] residual
    EPI_ASSIGN_OR_RETURN(DeviceBuffer normed, DeviceBuffer::alloc_f32(backend, T * H));  // [T, H]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer branch, DeviceBuffer::alloc_f32(backend, T * H));  // [T, H]

    if (stage.has_embedding) {
        if (T > 0) {
            EmbeddingArgs embed;
            embed.token_ids = in.ids;
            embed.table = w.embed_tokens;
            embed.table_dtype = w.embed_dtype;
            embed.out = hidden.f32();
            embed.num_tokens = T;
            embed.vocab_size = V;
            embed.hidden_size = H;
            EPI_RETURN_IF_ERROR(backend.embedding(embed));
        }
    } else if (T > 0) {
        const int prev = par->coords.pp_rank - 1;
        EPI_RETURN_IF_ERROR_CTX(par->pipeline->recv(hidden.data(), T * H, DType::kF32, prev),
                                "pipeline recv");
    }

    const GqaAttentionParams gqa = gqa_params(c, w);
    const MlaAttentionParams mla = mla_params(c, w, backend);
    const MoeRouterParams router = router_params(c);
    std::vector<AttentionSequence> attn_seqs(seqs.size());  // this layer's views of the sequences
    // The last MLP output waits in `branch` for the next norm, which adds it to `hidden` (one op for the
    // add and the norm); with an observer, which reads `hidden` after each layer, it is added at once.
    bool branch_pending = false;
    const auto norm_hidden = [&](const RmsNormWeight& norm) {
        if (!branch_pending) return rms_norm_forward(backend, norm, hidden.f32(), T, normed.f32());
        branch_pending = false;
        return add_rms_norm_forward(backend, norm, hidden.f32(), branch.f32(), T, normed.f32());
    };
    for (int64_t l = stage.layers.begin; l < stage.layers.end(); ++l) {
        const DecoderLayerWeights& lw = w.layers[static_cast<size_t>(l)];
        const std::string ctx = "layer " + std::to_string(l);
        for (size_t s = 0; s < seqs.size(); ++s) {
            attn_seqs[s] = {in.row_begin[s], static_cast<int64_t>(seqs[s].token_ids.size()),
                            &seqs[s].kv[static_cast<size_t>(l)]};
        }
        const AttentionBatch batch{in.positions, attn_seqs, in.kv_metadata};

        if (T > 0) {
            EPI_RETURN_IF_ERROR_CTX(norm_hidden(lw.input_layernorm), ctx);
            if (c.attention == AttentionKind::kMla) {
                EPI_RETURN_IF_ERROR_CTX(
                    mla_attention_forward(backend, lw.mla, mla, batch, normed.f32(), T, branch.f32()),
                    ctx + " attention");
            } else {
                EPI_RETURN_IF_ERROR_CTX(
                    gqa_attention_forward(backend, lw.gqa, gqa, batch, normed.f32(), T, branch.f32()),
                    ctx + " attention");
            }
            EPI_RETURN_IF_ERROR_CTX(all_reduce_sum_f32(attn_tp, branch.f32(), T * H), ctx + " attention");
            branch_pending = true;
            EPI_RETURN_IF_ERROR_CTX(norm_hidden(lw.post_attention_layernorm), ctx);
            EPI_RETURN_IF_ERROR(observe(backend, args.observer, "mlp_in", l, normed.f32(), T, H));
        }
        if (lw.is_moe) {
            EPI_RETURN_IF_ERROR_CTX(moe_block_forward(backend, lw.moe, router, normed.f32(), T, H,
                                                      branch.f32(), par != nullptr ? &moe_par : nullptr),
                                    ctx + " moe");
        } else if (T > 0) {
            EPI_RETURN_IF_ERROR_CTX(dense_ffn_forward(backend, lw.mlp, normed.f32(), T, branch.f32()),
                                    ctx + " mlp");
            EPI_RETURN_IF_ERROR_CTX(all_reduce_sum_f32(attn_tp, branch.f32(), T * H), ctx + " mlp");
        }
        if (T > 0) {
            EPI_RETURN_IF_ERROR(observe(backend, args.observer, "mlp_out", l, branch.f32(), T, H));
            branch_pending = true;
            if (args.observer != nullptr) {
                branch_pending = false;
                EPI_RETURN_IF_ERROR(add_in_place(backend, hidden.f32(), branch.f32(), T * H));
                EPI_RETURN_IF_ERROR(observe(backend, args.observer, "hidden", l, hidden.f32(), T, H));
            }
        }
    }
    if (T == 0) return Status::ok();
    if (!stage.has_lm_head) {
        if (branch_pending) EPI_RETURN_IF_ERROR(add_in_place(backend, hidden.f32(), branch.f32(), T * H));
        const int next = par->coords.pp_rank + 1;
        return par->pipeline->send(hidden.data(), T * H, DType::kF32, next);
    }

    // Final norm and LM head on the rows whose logits are wanted (out: [num_out, V] or [2, num_out]).
    int64_t num_out = T;
    const float* head_in = normed.f32();
    EPI_RETURN_IF_ERROR(norm_hidden(w.norm));
    EPI_RETURN_IF_ERROR(
        observe(backend, args.observer, "final_norm", c.num_hidden_layers, normed.f32(), T, H));
    DeviceBuffer last_rows_dev;  // [num_sequences] int32: the row index of each sequence's last token
    const bool one_row_each = std::all_of(seqs.begin(), seqs.end(),
                                          [](const SequenceInput& seq) { return seq.token_ids.size() == 1; });
    if (args.logits_mode == LogitsMode::kLastRowPerSequence && !one_row_each) {
        // Gather the last row of each sequence (an embedding lookup into the normed rows).
        num_out = static_cast<int64_t>(seqs.size());
        std::vector<int32_t> last_rows(seqs.size());
        for (size_t s = 0; s < seqs.size(); ++s)
            last_rows[s] = static_cast<int32_t>(in.row_begin[s] + static_cast<int64_t>(seqs[s].token_ids.size()) - 1);
        const size_t bytes = last_rows.size() * sizeof(int32_t);
        EPI_ASSIGN_OR_RETURN(last_rows_dev, DeviceBuffer::alloc(backend, bytes));
        EPI_RETURN_IF_ERROR(backend.copy_to_device(last_rows_dev.data(), last_rows.data(), bytes));
        EmbeddingArgs gather;
        gather.token_ids = static_cast<const int32_t*>(last_rows_dev.data());
        gather.table = normed.f32();
        gather.table_dtype = DType::kF32;
        gather.out = branch.f32();
        gather.num_tokens = num_out;
        gather.vocab_size = T;
        gather.hidden_size = H;
        EPI_RETURN_IF_ERROR(backend.embedding(gather));
        head_in = branch.f32();
    }
    if (out.logits != nullptr) {
        EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.lm_head, head_in, num_out, out.logits), "lm_head");
        return Status::ok();
    }
    EPI_ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::alloc_f32(backend, num_out * V));  // [rows, V]
    EPI_RETURN_IF_ERROR_CTX(linear_forward(backend, w.lm_head, head_in, num_out, logits.f32()), "lm_head");
    ArgmaxArgs argmax;
    argmax.logits = logits.f32();
    argmax.out_ids = out.greedy;
    argmax.out_non_finite = out.greedy + num_out;
    argmax.num_rows = num_out;
    argmax.vocab_size = V;
    argmax.row_stride = V;
    argmax.draws = out.draws;
    argmax.floor = out.floor;
    return backend.argmax(argmax);
}

}  // namespace epinfer
