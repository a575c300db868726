// epinfer plan: predicts memory and throughput of every TP/EP/PP/DP layout of a model on a machine.
//
//   epinfer plan --model kimi_k2/config.json --hardware rtx_pro_6000 --gpus 8 [--nodes 1] [--context L]
//                [--input-len 2048] [--concurrency 1,8,32,64,256,1024] [--weight-dtype experts=int4]
//                [--output-len 0] [--max-step-tokens 2048] [--kv-cache-dtype bf16] [--layout tp8,dp8-ep8]
//                [--micro-batches 0] [--memory-fraction F] [--kv-cache-tokens N] [--json]
// --model is a config.json or a checkpoint folder; --hardware a shipped profile name (profiles/*.json,
// EPINFER_PROFILES_DIR) or a profile file. --input-len defaults to 2048, or half the model's
// max_position_embeddings when that is fewer. --context defaults to --input-len + --output-len when
// --output-len > 0 (the closed loop's requests hold that many tokens), else 4096 (or the model's
// max_position_embeddings if fewer); a request longer than max_position_embeddings is refused, as the
// engine refuses it. --memory-fraction and --kv-cache-tokens mean what they mean to serve and bench
// (parsed by the same model_setup.h functions): the share of the GPU's memory to use (here the profile's
// gpu.memory_bytes; the engine's is its free memory at start-up), and the engine's KV pool per rank, whose
// fit the runtime's own check decides (planner.h PlanRequest::kv_cache_tokens). Errors print one line and
// exit 1.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/file_kind.h"
#include "checkpoint/hf_config.h"
#include "comma_list.h"
#include "commands.h"
#include "engine/bench_serving.h"
#include "model_setup.h"
#include "planner/engine_facts.h"
#include "planner/layouts.h"
#include "planner/plan_report.h"
#include "planner/planner.h"

namespace epinfer::cli {
namespace {

namespace fs = std::filesystem;

// The most requests in flight a --concurrency level may ask for (as `epinfer bench`'s levels).
constexpr int64_t kMaxPlanConcurrency = 65536;

struct PlanArgs {
    std::string model;
    std::string hardware;
    int gpus = 0;
    int nodes = 1;
    int64_t context = 4096;  // --context; used when given or without --output-len
    bool context_given = false;
    int64_t input_len = 2048;  // --input-len; without it half the model's positions when that is fewer
    bool input_len_given = false;
    int64_t output_len = 0;
    int64_t max_step_tokens = planner::kEngineMaxStepTokens;
    std::string concurrency = "1,8,32,64,256,1024";
    std::optional<std::string> weight_dtype;  // as given (none: the checkpoint's)
    std::string kv_cache_dtype = "bf16";
    std::optional<std::string> layouts;  // as given (none: every layout)
    int micro_batches = 0;
    std::optional<std::string> memory_fraction;  // --memory-fraction as given (none: the profile's fraction)
    std::optional<std::string> kv_cache_tokens;  // --kv-cache-tokens as given (none: the plan's own KV rule)
    bool json = false;
};

// The model's config and a label for reports (the checkpoint folder's or the file's name).
Result<ModelConfig> load_model(const std::string& path, std::string& label) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        label = fs::path(path).lexically_normal().filename().string();
        if (label.empty()) label = fs::path(path).lexically_normal().parent_path().filename().string();
        return load_hf_config(path);
    }
    // Not opened unless a regular file: opening a FIFO blocks until a writer comes.
    if (!path_exists(path)) return not_found(fmt::format("--model {}: no such file or folder", path));
    EPI_RETURN_IF_ERROR_CTX(check_regular_file(path), "--model");
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found(fmt::format("--model {}: cannot read the file", path));
    std::stringstream text;
    text << in.rdbuf();
    fs::path p(path);
    label =
        p.stem() == "config" && p.has_parent_path() ? p.parent_path().filename().string() : p.stem().string();
    return parse_hf_config(text.str(), path);
}

std::string executable_path() {
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    return ec ? std::string() : exe.string();
}

