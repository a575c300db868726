// config.json → ModelConfig. What a key means follows the transformers 5.17 modeling files
// (modeling_<family>.py). Defaults for absent keys are those of the transformers configuration classes
// (configuration_<family>.py, huggingface/transformers main at commit 008e5743 — the 5.x dataclass
// configs — and DeepseekV3Config at 001f85b3); the modeling dump used for the rest does not hold them.
#include "checkpoint/hf_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/file_kind.h"
#include "core/json_error.h"

namespace epinfer {
namespace {

using Json = nlohmann::json;

struct Family {
    const char* model_type;
    Architecture architecture;
    // Parsed so that `epinfer plan` and `inspect` read it; the runtime refuses it (model_registry.h).
    bool plan_only = false;
};

constexpr Family kFamilies[] = {
    {"deepseek_v3", Architecture::kDeepseekV3},
    {"kimi_k2", Architecture::kDeepseekV3},
    {"deepseek_v2", Architecture::kDeepseekV2},
    {"qwen3_moe", Architecture::kQwen3Moe},
    {"qwen2_moe", Architecture::kQwen2Moe},
    {"mixtral", Architecture::kMixtral},
    {"olmoe", Architecture::kOlmoe},
    {"glm4_moe", Architecture::kGlm4Moe},
    {"gpt_oss", Architecture::kGptOss, /*plan_only=*/true},
};

// Defaults of the transformers 5.17 configuration class of each family, for keys that are absent.
struct FamilyDefaults {
    double rms_norm_eps;
    int64_t max_position_embeddings;
    double rope_theta;              // RotaryEmbeddingConfigMixin.default_theta, Mixtral overrides it
    double partial_rotary_factor;   // Glm4MoeConfig.__post_init__ sets 0.5; others rotate the whole head
    int64_t num_key_value_heads;    // 0 = num_attention_heads
    int64_t first_k_dense_replace;  // DeepSeek/GLM: leading dense layers
};

FamilyDefaults family_defaults(Architecture arch) {
    switch (arch) {
        case Architecture::kDeepseekV3:
            return {1e-6, 4096, 10000.0, 1.0, 0, 3};
        case Architecture::kDeepseekV2:
            return {1e-6, 2048, 10000.0, 1.0, 0, 0};
        case Architecture::kQwen3Moe:
            return {1e-6, 32768, 10000.0, 1.0, 4, 0};
        case Architecture::kQwen2Moe:
            return {1e-6, 32768, 10000.0, 1.0, 16, 0};
        case Architecture::kMixtral:
            return {1e-5, 4096 * 32, 1000000.0, 1.0, 8, 0};
        case Architecture::kOlmoe:
            return {1e-5, 4096, 10000.0, 1.0, 0, 0};
        case Architecture::kGlm4Moe:
            return {1e-5, 131072, 10000.0, 0.5, 8, 1};
        case Architecture::kGptOss:
            return {1e-5, 131072, 150000.0, 1.0, 8, 0};
    }
    return {1e-6, 0, 10000.0, 1.0, 0, 0};
}

// "deepseek_v3, kimi_k2, ..., glm4_moe; gpt_oss for epinfer plan only": the runtime's model_types, then
// the plan-only ones.
std::string supported_list() {
    std::string runs, plan_only;
    for (const auto& f : kFamilies) {
        std::string& list = f.plan_only ? plan_only : runs;
        list += (list.empty() ? "" : ", ") + std::string(f.model_type);
    }
    return plan_only.empty() ? runs : runs + "; " + plan_only + " for epinfer plan only";
}

// A short rendering of a JSON value for error messages.
std::string brief(const Json& value) {
    std::string text = value.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return std::string(value.type_name()) + " " + text;
}

// The values a float key may take. Every float of the config reaches the model as fp32, so no range goes
// beyond the fp32 maximum; `lo_open` excludes `lo` itself ("(0, 1]").
struct FloatRange {
    double lo;
    double hi;
    bool lo_open;
};
constexpr double kFp32Max = std::numeric_limits<float>::max();

// Ranges of the float keys, by meaning. The open bounds exclude what makes no sense or divides by zero:
// an RMSNorm epsilon of 0, a RoPE base ≤ 1 (log(base) divides the YaRN correction range), a scaling factor
// of 0. The closed upper bounds far above every published value keep the derived quantities finite in fp32.
constexpr FloatRange kPositiveFp32{0.0, kFp32Max, true};      // a divisor or scale: > 0, finite in fp32
constexpr FloatRange kNonNegativeFp32{0.0, kFp32Max, false};  // 0 = the default (YaRN beta_fast/slow)
constexpr FloatRange kFraction{0.0, 1.0, true};               // (0, 1]: partial_rotary_factor
constexpr FloatRange kNormEps{0.0, 1.0, true};                // published 1e-6 … 1e-5
constexpr FloatRange kRopeTheta{1.0, kFp32Max, true};         // published 1e4 … 1e7
// YaRN mscale/mscale_all_dim (published 0.707, 1) and attention_factor (published ~1): the softmax scale
// is multiplied by up to (0.1·mscale·ln(factor) + 1)², which this bound keeps far inside fp32.
constexpr FloatRange kMscale{0.0, 100.0, false};
constexpr FloatRange kAttentionFactor{0.0, 100.0, true};
// routed_scaling_factor multiplies each routed expert's output (published 1 … 16, DeepSeek-V2's 16).
constexpr FloatRange kRoutedScaling{0.0, 1000.0, true};

bool in_range(double value, const FloatRange& range) {
    return (range.lo_open ? value > range.lo : value >= range.lo) && value <= range.hi;
}

// "(0, 1]"; the fp32 maximum is named as such.
std::string range_text(const FloatRange& range) {
    const std::string hi =
        range.hi == kFp32Max ? fmt::format("{:g} (fp32 max)", range.hi) : fmt::format("{:g}", range.hi);
    return fmt::format("{}{:g}, {}]", range.lo_open ? "(" : "[", range.lo, hi);
}

bool as_int64(const Json& v, int64_t* out) {
    if (v.is_number_unsigned()) {
        if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
        *out = static_cast<int64_t>(v.get<uint64_t>());
        return true;
    }
    if (v.is_number_integer()) {
        *out = v.get<int64_t>();
        return true;
    }
    if (v.is_number_float()) {  // 4096.0: written by some tools; accepted when exactly integral
        const double d = v.get<double>();
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
            *out = static_cast<int64_t>(d);
            return true;
        }
    }
    return false;
}

// Typed reads of the keys of one JSON object. The first error is kept in status(); after it, every read
// returns its fallback, so a parse reads all keys and checks status() once.
class KeyReader {
public:
    KeyReader(const Json& object, std::string source, std::string prefix = "")
        : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

