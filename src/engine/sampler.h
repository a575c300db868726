// Next-token sampling from fp32 logits on the host.
//
// Greedy (temperature 0): argmax, ties to the lower id. Temperature only (top_k 0, top_p 1; the temperature
// within draws_on_device's range): a draw from
// softmax(logits / T) by the Gumbel-max trick with counter-based noise (backend/gumbel_noise.h), keyed by
// the seed and the draw's index — the draw the device makes for such requests (ArgmaxArgs), so the engine
// takes it there and only ids cross to the host. Otherwise, in transformers' order: logits / temperature;
// keep the top_k best (0 = all; ranked by value, ties by lower id; as transformers, every logit equal to
// the k-th best is kept too); softmax over the kept in double; keep the smallest prefix of that ranking
// whose probability mass reaches top_p; draw from the renormalised prefix with std::mt19937_64 seeded by
// `seed` (53-bit uniform). Same seed, same logits → same tokens, on every machine.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "core/status.h"

namespace epinfer {

struct SamplingParams {
    double temperature = 0.0;  // ≥ 0; 0 = greedy
    int64_t top_k = 0;         // ≥ 0; 0 = no top-k filter
    double top_p = 1.0;        // (0, 1]; 1 = no nucleus filter
    uint64_t seed = 0;
};

// kInvalidArgument naming the bad field (negative or non-finite temperature, top_k < 0, top_p ∉ (0, 1]).
Status sampling_params_check(const SamplingParams& params);

// Index of the largest logit, ties to the lower index; NaN never wins unless every logit is NaN (then 0).
int32_t argmax_token(std::span<const float> logits);

// Temperatures whose Gumbel-max draw runs in fp32 on the device: 1 / T and logit / T stay finite and
// nonzero there (outside, the host draws in double: a tinier T is greedy, a larger one near uniform).
inline constexpr double kDeviceDrawMinTemperature = 1e-6;
inline constexpr double kDeviceDrawMaxTemperature = 1e6;

// True when the device can make the draw: greedy, or temperature only (top_k 0, top_p 1) with the
// temperature in [kDeviceDrawMinTemperature, kDeviceDrawMaxTemperature] (Gumbel-max, ArgmaxArgs).
bool draws_on_device(const SamplingParams& params);

class Sampler {
public:
    explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
    // One token id from logits [V] fp32 host (V ≥ 1).
    int32_t sample(std::span<const float> logits);
    // The noise key of the next temperature-only draw, which the device makes (counts it as drawn).
    uint64_t next_noise_key();
    // 1 / temperature as the draw's fp32 factor (0 for greedy).
    float inv_temperature() const;

private:
    SamplingParams params_;
    std::mt19937_64 rng_;
    uint64_t draws_ = 0;  // temperature-only draws made (the next key's index)
};

}  // namespace epinfer
