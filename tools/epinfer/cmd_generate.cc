// epinfer generate: load a Hugging Face checkpoint and generate from prompt token ids.
//
//   epinfer generate --model DIR --prompt-ids 12,7,99 --max-new-tokens N
//                    [--temperature T --top-p P --top-k K --seed S] [--ignore-eos] [--json]
//                    [the model set-up flags of model_setup.h: --threads N, --tp A --ep B --pp C --dp D,
//                     --device, --memory-fraction, ...]
//
// stdout: the new token ids, comma-separated; with --json one JSON object {"prompt_ids", "output_ids",
// "prefill_tokens", "prefill_tokens_per_s", "decode_tokens", "decode_tokens_per_s"}. stderr: prefill and
// decode throughput. Bad input: one line "epinfer: error: ..." naming the value, exit status 1.
// Start-up (config, layout, mpirun relaunch, memory check, weights, summary line) is start_model
// (tools/epinfer/model_setup.h). The KV pool per rank: --kv-cache-tokens when given (a request of more
// tokens is one line naming both, before anything starts), else the request's tokens in whole blocks.
// Rank 0 prints the output and the throughput; under a layout every rank prints one stderr line with its
// weight bytes.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "comma_list.h"
#include "commands.h"
#include "engine/generate.h"
#include "flag_values.h"
#include "model_setup.h"

