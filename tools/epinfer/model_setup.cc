#include "model_setup.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weight_names.h"
#include "flag_values.h"
#include "models/model_registry.h"
#include "planner/engine_facts.h"
#include "planner/fit_check.h"
#include "planner/layouts.h"
#include "planner/weight_format.h"
#if EPINFER_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "comm/nccl_communicator.h"
#endif

namespace epinfer::cli {

namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kMaxLayoutSize = int64_t{1} << 20;  // bound of --tp --ep --dp --pp (fits int products)

using Clock = std::chrono::steady_clock;

// A layout flag: not given → 0 (LayoutFlags' "not given"); given → an integer in [1, kMaxLayoutSize].
Result<int> parse_layout_flag(const std::optional<std::string>& text, const char* flag) {
    if (!text.has_value()) return 0;
    EPI_ASSIGN_OR_RETURN(const int64_t value, parse_flag_int(*text, flag, INT64_MIN, INT64_MAX));
    if (value < 1) return invalid_argument(fmt::format("{} must be ≥ 1, got {}", flag, value));
    if (value > kMaxLayoutSize)
        return invalid_argument(fmt::format("{} must be ≤ {}, got {}", flag, kMaxLayoutSize, value));
    return static_cast<int>(value);
}

// The flags as numbers, each checked.
struct SetupValues {
    LayoutFlags layout;  // 0 = not given
    bool layout_given = false;
    int64_t num_layers = 0;
    uint64_t seed = 0;
    DType random_dtype = DType::kBF16;
    bool cuda = false;
    int threads = 0;
    int64_t kv_cache_tokens = 0;
    double memory_fraction = 0.9;
    EngineOptions engine;
};

Result<SetupValues> parse_values(const ModelSetupFlags& f) {
    SetupValues v;
    if (f.random_weights) {
        if (f.model_dir.empty() == f.config_file.empty())
            return invalid_argument("--random-weights needs exactly one of --config FILE.json and --model DIR");
    } else {
        if (!f.config_file.empty()) return invalid_argument("--config needs --random-weights (else use --model DIR)");
        if (f.model_dir.empty()) return invalid_argument("--model DIR is required");
        if (f.num_layers != "0") return invalid_argument("--num-layers needs --random-weights");
    }
    EPI_ASSIGN_OR_RETURN(v.num_layers, parse_flag_int(f.num_layers, "--num-layers", 0, 1 << 20));
    EPI_ASSIGN_OR_RETURN(v.layout.tp, parse_layout_flag(f.tp, "--tp"));
    EPI_ASSIGN_OR_RETURN(v.layout.ep, parse_layout_flag(f.ep, "--ep"));
    EPI_ASSIGN_OR_RETURN(v.layout.dp, parse_layout_flag(f.dp, "--dp"));
    EPI_ASSIGN_OR_RETURN(v.layout.pp, parse_layout_flag(f.pp, "--pp"));
    v.layout_given = f.tp.has_value() || f.ep.has_value() || f.dp.has_value() || f.pp.has_value();
    EPI_ASSIGN_OR_RETURN(v.seed, parse_flag_uint64(f.seed, "--weights-seed"));
    if (f.random_dtype == "bf16") {
        v.random_dtype = DType::kBF16;
    } else if (f.random_dtype == "f16") {
        v.random_dtype = DType::kF16;
    } else if (f.random_dtype == "f32") {
        v.random_dtype = DType::kF32;
    } else {
        return invalid_argument(fmt::format("--random-dtype '{}' is not one of bf16, f16, f32", f.random_dtype));
    }
    if (f.device != "cpu" && f.device != "cuda")
        return invalid_argument(fmt::format("--device '{}' is not one of cpu, cuda", f.device));
    v.cuda = f.device == "cuda";
    EPI_ASSIGN_OR_RETURN(const int64_t threads, parse_flag_int(f.threads, "--threads", 0, kMaxThreads));
    v.threads = static_cast<int>(threads);
    EPI_ASSIGN_OR_RETURN(v.kv_cache_tokens, parse_kv_cache_tokens(f.kv_cache_tokens));
    EPI_ASSIGN_OR_RETURN(v.engine.block_size, parse_flag_int(f.block_size, "--block-size", 1, 4096));
    EPI_ASSIGN_OR_RETURN(v.engine.max_running, parse_flag_int(f.max_running, "--max-running", 1, 1 << 20));
    EPI_ASSIGN_OR_RETURN(v.engine.max_step_tokens,
                         parse_flag_int(f.max_step_tokens, "--max-step-tokens", 1, int64_t{1} << 24));
    EPI_ASSIGN_OR_RETURN(v.engine.max_waiting, parse_flag_int(f.max_waiting, "--max-waiting", 1, int64_t{1} << 24));
    EPI_ASSIGN_OR_RETURN(v.memory_fraction, parse_memory_fraction(f.memory_fraction));
    EPI_ASSIGN_OR_RETURN(v.engine.kv_cache_dtype, parse_kv_cache_dtype(f.kv_cache_dtype, v.cuda));
    EPI_RETURN_IF_ERROR(require_device_built(f.device));  // after the values, so a bad one is named first
    return v;
}

Result<ModelConfig> read_config_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found(path + ": cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    return parse_hf_config(text.str(), path);
}

}  // namespace