Status run_plan(PlanArgs args) {
    if (args.model.empty())
        return invalid_argument("--model is required (a config.json or a checkpoint folder)");
    if (args.hardware.empty())
        return invalid_argument("--hardware is required (a profile name or FILE.json)");

    planner::PlanRequest request;
    EPI_ASSIGN_OR_RETURN(ModelConfig config, load_model(args.model, request.model_label));
    const int64_t positions = config.max_position_embeddings;
    if (!args.input_len_given && positions > 0)  // the default fits a model of a short context
        args.input_len = std::min(args.input_len, std::max<int64_t>(1, positions / 2));
    EPI_ASSIGN_OR_RETURN(planner::HardwareProfile hardware,
                         planner::resolve_hardware_profile(args.hardware, executable_path()));
    request.gpus = args.gpus;
    request.nodes = args.nodes;
    EPI_ASSIGN_OR_RETURN(request.concurrency,
                         parse_concurrency_list(args.concurrency, "--concurrency", kMaxPlanConcurrency));
    request.input_len = args.input_len;
    request.output_len = args.output_len;
    request.max_step_tokens = args.max_step_tokens;
    request.memory.max_prefill_tokens = args.max_step_tokens;  // the engine sizes its buffers so
    request.memory.max_dispatch_tokens_per_rank = args.max_step_tokens;
    request.micro_batches = args.micro_batches;
    if (args.memory_fraction) {
        EPI_ASSIGN_OR_RETURN(request.memory_fraction, parse_memory_fraction(*args.memory_fraction));
    }
    if (args.kv_cache_tokens) {
        EPI_ASSIGN_OR_RETURN(request.kv_cache_tokens, parse_kv_cache_tokens(*args.kv_cache_tokens));
    }
    // A closed loop's requests hold input + output tokens: that is their KV unless --context says more.
    // The engine refuses a request past the model's positions: so does the plan, except that the default of
    // 4096 becomes the model's own limit when that is shorter, and the prompt's length when that is longer.
    if (positions > 0 && args.input_len > positions) {
        return invalid_argument(
            fmt::format("--input-len {}: more than the model's max_position_embeddings {} (the engine "
                        "refuses longer requests)",
                        args.input_len, positions));
    }
    if (args.context_given || args.output_len > 0) {
        request.memory.context_tokens = args.context_given ? args.context : args.input_len + args.output_len;
        if (positions > 0 && request.memory.context_tokens > positions) {
            return invalid_argument(
                fmt::format("{} {}: more than the model's max_position_embeddings {} (the engine refuses "
                            "longer requests)",
                            args.context_given ? "--context" : "--input-len + --output-len",
                            request.memory.context_tokens, positions));
        }
    } else {  // the default, at least the prompt (a request holds its prompt's KV whole)
        request.memory.context_tokens =
            std::max(args.input_len, positions > 0 ? std::min(args.context, positions) : args.context);
    }
    request.memory.weights = planner::checkpoint_weight_formats(config);
    if (args.weight_dtype) {
        EPI_ASSIGN_OR_RETURN(request.memory.weights,
                             planner::parse_weight_dtype(*args.weight_dtype, request.memory.weights));
    }
    if (args.kv_cache_dtype == "auto" || args.kv_cache_dtype == "bf16") {  // auto: the engine's on GPUs
        request.memory.kv_bytes_per_element = planner::kEngineKvBytesPerElement;
    } else if (args.kv_cache_dtype == "fp32") {
        request.memory.kv_bytes_per_element = 4;
    } else if (args.kv_cache_dtype == "fp8") {
        request.memory.kv_bytes_per_element = 1;
    } else {
        return invalid_argument(
            fmt::format("--kv-cache-dtype '{}': expected auto, bf16, fp32 or fp8", args.kv_cache_dtype));
    }
    if (args.layouts) {
        if (args.layouts->empty()) return invalid_argument("--layout '': name at least one layout, e.g. tp8");
        EPI_ASSIGN_OR_RETURN(
            const std::vector<std::string> specs,
            split_comma_lists({*args.layouts}, "plan", "--layout", "layouts such as tp8,dp8-ep8"));
        for (const std::string& spec : specs) {
            EPI_ASSIGN_OR_RETURN(ParallelLayout layout, planner::parse_layout_spec(spec));
            if (std::find(request.layouts.begin(), request.layouts.end(), layout) != request.layouts.end())
                return invalid_argument(fmt::format("--layout: {} is named twice", spec));
            request.layouts.push_back(layout);
            request.layout_names.push_back(spec);
        }
    }
    EPI_ASSIGN_OR_RETURN(planner::Plan plan, planner::make_plan(config, hardware, request));
    std::string text = args.json ? planner::plan_to_json(plan) : planner::plan_to_text(plan);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return Status::ok();
}

}  // namespace

