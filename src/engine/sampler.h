// Next-token sampling from fp32 logits: each request's draws (op_args.h TokenDraw), which the device's
// token-choice op (Backend::argmax) makes, and its CPU reference for host logits.
//
// Greedy (temperature 0): argmax, ties to the lower id. Otherwise, in transformers' order: logits / T; keep
// the top_k best (0 = all; every logit equal to the k-th best is kept too, as transformers); keep the
// smallest head of that ranking whose probability mass reaches top_p (every logit tied at its end kept;
// backend/sampling_floor.h: masses in 2^-40 fixed point); draw from the softmax renormalised over the kept
// by the Gumbel-max trick with counter-based noise keyed by the seed and the draw's index
// (backend/gumbel_noise.h). Same seed, same logits → same tokens, on every machine and backend.
#pragma once

#include <cstdint>
#include <span>

#include "backend/op_args.h"
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

// Temperatures are drawn with 1 / T in fp32: below kMinDrawTemperature a request is greedy (logit / T
// would overflow fp32 before the noise mattered); above kMaxDrawTemperature it draws as at it (a logit then
// moves its score by 1e-6 per unit against Gumbel noise of spread ~1: as near uniform over the kept tokens
// as any larger temperature).
inline constexpr double kMinDrawTemperature = 1e-6;
inline constexpr double kMaxDrawTemperature = 1e6;

class Sampler {
public:
    explicit Sampler(const SamplingParams& params) : params_(params) {}
    // The next token's draw (counted as made): TokenDraw{} for a greedy request, else 1 / T, top_k,
    // top_p and the noise key of draw index 0, 1, 2, … (sampling_noise_key).
    TokenDraw next_draw();
    // One token id from logits [V] fp32 host (V ≥ 1): next_draw() made by the op's CPU reference.
    int32_t sample(std::span<const float> logits);

private:
    SamplingParams params_;
    uint64_t draws_ = 0;  // draws made (the next key's index)
};

}  // namespace epinfer
