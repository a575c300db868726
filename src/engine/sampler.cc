#include "engine/sampler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <string>

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

TokenDraw Sampler::next_draw() {
    if (params_.temperature < kMinDrawTemperature) return TokenDraw{};
    TokenDraw draw;
    draw.noise_key = sampling_noise_key(params_.seed, draws_++);
    draw.inv_temperature = static_cast<float>(1.0 / std::min(params_.temperature, kMaxDrawTemperature));
    draw.top_p = static_cast<float>(params_.top_p);
    draw.top_k = static_cast<int32_t>(std::min<int64_t>(params_.top_k, INT32_MAX));
    return draw;
}

int32_t Sampler::sample(std::span<const float> logits) {
    const TokenDraw draw = next_draw();
    return cpu_argmax_row(logits, draw, cpu_sampling_floor(logits, draw));
}

}  // namespace epinfer