void add_plan_command(CLI::App& app) {
    auto args = std::make_shared<PlanArgs>();
    CLI::App* cmd = app.add_subcommand(
        "plan", "Predict memory and throughput of every TP/EP/PP/DP layout of a model on a machine");
    cmd->add_option("--model", args->model, "config.json or checkpoint folder (required)");
    cmd->add_option("--hardware", args->hardware,
                    "hardware profile name (profiles/*.json) or FILE.json (required)");
    cmd->add_option("--gpus", args->gpus, "GPUs in all (over every node)")->required();
    cmd->add_option("--nodes", args->nodes, "nodes the GPUs split evenly over")->capture_default_str();
    CLI::Option* context = cmd->add_option(
        "--context", args->context,
        "KV tokens each request holds and attends over, at most the model's "
        "max_position_embeddings (default: --input-len + --output-len with --output-len, else the "
        "larger of --input-len and 4096)");
    CLI::Option* input_len = cmd->add_option(
        "--input-len", args->input_len,
        "prompt tokens for the prefill estimate and the closed loop (default 2048, or half the "
        "model's max_position_embeddings when that is fewer)");
    cmd->add_option(
           "--output-len", args->output_len,
           "output tokens per request: ≥ 2 predicts a closed-loop run of C requests started together "
           "(TPOT of the median request, prompt chunks mixed into decode steps); 0 = one decode step")
        ->capture_default_str();
    cmd->add_option("--max-step-tokens", args->max_step_tokens,
                    "the engine's tokens per step: closed-loop chunks, activation and EP buffer rows")
        ->capture_default_str();
    cmd->add_option("--concurrency", args->concurrency, "requests in flight, comma separated (each ≤ 65536)")
        ->capture_default_str();
    cmd->add_option("--weight-dtype", args->weight_dtype,
                    "bf16|fp8|int4|nvfp4|mxfp4 for every linear weight, or experts=D,dense=D "
                    "(default: the checkpoint's)");
    cmd->add_option(
           "--kv-cache-dtype", args->kv_cache_dtype,
           "auto or bf16 (the engine's cache on GPUs: its auto is bf16 there)|fp32 (--kv-cache-dtype "
           "fp32)|fp8 (a what-if)")
        ->capture_default_str();
    cmd->add_option("--layout", args->layouts,
                    "only these layouts, comma separated (e.g. tp8,dp8-ep8,pp2-tp4)");
    cmd->add_option("--micro-batches", args->micro_batches, "pipeline micro-batches (0 = pp)")
        ->capture_default_str();
    cmd->add_option("--memory-fraction", args->memory_fraction,
                    "share of the GPU's memory to use, in (0, 1], as serve's (default: the profile's "
                    "usable_memory_fraction)");
    cmd->add_option("--kv-cache-tokens", args->kv_cache_tokens,
                    "KV cache tokens per rank, as serve's: fit as the engine's memory check decides it; 0 = "
                    "what is left after one request of max_position_embeddings (default: not the engine's "
                    "rule, one request of --context must fit)");
    cmd->add_flag("--json", args->json, "print one JSON document instead of the table");
    cmd->callback([args, context, input_len]() {
        args->context_given = context->count() > 0;
        args->input_len_given = input_len->count() > 0;
        exit_on_error(run_plan(*args));
    });
}

}  // namespace epinfer::cli