    const Status& status() const { return status_; }
    const std::string& source() const { return source_; }

    // Present with a non-null value.
    bool has(const char* key) const {
        auto it = object_.find(key);
        return it != object_.end() && !it->is_null();
    }
    bool is_null(const char* key) const {
        auto it = object_.find(key);
        return it != object_.end() && it->is_null();
    }

    // An integer ≥ 1 that must be present.
    int64_t required_count(const char* key) {
        if (!has(key)) {
            fail(invalid_argument(source_ + ": missing required key '" + prefix_ + key + "'"));
            return 0;
        }
        return positive_or(key, 0);
    }
    // An integer ≥ 1, or `fallback` when absent or null.
    int64_t positive_or(const char* key, int64_t fallback) {
        const int64_t value = int_or(key, fallback);
        if (status_.is_ok() && value < 1)
            fail(invalid_argument(source_ + ": key '" + prefix_ + key + "' must be >= 1, got " +
                                  std::to_string(value)));
        return value;
    }
    // An integer ≥ 0, or `fallback` when absent or null.
    int64_t count_or(const char* key, int64_t fallback) {
        const int64_t value = int_or(key, fallback);
        if (status_.is_ok() && value < 0)
            fail(invalid_argument(source_ + ": key '" + prefix_ + key + "' must be >= 0, got " +
                                  std::to_string(value)));
        return value;
    }
    // A number in `range`, or `fallback` when absent or null. The one place where a JSON number becomes a
    // float of the model: a value outside `range`, and a nonzero value that is 0 in fp32, fail naming the
    // key, the value and the range. (JSON has no inf or NaN; the parser refuses 1e400 as an overflow.)
    double number_or(const char* key, double fallback, const FloatRange& range) {
        if (!has(key) || !status_.is_ok()) return fallback;
        const Json& v = object_.at(key);
        if (!v.is_number()) return type_error(key, "a number", v), fallback;
        const double value = v.get<double>();
        if (!in_range(value, range)) {
            fail(invalid_argument(fmt::format("{}: key '{}{}' {} is outside {}", source_, prefix_, key, value,
                                              range_text(range))));
        } else if (value != 0.0 && static_cast<float>(value) == 0.0f) {
            fail(invalid_argument(fmt::format("{}: key '{}{}' {} is 0 in fp32 (below {:g})", source_, prefix_,
                                              key, value, std::numeric_limits<float>::denorm_min())));
        }
        return value;
    }
    double required_number(const char* key, const FloatRange& range) {
        if (!has(key)) {
            fail(invalid_argument(source_ + ": missing required key '" + prefix_ + key + "'"));
            return 0.0;
        }
        return number_or(key, 0.0, range);
    }
    bool bool_or(const char* key, bool fallback) {
        if (!has(key) || !status_.is_ok()) return fallback;
        const Json& v = object_.at(key);
        if (!v.is_boolean()) return type_error(key, "a boolean", v), fallback;
        return v.get<bool>();
    }
    std::string string_or(const char* key, const std::string& fallback) {
        if (!has(key) || !status_.is_ok()) return fallback;
        const Json& v = object_.at(key);
        if (!v.is_string()) return type_error(key, "a string", v), fallback;
        return v.get<std::string>();
    }
    // A list of integers; an integer alone is read as a list of one (eos_token_id). Empty when absent.
    std::vector<int64_t> int_list(const char* key) {
        std::vector<int64_t> out;
        if (!has(key) || !status_.is_ok()) return out;
        const Json& v = object_.at(key);
        int64_t x = 0;
        if (as_int64(v, &x)) return {x};
        if (!v.is_array()) return type_error(key, "an integer or a list of integers", v), out;
        for (const Json& item : v) {
            if (!as_int64(item, &x)) return type_error(key, "a list of integers", v), std::vector<int64_t>{};
            out.push_back(x);
        }
        return out;
    }
    void fail(Status status) {
        if (status_.is_ok()) status_ = std::move(status);
    }

private:
    int64_t int_or(const char* key, int64_t fallback) {
        if (!has(key) || !status_.is_ok()) return fallback;
        const Json& v = object_.at(key);
        int64_t out = 0;
        if (!as_int64(v, &out)) return type_error(key, "an integer", v), fallback;
        return out;
    }
    void type_error(const char* key, const char* expected, const Json& v) {
        fail(invalid_argument(source_ + ": key '" + prefix_ + key + "' must be " + expected + ", got " +
                              brief(v)));
    }

