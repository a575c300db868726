// Sampling from softmax(logits / T) by the Gumbel-max trick: the index of the largest
// logit_i · (1 / T) + G_i, with G_i = −log(−log(U_i)) and U_i uniform in (0, 1), is distributed as
// softmax(logits / T) (Gumbel 1954; Maddison, Tarlow, Minka 2014, "A* Sampling", §2). One pass over the
// row, no sort, no normalisation, so the device draws it where greedy decoding takes its argmax
// (ArgmaxArgs) and only ids cross to the host.
//
// The noise is counter-based, so the host and the device compute the same value from the same inputs: a
// draw's key comes from the request's seed and the draw's index (sampling_noise_key), U_i from the key and
// the token id through splitmix64's finaliser (Steele, Lea, Flood 2014), G_i in double and rounded to fp32
// (so one-ulp differences between the host's and the device's log cannot reach the fp32 value except at a
// rounding boundary), and the score as fmaf(logit, 1 / T, G_i). Host and device draws agree bit for bit
// except where two scores tie within that rounding.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/splitmix64.h"

namespace epinfer {

// The key of draw `draw` (0, 1, 2, … : one per produced token) of a request sampled with `seed`.
EPI_HOST_DEVICE inline uint64_t sampling_noise_key(uint64_t seed, uint64_t draw) {
    return mix64(mix64(seed) + kSplitMix64Gamma * (draw + 1));
}

// G_i of token `token` in the draw keyed `key`: U = (24 random bits + 0.5) / 2^24 ∈ (0, 1), G = −log(−log U).
EPI_HOST_DEVICE inline float gumbel_noise(uint64_t key, int64_t token) {
    const uint64_t h = mix64(key ^ (static_cast<uint64_t>(token) * 0xd1b54a32d192ed03ull));
    const double u = (static_cast<double>(h >> 40) + 0.5) * 0x1.0p-24;
    return static_cast<float>(-log(-log(u)));
}

// The score the draw maximises: logit · inv_temperature + G (one rounding). NaN logits stay NaN (never win).
EPI_HOST_DEVICE inline float gumbel_score(float logit, float inv_temperature, uint64_t key, int64_t token) {
    return fmaf(logit, inv_temperature, gumbel_noise(key, token));
}

}  // namespace epinfer
