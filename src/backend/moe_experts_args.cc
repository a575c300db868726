#include "backend/moe_experts_args.h"

#include <limits>
#include <string>

namespace epinfer {

namespace {

Status bad(const std::string& what) {
    return invalid_argument("moe_experts: " + what);
}

}  // namespace

Status moe_experts_check(const MoeExpertsArgs& a) {
    if (a.num_tokens < 0) return bad("num_tokens must be ≥ 0, got " + std::to_string(a.num_tokens));
    if (a.top_k < 1) return bad("top_k must be ≥ 1, got " + std::to_string(a.top_k));
    if (a.num_experts < 1) return bad("num_experts must be ≥ 1, got " + std::to_string(a.num_experts));
    if (a.hidden < 1) return bad("hidden must be ≥ 1, got " + std::to_string(a.hidden));
    if (a.first_expert < 0) return bad("first_expert must be ≥ 0, got " + std::to_string(a.first_expert));
    if (a.intermediate < 1) return bad("intermediate must be ≥ 1, got " + std::to_string(a.intermediate));
    if (a.num_tokens > std::numeric_limits<int32_t>::max() / a.top_k) {
        return bad("num_tokens " + std::to_string(a.num_tokens) + " × top_k " + std::to_string(a.top_k) +
                   " must stay below 2^31");
    }
    if (!dtype_is_float_weight(a.weight_dtype)) {
        return {StatusCode::kNotSupported, std::string("moe_experts: weight dtype ") +
                                               dtype_name(a.weight_dtype) + " (want F32, F16 or BF16)"};
    }
    if (a.num_tokens == 0) return Status::ok();
    if (a.x == nullptr) return bad("x is null");
    if (a.topk_ids == nullptr) return bad("topk_ids is null");
    if (a.topk_weights == nullptr) return bad("topk_weights is null");
    if (a.out == nullptr) return bad("out is null");
    if (a.experts == nullptr) return bad("experts is null");
    for (int64_t e = 0; e < a.num_experts; ++e) {
        const MoeExpertWeights& w = a.experts[e];
        const char* missing = w.gate == nullptr   ? "gate"
                              : w.up == nullptr   ? "up"
                              : w.down == nullptr ? "down"
                                                  : nullptr;
        if (missing != nullptr)
            return bad("expert " + std::to_string(e) + " has a null " + missing + " pointer");
    }
    return Status::ok();
}

}  // namespace epinfer
