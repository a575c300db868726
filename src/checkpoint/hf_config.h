// config.json (+ generation_config.json) → ModelConfig.
//
// Semantics are those of transformers 5.17 (configuration_<family>.py and modeling_<family>.py): a key
// that fixes tensor shapes and has no sensible default (vocab_size, hidden_size, num_hidden_layers,
// num_attention_heads, the expert count, num_experts_per_tok, the MoE width, the MLA ranks) is required;
// every other key takes the default of its family's transformers configuration class.
// Both spellings of RoPE are read: rope_theta + rope_scaling ("type" or "rope_type") of published
// checkpoints, and the rope_parameters dict that transformers 5 writes; rope_scaling wins when both are
// set, as in transformers.
// gpt_oss is parsed (sliding/full layer_types, attention sinks, router and expert biases, mxfp4 experts by
// quantization_config) so that `epinfer plan` can size it; the runtime refuses it (models/model_registry.h).
#pragma once

#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "core/status.h"

namespace epinfer {

// The config.json model_type values this build runs, in a fixed order (deepseek_v3, kimi_k2, ...).
const std::vector<std::string>& supported_model_types();

// Parses the JSON text of a config.json. `source` names the file in error messages.
// Errors (one line naming `source` and the key): kInvalidArgument for malformed JSON, a missing required
// key, a key of the wrong type, an unknown model_type/architecture (the message lists the model_types the
// runtime runs, then "gpt_oss for epinfer plan only"), a present max_position_embeddings < 1, a
// torch_dtype/dtype that names no torch floating dtype, a float key outside the range its meaning and fp32
// allow or 0 in fp32 ("key 'rms_norm_eps' 1e+300 is outside (0, 1]": the message states the range), and
// inconsistent values (heads not divisible by KV heads, K > E, E not divisible by n_group, ...);
// kNotSupported for settings this build does not run (a hidden_act other than silu, sliding-window
// attention, clip_qkv, a RoPE type other than default/linear/yarn/llama3, ...).
Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& source);

// Reads DIR/config.json and, when present, DIR/generation_config.json (its eos_token_id is merged after
// config.json's, deduplicated, order kept).
// Errors: kNotFound when DIR is not a folder, DIR/config.json is missing, or either file is something else
// than a regular file ("DIR/config.json: is a directory, not a file", a FIFO, ...: check_regular_file in
// file_kind.h); kInvalidArgument for a malformed generation_config.json; otherwise as parse_hf_config.
Result<ModelConfig> load_hf_config(const std::string& model_dir);

}  // namespace epinfer