Result<int64_t> parse_kv_cache_tokens(const std::string& text) {
    return parse_flag_int(text, "--kv-cache-tokens", 0, kMaxKvCacheTokens);
}

Result<double> parse_memory_fraction(const std::string& text) {
    EPI_ASSIGN_OR_RETURN(const double fraction, parse_flag_double(text, "--memory-fraction"));
    if (!(fraction > 0.0 && fraction <= 1.0))
        return invalid_argument(fmt::format("--memory-fraction must be in (0, 1], got {}", text));
    return fraction;
}

Result<DType> parse_kv_cache_dtype(const std::string& text, bool cuda) {
    if (text == "auto") return cuda ? DType::kBF16 : DType::kF32;
    if (text == "bf16") return DType::kBF16;
    if (text == "fp32") return DType::kF32;
    return invalid_argument(fmt::format("--kv-cache-dtype '{}': expected auto, bf16 or fp32", text));
}

Result<int64_t> explicit_kv_pool_tokens(const ModelSetupFlags& flags) {
    EPI_ASSIGN_OR_RETURN(const int64_t tokens, parse_kv_cache_tokens(flags.kv_cache_tokens));
    EPI_ASSIGN_OR_RETURN(const int64_t block_size, parse_flag_int(flags.block_size, "--block-size", 1, 4096));
    return tokens / block_size * block_size;
}

const char* kv_cache_dtype_name(DType dtype) {
    return dtype == DType::kBF16 ? "bf16" : "fp32";
}

Status require_device_built(const std::string& device) {
#if !EPINFER_WITH_CUDA
    if (device == "cuda")
        return not_supported("--device cuda: this build has no CUDA (configure with -DEPINFER_CUDA=ON)");
#else
    (void)device;
#endif
    return Status::ok();
}

Result<HostRanks> host_ranks(Communicator* world) {
    if (world == nullptr || world->size() == 1) return HostRanks{};
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    const int color = static_cast<int>(std::hash<std::string>{}(host) & 0x7fffffff);
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> same_host, world->split(color, world->rank(), "host"));
    return HostRanks{same_host->size(), same_host->rank()};
}

