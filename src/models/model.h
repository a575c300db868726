// A loaded model and its forward pass: token ids → logits, through the KV caches of the sequences.
//
// Load: DIR/config.json (+ generation_config.json) → ModelConfig; the safetensors checkpoint is
// memory-mapped, checked against the config (checkpoint/weight_names.h) and used in place. Or random
// weights at the shapes of a config (create_random), for benchmarks.
// Forward: one batch holds the new tokens of one or more sequences; each sequence continues at the
// position its cache has reached (prefill: the whole prompt; decode: one token). Per-family facts:
// models/model_registry.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

#include "backend/backend.h"
#include "checkpoint/model_config.h"
#include "core/dtype.h"
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
    // Token choice on the device instead of logits (kLastRowPerSequence, logits null): greedy_ids
    // [num_sequences] int32 host receives the argmax of each sequence's logits (Backend::argmax, the
    // sampler's argmax_token), greedy_non_finite [num_sequences] int32 host 1 where those logits held a
    // NaN or ±inf. Only ids cross to the host, not [num_sequences, V] logits.
    int32_t* greedy_ids = nullptr;
    int32_t* greedy_non_finite = nullptr;
    // Optional, with greedy_ids: sample_draws [num_sequences] host, each sequence's draw (op_args.h
    // TokenDraw, Sampler::next_draw: greedy, or a draw from its softmax with top-k / top-p by the Gumbel-max
    // trick); greedy_ids then receives the drawn ids.
    const TokenDraw* sample_draws = nullptr;
};

// The model sizes validate_layout checks a layout against (parallel/layout.h).
LayoutModelDims layout_model_dims(const ModelConfig& config);

// The new rows of one sequence up to which MLA attention takes the absorbed form on `backend`
// (MlaAttentionParams::absorb_max_rows, layers/attention_mla.h): every chunk (INT64_MAX) where the backend
// has the latent-attention kernel, else mla_absorb_max_rows of the config's kv_lora_rank and head dims. The
// runtime's memory check sizes MLA's attention temporaries by it (planner::EngineDevice).
int64_t mla_absorb_max_rows(const ModelConfig& config, const Backend& backend);

// Called while weights are bound or copied: bytes of this rank's weights done so far, of bytes_total (the
// bytes weight_bytes() will report). Starts with (0, total), ends with (total, total); never decreases.
using LoadProgress = std::function<void(int64_t bytes_done, int64_t bytes_total)>;

// Random weights at the shapes of a config, for benchmarks without a checkpoint (Model::create_random).
struct RandomWeightsOptions {
    uint64_t seed = 0;           // same seed, config, layout and dtype → bit-identical weights
    int64_t num_layers = 0;      // 0: every decoder layer; N: the config cut to its first N layers
    DType dtype = DType::kBF16;  // of every tensor: F32, F16 or BF16
};

// `config` cut to its first `num_layers` decoder layers (layer_is_moe cut alike; 0: unchanged), as
// create_random runs it; build the ParallelContext and validate the layout against this config.
// Errors: kInvalidArgument when num_layers < 0 or > config.num_hidden_layers (naming both).
Result<ModelConfig> config_first_layers(const ModelConfig& config, int64_t num_layers);

class Model {
public:
    // Loads the weights this rank holds under `parallel` (null: one rank, every weight; the context must
    // outlive the model; see layers/parallel_context.h and models/model_weights.h).
    // Errors: kNotFound (no DIR/config.json, no safetensors, a missing tensor), kInvalidArgument (a bad
    // config or tensor shape, a tensor that does not split over the layout), kNotSupported (an unsupported
    // architecture or dtype, a parallel layout on a backend that is not host memory), kDataLoss (a corrupt
    // file); each message names the file or tensor.
    // `progress` (optional) is called as tensors are bound or copied, on the calling thread.
    static Result<std::unique_ptr<Model>> load(const std::string& model_dir, Backend& backend,
                                               const ParallelContext* parallel = nullptr,
                                               const LoadProgress* progress = nullptr);
    // A model with random weights: every tensor a checkpoint of config_first_layers(config,
    // options.num_layers) holds (checkpoint/weight_names.h), at its real shape and sliced under `parallel`
    // exactly as load slices it, in options.dtype; on host-memory backends in host buffers the model owns.
    // Values: norm weights 1; biases and e_score_correction_bias 0; every matrix [out, in] uniform in
    // ±1/sqrt(in) (the embedding too), which keeps activations finite over many layers. Fast at any size:
    // one pool of ≥ 4M uniform values is drawn from the seed on the host, uploaded once per distinct
    // scale and dtype, and each tensor is copied from it on the device (models/random_weights.h).
    // `parallel` must have been built for the cut config. Errors: those of config_first_layers,
    // kInvalidArgument for a dtype other than F32/F16/BF16 or a layout that does not fit the config,
    // kNotSupported as load; the backend's memory errors.
    static Result<std::unique_ptr<Model>> create_random(const ModelConfig& config, Backend& backend,
                                                        const RandomWeightsOptions& options,
                                                        const ParallelContext* parallel = nullptr,
                                                        const LoadProgress* progress = nullptr);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelConfig& config() const { return config_; }
    Backend& backend() const { return *backend_; }
    // The layout this model runs under; null for one rank.
    const ParallelContext* parallel() const { return parallel_; }
    // Bytes of checkpoint tensors (or slices of them) this rank holds; random weights: as their checkpoint.
    int64_t weight_bytes() const;
    // Elements per token per layer of LayerKvCache::k_pool and ::v_pool rows (MLA: the latent width, and
    // 0); this rank's KV heads under attention TP.
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