    const Json& object_;
    std::string source_;
    std::string prefix_;
    Status status_;
};

// The first of `keys` that is present (aliases: n_routed_experts / num_local_experts / num_experts).
const char* first_present(const KeyReader& r, std::initializer_list<const char*> keys) {
    for (const char* key : keys)
        if (r.has(key)) return key;
    return *keys.begin();
}

Result<const Family*> resolve_family(const Json& root, const std::string& source) {
    KeyReader r(root, source);
    const std::string model_type = r.string_or("model_type", "");
    std::string arch_name;
    if (auto it = root.find("architectures"); it != root.end() && !it->is_null()) {
        if (!it->is_array() || (!it->empty() && !(*it)[0].is_string()))
            return invalid_argument(source + ": key 'architectures' must be a list of strings, got " +
                                    brief(*it));
        if (!it->empty()) arch_name = (*it)[0].get<std::string>();
    }
    EPI_RETURN_IF_ERROR(r.status());
    if (model_type.empty() && arch_name.empty())
        return invalid_argument(source +
                                ": missing required key 'model_type' (supported: " + supported_list() + ")");
    const Family* family = nullptr;
    for (const auto& f : kFamilies) {
        if (!model_type.empty() ? model_type == f.model_type
                                : arch_name == architecture_name(f.architecture)) {
            family = &f;
            break;
        }
    }
    if (family == nullptr) {
        const std::string what =
            !model_type.empty() ? "model_type '" + model_type + "'" : "architecture '" + arch_name + "'";
        return invalid_argument(source + ": unsupported " + what +
                                " (supported model_types: " + supported_list() + ")");
    }
    if (!arch_name.empty() && arch_name != architecture_name(family->architecture))
        return invalid_argument(source + ": architectures[0] '" + arch_name +
                                "' does not match model_type '" + family->model_type + "' (expected " +
                                architecture_name(family->architecture) + ")");
    return family;
}

bool is_mla(Architecture arch) {
    return arch == Architecture::kDeepseekV3 || arch == Architecture::kDeepseekV2;
}

// Attention shape keys; MLA per DeepseekV3Attention/DeepseekV2Attention, GQA per <Family>Attention.
void parse_attention(KeyReader& r, const FamilyDefaults& d, ModelConfig& c) {
    c.num_attention_heads = r.required_count("num_attention_heads");
    if (is_mla(c.architecture)) {
        c.attention = AttentionKind::kMla;
        c.num_key_value_heads = c.num_attention_heads;  // MLA: every head reads the shared latent
        if (!r.has("q_lora_rank") && !r.is_null("q_lora_rank"))
            r.fail(invalid_argument(r.source() +
                                    ": missing required key 'q_lora_rank' (null: no q compression)"));
        c.q_lora_rank = r.count_or("q_lora_rank", 0);
        c.kv_lora_rank = r.required_count("kv_lora_rank");
        c.qk_nope_head_dim = r.required_count("qk_nope_head_dim");
        c.qk_rope_head_dim = r.required_count("qk_rope_head_dim");
        c.v_head_dim = r.required_count("v_head_dim");
        c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
        // attention_bias adds a bias to q_a_proj, kv_a_proj_with_mqa and o_proj (never q_proj, q_b_proj,
        // kv_b_proj).
        c.attention_bias = c.attention_out_bias = r.bool_or("attention_bias", false);
        return;
    }
    c.attention = AttentionKind::kGqa;
    c.num_key_value_heads = r.count_or(
        "num_key_value_heads", d.num_key_value_heads > 0 ? d.num_key_value_heads : c.num_attention_heads);
    // head_dim: getattr(config, "head_dim", hidden_size // num_attention_heads); GptOssConfig defaults to 64.
    const int64_t default_head_dim = c.architecture == Architecture::kGptOss ? 64
                                     : c.num_attention_heads > 0        ? c.hidden_size / c.num_attention_heads
                                                                        : 0;
    c.head_dim = r.count_or("head_dim", default_head_dim);
    switch (c.architecture) {
        case Architecture::kQwen3Moe:  // q/k/v/o bias = attention_bias; RMSNorm per head on q and k
            c.attention_bias = c.attention_out_bias = r.bool_or("attention_bias", false);
            c.qk_norm = QkNormKind::kPerHead;
            break;
        case Architecture::kQwen2Moe:  // q/k/v bias = qkv_bias (default true); o_proj never
            c.attention_bias = r.bool_or("qkv_bias", true);
            break;
        case Architecture::kOlmoe:  // q/k/v/o bias = attention_bias; RMSNorm over the whole q and k
            c.attention_bias = c.attention_out_bias = r.bool_or("attention_bias", false);
            c.qk_norm = QkNormKind::kFullProjection;
            if (r.has("clip_qkv"))
                r.fail(not_supported(r.source() + ": clip_qkv is not supported (set it to null)"));
            break;
        case Architecture::kGlm4Moe:  // q/k/v bias = attention_bias; o_proj never; per-head norm optional
            c.attention_bias = r.bool_or("attention_bias", false);
            if (r.bool_or("use_qk_norm", false)) c.qk_norm = QkNormKind::kPerHead;
            break;
        case Architecture::kGptOss:  // q/k/v/o bias = attention_bias (default true); windows: parse_gpt_oss
            c.attention_bias = c.attention_out_bias = r.bool_or("attention_bias", true);
            return;
        default:
            break;  // Mixtral: no biases, no q/k norm
    }
    // Sliding-window attention (transformers applies it when sliding_window is set and, for Qwen,
    // use_sliding_window is true) is not supported, unless the window covers every position the model
    // accepts (sliding_window ≥ max_position_embeddings), where it changes nothing.
    const bool window_on = c.architecture == Architecture::kMixtral ? r.has("sliding_window")
                                                                    : r.bool_or("use_sliding_window", false);
    if (window_on && r.count_or("sliding_window", 0) < c.max_position_embeddings)
        r.fail(not_supported(r.source() + ": sliding-window attention (sliding_window " +
                             std::to_string(r.count_or("sliding_window", 0)) + " < max_position_embeddings " +
                             std::to_string(c.max_position_embeddings) + ") is not supported"));
}

// rope_scaling (published checkpoints) or rope_parameters (transformers 5); rope_scaling wins, as in
// PreTrainedConfig.convert_rope_params_to_dict. Required keys per type, as transformers 5's
// _validate_<type>_rope_parameters (a KeyError when one is absent; rope_theta and
// original_max_position_embeddings are filled in before by standardize_rope_params): default none, linear
// factor, yarn factor (null allowed), llama3 factor, low_freq_factor, high_freq_factor.
void parse_rope(const Json& root, KeyReader& top, const FamilyDefaults& d, ModelConfig& c) {
    static const Json kEmpty = Json::object();
    const Json* dict = &kEmpty;
    std::string dict_key = "rope_parameters";
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
        auto it = root.find(key);
        if (it == root.end() || it->is_null()) continue;
        if (!it->is_object()) {
            top.fail(invalid_argument(top.source() + ": key '" + key + "' must be an object or null, got " +
                                      brief(*it)));
            return;
        }
        if (it->empty()) continue;
        dict = &*it;
        dict_key = key;
        break;
    }
    // GptOssConfig.__post_init__: without rope parameters, YaRN factor 32 over 4096 positions.
    static const Json kGptOssRope = {{"rope_type", "yarn"}, {"factor", 32.0},   {"beta_fast", 32.0},
                                     {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
    if (c.architecture == Architecture::kGptOss && dict == &kEmpty) dict = &kGptOssRope;
    KeyReader r(*dict, top.source(), dict_key + ".");
    RopeConfig& rope = c.rope;
    const std::string type = r.string_or("rope_type", r.string_or("type", "default"));
    rope.theta = r.has("rope_theta") ? r.number_or("rope_theta", 0.0, kRopeTheta)
                                     : top.number_or("rope_theta", d.rope_theta, kRopeTheta);

    if (is_mla(c.architecture)) {
        rope.rotary_dim = c.qk_rope_head_dim;
        // DeepSeek-V2 rotates complex pairs (view_as_complex): always interleaved. DeepSeek-V3 reads
        // rope_interleave (DeepseekV3Config default true).
        rope.interleaved =
            c.architecture == Architecture::kDeepseekV2 ? true : top.bool_or("rope_interleave", true);
    } else {
        // standardize_rope_params copies a top-level partial_rotary_factor over the dict's.
        const double partial = top.has("partial_rotary_factor")
                                   ? top.number_or("partial_rotary_factor", 1.0, kFraction)
                                   : r.number_or("partial_rotary_factor", d.partial_rotary_factor, kFraction);
        rope.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);  // int() as HF
    }

    if (type == "default") {
        rope.type = RopeType::kDefault;
    } else if (type == "linear") {
        rope.type = RopeType::kLinear;
        rope.factor = r.required_number("factor", kPositiveFp32);
    } else if (type == "yarn" || type == "llama3") {
        rope.type = type == "yarn" ? RopeType::kYarn : RopeType::kLlama3;
        // A top-level original_max_position_embeddings wins (standardize_rope_params), else the dict's,
        // else max_position_embeddings.
        rope.original_max_position_embeddings =
            top.has("original_max_position_embeddings")
                ? top.count_or("original_max_position_embeddings", 0)
                : r.count_or("original_max_position_embeddings", c.max_position_embeddings);
        if (type == "yarn") {
            // factor is a required key (transformers 5 _validate_yarn_rope_parameters raises KeyError
            // without it); a null factor is max_position / original_max_position (_compute_yarn_parameters).
            // beta_fast/beta_slow are read with `or 32` / `or 1`.
            if (r.has("factor")) {
                rope.factor = r.number_or("factor", 1.0, kPositiveFp32);
            } else if (!r.is_null("factor")) {
                r.fail(invalid_argument(top.source() + ": missing required key '" + dict_key +
                                        ".factor' (rope_type yarn; null: max_position_embeddings / "
                                        "original_max_position_embeddings)"));
            } else if (rope.original_max_position_embeddings > 0) {
                rope.factor = static_cast<double>(c.max_position_embeddings) /
                              static_cast<double>(rope.original_max_position_embeddings);
            }
            const double beta_fast = r.number_or("beta_fast", 0.0, kNonNegativeFp32);
            const double beta_slow = r.number_or("beta_slow", 0.0, kNonNegativeFp32);
            rope.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
            rope.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
            rope.mscale = r.number_or("mscale", 0.0, kMscale);
            rope.mscale_all_dim = r.number_or("mscale_all_dim", 0.0, kMscale);
            rope.attention_factor = r.number_or("attention_factor", 0.0, kAttentionFactor);
            rope.truncate = r.bool_or("truncate", true);
        } else {
            rope.factor = r.required_number("factor", kPositiveFp32);
            rope.low_freq_factor = r.required_number("low_freq_factor", kPositiveFp32);
            rope.high_freq_factor = r.required_number("high_freq_factor", kPositiveFp32);
        }
        if (rope.original_max_position_embeddings < 1 && r.status().is_ok())
            r.fail(invalid_argument(top.source() + ": " + dict_key +
                                    ".original_max_position_embeddings must be >= 1"));
    } else {
        r.fail(not_supported(top.source() + ": " + dict_key + " type '" + type +
                             "' is not supported (supported: default, linear, yarn, llama3)"));
    }
    top.fail(r.status());
}

bool is_noaux(Architecture arch) {
    return arch == Architecture::kDeepseekV3 || arch == Architecture::kGlm4Moe;
}

// The key naming E: the family's own spelling first, then the aliases of its attribute_map (transformers 5
// writes e.g. num_local_experts for qwen3_moe).
const char* expert_count_key(const KeyReader& r, Architecture arch) {
    switch (arch) {
        case Architecture::kMixtral:
        case Architecture::kGptOss:
            return first_present(r, {"num_local_experts", "num_experts", "n_routed_experts"});
        case Architecture::kQwen3Moe:
        case Architecture::kQwen2Moe:
        case Architecture::kOlmoe:
            return first_present(r, {"num_experts", "num_local_experts", "n_routed_experts"});
        default:
            return first_present(r, {"n_routed_experts", "num_local_experts", "num_experts"});
    }
}

// Expert counts, widths and router semantics (ARCHITECTURE.md §4), per <Family>TopkRouter/SparseMoeBlock.
void parse_moe(KeyReader& r, ModelConfig& c) {
    const Architecture arch = c.architecture;
    c.n_routed_experts = r.required_count(expert_count_key(r, arch));
    // gpt-oss: OpenAI's own config.json spells K experts_per_token.
    c.router.num_experts_per_tok = r.required_count(
        arch == Architecture::kGptOss ? first_present(r, {"num_experts_per_tok", "experts_per_token"})
                                      : "num_experts_per_tok");
    RouterConfig& router = c.router;
    if (arch == Architecture::kMixtral || arch == Architecture::kOlmoe || arch == Architecture::kGptOss) {
        // MixtralExperts/OlmoeExperts/GptOssExperts are intermediate_size wide; none has a dense layer.
        c.moe_intermediate_size = c.intermediate_size = r.required_count("intermediate_size");
    } else {
        c.moe_intermediate_size = r.required_count("moe_intermediate_size");
    }

    if (is_noaux(arch)) {
        // DeepseekV3TopkRouter / Glm4MoeTopkRouter: sigmoid, + e_score_correction_bias for the choice,
        // group score = sum of the top-2, renormalise iff norm_topk_prob, then scale.
        const bool v3 = arch == Architecture::kDeepseekV3;
        if (const std::string s = r.string_or("scoring_func", "sigmoid"); s != "sigmoid")
            r.fail(invalid_argument(r.source() + ": scoring_func '" + s +
                                    "' is inconsistent with model_type " + c.model_type + " (sigmoid)"));
        if (const std::string m = r.string_or("topk_method", "noaux_tc"); m != "noaux_tc")
            r.fail(invalid_argument(r.source() + ": topk_method '" + m +
                                    "' is inconsistent with model_type " + c.model_type + " (noaux_tc)"));
        router.scoring_func = ScoringFunc::kSigmoid;
        router.topk_method = TopkMethod::kNoauxTc;
        router.has_correction_bias = true;
        router.n_group = r.count_or("n_group", v3 ? 8 : 1);
        router.topk_group = r.count_or("topk_group", v3 ? 4 : 1);
        router.norm_topk_prob = r.bool_or("norm_topk_prob", true);
        router.routed_scaling_factor = r.number_or("routed_scaling_factor", v3 ? 2.5 : 1.0, kRoutedScaling);
        c.n_shared_experts = r.count_or("n_shared_experts", 1);
    } else if (arch == Architecture::kDeepseekV2) {
        // DeepseekV2TopkRouter: softmax; greedy or group_limited_greedy (group score = max); never
        // renormalises; always multiplies by routed_scaling_factor.
        if (const std::string s = r.string_or("scoring_func", "softmax"); s != "softmax")
            r.fail(invalid_argument(r.source() + ": scoring_func '" + s +
                                    "' is inconsistent with model_type deepseek_v2 (softmax)"));
        const std::string method = r.string_or("topk_method", "greedy");
        router.scoring_func = ScoringFunc::kSoftmax;
        if (method == "greedy") {
            router.topk_method = TopkMethod::kGreedy;
            router.n_group = router.topk_group = 1;
        } else if (method == "group_limited_greedy") {
            router.topk_method = TopkMethod::kGroupLimitedGreedy;
            router.n_group = r.required_count("n_group");
            router.topk_group = r.required_count("topk_group");
        } else {
            r.fail(invalid_argument(r.source() + ": topk_method '" + method +
                                    "' is not one of greedy, group_limited_greedy (deepseek_v2)"));
        }
        // transformers (DeepseekV2TopkRouter, 5.17) ignores norm_topk_prob and only scales; epinfer follows
        // the reference it is tested against. (DeepSeek's own modeling code renormalises instead; the
        // published checkpoints set false, where both agree.)
        router.norm_topk_prob = false;
        router.routed_scaling_factor = r.number_or("routed_scaling_factor", 1.0, kRoutedScaling);
        c.n_shared_experts = r.count_or("n_shared_experts", 2);
    } else {
        // Qwen3/Qwen2-MoE, OLMoE: softmax, top-K, renormalise iff norm_topk_prob (default false);
        // Mixtral: always renormalise.
        router.scoring_func = ScoringFunc::kSoftmax;
        router.topk_method = TopkMethod::kGreedy;
        router.norm_topk_prob = arch == Architecture::kMixtral ? true : r.bool_or("norm_topk_prob", false);
        if (arch == Architecture::kGptOss) {
            // GptOssTopKRouter: logits = x·Wᵀ + b, top-K of the raw logits, softmax over those K — the
            // same weights as a softmax over all E renormalised over the K picked.
            router.norm_topk_prob = true;
            c.router_bias = c.expert_bias = true;
            c.swiglu_limit = r.number_or("swiglu_limit", 7.0, kPositiveFp32);
            c.swiglu_alpha = r.number_or("swiglu_alpha", 1.702, kPositiveFp32);
        }
        if (arch == Architecture::kQwen2Moe)
            c.shared_expert_intermediate_size = r.count_or("shared_expert_intermediate_size", 5632);
    }
}

// layer_is_moe as each family's DecoderLayer decides.
void parse_layer_kinds(KeyReader& r, const FamilyDefaults& d, ModelConfig& c) {
    const int64_t num_layers = c.num_hidden_layers;
    c.layer_is_moe.assign(static_cast<size_t>(num_layers), true);
    switch (c.architecture) {
        case Architecture::kDeepseekV3:
        case Architecture::kDeepseekV2:
        case Architecture::kGlm4Moe: {
            // MoE iff layer ≥ first_k_dense_replace (and layer % moe_layer_freq == 0 in DeepSeek's own
            // code; transformers has no moe_layer_freq: published configs set 1).
            const int64_t first_dense = r.count_or("first_k_dense_replace", d.first_k_dense_replace);
            const int64_t freq =
                c.architecture == Architecture::kGlm4Moe ? 1 : r.count_or("moe_layer_freq", 1);
            if (freq < 1) {
                r.fail(invalid_argument(r.source() + ": moe_layer_freq must be >= 1"));
                break;
            }
            for (int64_t l = 0; l < num_layers; ++l) c.layer_is_moe[l] = l >= first_dense && l % freq == 0;
            break;
        }
        case Architecture::kQwen3Moe:
        case Architecture::kQwen2Moe: {
            // MoE iff layer ∉ mlp_only_layers and (layer + 1) % decoder_sparse_step == 0.
            const int64_t step = r.count_or("decoder_sparse_step", 1);
            if (step < 1 && r.status().is_ok())
                r.fail(invalid_argument(r.source() + ": decoder_sparse_step must be >= 1, got " +
                                        std::to_string(step)));
            for (int64_t l = 0; l < num_layers; ++l) c.layer_is_moe[l] = step >= 1 && (l + 1) % step == 0;
            for (int64_t l : r.int_list("mlp_only_layers")) {
                if (l < 0 || l >= num_layers) {
                    r.fail(invalid_argument(r.source() + ": mlp_only_layers entry " + std::to_string(l) +
                                            " is outside [0, " + std::to_string(num_layers) + ")"));
                    break;
                }
                c.layer_is_moe[l] = false;
            }
            break;
        }
        case Architecture::kMixtral:
        case Architecture::kOlmoe:
        case Architecture::kGptOss:
            break;  // every layer is MoE
    }
}

// gpt-oss (GptOssConfig, GptOssAttention): layer_types alternates "sliding_attention" (a window of
// sliding_window positions, default 128; null = none) and "full_attention", default sliding on even layers;
// every layer adds learned attention sinks.
void parse_gpt_oss_attention(const Json& root, KeyReader& r, ModelConfig& c) {
    const int64_t num_layers = c.num_hidden_layers;
    c.attention_sinks = true;
    c.sliding_window = r.is_null("sliding_window") ? 0 : r.count_or("sliding_window", 128);
    std::vector<bool> sliding(static_cast<size_t>(num_layers));
    for (int64_t l = 0; l < num_layers; ++l) sliding[l] = (l + 1) % 2 != 0;
    if (auto it = root.find("layer_types"); it != root.end() && !it->is_null()) {
        if (!it->is_array() || static_cast<int64_t>(it->size()) != num_layers) {
            r.fail(invalid_argument(r.source() + ": key 'layer_types' must be a list of num_hidden_layers " +
                                    std::to_string(num_layers) + " strings, got " + brief(*it)));
            return;
        }
        for (int64_t l = 0; l < num_layers; ++l) {
            const Json& t = (*it)[static_cast<size_t>(l)];
            if (t == "sliding_attention") {
                sliding[l] = true;
            } else if (t == "full_attention") {
                sliding[l] = false;
            } else {
                r.fail(invalid_argument(r.source() + ": layer_types[" + std::to_string(l) + "] is " + brief(t) +
                                        ", not \"sliding_attention\" or \"full_attention\""));
                return;
            }
        }
    }
    if (c.sliding_window > 0) c.layer_is_sliding = std::move(sliding);
}

// Upper bounds far above every published model, so that a corrupt config fails in one line instead of
// exhausting memory or overflowing byte counts (int64) downstream.
struct ConfigLimit {
    const char* key;
    int64_t value;
    int64_t max;
};

Status check_limits(std::initializer_list<ConfigLimit> limits, const std::string& source) {
    for (const ConfigLimit& l : limits) {
        if (l.value > l.max)
            return invalid_argument(source + ": key '" + l.key + "' is " + std::to_string(l.value) +
                                    ", above the supported maximum " + std::to_string(l.max));
    }
    return Status::ok();
}

Status check_consistency(const ModelConfig& c, const std::string& source) {
    auto bad = [&](const std::string& what) { return invalid_argument(source + ": " + what); };
    const auto s = [](int64_t v) { return std::to_string(v); };
    EPI_RETURN_IF_ERROR(check_limits({{"num_attention_heads", c.num_attention_heads, 1 << 12},
                                      {"num_key_value_heads", c.num_key_value_heads, 1 << 12},
                                      {"head_dim", c.head_dim, 1 << 12},
                                      {"q_lora_rank", c.q_lora_rank, 1 << 16},
                                      {"kv_lora_rank", c.kv_lora_rank, 1 << 16},
                                      {"intermediate_size", c.intermediate_size, 1 << 20},
                                      {"moe_intermediate_size", c.moe_intermediate_size, 1 << 20},
                                      {"shared_expert_intermediate_size", c.shared_expert_intermediate_size,
                                       1 << 20},
                                      {"n_shared_experts", c.n_shared_experts, 1 << 10},
                                      {"n_routed_experts", c.n_routed_experts, 1 << 16},
                                      {"n_group", c.router.n_group, 1 << 16}},
                                     source));
    if (c.attention == AttentionKind::kGqa) {
        if (c.num_key_value_heads < 1) return bad("num_key_value_heads must be >= 1");
        if (c.num_attention_heads % c.num_key_value_heads != 0)
            return bad("num_attention_heads " + s(c.num_attention_heads) +
                       " is not divisible by num_key_value_heads " + s(c.num_key_value_heads));
        if (c.head_dim < 1) return bad("head_dim must be >= 1 (hidden_size / num_attention_heads is 0)");
    }
    if (c.rope.rotary_dim < 2 || c.rope.rotary_dim % 2 != 0 || c.rope.rotary_dim > c.head_dim)
        return bad("rotary dimension " + s(c.rope.rotary_dim) + " must be even and in [2, head_dim " +
                   s(c.head_dim) + "]");
    const RouterConfig& r = c.router;
    const int64_t e = c.n_routed_experts, k = r.num_experts_per_tok;
    if (k > e) return bad("num_experts_per_tok " + s(k) + " exceeds the expert count " + s(e));
    if (r.n_group < 1 || e % r.n_group != 0)
        return bad("expert count " + s(e) + " is not divisible by n_group " + s(r.n_group));
    if (r.topk_group < 1 || r.topk_group > r.n_group)
        return bad("topk_group " + s(r.topk_group) + " must be in [1, n_group " + s(r.n_group) + "]");
    if (k > r.topk_group * (e / r.n_group))
        return bad("num_experts_per_tok " + s(k) + " exceeds the experts of the topk_group " +
                   s(r.topk_group) + " kept groups (" + s(r.topk_group * (e / r.n_group)) + ")");
    if (r.topk_method == TopkMethod::kNoauxTc && e / r.n_group < 2)
        return bad("noaux_tc routing needs >= 2 experts per group, got " + s(e / r.n_group));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        if (!c.layer_is_moe[l] && c.intermediate_size < 1)
            return bad("intermediate_size must be >= 1: layer " + s(l) + " is a dense MLP");
    }
    return Status::ok();
}

