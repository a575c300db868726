#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_argmax.h"
#include "backend/gumbel_noise.h"

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
    return cpu_argmax_row(logits);
}

namespace {

// A token kept by the top-k filter: its logit (NaN as −inf), id and exp(logit / T − max / T).
struct Candidate {
    float key;
    int32_t id;
    double prob;
};

// The ranking of transformers' warpers: higher logit first, ties by lower id.
bool ranks_before(const Candidate& a, const Candidate& b) {
    return a.key > b.key || (a.key == b.key && a.id < b.id);
}

}  // namespace

bool draws_on_device(const SamplingParams& params) {
    if (params.temperature == 0.0) return true;
    return params.top_k == 0 && params.top_p >= 1.0 && params.temperature >= kDeviceDrawMinTemperature &&
           params.temperature <= kDeviceDrawMaxTemperature;
}

uint64_t Sampler::next_noise_key() {
    return sampling_noise_key(params_.seed, draws_++);
}

float Sampler::inv_temperature() const {
    return params_.temperature == 0.0 ? 0.0f : static_cast<float>(1.0 / params_.temperature);
}

int32_t Sampler::sample(std::span<const float> logits) {
    if (params_.temperature == 0.0) return argmax_token(logits);
    // The device's Gumbel-max draw, by the op's CPU reference.
    if (draws_on_device(params_)) return cpu_argmax_row(logits, inv_temperature(), next_noise_key());
    const size_t V = logits.size();
    const auto key = [&](size_t i) { return std::isnan(logits[i]) ? -INFINITY : logits[i]; };
    size_t best = 0;  // the largest logit, ties by lower id
    for (size_t i = 1; i < V; ++i)
        if (key(i) > key(best)) best = i;
    const double max_logit = static_cast<double>(key(best)) / params_.temperature;
    if (!std::isfinite(max_logit)) return static_cast<int32_t>(best);  // an infinite best takes all the mass

    // top_k: keep every logit that reaches the k-th best (transformers' TopKLogitsWarper keeps ties with it).
    float floor = -INFINITY;
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < V) {
        std::vector<float> keys(V);
        for (size_t i = 0; i < V; ++i) keys[i] = key(i);
        const auto kth = keys.begin() + (params_.top_k - 1);
        std::nth_element(keys.begin(), kth, keys.end(), std::greater<>());
        floor = *kth;
    }
    std::vector<Candidate> kept;  // in id order
    kept.reserve(V);
    double sum = 0.0;
    for (size_t i = 0; i < V; ++i) {
        const float k = key(i);
        if (!(k >= floor)) continue;
        const double prob = std::exp(static_cast<double>(k) / params_.temperature - max_logit);
        kept.push_back({k, static_cast<int32_t>(i), prob});
        sum += prob;
    }
    const double u01 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    if (params_.top_p >= 1.0) {
        // No nucleus: the draw walks the kept tokens in id order (the same distribution, no ranking needed).
        const double u = u01 * sum;
        double acc = 0.0;
        for (const Candidate& c : kept) {
            acc += c.prob;
            if (u < acc) return c.id;
        }
        return kept.back().id;
    }
    // Nucleus: the smallest prefix of the ranking whose mass reaches top_p (at least one token), found by
    // selection rather than a sort (expected O(kept)): halve the range holding the prefix's end, placing the
    // ranked-before part in front with nth_element, until a few hundred are left to rank one by one.
    const double target = params_.top_p * sum;
    // The prefix ends in (lo, hi]; kept[0, lo) are its first lo tokens (unordered), of mass mass_lo.
    size_t lo = 0, hi = kept.size();
    double mass_lo = 0.0;
    const auto at = [&](size_t i) { return kept.begin() + static_cast<std::ptrdiff_t>(i); };
    while (hi - lo > 256) {
        const size_t mid = lo + (hi - lo) / 2;
        std::nth_element(at(lo), at(mid), at(hi), ranks_before);
        double mass = mass_lo;  // of the prefix ending at mid (inclusive)
        for (size_t i = lo; i <= mid; ++i) mass += kept[i].prob;
        if (mass >= target) {
            hi = mid + 1;
        } else {
            lo = mid + 1;
            mass_lo = mass;
        }
    }
    std::sort(at(lo), at(hi), ranks_before);
    size_t nucleus = lo;
    double mass = mass_lo;
    while (nucleus < hi && (nucleus == 0 || mass < target)) mass += kept[nucleus++].prob;
    const double u = u01 * mass;
    double acc = 0.0;
    for (size_t i = 0; i < nucleus; ++i) {
        acc += kept[i].prob;
        if (u < acc) return kept[i].id;
    }
    return kept[nucleus - 1].id;
}

}  // namespace epinfer
