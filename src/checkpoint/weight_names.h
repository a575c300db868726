// The Hugging Face tensors of a checkpoint, derived from its ModelConfig: names, shapes, parameter counts,
// and the check of a checkpoint's tensor list against them.
//
// Names are those of the safetensors files on the Hub (as transformers 5.17 saves them): per-expert
// tensors model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight (Mixtral:
// model.layers.{l}.block_sparse_moe.experts.{e}.w1/w3/w2.weight), never the fused 3-D gate_up_proj that
// transformers builds in memory; gpt-oss: the fused model.layers.{l}.mlp.experts.{gate_up_proj,down_proj}
// (+ _bias) of its BF16 checkpoints, router mlp.router.{weight,bias}, attention sinks self_attn.sinks.
// Shapes are PyTorch's, outermost first: a Linear weight is [out, in].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"
#include "core/status.h"

namespace epinfer {

// What a tensor is for; parameter counts are broken down by it.
enum class ParamGroup {
    kEmbedding,     // model.embed_tokens
    kLmHead,        // lm_head (absent when tie_word_embeddings)
    kNorm,          // input/post-attention layernorms, final norm
    kAttention,     // projections, their biases, q/k and latent norms
    kDenseMlp,      // mlp.{gate,up,down}_proj of a dense layer
    kRouter,        // gate.weight, e_score_correction_bias
    kSharedExpert,  // shared_experts.* (DeepSeek/GLM), shared_expert.* and shared_expert_gate (Qwen2-MoE)
    kRoutedExpert,  // experts.{e}.*
};

struct ExpectedTensor {
    std::string name;            // HF name, e.g. "model.layers.3.mlp.experts.7.gate_proj.weight"
    std::vector<int64_t> shape;  // outermost first, e.g. [I, H]
    ParamGroup group = ParamGroup::kEmbedding;
    int64_t layer = -1;   // decoder layer; -1 for embedding, final norm, lm_head
    int64_t expert = -1;  // routed expert; -1 otherwise (and for gpt-oss's fused tensors of all E experts)
};

// Every tensor a checkpoint of `config` holds, MTP layers (model.layers.{L+i}) excluded: embedding, then
// layer by layer (norms, attention, MLP or MoE), then the final norm and lm_head.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

enum class ExpertProj { kGate, kUp, kDown };

// Name of routed expert `expert`'s projection in layer `layer`, e.g.
// "model.layers.1.mlp.experts.5.down_proj.weight" (Mixtral: "...block_sparse_moe.experts.5.w2.weight";
// gate = w1, up = w3, down = w2). Shapes: gate/up [I, H], down [H, I]. Not gpt-oss (fused experts).
std::string expert_tensor_name(const ModelConfig& config, int64_t layer, int64_t expert, ExpertProj proj);

// Prefix of the MoE block of a layer: "model.layers.{l}.mlp" (Mixtral: "model.layers.{l}.block_sparse_moe").
// Its router is PREFIX.gate.weight [E, H].
std::string moe_block_prefix(const ModelConfig& config, int64_t layer);

// Parameter counts from the config alone (the sum over expected_tensors; MTP layers excluded, as the
// published totals are: DeepSeek-V3 671B is the main model, 685B with its 14B MTP module).
struct ParameterCounts {
    int64_t total = 0;
    // Used per token: everything except the E − K routed experts not chosen in each MoE layer
    // (embedding + attention + norms + dense MLPs + routers + shared experts + K experts + lm_head).
    int64_t active = 0;
    int64_t embedding = 0, lm_head = 0, norms = 0, attention = 0, dense_mlp = 0, router = 0;
    int64_t shared_experts = 0, routed_experts = 0;  // routed_experts: all E per MoE layer
};
ParameterCounts count_parameters(const ModelConfig& config);

// One difference between a checkpoint's tensors and expected_tensors().
struct TensorIssue {
    enum class Kind { kMissing, kUnexpected, kWrongShape, kWrongDtype };
    Kind kind = Kind::kMissing;
    std::string name;
    std::string message;  // one line naming the tensor, e.g. "x.weight: shape [8, 64], expected [16, 64]"
};

// Every difference, missing tensors first (in expected order), then the checkpoint's tensors in their
// order. Not issues: MTP layers model.layers.{L+i}.* with i < num_nextn_predict_layers whose MTP projection
// model.layers.{L+i}.eh_proj.weight is present (DeepSeek-V3's layer 61, GLM-4.5's 92), rotary
// "*.inv_freq" buffers, and lm_head.weight of the right shape when the embeddings are tied. Any other
// tensor of a layer ≥ num_hidden_layers is unexpected; its message says so ("(layer 2 >=
// num_hidden_layers 2; not an MTP layer: no model.layers.2.eh_proj.weight)").
// A tensor whose dtype is not F32, F16 or BF16 (e.g. FP8 weights, their *_scale_inv) is an issue.
std::vector<TensorIssue> check_checkpoint_tensors(const ModelConfig& config,
                                                  const std::vector<TensorInfo>& tensors);

// OK when check_checkpoint_tensors finds nothing; else the first issue, with the count of the others:
// kNotFound (a missing tensor), kInvalidArgument (an unexpected tensor or a wrong shape), kNotSupported
// (a dtype other than F32, F16, BF16).
Status validate_checkpoint_tensors(const ModelConfig& config, const std::vector<TensorInfo>& tensors);

// "[16, 64]".
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace epinfer