// hidden_act: every MLP this build runs is SwiGLU, down(silu(gate)·up) (layers/dense_ffn.h); "silu" is also
// the default of every family's transformers configuration class.
void check_hidden_act(KeyReader& r) {
    const std::string act = r.string_or("hidden_act", "silu");
    if (r.status().is_ok() && act != "silu")
        r.fail(not_supported(r.source() + ": hidden_act '" + act + "' is not supported (supported: silu)"));
}

// torch_dtype (transformers 4) and dtype (transformers 5) name the torch dtype the checkpoint was saved in
// (str(torch.bfloat16) without "torch."). Informational: the weights' dtypes are read from the safetensors
// headers; a name that is no torch floating dtype is refused.
void check_dtype_names(KeyReader& r) {
    static constexpr const char* kNames[] = {"float32", "float16",       "bfloat16",
                                             "float64", "float8_e4m3fn", "float8_e5m2"};
    for (const char* key : {"torch_dtype", "dtype"}) {
        if (!r.has(key)) continue;
        const std::string name = r.string_or(key, "");
        if (!r.status().is_ok() || std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames))
            continue;
        std::string known;
        for (const char* n : kNames) known += (known.empty() ? "" : ", ") + std::string(n);
        r.fail(invalid_argument(r.source() + ": " + key + " '" + name +
                                "' is not a known dtype (known: " + known + ")"));
    }
}