namespace {

// v.cuda only in CUDA builds (parse_values: require_device_built).
Result<std::unique_ptr<Backend>> make_backend(const SetupValues& v, int device_index) {
#if EPINFER_WITH_CUDA
    if (v.cuda) return make_cuda_backend(device_index);
#endif
    (void)device_index;
    return make_cpu_backend(v.threads);
}

// The NCCL world over the ranks of `world` on the stream of `backend` (a CUDA backend on device
// `device_index`).
Result<std::unique_ptr<Communicator>> nccl_world_on(Communicator& world, Backend& backend, int device_index) {
#if EPINFER_WITH_CUDA
    NcclOptions options;
    options.device = device_index;
    options.stream = cuda_stream_of(backend);
    return create_nccl_communicator(world, options);
#else
    (void)world;
    (void)device_index;
    return not_supported(std::string("backend ") + backend.name() + " has no communicator for its memory");
#endif
}

// The NCCL world over the ranks of `world`, on the stream of `backend`, when the ranks are several GPUs;
// null for CPU ranks and for one rank (its groups have nothing to move).
Result<std::unique_ptr<Communicator>> make_device_world(Communicator& world, Backend& backend, int device_index) {
    if (backend.host_accessible() || world.size() == 1) return std::unique_ptr<Communicator>();
    return nccl_world_on(world, backend, device_index);
}

// The memory one rank may plan with: the device's free memory (cpu: MemAvailable shared by this host's
// ranks), the least over the world so that every rank reaches the same verdict.
Result<int64_t> rank_memory_bytes(const Backend& backend, const HostRanks& host, Communicator* world) {
    Result<DeviceMemory> info = backend.memory_info();
    int64_t bytes = info.is_ok() ? info->free_bytes : -1;
    if (info.is_ok() && backend.host_accessible()) bytes /= host.count;
    if (world != nullptr && world->size() > 1) {
        EPI_RETURN_IF_ERROR(world->all_reduce(&bytes, &bytes, 1, DType::kI64, ReduceOp::kMin));
    }
    if (!info.is_ok()) return info.status().with_context("memory check");
    if (bytes < 0) return internal_error("memory check: another rank could not read its device memory");
    return bytes;
}

planner::WeightFormat format_of_dtype(DType dtype, planner::WeightFormat fallback) {
    switch (dtype) {
        case DType::kF32:
            return planner::WeightFormat::kFp32;
        case DType::kF16:
        case DType::kBF16:
            return planner::WeightFormat::kBf16;
        case DType::kF8E4M3:
        case DType::kF8E5M2:
            return planner::WeightFormat::kFp8Block128;
        default:
            return fallback;
    }
}

// The formats of the checkpoint's own tensors (one routed expert, o_proj of layer 0, the embedding);
// the config's quantization where a tensor is absent (Model::load then reports it).
Result<planner::WeightFormats> checkpoint_formats(const ModelConfig& config, const std::string& model_dir) {
    planner::WeightFormats formats = planner::checkpoint_weight_formats(config);
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open(model_dir));
    const auto dtype_of = [&](const std::string& name, planner::WeightFormat& out) {
        if (const TensorInfo* info = ckpt->find(name).info) out = format_of_dtype(info->dtype, out);
    };
    const auto first_moe = std::find(config.layer_is_moe.begin(), config.layer_is_moe.end(), true);
    if (first_moe != config.layer_is_moe.end())
        dtype_of(expert_tensor_name(config, first_moe - config.layer_is_moe.begin(), 0, ExpertProj::kGate),
                 formats.routed_experts);
    dtype_of("model.layers.0.self_attn.o_proj.weight", formats.dense);
    dtype_of("model.embed_tokens.weight", formats.other);
    return formats;
}

// "\repinfer: loading weights  42% (1.1 GiB of 2.6 GiB)" on stderr, redrawn when the percentage changes.
class ProgressBar {
public:
    void update(int64_t done, int64_t total) {
        const int percent = total > 0 ? static_cast<int>(done * 100 / total) : 100;
        if (percent == last_percent_) return;
        last_percent_ = percent;
        std::fprintf(stderr, "\repinfer: loading weights %3d%% (%s of %s)\033[K", percent,
                     planner::format_bytes(done).c_str(), planner::format_bytes(total).c_str());
        if (done >= total) std::fprintf(stderr, "\n");
        std::fflush(stderr);
    }

private:
    int last_percent_ = -1;
};

