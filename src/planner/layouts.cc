#include "planner/layouts.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <tuple>
#include <vector>

namespace epinfer::planner {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

// 0 = TP, 1 = EP with TP attention, 2 = EP with DP attention, 3 = hybrid.
int family_rank(const ParallelLayout& l) {
    int W = l.stage_size();
    if (l.attn_tp == W && l.moe_tp == W) return 0;
    if (l.attn_tp == W && l.moe_ep == W) return 1;
    if (l.attn_dp == W && l.moe_ep == W) return 2;
    return 3;
}

}  // namespace

std::string layout_spec(const ParallelLayout& l) {
    std::vector<std::string> tokens;
    if (l.pp > 1) tokens.push_back(fmt::format("pp{}", l.pp));
    int W = l.stage_size();
    if (W != std::max({l.moe_ep, l.attn_dp, 1})) tokens.push_back(fmt::format("tp{}", W));
    if (l.attn_dp > 1) tokens.push_back(fmt::format("dp{}", l.attn_dp));
    if (l.moe_ep > 1) tokens.push_back(fmt::format("ep{}", l.moe_ep));
    if (tokens.empty()) return "tp1";
    return fmt::format("{}", fmt::join(tokens, "-"));
}

Result<ParallelLayout> parse_layout_spec(const std::string& spec) {
    auto bad = [&](const std::string& why) {
        return invalid_argument(fmt::format(
            "--layout '{}': {} (expected tokens tpN, epN, dpN, ppN joined by '-', e.g. dp8-ep8)", spec, why));
    };
    if (spec.empty()) return bad("empty");
    std::vector<std::string> tokens;  // split at every '-', keeping empty tokens
    for (size_t begin = 0;;) {
        const size_t dash = std::min(spec.find('-', begin), spec.size());
        tokens.push_back(spec.substr(begin, dash - begin));
        if (dash == spec.size()) break;
        begin = dash + 1;
    }
    LayoutFlags flags;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const std::string& token = tokens[i];
        if (token.empty()) return bad("an empty token (a '-' at an end or doubled)");
        std::string lower;
        for (char ch : token) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        const std::string key = lower.substr(0, 2);
        int* slot = key == "tp"   ? &flags.tp
                    : key == "ep" ? &flags.ep
                    : key == "dp" ? &flags.dp
                    : key == "pp" ? &flags.pp
                                  : nullptr;
        if (!slot) return bad(fmt::format("unknown token '{}'", token));
        // The degree: digits right after the key ("tp-1" splits into "tp" and "1": its degree reads -1).
        std::string digits = token.substr(2);
        if (digits.empty() && i + 1 < tokens.size() && !tokens[i + 1].empty() &&
            std::isdigit(static_cast<unsigned char>(tokens[i + 1][0]))) {
            digits = "-" + tokens[i + 1];
        }
        const bool number =
            !digits.empty() && digits.size() <= 6 &&
            std::all_of(digits.begin(), digits.end(), [](unsigned char ch) { return std::isdigit(ch) != 0; });
        const int value = number ? std::stoi(digits) : 0;
        if (value < 1) {
            return bad(fmt::format(
                "degree of '{}' must be a positive integer (at most 999999) right after it, got {}",
                token.substr(0, 2), digits.empty() ? "nothing" : "'" + digits + "'"));
        }
        if (*slot != 0) return bad(fmt::format("'{}' given twice", key));
        *slot = value;
    }
    Result<ParallelLayout> layout = layout_from_flags(flags);
    if (!layout.is_ok()) return layout.status().with_context(fmt::format("--layout '{}'", spec));
    return layout;
}

LayoutModelDims layout_model_dims(const ModelCosts& m) {
    LayoutModelDims dims;
    dims.num_hidden_layers = m.num_layers;
    dims.num_attention_heads = m.num_heads;
    dims.num_key_value_heads = m.mla ? 0 : m.num_kv_heads;
    dims.n_routed_experts = m.n_experts;
    dims.moe_intermediate_size = m.expert_width;
    dims.dense_intermediate_size = m.dense_width;
    dims.shared_intermediate_size = m.shared_width;
    return dims;
}

std::vector<ParallelLayout> enumerate_layouts(int gpus, const ModelCosts& model) {
    std::vector<ParallelLayout> layouts;
    LayoutModelDims dims = layout_model_dims(model);
    for (int pp = 1; pp <= gpus; ++pp) {
        if (gpus % pp != 0) continue;
        int W = gpus / pp;
        for (int attn_tp = 1; attn_tp <= W; ++attn_tp) {
            if (W % attn_tp != 0) continue;
            for (int moe_tp = 1; moe_tp <= W; ++moe_tp) {
                if (W % moe_tp != 0) continue;
                ParallelLayout l{pp, attn_tp, W / attn_tp, moe_tp, W / moe_tp};
                if (validate_layout(l, dims, gpus).is_ok()) layouts.push_back(l);
            }
        }
    }
    std::stable_sort(layouts.begin(), layouts.end(), [](const ParallelLayout& a, const ParallelLayout& b) {
        return std::make_tuple(a.pp, family_rank(a), -a.attn_tp, -a.moe_tp) <
               std::make_tuple(b.pp, family_rank(b), -b.attn_tp, -b.moe_tp);
    });
    return layouts;
}

std::vector<PipelineStage> layout_stages(const ModelCosts& model, int pp) {
    const int64_t layers = std::max<int64_t>(1, model.num_layers);
    return pipeline_stages(layers, static_cast<int>(std::clamp<int64_t>(pp, 1, layers))).value();
}

RankShare rank_share(const ModelCosts& m, const ParallelLayout& l) {
    RankShare s;
    const int64_t a = l.attn_tp;
    s.attn_params = m.attn_split_params / a + m.attn_replicated_params;
    if (m.num_kv_heads > 0) {
        s.kv_heads_per_rank = std::max<int64_t>(1, m.num_kv_heads / a);
        s.attn_params += m.attn_kv_head_params / m.num_kv_heads * s.kv_heads_per_rank;
        s.kv_elems_per_token = m.kv_elems_per_token_per_layer / m.num_kv_heads * s.kv_heads_per_rank;
    } else {
        s.kv_elems_per_token = m.kv_elems_per_token_per_layer;  // MLA: the latent is not split by heads
    }
    s.dense_mlp_params = m.dense_mlp_params / a;
    s.shared_params = m.shared_expert_params / a;
    s.local_experts = m.n_experts > 0 ? ceil_div(m.n_experts, l.moe_ep) : 0;
    s.expert_slice_params = m.expert_params / l.moe_tp;
    s.vocab_slice = ceil_div(m.vocab, a);
    return s;
}

}  // namespace epinfer::planner