Result<Json> parse_json(const std::string& text, const std::string& source) {
    try {
        return Json::parse(text);
    } catch (const Json::exception& e) {
        return invalid_argument(source + ": malformed JSON: " + json_error_text(e));
    }
}

Result<std::string> read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found(path + ": cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

void merge_eos(std::vector<int64_t>& into, const std::vector<int64_t>& ids) {
    for (int64_t id : ids)
        if (std::find(into.begin(), into.end(), id) == into.end()) into.push_back(id);
}

}  // namespace

const std::vector<std::string>& supported_model_types() {
    static const std::vector<std::string> kTypes = [] {
        std::vector<std::string> out;
        for (const auto& f : kFamilies)
            if (!f.plan_only) out.emplace_back(f.model_type);
        return out;
    }();
    return kTypes;
}

Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& source) {
    EPI_ASSIGN_OR_RETURN(const Json root, parse_json(json_text, source));
    if (!root.is_object()) return invalid_argument(source + ": expected a JSON object, got " + brief(root));
    EPI_ASSIGN_OR_RETURN(const Family* family, resolve_family(root, source));

    ModelConfig c;
    c.architecture = family->architecture;
    c.model_type = family->model_type;
    const FamilyDefaults d = family_defaults(c.architecture);
    KeyReader r(root, source);
    c.vocab_size = r.required_count("vocab_size");
    c.hidden_size = r.required_count("hidden_size");
    c.num_hidden_layers = r.required_count("num_hidden_layers");
    c.max_position_embeddings = r.positive_or("max_position_embeddings", d.max_position_embeddings);
    c.rms_norm_eps = r.number_or("rms_norm_eps", d.rms_norm_eps, kNormEps);
    c.tie_word_embeddings = r.bool_or("tie_word_embeddings", false);
    check_hidden_act(r);
    check_dtype_names(r);
    EPI_RETURN_IF_ERROR(r.status());
    EPI_RETURN_IF_ERROR(check_limits({{"vocab_size", c.vocab_size, int64_t{1} << 24},
                                      {"hidden_size", c.hidden_size, 1 << 17},
                                      {"num_hidden_layers", c.num_hidden_layers, 1 << 12},
                                      {"max_position_embeddings", c.max_position_embeddings, int64_t{1} << 30}},
                                     source));
    if (is_noaux(c.architecture)) {
        // MTP layers (DeepSeek's num_nextn_predict_layers; Glm4MoeConfig num_mtp_layers, default 1).
        const bool glm = c.architecture == Architecture::kGlm4Moe;
        c.num_nextn_predict_layers =
            r.count_or(glm ? first_present(r, {"num_nextn_predict_layers", "num_mtp_layers"})
                           : "num_nextn_predict_layers",
                       glm ? 1 : 0);
    }
    parse_attention(r, d, c);
    EPI_RETURN_IF_ERROR(r.status());  // rope needs the head dims
    parse_rope(root, r, d, c);
    parse_moe(r, c);
    parse_layer_kinds(r, d, c);
    if (c.architecture == Architecture::kGptOss) parse_gpt_oss_attention(root, r, c);
    // intermediate_size: the dense MLP width, required only when a layer is dense.
    if (c.architecture != Architecture::kMixtral && c.architecture != Architecture::kOlmoe &&
        c.architecture != Architecture::kGptOss) {
        const bool any_dense = c.num_moe_layers() < c.num_hidden_layers;
        c.intermediate_size =
            any_dense ? r.required_count("intermediate_size") : r.count_or("intermediate_size", 0);
    }
    merge_eos(c.eos_token_ids, r.int_list("eos_token_id"));
    if (auto it = root.find("quantization_config"); it != root.end() && it->is_object()) {
        KeyReader q(*it, source, "quantization_config.");
        c.quant_method = q.string_or("quant_method", "");
        r.fail(q.status());
    }
    EPI_RETURN_IF_ERROR(r.status());
    EPI_RETURN_IF_ERROR(check_consistency(c, source));
    return c;
}

