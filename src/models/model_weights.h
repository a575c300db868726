// The weights of one model as views the layers read: into the checkpoint mmap on host backends, into
// uploaded copies otherwise (always for random weights). Internal to models/ (Model owns one).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"
#include "layers/attention_gqa.h"
#include "layers/attention_mla.h"
#include "layers/dense_ffn.h"
#include "layers/moe/moe_block.h"
#include "layers/parallel_context.h"
#include "models/model.h"
#include "models/tensor_source.h"

namespace epinfer {

// Under a parallel layout (layers/parallel_context.h) a rank binds only the layers of its pipeline stage
// (the others stay empty), the embedding on the first stage, the final norm and LM head on the last; its
// heads' rows of the attention input projections and the matching o_proj columns; its attn_tp slice of the
// dense MLP and shared experts (gate/up rows, down columns); its moe_ep block of routed experts, each
// sliced to its moe_tp part of I. Sliced tensors are copied out of the mmap (only the slice is read).
struct DecoderLayerWeights {
    RmsNormWeight input_layernorm;           // [H]
    RmsNormWeight post_attention_layernorm;  // [H]
    GqaAttentionWeights gqa;                 // config.attention == kGqa
    MlaAttentionWeights mla;                 // config.attention == kMla
    bool is_moe = false;
    DenseFfnWeights mlp;  // dense layer: gate/up [intermediate_size, H], down [H, intermediate_size]
    MoeBlockWeights moe;  // MoE layer
};

// This rank's attention heads under attention TP (all of them on one rank).
struct AttentionShard {
    int64_t num_heads = 0;     // q heads held
    int64_t head_begin = 0;    // first q head
    int64_t num_kv_heads = 0;  // GQA KV heads held
    int64_t kv_head_begin = 0;
    bool full_qk_projection = false;  // OLMoE q/k norm under TP: q_proj/k_proj hold every head
};

struct ModelWeights {
    std::unique_ptr<Checkpoint> checkpoint;  // the mmap every view points into (host backends); null: random
    std::vector<DeviceBuffer> owned;         // uploads and fp32 conversions (router bias, RoPE inv_freq)
    const void* embed_tokens = nullptr;      // [V, H] embed_dtype, device
    DType embed_dtype = DType::kBF16;
    std::vector<DecoderLayerWeights> layers;  // [L]
    RmsNormWeight norm;                       // [H]
    Linear lm_head;                           // [V, H]; the embedding when tie_word_embeddings
    const float* inv_freq = nullptr;          // [rotary_dim / 2] fp32, device
    float rope_attention_scaling = 1.0f;
    AttentionShard attention_shard;
    int64_t weight_bytes = 0;  // bytes of checkpoint tensors (or slices of them) this rank holds
};

// Opens the checkpoint of model_dir, checks its tensors against `config` (validate_checkpoint_tensors)
// and binds the weights this rank holds (`parallel` null: every weight); `progress` as Model::load.
// Errors: those of Checkpoint::open and validate_checkpoint_tensors, each naming the folder;
// kInvalidArgument when a tensor does not split over the layout; op/memory errors of the backend.
Result<std::unique_ptr<ModelWeights>> load_model_weights(const ModelConfig& config,
                                                         const std::string& model_dir, Backend& backend,
                                                         const ParallelContext* parallel = nullptr,
                                                         const LoadProgress* progress = nullptr);

// Binds the weights this rank holds from `source` (which must hold every tensor of expected_tensors at
// its shape), with the same slicing as load_model_weights; every tensor is copied (random weights), the
// source may be dropped afterwards. Errors: kNotFound for a missing tensor, as load_model_weights.
Result<std::unique_ptr<ModelWeights>> bind_model_weights(TensorSource& source, const ModelConfig& config,
                                                         Backend& backend,
                                                         const ParallelContext* parallel = nullptr,
                                                         const LoadProgress* progress = nullptr);

}  // namespace epinfer
