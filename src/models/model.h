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
#include "layers/parallel_context.h"
#include "parallel/layout.h"

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

// The model sizes validate_layout checks a layout against (parallel/layout.h).
LayoutModelDims layout_model_dims(const ModelConfig& config);

class Model {
public:
    // Loads the weights this rank holds under `parallel` (null: one rank, every weight; the context must
    // outlive the model; see layers/parallel_context.h and models/model_weights.h).
    // Errors: kNotFound (no DIR/config.json, no safetensors, a missing tensor), kInvalidArgument (a bad
    // config or tensor shape, a tensor that does not split over the layout), kNotSupported (an unsupported
    // architecture or dtype, a parallel layout on a backend that is not host memory), kDataLoss (a corrupt
    // file); each message names the file or tensor.
    static Result<std::unique_ptr<Model>> load(const std::string& model_dir, Backend& backend,
                                               const ParallelContext* parallel = nullptr);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelConfig& config() const { return config_; }
    Backend& backend() const { return *backend_; }
    // The layout this model runs under; null for one rank.
    const ParallelContext* parallel() const { return parallel_; }
    // Bytes of checkpoint tensors (or slices of them) this rank holds.
    int64_t weight_bytes() const;
    // Elements per token per layer of LayerKvCache::k and ::v (MLA: the latent width, and 0); this rank's
    // KV heads under attention TP.
    int64_t kv_k_width() const;
    int64_t kv_v_width() const;

    // Runs the new tokens of every sequence through all layers, appends their K/V to the caches (each
    // cache's num_tokens advances by its n on success) and writes the logits.
    // Under a parallel layout every rank of the world calls forward together: the ranks of one
    // attention-DP group with the same sequences, other DP groups with theirs (possibly none); every stage
    // with the same sequences. With pp > 1 the sequences are split into pp micro-batches that flow through
    // the stages one after another (stage s works on micro-batch m while stage s + 1 works on m − 1); the
    // last stage broadcasts the logits to the other stages, so every rank receives them.
    // Errors: kInvalidArgument for an empty sequence, a token id outside [0, V) (from the embedding op,
    // before any cache is written), a cache without room, positions beyond max_position_embeddings; op
    // errors.
    Status forward(const ForwardArgs& args);

private:
    Model() = default;
    Status check_inputs(const ForwardArgs& args) const;
    // The stage's part of forward for sequences [seq_begin, seq_end) of args; logits rows go to `logits`.
    Status forward_micro_batch(const ForwardArgs& args, size_t seq_begin, size_t seq_end, float* logits);

    ModelConfig config_;
    Backend* backend_ = nullptr;
    std::unique_ptr<ModelWeights> weights_;
    const ParallelContext* parallel_ = nullptr;
};

}  // namespace epinfer
