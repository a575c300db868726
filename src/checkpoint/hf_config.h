// config.json (+ generation_config.json) → ModelConfig.
#pragma once

#include <string>

#include "checkpoint/model_config.h"
#include "core/status.h"

namespace epinfer {

// Parses the JSON text of a config.json. `source` names the file in error messages.
// Errors: kInvalidArgument for malformed JSON, missing or mistyped keys, and an unknown
// model_type/architecture (the message lists the supported ones).
Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& source);

// Reads DIR/config.json and, when present, DIR/generation_config.json (its eos_token_id is merged).
// Errors: kNotFound when DIR/config.json is missing; otherwise as parse_hf_config.
Result<ModelConfig> load_hf_config(const std::string& model_dir);

}  // namespace epinfer
