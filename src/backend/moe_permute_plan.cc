#include "backend/moe_permute_plan.h"

#include <cstring>

namespace epinfer {

MoeRoutePlan moe_permute_plan(const int32_t* topk_ids, int64_t num_tokens, int64_t top_k,
                              int64_t num_experts) {
    MoeRoutePlan plan;
    plan.num_tokens = num_tokens;
    plan.top_k = top_k;
    plan.num_experts = num_experts;
    const int64_t num_picks = num_tokens * top_k;    // T·K
    plan.expert_counts.assign(num_experts, 0);       // [E]
    plan.expert_offsets.assign(num_experts + 1, 0);  // [E + 1]
    plan.slot_of_token_k.assign(num_picks, -1);      // [T, K]

    auto is_valid = [&](int32_t expert_idx) { return expert_idx >= 0 && expert_idx < num_experts; };
    for (int64_t i = 0; i < num_picks; ++i) {
        if (is_valid(topk_ids[i])) ++plan.expert_counts[topk_ids[i]];
    }
    for (int64_t e = 0; e < num_experts; ++e) {
        plan.expert_offsets[e + 1] = plan.expert_offsets[e] + plan.expert_counts[e];
    }
    const int32_t num_slots = plan.expert_offsets[num_experts];  // S
    plan.token_of_slot.resize(num_slots);                        // [S]
    plan.k_of_slot.resize(num_slots);                            // [S]

    // Visiting picks in (t, k) order and filling each expert's block front to back makes the order
    // (expert, t, k).
    std::vector<int32_t> next_slot(plan.expert_offsets.begin(), plan.expert_offsets.end() - 1);  // [E]
    for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t k = 0; k < top_k; ++k) {
            const int32_t expert_idx = topk_ids[t * top_k + k];
            if (!is_valid(expert_idx)) continue;
            const int32_t slot = next_slot[expert_idx]++;
            plan.token_of_slot[slot] = static_cast<int32_t>(t);
            plan.k_of_slot[slot] = static_cast<int32_t>(k);
            plan.slot_of_token_k[t * top_k + k] = slot;
        }
    }
    return plan;
}

void moe_permute_rows(const MoeRoutePlan& plan, const void* x, size_t row_bytes, void* x_perm) {
    const auto* src = static_cast<const unsigned char*>(x);  // [T, row_bytes]
    auto* dst = static_cast<unsigned char*>(x_perm);         // [S, row_bytes]
    for (int64_t s = 0; s < plan.num_slots(); ++s) {
        std::memcpy(dst + s * row_bytes, src + plan.token_of_slot[s] * row_bytes, row_bytes);
    }
}

void moe_combine_rows(const MoeRoutePlan& plan, const float* y, const float* topk_weights, int64_t hidden,
                      float* out) {
    const int64_t top_k = plan.top_k;
    for (int64_t t = 0; t < plan.num_tokens; ++t) {
        float* out_row = out + t * hidden;  // [H]
        for (int64_t h = 0; h < hidden; ++h) out_row[h] = 0.0f;
        for (int64_t k = 0; k < top_k; ++k) {
            const int32_t slot = plan.slot_of_token_k[t * top_k + k];
            if (slot < 0) continue;
            const float weight = topk_weights[t * top_k + k];
            const float* y_row = y + static_cast<int64_t>(slot) * hidden;  // [H]
            for (int64_t h = 0; h < hidden; ++h) out_row[h] += weight * y_row[h];
        }
    }
}

}  // namespace epinfer
