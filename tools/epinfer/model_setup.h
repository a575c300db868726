// Start-up shared by `generate`, `serve` and `bench`: the flags that choose the model, the layout, the
// device and the KV cache, and what they drive, in order:
//   1. config.json (or --config FILE with --random-weights) → ModelConfig (a family the runtime does not
//      run, e.g. gpt_oss, stops here with kNotSupported); the layout flags → ParallelLayout, validated
//      against it; outside MPI, re-run under mpirun on the layout's ranks, this process staying as its
//      supervisor (mpi_launch.h; start_model does not return there);
//   2. the backend (--device cpu: make_cpu_backend(--threads); cuda: make_cuda_backend(this host's rank),
//      in CUDA builds only) and the layout's ParallelContext: its activation groups over NCCL (bootstrapped
//      over MPI, on the backend's stream) when the ranks are several GPUs, over MPI for CPU ranks;
//   3. the memory check (planner/fit_check.h, the planner's own memory model): this rank's weights (in the
//      checkpoint's dtypes), buffers, activations (fp32, --max-step-tokens rows; attention's temporaries as
//      the backend runs MLA: models/model.h mla_absorb_max_rows) and the KV (in
//      --kv-cache-dtype: auto = bf16 on cuda, fp32 on cpu) of --kv-cache-tokens tokens, or of one
//      request of max_position_embeddings tokens when that flag is 0,
//      must fit the device (cpu: MemAvailable of the host divided among this host's ranks; cuda: the GPU's
//      free memory; the least over all ranks) times --memory-fraction; otherwise one-line kOutOfMemory
//      with the breakdown, before the weights are read;
//   4. the weights (a progress bar on rank 0's stderr when it is a terminal), or random weights at the
//      config's shapes (--random-weights, optionally --num-layers N, --weights-seed, --random-dtype);
//   5. the KV pool: --kv-cache-tokens, or (0) the command's own size (ModelSetupFlags::
//      default_kv_cache_tokens: generate's request), or else what the memory check leaves (at most
//      --max-running × max_position_embeddings), in blocks of --block-size, of --kv-cache-dtype elements
//      → EngineOptions;
//   6. one summary line on rank 0's stderr, e.g.
//      "epinfer: ready in 1.2 s: deepseek_v3 (3 layers), layout tp1 ep1 pp1 dp1 on cpu, per rank: weights
//       2.1 MiB, KV cache 16384 tokens (1024 blocks of 16, fp32)".
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/status.h"
#include "engine/engine.h"
#include "layers/parallel_context.h"
#include "models/model.h"
#include "mpi_launch.h"
#include "parallel/layout.h"

