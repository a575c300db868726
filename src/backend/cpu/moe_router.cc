#include "backend/cpu/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace epinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kRenormEps = 1e-20f;  // transformers DeepseekV3TopkRouter: Σw + 1e-20

// The one ordering of the router: true when (a, id a_idx) ranks before (b, id b_idx). Higher value first,
// NaN below everything (−inf included), ties to the lower id.
bool ranks_before(float a, int64_t a_idx, float b, int64_t b_idx) {
    const bool a_nan = std::isnan(a);
    const bool b_nan = std::isnan(b);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && a != b) return a > b;
    return a_idx < b_idx;
}

float nan_to_neg_inf(float v) {
    return std::isnan(v) ? kNegInf : v;
}

// p[e] for one row: softmax over the non-NaN logits (NaN → p = 0), or sigmoid (NaN stays NaN).
void row_scores(const MoeRouterTopkArgs& args, const float* logits, float* p) {  // [E] fp32 each
    const int64_t num_experts = args.num_experts;
    if (args.scoring_func == ScoringFunc::kSigmoid) {
        for (int64_t e = 0; e < num_experts; ++e) p[e] = 1.0f / (1.0f + std::exp(-logits[e]));
        return;
    }
    float max_logit = kNegInf;
    for (int64_t e = 0; e < num_experts; ++e) {
        if (!std::isnan(logits[e])) max_logit = std::max(max_logit, logits[e]);
    }
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) {
        if (std::isnan(logits[e])) {
            p[e] = 0.0f;
        } else {
            // Equal to the max gives exactly 1, also for ±inf (where logit − max would be NaN).
            p[e] = logits[e] == max_logit ? 1.0f : std::exp(logits[e] - max_logit);
            sum += p[e];
        }
    }
    if (sum > 0.0f) {  // 0 only when every logit is NaN: no expert is choosable then
        for (int64_t e = 0; e < num_experts; ++e) p[e] /= sum;
    }
}

// Score of one group of `size` experts: max c (group_limited_greedy) or the sum of its top-2 c (noaux_tc).
// NaN counts as −inf.
float group_score(TopkMethod method, const float* c, int64_t size) {  // c: [size] fp32
    float best = kNegInf;
    float second = kNegInf;
    for (int64_t i = 0; i < size; ++i) {
        const float v = nan_to_neg_inf(c[i]);
        if (v > best) {
            second = best;
            best = v;
        } else if (v > second) {
            second = v;
        }
    }
    return method == TopkMethod::kNoauxTc ? best + second : best;
}

// Scratch reused across rows.
struct RowScratch {
    std::vector<float> p;              // [E] scores (weights are read here)
    std::vector<float> c;              // [E] choice scores; NaN for masked or NaN experts
    std::vector<float> group_scores;   // [n_group]
    std::vector<int64_t> group_order;  // [n_group]
    std::vector<int64_t> candidates;   // [≤ E] expert ids
};

void route_row(const MoeRouterTopkArgs& args, int64_t t, RowScratch& s) {
    const int64_t num_experts = args.num_experts;
    const int64_t top_k = args.top_k;
    const float* logits = args.router_logits + t * num_experts;  // [E]
    int32_t* ids = args.topk_ids + t * top_k;                    // [K]
    float* weights = args.topk_weights + t * top_k;              // [K]

    row_scores(args, logits, s.p.data());
    for (int64_t e = 0; e < num_experts; ++e) {
        const float bias = args.e_score_correction_bias ? args.e_score_correction_bias[e] : 0.0f;
        s.c[e] = std::isnan(logits[e]) ? kNaN : s.p[e] + bias;
    }

    // Keep the best topk_group groups; experts of the others become unchoosable (NaN).
    if (args.topk_method != TopkMethod::kGreedy && args.topk_group < args.n_group) {
        const int64_t group_size = num_experts / args.n_group;
        for (int64_t g = 0; g < args.n_group; ++g) {
            s.group_scores[g] = group_score(args.topk_method, s.c.data() + g * group_size, group_size);
            s.group_order[g] = g;
        }
        std::partial_sort(
            s.group_order.begin(), s.group_order.begin() + args.topk_group, s.group_order.end(),
            [&](int64_t a, int64_t b) { return ranks_before(s.group_scores[a], a, s.group_scores[b], b); });
        for (auto it = s.group_order.begin() + args.topk_group; it != s.group_order.end(); ++it) {
            std::fill_n(s.c.begin() + *it * group_size, group_size, kNaN);
        }
    }

    s.candidates.clear();
    for (int64_t e = 0; e < num_experts; ++e) {
        if (!std::isnan(s.c[e])) s.candidates.push_back(e);
    }
    const int64_t num_chosen = std::min<int64_t>(top_k, static_cast<int64_t>(s.candidates.size()));
    std::partial_sort(s.candidates.begin(), s.candidates.begin() + num_chosen, s.candidates.end(),
                      [&](int64_t a, int64_t b) { return ranks_before(s.c[a], a, s.c[b], b); });

    for (int64_t k = 0; k < top_k; ++k) {
        const bool chosen = k < num_chosen;
        ids[k] = chosen ? static_cast<int32_t>(s.candidates[k]) : -1;
        weights[k] = chosen ? s.p[s.candidates[k]] : 0.0f;
    }
    if (args.norm_topk_prob) {
        float sum = 0.0f;
        for (int64_t k = 0; k < top_k; ++k) sum += weights[k];
        const float denominator = sum + kRenormEps;
        for (int64_t k = 0; k < top_k; ++k) weights[k] /= denominator;
    }
    for (int64_t k = 0; k < top_k; ++k) weights[k] *= args.routed_scaling_factor;
}

}  // namespace

Status cpu_moe_router_topk(const MoeRouterTopkArgs& args) {
    EPI_RETURN_IF_ERROR(moe_router_topk_check(args));
    RowScratch scratch;
    scratch.p.resize(args.num_experts);
    scratch.c.resize(args.num_experts);
    scratch.group_scores.resize(args.n_group);
    scratch.group_order.resize(args.n_group);
    scratch.candidates.reserve(args.num_experts);
    for (int64_t t = 0; t < args.num_tokens; ++t) route_row(args, t, scratch);
    return Status::ok();
}

}  // namespace epinfer