namespace epinfer::cli {

namespace {

struct GenerateOptions {
    ModelSetupFlags setup;
    std::string prompt_ids;
    std::string max_new_tokens = "16";
    std::string temperature = "0";
    std::string top_p = "1";
    std::string top_k = "0";
    std::string seed = "0";
    bool ignore_eos = false;
    bool json = false;
};

// "12,7,99" → {12, 7, 99}; ids outside int32 are reported here, ids outside the vocabulary by
// check_request_flags. An empty value or item is one line naming --prompt-ids.
Result<std::vector<int32_t>> parse_prompt_ids(const std::string& text) {
    EPI_ASSIGN_OR_RETURN(const std::vector<int64_t> values,
                         parse_comma_ints({text}, "generate", "--prompt-ids"));
    std::vector<int32_t> ids;
    for (const int64_t id : values) {
        if (id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max())
            return invalid_argument(fmt::format("--prompt-ids: token id {} is outside the int32 range", id));
        ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
}

// Parses the options; their values are checked against the model by check_request_flags.
Result<GenerateRequest> build_request(const GenerateOptions& o) {
    GenerateRequest r;
    EPI_ASSIGN_OR_RETURN(r.prompt_ids, parse_prompt_ids(o.prompt_ids));
    EPI_ASSIGN_OR_RETURN(r.max_new_tokens,
                         parse_flag_int(o.max_new_tokens, "--max-new-tokens", 1, INT64_MAX));
    EPI_ASSIGN_OR_RETURN(r.sampling.temperature, parse_flag_double(o.temperature, "--temperature"));
    EPI_ASSIGN_OR_RETURN(r.sampling.top_p, parse_flag_double(o.top_p, "--top-p"));
    EPI_ASSIGN_OR_RETURN(r.sampling.top_k, parse_flag_int(o.top_k, "--top-k", 0, INT64_MAX));
    EPI_ASSIGN_OR_RETURN(r.sampling.seed, parse_flag_uint64(o.seed, "--seed"));
    r.ignore_eos = o.ignore_eos;
    return r;
}

// The request against config.json in the names of the flags the user typed (generate_request_check, which
// the engine runs again, names the fields of GenerateRequest).
Status check_request_flags(const ModelConfig& config, const GenerateRequest& r) {
    for (const int32_t id : r.prompt_ids) {
        if (id < 0 || id >= config.vocab_size) {
            return invalid_argument(
                fmt::format("--prompt-ids: token id {} is outside [0, vocab_size {}) of config.json", id,
                            config.vocab_size));
        }
    }
    const auto prompt_len = static_cast<int64_t>(r.prompt_ids.size());
    if (r.max_new_tokens > config.max_position_embeddings - prompt_len) {
        return invalid_argument(
            fmt::format("--max-new-tokens {} after a prompt of {} tokens (--prompt-ids) exceeds "
                        "max_position_embeddings {} of config.json (at most {} new tokens)",
                        r.max_new_tokens, prompt_len, config.max_position_embeddings,
                        std::max<int64_t>(0, config.max_position_embeddings - prompt_len)));
    }
    return check_sampling_flags(r.sampling.temperature, r.sampling.top_p, r.sampling.top_k);
}

std::string join_ids(const std::vector<int32_t>& ids) {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) out += ',';
        out += std::to_string(ids[i]);
    }
    return out;
}

Status run_generate(const GenerateOptions& o) {
    EPI_ASSIGN_OR_RETURN(const GenerateRequest request, build_request(o));
    {  // the request against config.json first: a bad request is one line, before anything starts
        EPI_ASSIGN_OR_RETURN(const ModelConfig config, load_hf_config(o.setup.model_dir));
        EPI_RETURN_IF_ERROR(check_request_flags(config, request));
        EPI_RETURN_IF_ERROR(generate_request_check(config, request));
    }
    // The KV pool: --kv-cache-tokens when given (the request must fit in it), else the request's tokens.
    const auto prompt_len = static_cast<int64_t>(request.prompt_ids.size());
    const int64_t request_tokens = prompt_len + request.max_new_tokens;
    EPI_ASSIGN_OR_RETURN(const int64_t kv_pool_tokens, explicit_kv_pool_tokens(o.setup));
    if (kv_pool_tokens > 0 && request_tokens > kv_pool_tokens) {
        return invalid_argument(fmt::format(
            "prompt of {} tokens + --max-new-tokens {} = {} tokens exceed the KV cache of {} tokens per rank "
            "(--kv-cache-tokens {}, in blocks of --block-size {})",
            prompt_len, request.max_new_tokens, request_tokens, kv_pool_tokens, o.setup.kv_cache_tokens,
            o.setup.block_size));
    }
    ModelSetupFlags setup_flags = o.setup;
    setup_flags.default_kv_cache_tokens = request_tokens;
    EPI_ASSIGN_OR_RETURN(ModelSetup setup, start_model(setup_flags));
    const std::unique_ptr<Communicator>& world = setup.world;
    const std::unique_ptr<Model>& model = setup.model;
    if (setup.parallel != nullptr) {
        const RankCoords& rc = setup.parallel->coords;
        std::fprintf(stderr,
                     "rank %d/%d (pp %d, attn_tp %d, attn_dp %d, moe_tp %d, moe_ep %d): weight bytes %lld\n",
                     world->rank(), world->size(), rc.pp_rank, rc.attn_tp_rank, rc.attn_dp_rank,
                     rc.moe_tp_rank, rc.moe_ep_rank, static_cast<long long>(model->weight_bytes()));
    }
    GenerateKvCache kv_cache;
    kv_cache.dtype = setup.engine_options.kv_cache_dtype;
    kv_cache.num_kv_blocks = setup.engine_options.num_kv_blocks;
    kv_cache.block_size = setup.engine_options.block_size;
    EPI_ASSIGN_OR_RETURN(const GenerateOutput result, generate(*model, std::span(&request, 1), kv_cache));
    if (world != nullptr && world->rank() != 0) return Status::ok();

    const std::vector<int32_t>& output = result.output_ids.front();
    const GenerateStats& st = result.stats;
    if (o.json) {
        const nlohmann::json j = {
            {"prompt_ids", request.prompt_ids},    {"output_ids", output},
            {"prefill_tokens", st.prefill_tokens}, {"prefill_tokens_per_s", st.prefill_tokens_per_s()},
            {"decode_tokens", st.decode_tokens},   {"decode_tokens_per_s", st.decode_tokens_per_s()},
        };
        std::printf("%s\n", j.dump().c_str());
    } else {
        std::printf("%s\n", join_ids(output).c_str());
    }
    std::fflush(stdout);
    std::fprintf(
        stderr,
        "prefill: %lld tokens in %.3f ms (%.1f tokens/s); decode: %lld tokens in %.3f ms (%.1f tokens/s)\n",
        static_cast<long long>(st.prefill_tokens), st.prefill_seconds * 1e3, st.prefill_tokens_per_s(),
        static_cast<long long>(st.decode_tokens), st.decode_seconds * 1e3, st.decode_tokens_per_s());
    return Status::ok();
}

}  // namespace

void add_generate_command(CLI::App& app) {
    auto opts = std::make_shared<GenerateOptions>();
    CLI::App* cmd = app.add_subcommand("generate", "Generate tokens from prompt token ids");
    add_model_setup_flags(*cmd, opts->setup, /*allow_random_weights=*/false);
    cmd->add_option("--prompt-ids", opts->prompt_ids, "Prompt token ids, comma-separated, e.g. 12,7,99")
        ->required();
    cmd->add_option("--max-new-tokens", opts->max_new_tokens, "Tokens to generate (≥ 1; default 16)");
    cmd->add_option("--temperature", opts->temperature, "Sampling temperature; 0 = greedy (default 0)");
    cmd->add_option("--top-p", opts->top_p, "Nucleus mass in (0, 1] (default 1)");
    cmd->add_option("--top-k", opts->top_k, "Keep the K best tokens; 0 = all (default 0)");
    cmd->add_option("--seed", opts->seed, "Sampling seed (default 0)");
    cmd->add_flag("--ignore-eos", opts->ignore_eos, "Do not stop at an EOS token of the config");
    cmd->add_flag("--json", opts->json, "Print one JSON object on stdout");
    cmd->callback([opts] { exit_on_error(run_generate(*opts)); });
}

}  // namespace epinfer::cli