namespace epinfer::cli {

// Numbers are kept as text and parsed by start_model, so that a bad value is one line naming the flag.
struct ModelSetupFlags {
    std::string model_dir;          // --model DIR
    std::string config_file;        // --config FILE.json (with --random-weights instead of --model)
    bool random_weights = false;    // --random-weights
    std::string num_layers = "0";   // --num-layers N (random weights: the first N layers; 0 = all)
    std::string seed = "0";         // --weights-seed (random weights)
    std::string random_dtype = "bf16";  // --random-dtype bf16|f16|f32 (random weights)
    std::string device = "cpu";     // --device cpu|cuda
    std::string threads = "0";      // --threads (CPU backend; 0 = up to 8)
    // --tp --ep --dp --pp as given (nullopt: not given, see parallel/layout.h); a given value must be an
    // integer ≥ 1 ("--tp 0" is an error, not "not given").
    std::optional<std::string> tp;
    std::optional<std::string> ep;
    std::optional<std::string> dp;
    std::optional<std::string> pp;
    std::string kv_cache_tokens = "0";     // --kv-cache-tokens per rank (0 = what fits)
    std::string kv_cache_dtype = "auto";   // --kv-cache-dtype auto|bf16|fp32
    std::string block_size = "16";         // --block-size
    std::string max_running = "256";       // --max-running
    std::string max_step_tokens = "2048";  // --max-step-tokens
    std::string max_waiting = "4096";      // --max-waiting
    std::string memory_fraction = "0.9";   // --memory-fraction of the device's memory epinfer may use
    bool no_decode_graphs = false;         // --no-decode-graphs (Model::set_decode_graphs(false))
    // Not a flag, set by the command: what the supervisor of the mpirun that step 1 starts does with a
    // SIGTERM or SIGINT (mpi_launch.h; default: mpirun ends the ranks).
    MpirunStop mpirun_stop;
    // Not a flag, set by the command: the KV pool per rank when --kv-cache-tokens is 0, in tokens (rounded
    // up to whole blocks; generate: its request's prompt + new tokens); 0 = what the memory check leaves.
    // The memory check still prices one request of max_position_embeddings.
    int64_t default_kv_cache_tokens = 0;
};

// Ranks of this host (a split of the world by host name) and this rank's place among them: a rank's GPU is
// device `index`. One rank (or no world): {1, 0}. Collective over `world`.
struct HostRanks {
    int count = 1;
    int index = 0;
};
Result<HostRanks> host_ranks(Communicator* world);

// One GPU per rank for the bench commands' --device cuda: the CUDA backend of this rank's GPU (device
// host_ranks(world).index) and an NCCL communicator over the ranks of `world` (same order) on that
// backend's stream, also at world size 1. Collective over `world`. Errors: kNotSupported in a build
// without CUDA; the backend's and NCCL's errors.
struct GpuRank {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Communicator> nccl;
};
Result<GpuRank> make_gpu_rank(Communicator& world);

// --device cuda in a build without CUDA: one kNotSupported line naming the CMake option; OK otherwise.
// Called before a command re-runs itself under mpirun, so that the error is printed once.
Status require_device_built(const std::string& device);

// The KV-cache flags as every command that takes them reads them (serve, bench, generate through
// start_model; plan): --kv-cache-tokens, an integer in [0, kMaxKvCacheTokens] (per rank; 0 = what the
// memory check leaves); --memory-fraction, a finite number in (0, 1]. Errors: kInvalidArgument, one line
// naming the flag and the text, e.g. "--memory-fraction must be in (0, 1], got 1.5".
inline constexpr int64_t kMaxKvCacheTokens = int64_t{1} << 40;
Result<int64_t> parse_kv_cache_tokens(const std::string& text);
Result<double> parse_memory_fraction(const std::string& text);
// The KV pool per rank that --kv-cache-tokens gives when it is not 0: whole blocks of --block-size, as
// step 5 sizes it (0 for 0). Errors: those of the two flags, as start_model reports them.
Result<int64_t> explicit_kv_pool_tokens(const ModelSetupFlags& flags);
// --kv-cache-dtype of the engine commands: "bf16" → kBF16, "fp32" → kF32, "auto" → kBF16 on CUDA (`cuda`),
// kF32 on the CPU backend (the exact fp32 reference). Errors: kInvalidArgument naming the text, e.g.
// "--kv-cache-dtype 'fp16': expected auto, bf16 or fp32".
Result<DType> parse_kv_cache_dtype(const std::string& text, bool cuda);
// "fp32" or "bf16", as the flag spells them.
const char* kv_cache_dtype_name(DType dtype);

// Registers the flags above on `cmd` and returns them, in that order (a command that can run without a
// model refuses those given, by CLI::Option::count: bench --url). allow_random_weights: also --config,
// --random-weights, --num-layers, --weights-seed and --random-dtype (then --model is optional); otherwise
// --model is required.
std::vector<const CLI::Option*> add_model_setup_flags(CLI::App& cmd, ModelSetupFlags& flags,
                                                      bool allow_random_weights);

// Everything a command needs to run requests. Members are destroyed in reverse order (model before
// the layout's groups before the NCCL world before backend before world).
struct ModelSetup {
    std::unique_ptr<Communicator> world;         // null for one rank without flags
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Communicator> device_world;  // NCCL over the world's GPU ranks; null for CPU or one rank
    std::unique_ptr<ParallelContext> parallel;   // null for one rank without flags
    std::unique_ptr<Model> model;
    EngineOptions engine_options;  // every field from the flags; num_kv_blocks sized by step 5
    ParallelLayout layout;         // the layout run (tp1 for one rank)
    int64_t kv_cache_tokens = 0;   // per rank: engine_options.num_kv_blocks × block_size
    double ready_seconds = 0.0;    // from start_model's call to the summary line
    bool is_driver() const { return world == nullptr || world->rank() == 0; }
};

// Steps 1–6. Errors: one line naming the flag, file, tensor or limit (kInvalidArgument, kNotFound,
// kOutOfMemory with the breakdown, kNotSupported for --device cuda in a build without CUDA or a family
// the runtime does not run). Under mpirun every rank returns the same error for the flags, the config,
// the layout and the memory check (the check uses the least memory over the ranks).
Result<ModelSetup> start_model(const ModelSetupFlags& flags);

}  // namespace epinfer::cli
