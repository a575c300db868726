#include "backend/cpu/cpu_argmax.h"

#include <cmath>

#include "backend/gumbel_noise.h"

namespace epinfer {

void cpu_argmax(const ArgmaxArgs& args) {
    for (int64_t r = 0; r < args.num_rows; ++r) {
        const float* row = args.logits + r * args.row_stride;  // [V] fp32
        const float inv_t = args.inv_temperature != nullptr ? args.inv_temperature[r] : 0.0f;
        const uint64_t key = args.noise_keys != nullptr ? args.noise_keys[r] : 0;
        int64_t best = -1;
        float best_score = 0.0f;
        bool non_finite = false;
        for (int64_t i = 0; i < args.vocab_size; ++i) {
            const float v = row[i];
            if (!std::isfinite(v)) non_finite = true;
            if (std::isnan(v)) continue;
            const float score = inv_t > 0.0f ? gumbel_score(v, inv_t, key, i) : v;
            if (best < 0 || score > best_score) {  // strict: a tie keeps the lower index
                best = i;
                best_score = score;
            }
        }
        args.out_ids[r] = best < 0 ? 0 : static_cast<int32_t>(best);
        args.out_non_finite[r] = non_finite ? 1 : 0;
    }
}

}  // namespace epinfer