std::string layout_words(const ParallelLayout& l) {
    return fmt::format("tp{} ep{} pp{} dp{}", l.stage_size(), l.moe_ep, l.pp, l.attn_dp);
}

}  // namespace

Result<GpuRank> make_gpu_rank(Communicator& world) {
#if EPINFER_WITH_CUDA
    EPI_ASSIGN_OR_RETURN(const HostRanks host, host_ranks(&world));
    GpuRank rank;
    EPI_ASSIGN_OR_RETURN(rank.backend, make_cuda_backend(host.index));
    EPI_ASSIGN_OR_RETURN(rank.nccl, nccl_world_on(world, *rank.backend, host.index));
    return rank;
#else
    (void)world;
    return require_device_built("cuda");
#endif
}

std::vector<const CLI::Option*> add_model_setup_flags(CLI::App& cmd, ModelSetupFlags& f,
                                                      bool allow_random_weights) {
    std::vector<const CLI::Option*> options;
    CLI::Option* model =
        cmd.add_option("--model", f.model_dir, "Checkpoint folder (config.json + safetensors)");
    options.push_back(model);
    if (allow_random_weights) {
        options.push_back(
            cmd.add_option("--config", f.config_file, "config.json of the model (with --random-weights)"));
        options.push_back(
            cmd.add_flag("--random-weights", f.random_weights,
                         "Random weights at the config's shapes instead of a checkpoint (benchmarks)"));
        options.push_back(cmd.add_option("--num-layers", f.num_layers,
                                         "Random weights: the first N decoder layers; 0 = all (default 0)"));
        options.push_back(cmd.add_option("--weights-seed", f.seed, "Random weights: seed (default 0)"));
        options.push_back(cmd.add_option("--random-dtype", f.random_dtype,
                                         "Random weights: bf16, f16 or f32 (default bf16)"));
    } else {
        model->required();
    }
    options.push_back(cmd.add_option("--device", f.device, "cpu or cuda (default cpu)"));
    options.push_back(cmd.add_option("--threads", f.threads, "CPU threads; 0 = up to 8 (default 0)"));
    options.push_back(
        cmd.add_option("--tp", f.tp, "Ranks per pipeline stage (attention TP × DP = MoE TP × EP), ≥ 1"));
    options.push_back(cmd.add_option("--ep", f.ep, "Expert-parallel ranks per stage (moe_ep), ≥ 1"));
    options.push_back(cmd.add_option("--dp", f.dp, "Data-parallel attention ranks per stage (attn_dp), ≥ 1"));
    options.push_back(cmd.add_option("--pp", f.pp, "Pipeline stages, ≥ 1"));
    options.push_back(
        cmd.add_option("--kv-cache-tokens", f.kv_cache_tokens,
                       "KV cache tokens per rank; 0 = what the memory check leaves (default 0)"));
    options.push_back(
        cmd.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                       "KV cache element: auto (bf16 on cuda, fp32 on cpu), bf16 or fp32 (default auto)"));
    options.push_back(cmd.add_option("--block-size", f.block_size, "Tokens per KV block (default 16)"));
    options.push_back(
        cmd.add_option("--max-running", f.max_running, "Sequences in one step at most (default 256)"));
    options.push_back(
        cmd.add_flag("--no-decode-graphs", f.no_decode_graphs,
                     "Issue every decode step's ops one by one instead of replaying CUDA graphs"));
    options.push_back(
        cmd.add_option("--max-step-tokens", f.max_step_tokens, "Tokens in one step at most (default 2048)"));
    options.push_back(
        cmd.add_option("--max-waiting", f.max_waiting, "Queued requests at most (default 4096)"));
    options.push_back(
        cmd.add_option("--memory-fraction", f.memory_fraction,
                       "Share of the device's free memory epinfer may use, in (0, 1] (default 0.9)"));
    return options;
}