    // Decode steps replay op graphs (CUDA graphs) where they fit: on a backend with op graphs, one rank,
    // GQA attention, greedy output, one new token per sequence, at most kMaxGraphRows sequences. Default
    // on; off: every step issues its ops one by one.
    void set_decode_graphs(bool enabled) { decode_graphs_enabled_ = enabled; }
    // Decode graphs captured so far (0 when off, or after a backend refused to record one).
    int64_t num_decode_graphs() const;
    // Why decode graphs turned themselves off (the failed recording's error); OK otherwise.
    const Status& decode_graphs_status() const { return decode_graphs_status_; }
    static constexpr int64_t kMaxGraphRows = 256;

private:
    Model() = default;
    Status check_inputs(const ForwardArgs& args) const;
    // Where one micro-batch's outputs go: its rows of ForwardArgs::logits, or of greedy_ids/non_finite.
    struct MicroBatchOutput {
        float* logits = nullptr;
        int32_t* greedy_ids = nullptr;
        int32_t* greedy_non_finite = nullptr;
        const TokenDraw* draws = nullptr;  // the micro-batch's rows of ForwardArgs::sample_draws, or null
    };
    // The stage's part of forward for sequences [seq_begin, seq_end) of args: uploads the rows and the
    // paged-attention metadata (or hands a decode step to forward_decode_graph), runs run_stage, and
    // downloads the logits or greedy ids into `out`.
    Status forward_micro_batch(const ForwardArgs& args, size_t seq_begin, size_t seq_end,
                               const MicroBatchOutput& out);

    // What run_stage reads: the micro-batch's rows in backend memory.
    struct StageInputs {
        std::span<const SequenceInput> sequences;
        std::span<const int64_t> row_begin;      // [num_sequences] host: first row of each sequence
        const int32_t* ids = nullptr;            // [T] int32, device
        const int32_t* positions = nullptr;      // [T] int32, device
        const KvBatchMetadata* kv_metadata = nullptr;
        int64_t num_rows = 0;                    // T
    };
    // Where the last stage puts its result: logits [num_out, V] fp32, or argmax ids then non-finite flags
    // [2, num_out] int32 (device; num_out = T, or num_sequences for kLastRowPerSequence).
    struct StageOutput {
        float* logits = nullptr;
        int32_t* greedy = nullptr;
        const TokenDraw* draws = nullptr;  // [num_out] device, or null: ArgmaxArgs
        float* floor = nullptr;            // [num_out] fp32, device workspace, with draws
    };
    // This rank's stage on device inputs: embedding or pipeline recv, the stage's layers, then pipeline
    // send or final norm + LM head (+ argmax). Only ops and collectives: no host copies unless an observer
    // is set or a sequence has several rows with kLastRowPerSequence (the row gather uploads indices).
    Status run_stage(const ForwardArgs& args, const StageInputs& in, const StageOutput& out);

    // Decode graphs (model_decode_graph.cc): the batch is padded to a size bucket and the block tables to
    // a width bucket; each (rows, width) bucket runs once directly, is captured, and is replayed after.
    struct DecodeGraph;
    bool decode_graph_fits(const ForwardArgs& args, std::span<const SequenceInput> seqs, int64_t num_rows) const;
    // MLA decode rows take the absorbed form (one paged op per layer, no per-sequence shapes: recordable):
    // mla_absorb_max_rows ≥ 1 and no layer's kv_b_proj has a bias. False for GQA models.
    bool mla_decode_absorbed() const;
    Status forward_decode_graph(std::span<const SequenceInput> seqs, const std::vector<int32_t>& ids,
                                const std::vector<int32_t>& positions, const MicroBatchOutput& out);

    ModelConfig config_;
    Backend* backend_ = nullptr;
    std::unique_ptr<ModelWeights> weights_;
    const ParallelContext* parallel_ = nullptr;
    bool decode_graphs_enabled_ = true;
    Status decode_graphs_status_;
    // By (rows, width, drawn): steps with a drawn row have graphs of their own, with the sampling floors.
    std::map<std::tuple<int64_t, int64_t, bool>, std::unique_ptr<DecodeGraph>> decode_graphs_;
};

}  // namespace epinfer
