// The floor of a drawn row (op_args.h TokenDraw, ArgmaxArgs): the smallest logit a top-k / top-p draw may
// pick. The draw then takes the Gumbel-max over the logits ≥ the floor, which is a draw from the softmax
// renormalised over them.
//
// Definition, in transformers' order (TopKLogitsWarper, then TopPLogitsWarper), over keys = the logits with
// NaN as −inf and −0 as +0:
//   top-k (0 < top_k < V): f_k = the top_k-th largest key; every key equal to it is kept too (transformers).
//   top-p (top_p < 1): each kept key x weighs q(x) = floor(exp((x − max) · inv_temperature) · 2^40), a
//   fixed-point probability (computed in double), so that sums are exact integers and every summation order
//   gives the same mass; target = min(total, max(1, ceil(top_p · total))) over the kept keys' total; the
//   floor is the largest key value f with mass(keys ≥ f) ≥ target: the smallest head of the ranking whose
//   mass reaches top_p, with every key tied at its end kept (as FlashInfer's threshold filters, where
//   transformers' sort would break the tie by position).
//   No filter, a greedy row (inv_temperature 0) or a non-finite maximum: −inf.
// The fixed point drops only probabilities below 2^-40 of the maximum's (exp(z) < 2^-40 for z < −27.8):
// the mass differs from transformers' double sum by at most V · 2^-40 of the maximum's probability.
// The host (cpu_sampling_floor) and the device (kernels/sampling_floor.cu) share these helpers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/splitmix64.h"  // EPI_HOST_DEVICE

namespace epinfer {

// The key of a logit: NaN → −inf, −0 → +0 (so that equal floats have equal keys).
EPI_HOST_DEVICE inline float sampling_key(float logit) {
    if (logit != logit) return -INFINITY;
    return logit == 0.0f ? 0.0f : logit;
}

// An order-preserving map of a non-NaN float to uint32: a < b ⇔ order(a) < order(b) (radix selection).
EPI_HOST_DEVICE inline uint32_t sampling_order(float key) {
    uint32_t bits;
    memcpy(&bits, &key, sizeof(bits));
    return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// The inverse of sampling_order.
EPI_HOST_DEVICE inline float sampling_order_key(uint32_t order) {
    const uint32_t bits = (order & 0x80000000u) != 0 ? order & 0x7fffffffu : ~order;
    float key;
    memcpy(&key, &bits, sizeof(key));
    return key;
}

// Exponents below this give a fixed-point weight of 0: exp(−27.8) · 2^40 < 1.
inline constexpr double kNucleusMinExponent = -28.0;

// q(key) = floor(exp((key − max_key) · inv_temperature) · 2^40) for key ≤ max_key (finite max_key).
EPI_HOST_DEVICE inline uint64_t nucleus_weight(float key, float max_key, float inv_temperature) {
    const double z =
        (static_cast<double>(key) - static_cast<double>(max_key)) * static_cast<double>(inv_temperature);
    if (!(z >= kNucleusMinExponent)) return 0;  // also −inf keys
    return static_cast<uint64_t>(exp(z) * 0x1.0p40);
}

// The mass the nucleus must reach: min(total, max(1, ceil(top_p · total))), for top_p < 1.
EPI_HOST_DEVICE inline uint64_t nucleus_target(uint64_t total, float top_p) {
    const double t = ceil(static_cast<double>(top_p) * static_cast<double>(total));
    if (!(t >= 1.0)) return total < 1 ? total : 1;
    if (t >= static_cast<double>(total)) return total;
    return static_cast<uint64_t>(t);
}

}  // namespace epinfer
