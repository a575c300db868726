#include "backend/cpu/cpu_argmax.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "backend/gumbel_noise.h"
#include "backend/sampling_floor.h"

namespace epinfer {

float cpu_sampling_floor(std::span<const float> logits, const TokenDraw& draw) {
    const auto V = static_cast<int64_t>(logits.size());
    const bool top_k = draw.top_k > 0 && draw.top_k < V;
    const bool top_p = draw.top_p < 1.0f;
    if (!(draw.inv_temperature > 0.0f) || (!top_k && !top_p)) return -INFINITY;
    std::vector<float> keys(logits.size());
    std::transform(logits.begin(), logits.end(), keys.begin(), sampling_key);
    const float max_key = *std::max_element(keys.begin(), keys.end());
    if (!std::isfinite(max_key)) return -INFINITY;
    float floor = -INFINITY;
    if (top_k) {
        std::vector<float> ranked = keys;
        std::nth_element(ranked.begin(), ranked.begin() + (draw.top_k - 1), ranked.end(), std::greater<>());
        floor = ranked[static_cast<size_t>(draw.top_k - 1)];
    }
    if (!top_p) return floor;
    // The kept keys by decreasing value with their weights; the floor is the key at which the running mass
    // (over whole groups of equal keys) first reaches the target.
    std::vector<std::pair<float, uint64_t>> kept;
    uint64_t total = 0;
    for (const float key : keys) {
        if (!(key >= floor)) continue;
        const uint64_t q = nucleus_weight(key, max_key, draw.inv_temperature);
        kept.emplace_back(key, q);
        total += q;
    }
    std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    const uint64_t target = nucleus_target(total, draw.top_p);
    uint64_t mass = 0;
    for (size_t i = 0; i < kept.size();) {
        const float key = kept[i].first;
        for (; i < kept.size() && kept[i].first == key; ++i) mass += kept[i].second;
        if (mass >= target) return key;
    }
    return floor;  // not reached: the target is at most the total
}

int32_t cpu_argmax_row(std::span<const float> logits, const TokenDraw& draw, float floor, bool* non_finite) {
    const bool drawn = draw.inv_temperature > 0.0f;
    int64_t best = -1;
    float best_score = 0.0f;
    bool any_non_finite = false;
    for (size_t i = 0; i < logits.size(); ++i) {
        const float v = logits[i];
        if (!std::isfinite(v)) any_non_finite = true;
        if (std::isnan(v) || (drawn && !(v >= floor))) continue;
        const auto id = static_cast<int64_t>(i);
        const float score = drawn ? gumbel_score(v, draw.inv_temperature, draw.noise_key, id) : v;
        if (best < 0 || score > best_score) {  // strict: a tie keeps the lower index
            best = id;
            best_score = score;
        }
    }
    if (non_finite != nullptr) *non_finite = any_non_finite;
    return best < 0 ? 0 : static_cast<int32_t>(best);
}

void cpu_argmax(const ArgmaxArgs& args, ThreadPool& pool) {
    pool.parallel_for(args.num_rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const std::span<const float> row(args.logits + r * args.row_stride,
                                             static_cast<size_t>(args.vocab_size));
            const TokenDraw draw = args.draws != nullptr ? args.draws[r] : TokenDraw{};
            const float floor = cpu_sampling_floor(row, draw);
            if (args.draws != nullptr) args.floor[r] = floor;
            bool non_finite = false;
            args.out_ids[r] = cpu_argmax_row(row, draw, floor, &non_finite);
            args.out_non_finite[r] = non_finite ? 1 : 0;
        }
    });
}

}  // namespace epinfer
