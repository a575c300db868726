// The weights of one model as views the layers read: into the checkpoint mmap on host backends, into
// uploaded copies otherwise. Internal to models/ (Model owns one).
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

namespace epinfer {

struct DecoderLayerWeights {
    RmsNormWeight input_layernorm;           // [H]
    RmsNormWeight post_attention_layernorm;  // [H]
    GqaAttentionWeights gqa;                 // config.attention == kGqa
    MlaAttentionWeights mla;                 // config.attention == kMla
    bool is_moe = false;
    DenseFfnWeights mlp;  // dense layer: gate/up [intermediate_size, H], down [H, intermediate_size]
    MoeBlockWeights moe;  // MoE layer
};

struct ModelWeights {
    std::unique_ptr<Checkpoint> checkpoint;  // the mmap every view points into (host backends)
    std::vector<DeviceBuffer> owned;         // uploads and fp32 conversions (router bias, RoPE inv_freq)
    const void* embed_tokens = nullptr;      // [V, H] embed_dtype, device
    DType embed_dtype = DType::kBF16;
    std::vector<DecoderLayerWeights> layers;  // [L]
    RmsNormWeight norm;                       // [H]
    Linear lm_head;                           // [V, H]; the embedding when tie_word_embeddings
    const float* inv_freq = nullptr;          // [rotary_dim / 2] fp32, device
    float rope_attention_scaling = 1.0f;
};

// Opens the checkpoint of model_dir, checks its tensors against `config` (validate_checkpoint_tensors)
// and binds every weight. Errors: those of Checkpoint::open and validate_checkpoint_tensors, each naming
// the folder; op/memory errors of the backend.
Result<std::unique_ptr<ModelWeights>> load_model_weights(const ModelConfig& config,
                                                         const std::string& model_dir, Backend& backend);

}  // namespace epinfer
