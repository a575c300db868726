#include "backend/cpu/cpu_argmax.h"

#include <cmath>

#include "backend/gumbel_noise.h"

namespace epinfer {

int32_t cpu_argmax_row(std::span<const float> logits, float inv_temperature, uint64_t noise_key,
                       bool* non_finite) {
    int64_t best = -1;
    float best_score = 0.0f;
    bool any_non_finite = false;
    for (size_t i = 0; i < logits.size(); ++i) {
        const float v = logits[i];
        if (!std::isfinite(v)) any_non_finite = true;
        if (std::isnan(v)) continue;
        const auto id = static_cast<int64_t>(i);
        const float score = inv_temperature > 0.0f ? gumbel_score(v, inv_temperature, noise_key, id) : v;
        if (best < 0 || score > best_score) {  // strict: a tie keeps the lower index
            best = id;
            best_score = score;
        }
    }
    if (non_finite != nullptr) *non_finite = any_non_finite;
    return best < 0 ? 0 : static_cast<int32_t>(best);
}

void cpu_argmax(const ArgmaxArgs& args) {
    for (int64_t r = 0; r < args.num_rows; ++r) {
        const std::span<const float> row(args.logits + r * args.row_stride,
                                         static_cast<size_t>(args.vocab_size));
        const float inv_t = args.inv_temperature != nullptr ? args.inv_temperature[r] : 0.0f;
        const uint64_t key = args.noise_keys != nullptr ? args.noise_keys[r] : 0;
        bool non_finite = false;
        args.out_ids[r] = cpu_argmax_row(row, inv_t, key, &non_finite);
        args.out_non_finite[r] = non_finite ? 1 : 0;
    }
}

}  // namespace epinfer
