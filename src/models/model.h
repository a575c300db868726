// A loaded model and its forward pass: token ids → logits, through the KV caches of the sequences.
//
// Load: DIR/config.json (+ generation_config.json) → ModelConfig; the safetensors checkpoint is
// memory-mapped, checked against the config (checkpoint/weight_names.h) and used in place.
// Forward: one batch holds the new tokens of one or more sequences; each sequence continues at the
// position its cache has reached (prefill: the whole prompt; decode: one token). Per-family facts:
// models/model_registry.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "checkpoint/model_config.h"
#include "core/status.h"
#include "layers/kv_cache.h"

namespace epinfer {

struct ModelWeights;

struct SequenceInput {
    std::span<const int32_t> token_ids;  // [n] int32, host: the sequence's new tokens, n ≥ 1
    std::span<LayerKvCache> kv;          // [L]: its cache per layer, every layer at the same num_tokens
};

enum class LogitsMode {
    kAllRows,             // logits of every new token: [T, V], T = Σ n
    kLastRowPerSequence,  // logits of each sequence's last new token: [num_sequences, V]
};

// Receives host copies of per-layer activations, rows in batch order ([T, H] fp32):
// what = "mlp_in" (post_attention_layernorm output), "mlp_out" (MLP/MoE block output), "hidden"
// (decoder layer output) for layer = 0 .. L − 1, then "final_norm" (model.norm output) with layer = L.
using LayerObserver =
    std::function<void(std::string_view what, int64_t layer, const float* rows, int64_t num_rows)>;

struct ForwardArgs {
    std::span<const SequenceInput> sequences;
    LogitsMode logits_mode = LogitsMode::kLastRowPerSequence;
    float* logits = nullptr;                  // host fp32, shape per logits_mode
    const LayerObserver* observer = nullptr;  // optional (tests)
};

class Model {
public:
    // Errors: kNotFound (no DIR/config.json, no safetensors, a missing tensor), kInvalidArgument (a bad
    // config or tensor shape), kNotSupported (an unsupported architecture or dtype), kDataLoss (a corrupt
    // file); each message names the file or tensor.
    static Result<std::unique_ptr<Model>> load(const std::string& model_dir, Backend& backend);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelConfig& config() const { return config_; }
    Backend& backend() const { return *backend_; }
    // Elements per token per layer of LayerKvCache::k and ::v (MLA: the latent width, and 0).
    int64_t kv_k_width() const;
    int64_t kv_v_width() const;

    // Runs the new tokens of every sequence through all layers, appends their K/V to the caches (each
    // cache's num_tokens advances by its n on success) and writes the logits.
    // Errors: kInvalidArgument for an empty sequence, a token id outside [0, V) (from the embedding op,
    // before any cache is written), a cache without room, positions beyond max_position_embeddings; op
    // errors.
    Status forward(const ForwardArgs& args);

private:
    Model() = default;
    Status check_inputs(const ForwardArgs& args) const;

    ModelConfig config_;
    Backend* backend_ = nullptr;
    std::unique_ptr<ModelWeights> weights_;
};

}  // namespace epinfer
