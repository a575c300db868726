// epinfer inspect --model DIR [--json]: what a Hugging Face checkpoint is (architecture, layers, experts,
// attention, parameters, bytes by dtype) and whether its tensors are exactly those its config.json asks for.
// Exits 1 when a tensor is missing, unexpected, of the wrong shape or of an unsupported dtype.
// --model may also name a config.json file alone: the checkpoint part is then skipped.
//   epinfer inspect --model tests/data/fixtures/deepseek_v3_tiny
//   epinfer inspect --model tests/data/configs/deepseek_v3.json --json
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weight_names.h"
#include "commands.h"

namespace epinfer::cli {
namespace {

struct InspectOptions {
    std::string model;
    bool json = false;
};

struct DtypeTotal {
    uint64_t bytes = 0;
    int64_t tensors = 0;
};

// What the checkpoint folder holds; absent when --model names a config.json file.
struct CheckpointReport {
    std::map<std::string, DtypeTotal> by_dtype;  // safetensors dtype name → totals
    size_t num_expected = 0;
    std::vector<TensorIssue> issues;
};

struct Report {
    std::string model;
    ModelConfig config;
    ParameterCounts params;
    std::optional<CheckpointReport> checkpoint;
};

Result<ModelConfig> load_config(const std::string& model) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(model, ec)) return load_hf_config(model);
    std::ifstream in(model, std::ios::binary);
    if (!in) return not_found(model + ": cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    return parse_hf_config(text.str(), model);
}

Result<Report> build_report(const InspectOptions& opts) {
    Report report;
    report.model = opts.model;
    EPI_ASSIGN_OR_RETURN(report.config, load_config(opts.model));
    report.params = count_parameters(report.config);
    std::error_code ec;
    if (std::filesystem::is_regular_file(opts.model, ec)) return report;

    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open(opts.model));
    CheckpointReport cr;
    std::vector<TensorInfo> tensors;
    for (const std::string& name : ckpt->names()) {
        const TensorInfo& info = *ckpt->find(name).info;
        DtypeTotal& total = cr.by_dtype[dtype_name(info.dtype)];
        total.bytes += info.num_bytes();
        ++total.tensors;
        tensors.push_back(info);
    }
    cr.num_expected = expected_tensors(report.config).size();
    cr.issues = check_checkpoint_tensors(report.config, tensors);
    report.checkpoint = std::move(cr);
    return report;
}

const char* scoring_name(ScoringFunc f) {
    return f == ScoringFunc::kSigmoid ? "sigmoid" : "softmax";
}

const char* topk_method_name(TopkMethod m) {
    switch (m) {
        case TopkMethod::kGreedy:
            return "greedy";
        case TopkMethod::kGroupLimitedGreedy:
            return "group_limited_greedy";
        case TopkMethod::kNoauxTc:
            return "noaux_tc";
    }
    return "unknown";
}

const char* rope_type_name(RopeType t) {
    switch (t) {
        case RopeType::kDefault:
            return "default";
        case RopeType::kYarn:
            return "yarn";
        case RopeType::kLinear:
            return "linear";
        case RopeType::kLlama3:
            return "llama3";
    }
    return "unknown";
}

const char* qk_norm_name(QkNormKind k) {
    switch (k) {
        case QkNormKind::kNone:
            return "none";
        case QkNormKind::kPerHead:
            return "per_head";
        case QkNormKind::kFullProjection:
            return "full_projection";
    }
    return "unknown";
}

const char* issue_kind_name(TensorIssue::Kind k) {
    switch (k) {
        case TensorIssue::Kind::kMissing:
            return "missing";
        case TensorIssue::Kind::kUnexpected:
            return "unexpected";
        case TensorIssue::Kind::kWrongShape:
            return "wrong_shape";
        case TensorIssue::Kind::kWrongDtype:
            return "wrong_dtype";
    }
    return "unknown";
}

// Shared-expert MLPs per MoE layer and their width (DeepSeek/GLM: one of n_shared·I; Qwen2-MoE: one gated).
std::pair<int64_t, int64_t> shared_experts(const ModelConfig& c) {
    if (c.n_shared_experts > 0) return {c.n_shared_experts, c.n_shared_experts * c.moe_intermediate_size};
    if (c.shared_expert_intermediate_size > 0) return {1, c.shared_expert_intermediate_size};
    return {0, 0};
}

std::string with_commas(int64_t n) {
    std::string digits = std::to_string(n), out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

std::string billions(int64_t n) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2fB", static_cast<double>(n) / 1e9);
    return buf;
}

std::string number(double x) {
    std::ostringstream out;
    out << x;
    return out.str();
}