Result<ModelSetup> start_model(const ModelSetupFlags& flags) {
    const Clock::time_point start = Clock::now();
    EPI_ASSIGN_OR_RETURN(const SetupValues v, parse_values(flags));

    // 1. Config and layout; outside MPI, re-run under mpirun when the layout has several ranks.
    ModelConfig config;
    if (flags.random_weights && !flags.config_file.empty()) {
        EPI_ASSIGN_OR_RETURN(config, read_config_file(flags.config_file));
    } else {
        EPI_ASSIGN_OR_RETURN(config, load_hf_config(flags.model_dir));
    }
    EPI_RETURN_IF_ERROR(check_runtime_support(config));
    if (flags.random_weights) {
        EPI_ASSIGN_OR_RETURN(config, config_first_layers(config, v.num_layers));
    }
    const LayoutModelDims dims = layout_model_dims(config);
    ModelSetup setup;
    EPI_ASSIGN_OR_RETURN(setup.layout, layout_from_flags(v.layout));
    if (v.layout_given || launched_by_mpi()) {
        if (!launched_by_mpi()) {
            EPI_RETURN_IF_ERROR(validate_layout(setup.layout, dims, setup.layout.world_size()));
            EPI_RETURN_IF_ERROR(relaunch_under_mpirun_if_needed(setup.layout.world_size(), flags.mpirun_stop));
        }
        EPI_ASSIGN_OR_RETURN(setup.world, create_world_communicator());
        EPI_RETURN_IF_ERROR(validate_layout(setup.layout, dims, setup.world->size()));
    } else {
        EPI_RETURN_IF_ERROR(validate_layout(setup.layout, dims, 1));
    }
    EPI_ASSIGN_OR_RETURN(const HostRanks host, host_ranks(setup.world.get()));
    const bool driver = setup.is_driver();

    // 2. Backend, and the layout's groups: on GPUs the activations travel through NCCL on the backend's
    // stream (one GPU per rank of a host), the engine's step plans through MPI.
    EPI_ASSIGN_OR_RETURN(setup.backend, make_backend(v, host.index));
    if (setup.world != nullptr) {
        EPI_ASSIGN_OR_RETURN(setup.device_world, make_device_world(*setup.world, *setup.backend, host.index));
        EPI_ASSIGN_OR_RETURN(setup.parallel, create_parallel_context(*setup.world, setup.layout, dims,
                                                                     setup.device_world.get()));
    }

    // 3. Memory check, before any weight is read.
    EPI_ASSIGN_OR_RETURN(const int64_t device_bytes, rank_memory_bytes(*setup.backend, host, setup.world.get()));
    planner::FitOptions fit;
    fit.device_bytes = device_bytes;
    fit.usable_fraction = v.memory_fraction;
    fit.device = v.cuda ? fmt::format("cuda:{}: free memory", host.index)
                        : fmt::format("cpu: MemAvailable / {} rank{} of this host", host.count,
                                      host.count == 1 ? "" : "s");
    if (flags.random_weights) {
        const planner::WeightFormat f = format_of_dtype(v.random_dtype, planner::WeightFormat::kBf16);
        fit.memory.weights = planner::WeightFormats{f, f, f};
    } else {
        EPI_ASSIGN_OR_RETURN(fit.memory.weights, checkpoint_formats(config, flags.model_dir));
    }
    fit.memory.context_tokens = v.kv_cache_tokens > 0 ? v.kv_cache_tokens : config.max_position_embeddings;
    fit.kv_tokens_source =
        v.kv_cache_tokens > 0 ? "--kv-cache-tokens" : "one request of max_position_embeddings";
    fit.memory.kv_bytes_per_element = static_cast<int>(dtype_size(v.engine.kv_cache_dtype));
    fit.memory.activation_bytes_per_element = planner::kEngineActivationBytesPerElement;
    fit.memory.max_prefill_tokens = v.engine.max_step_tokens;
    fit.memory.max_dispatch_tokens_per_rank = v.engine.max_step_tokens;
    fit.memory.max_batch_requests_per_rank = v.engine.max_running;
    // MLA's attention temporaries as this backend runs them; the CPU backend's GEMMs copy no input.
    fit.memory.device.mla_absorb_max_rows = mla_absorb_max_rows(config, *setup.backend);
    if (!v.cuda) fit.memory.device.gemm_input_copy_bytes_per_element = 0;
    // Decode graphs (CUDA, one rank) keep their buckets' temporaries: the planner's reserve for them.
    const bool decode_graphs = v.cuda && !flags.no_decode_graphs && setup.layout.world_size() == 1;
    if (!decode_graphs) fit.memory.cuda_graph_bytes = 0;
    Result<planner::MemoryPlan> plan = planner::check_fits(config, setup.layout, fit);
    if (!plan.is_ok()) {
        const Status& s = plan.status();
        if (s.code() != StatusCode::kOutOfMemory) return s;
        return Status(s.code(), s.message() + " (lower --kv-cache-tokens, --max-step-tokens or --max-running, "
                                              "raise --memory-fraction, or use more ranks)");
    }

    // 4. Weights.
    ProgressBar bar;
    const LoadProgress progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
    const LoadProgress* progress_ptr = driver && isatty(STDERR_FILENO) ? &progress : nullptr;
    if (flags.random_weights) {
        RandomWeightsOptions random;
        random.seed = v.seed;
        random.num_layers = 0;  // config is already cut to --num-layers
        random.dtype = v.random_dtype;
        EPI_ASSIGN_OR_RETURN(setup.model, Model::create_random(config, *setup.backend, random,
                                                                setup.parallel.get(), progress_ptr));
    } else {
        EPI_ASSIGN_OR_RETURN(setup.model,
                             Model::load(flags.model_dir, *setup.backend, setup.parallel.get(), progress_ptr));
    }
    setup.model->set_decode_graphs(!flags.no_decode_graphs);

    // 5. KV pool.
    int64_t kv_tokens = v.kv_cache_tokens;
    if (kv_tokens == 0 && flags.default_kv_cache_tokens > 0) {
        const int64_t block = v.engine.block_size;
        kv_tokens = (flags.default_kv_cache_tokens + block - 1) / block * block;
    } else if (kv_tokens == 0) {
        // What fits, but never more than max_running full-context requests can use at once.
        kv_tokens = std::min(plan->kv_tokens_per_rank, v.engine.max_running * config.max_position_embeddings);
    }
    setup.engine_options = v.engine;
    setup.engine_options.num_kv_blocks = kv_tokens / v.engine.block_size;
    if (setup.engine_options.num_kv_blocks < 1)
        return invalid_argument(fmt::format("a KV cache of {} tokens per rank holds no block of --block-size {}",
                                            kv_tokens, v.engine.block_size));
    setup.kv_cache_tokens = setup.engine_options.num_kv_blocks * v.engine.block_size;

    // 6. Summary.
    setup.ready_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (driver) {
        std::fprintf(
            stderr,
            "epinfer: ready in %.1f s: %s (%lld layers%s), layout %s on %s, per rank: weights %s, KV cache "
            "%lld tokens (%lld block%s of %lld, %s)\n",
            setup.ready_seconds, config.model_type.c_str(), static_cast<long long>(config.num_hidden_layers),
            flags.random_weights ? ", random weights" : "", layout_words(setup.layout).c_str(),
            flags.device.c_str(), planner::format_bytes(setup.model->weight_bytes()).c_str(),
            static_cast<long long>(setup.kv_cache_tokens),
            static_cast<long long>(setup.engine_options.num_kv_blocks),
            setup.engine_options.num_kv_blocks == 1 ? "" : "s", static_cast<long long>(v.engine.block_size),
            kv_cache_dtype_name(v.engine.kv_cache_dtype));
        std::fflush(stderr);
    }
    return setup;
}

}  // namespace epinfer::cli