Result<ModelConfig> load_hf_config(const std::string& model_dir) {
    const std::filesystem::path dir(model_dir);
    const std::string config_path = (dir / "config.json").string();
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) return not_found(model_dir + ": no such folder");
    EPI_RETURN_IF_ERROR(check_regular_file(config_path));
    EPI_ASSIGN_OR_RETURN(const std::string text, read_text_file(config_path));
    EPI_ASSIGN_OR_RETURN(ModelConfig config, parse_hf_config(text, config_path));

    const std::string gen_path = (dir / "generation_config.json").string();
    if (path_exists(gen_path)) {  // optional, but a folder or a FIFO in its place is an error
        EPI_RETURN_IF_ERROR(check_regular_file(gen_path));
        EPI_ASSIGN_OR_RETURN(const std::string gen_text, read_text_file(gen_path));
        EPI_ASSIGN_OR_RETURN(const Json gen, parse_json(gen_text, gen_path));
        if (!gen.is_object())
            return invalid_argument(gen_path + ": expected a JSON object, got " + brief(gen));
        KeyReader r(gen, gen_path);
        const std::vector<int64_t> ids = r.int_list("eos_token_id");
        EPI_RETURN_IF_ERROR(r.status());
        merge_eos(config.eos_token_ids, ids);
    }
    return config;
}

}  // namespace epinfer