void print_text(const Report& r) {
    const ModelConfig& c = r.config;
    const RouterConfig& router = c.router;
    const auto [num_shared, shared_width] = shared_experts(c);
    std::printf("model         %s\n", r.model.c_str());
    std::printf("architecture  %s (model_type %s)\n", architecture_name(c.architecture),
                c.model_type.c_str());
    std::printf("layers        %lld (%lld dense, %lld MoE)\n", static_cast<long long>(c.num_hidden_layers),
                static_cast<long long>(c.num_hidden_layers - c.num_moe_layers()),
                static_cast<long long>(c.num_moe_layers()));
    std::printf("experts       E=%lld routed of width %lld, K=%lld, %lld shared",
                static_cast<long long>(c.n_routed_experts), static_cast<long long>(c.moe_intermediate_size),
                static_cast<long long>(router.num_experts_per_tok), static_cast<long long>(num_shared));
    if (num_shared > 0) std::printf(" (width %lld)", static_cast<long long>(shared_width));
    std::printf("\n");
    std::printf("router        %s%s, %s, n_group %lld, topk_group %lld, norm_topk_prob %s, scale %s\n",
                scoring_name(router.scoring_func), router.has_correction_bias ? " + correction bias" : "",
                topk_method_name(router.topk_method), static_cast<long long>(router.n_group),
                static_cast<long long>(router.topk_group), router.norm_topk_prob ? "true" : "false",
                number(router.routed_scaling_factor).c_str());
    if (c.attention == AttentionKind::kMla) {
        std::printf(
            "attention     MLA, %lld heads, q_lora_rank %lld, kv_lora_rank %lld, qk_nope %lld + qk_rope "
            "%lld, v %lld\n",
            static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.q_lora_rank),
            static_cast<long long>(c.kv_lora_rank), static_cast<long long>(c.qk_nope_head_dim),
            static_cast<long long>(c.qk_rope_head_dim), static_cast<long long>(c.v_head_dim));
    } else {
        std::string extras = c.attention_bias ? ", qkv bias" : "";
        if (!c.layer_is_sliding.empty()) {
            const auto sliding = std::count(c.layer_is_sliding.begin(), c.layer_is_sliding.end(), true);
            extras += ", sliding window " + std::to_string(c.sliding_window) + " on " + std::to_string(sliding) +
                      " of " + std::to_string(c.num_hidden_layers) + " layers";
        }
        if (c.attention_sinks) extras += ", attention sinks";
        std::printf("attention     GQA, %lld heads, %lld KV heads, head_dim %lld, qk_norm %s%s\n",
                    static_cast<long long>(c.num_attention_heads),
                    static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.head_dim),
                    qk_norm_name(c.qk_norm), extras.c_str());
    }
    std::printf("rope          %s, theta %s, rotary_dim %lld%s\n", rope_type_name(c.rope.type),
                number(c.rope.theta).c_str(), static_cast<long long>(c.rope.rotary_dim),
                c.rope.interleaved ? ", interleaved" : "");
    std::printf("parameters    total %s (%s), active %s (%s)\n", with_commas(r.params.total).c_str(),
                billions(r.params.total).c_str(), with_commas(r.params.active).c_str(),
                billions(r.params.active).c_str());
    if (!r.checkpoint) return;
    const CheckpointReport& cr = *r.checkpoint;
    for (const auto& [dtype, total] : cr.by_dtype)
        std::printf("weights       %s: %s bytes in %lld tensors\n", dtype.c_str(),
                    with_commas(total.bytes).c_str(), static_cast<long long>(total.tensors));
    if (cr.issues.empty()) {
        std::printf("tensors       %zu expected, all present\n", cr.num_expected);
        return;
    }
    std::map<TensorIssue::Kind, size_t> counts;
    for (const TensorIssue& issue : cr.issues) ++counts[issue.kind];
    std::printf("tensors       %zu expected: %zu missing, %zu unexpected, %zu wrong shape, %zu wrong dtype\n",
                cr.num_expected, counts[TensorIssue::Kind::kMissing], counts[TensorIssue::Kind::kUnexpected],
                counts[TensorIssue::Kind::kWrongShape], counts[TensorIssue::Kind::kWrongDtype]);
    for (const TensorIssue& issue : cr.issues)
        std::printf("  %-12s %s\n", issue_kind_name(issue.kind), issue.message.c_str());
}

