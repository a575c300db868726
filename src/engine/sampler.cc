#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

namespace epinfer {

namespace {
std::string format_number(double value) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", value);
    return buf;
}
}  // namespace

Status sampling_params_check(const SamplingParams& p) {
    if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature)) {
        return invalid_argument("temperature must be a finite number ≥ 0, got " +
                                format_number(p.temperature));
    }
    if (p.top_k < 0) return invalid_argument("top_k must be ≥ 0, got " + std::to_string(p.top_k));
    if (!(p.top_p > 0.0 && p.top_p <= 1.0)) {
        return invalid_argument("top_p must be in (0, 1], got " + format_number(p.top_p));
    }
    return Status::ok();
}

int32_t argmax_token(std::span<const float> logits) {
    int32_t best = -1;
    for (size_t i = 0; i < logits.size(); ++i) {
        if (std::isnan(logits[i])) continue;
        if (best < 0 || logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
    }
    return best < 0 ? 0 : best;
}

int32_t Sampler::sample(std::span<const float> logits) {
    if (params_.temperature == 0.0) return argmax_token(logits);
    // Candidates ranked by logit (descending), ties by lower id; NaN last.
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    const auto key = [&](int32_t i) { return std::isnan(logits[i]) ? -INFINITY : logits[i]; };
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
    size_t kept = order.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < kept) {
        // transformers' TopKLogitsWarper removes only logits below the k-th best: ties with it stay.
        kept = static_cast<size_t>(params_.top_k);
        while (kept < order.size() && key(order[kept]) == key(order[kept - 1])) ++kept;
    }

    std::vector<double> probs(kept);
    const double max_logit = static_cast<double>(key(order[0])) / params_.temperature;
    if (!std::isfinite(max_logit)) return order[0];  // an infinite best logit takes all the mass
    double sum = 0.0;
    for (size_t i = 0; i < kept; ++i) {
        probs[i] = std::exp(static_cast<double>(key(order[i])) / params_.temperature - max_logit);
        sum += probs[i];
    }
    // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
    double mass = 0.0;
    size_t nucleus = 0;
    while (nucleus < kept && (nucleus == 0 || mass < params_.top_p * sum)) mass += probs[nucleus++];

    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * mass;  // uniform in [0, mass)
    double acc = 0.0;
    for (size_t i = 0; i < nucleus; ++i) {
        acc += probs[i];
        if (u < acc) return order[i];
    }
    return order[nucleus - 1];
}

}  // namespace epinfer
