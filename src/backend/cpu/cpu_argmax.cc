#include "backend/cpu/cpu_argmax.h"

#include <cmath>

namespace epinfer {

void cpu_argmax(const ArgmaxArgs& args) {
    for (int64_t r = 0; r < args.num_rows; ++r) {
        const float* row = args.logits + r * args.row_stride;  // [V] fp32
        int64_t best = -1;
        bool non_finite = false;
        for (int64_t i = 0; i < args.vocab_size; ++i) {
            const float v = row[i];
            if (!std::isfinite(v)) non_finite = true;
            if (std::isnan(v)) continue;
            if (best < 0 || v > row[best]) best = i;  // strict: a tie keeps the lower index
        }
        args.out_ids[r] = best < 0 ? 0 : static_cast<int32_t>(best);
        args.out_non_finite[r] = non_finite ? 1 : 0;
    }
}

}  // namespace epinfer