nlohmann::json to_json(const Report& r) {
    const ModelConfig& c = r.config;
    const RouterConfig& router = c.router;
    const auto [num_shared, shared_width] = shared_experts(c);
    nlohmann::json j;
    j["model"] = r.model;
    j["architecture"] = architecture_name(c.architecture);
    j["model_type"] = c.model_type;
    j["layers"] = {{"total", c.num_hidden_layers},
                   {"dense", c.num_hidden_layers - c.num_moe_layers()},
                   {"moe", c.num_moe_layers()}};
    j["experts"] = {{"routed", c.n_routed_experts},
                    {"top_k", router.num_experts_per_tok},
                    {"width", c.moe_intermediate_size},
                    {"shared", num_shared},
                    {"shared_width", shared_width}};
    j["router"] = {{"scoring_func", scoring_name(router.scoring_func)},
                   {"topk_method", topk_method_name(router.topk_method)},
                   {"correction_bias", router.has_correction_bias},
                   {"n_group", router.n_group},
                   {"topk_group", router.topk_group},
                   {"norm_topk_prob", router.norm_topk_prob},
                   {"routed_scaling_factor", router.routed_scaling_factor}};
    j["attention"] = {{"kind", c.attention == AttentionKind::kMla ? "mla" : "gqa"},
                      {"num_heads", c.num_attention_heads},
                      {"num_kv_heads", c.num_key_value_heads},
                      {"head_dim", c.head_dim},
                      {"qk_norm", qk_norm_name(c.qk_norm)}};
    if (!c.layer_is_sliding.empty()) {
        j["attention"]["sliding_window"] = c.sliding_window;
        j["attention"]["layer_is_sliding"] = c.layer_is_sliding;
    }
    if (c.attention_sinks) j["attention"]["sinks"] = true;
    if (c.attention == AttentionKind::kMla) {
        j["attention"].update({{"q_lora_rank", c.q_lora_rank},
                               {"kv_lora_rank", c.kv_lora_rank},
                               {"qk_nope_head_dim", c.qk_nope_head_dim},
                               {"qk_rope_head_dim", c.qk_rope_head_dim},
                               {"v_head_dim", c.v_head_dim}});
    }
    j["rope"] = {{"type", rope_type_name(c.rope.type)},
                 {"theta", c.rope.theta},
                 {"rotary_dim", c.rope.rotary_dim},
                 {"interleaved", c.rope.interleaved},
                 {"factor", c.rope.factor}};
    const ParameterCounts& p = r.params;
    j["parameters"] = {{"total", p.total},
                       {"active", p.active},
                       {"embedding", p.embedding},
                       {"lm_head", p.lm_head},
                       {"attention", p.attention},
                       {"norms", p.norms},
                       {"dense_mlp", p.dense_mlp},
                       {"router", p.router},
                       {"shared_experts", p.shared_experts},
                       {"routed_experts", p.routed_experts}};
    j["eos_token_ids"] = c.eos_token_ids;
    if (!r.checkpoint) {
        j["weights"] = nullptr;
        j["tensors"] = nullptr;
        return j;
    }
    const CheckpointReport& cr = *r.checkpoint;
    j["weights"] = nlohmann::json::object();
    for (const auto& [dtype, total] : cr.by_dtype)
        j["weights"][dtype] = {{"bytes", total.bytes}, {"tensors", total.tensors}};
    nlohmann::json tensors = {{"expected", cr.num_expected}, {"complete", cr.issues.empty()}};
    for (const char* kind : {"missing", "unexpected", "wrong_shape", "wrong_dtype"})
        tensors[kind] = nlohmann::json::array();
    for (const TensorIssue& issue : cr.issues)
        tensors[issue_kind_name(issue.kind)].push_back({{"name", issue.name}, {"message", issue.message}});
    j["tensors"] = tensors;
    return j;
}

void run_inspect(const InspectOptions& opts) {
    Result<Report> report = build_report(opts);
    exit_on_error(report.status());
    if (opts.json)
        std::printf("%s\n", to_json(*report).dump(2).c_str());
    else
        print_text(*report);
    std::fflush(stdout);
    if (report->checkpoint && !report->checkpoint->issues.empty()) {
        const size_t n = report->checkpoint->issues.size();
        exit_on_error(invalid_argument(opts.model + ": the checkpoint's tensors do not match config.json (" +
                                       std::to_string(n) + (n == 1 ? " issue)" : " issues)")));
    }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
    auto opts = std::make_shared<InspectOptions>();
    CLI::App* cmd = app.add_subcommand(
        "inspect",
        "Architecture, layers, experts, parameters and dtypes of a checkpoint; checks its tensors");
    cmd->add_option("--model", opts->model,
                    "checkpoint folder (config.json + safetensors), or a config.json file")
        ->required();
    cmd->add_flag("--json", opts->json, "print one JSON object");
    cmd->callback([opts] { run_inspect(*opts); });
}

}  // namespace epinfer::cli
