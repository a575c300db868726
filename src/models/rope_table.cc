#include "models/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace epinfer {

namespace {

// transformers yarn get_mscale.
double get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * std::log(scale) + 1.0;
}

// base^(2i/d) in fp32, as `base ** (torch.arange(0, d, 2).float() / d)`.
std::vector<float> pos_freqs(double base, int64_t dim) {
    std::vector<float> out(static_cast<size_t>(dim / 2));
    for (int64_t i = 0; i < dim / 2; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
        out[i] = static_cast<float>(std::pow(base, static_cast<double>(exponent)));
    }
    return out;
}

// Inverse of the dimension that makes num_rotations turns over max_positions (YaRN paper, eq. 17).
double find_correction_dim(double num_rotations, int64_t dim, double base, double max_positions) {
    return (static_cast<double>(dim) * std::log(max_positions / (num_rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(base));
}

void apply_yarn(const RopeConfig& rope, int64_t dim, RopeTable& table) {
    const std::vector<float> freqs = pos_freqs(rope.theta, dim);
    const float factor = static_cast<float>(rope.factor);
    const double original = static_cast<double>(rope.original_max_position_embeddings);
    const double beta_fast = rope.beta_fast != 0.0 ? rope.beta_fast : 32.0;
    const double beta_slow = rope.beta_slow != 0.0 ? rope.beta_slow : 1.0;
    double low = find_correction_dim(beta_fast, dim, rope.theta, original);
    double high = find_correction_dim(beta_slow, dim, rope.theta, original);
    if (rope.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // transformers: prevent a singular ramp
    const float low_f = static_cast<float>(low), range_f = static_cast<float>(high - low);
    for (int64_t i = 0; i < dim / 2; ++i) {
        const float extrapolation = 1.0f / freqs[i];
        const float interpolation = 1.0f / (factor * freqs[i]);
        const float ramp = std::clamp((static_cast<float>(i) - low_f) / range_f, 0.0f, 1.0f);
        const float extrapolation_factor = 1.0f - ramp;
        table.inv_freq[i] =
            interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
    double attention_factor = rope.attention_factor;
    if (attention_factor == 0.0) {
        attention_factor =
            rope.mscale != 0.0 && rope.mscale_all_dim != 0.0
                ? get_mscale(rope.factor, rope.mscale) / get_mscale(rope.factor, rope.mscale_all_dim)
                : get_mscale(rope.factor, 1.0);
    }
    table.attention_scaling = static_cast<float>(attention_factor);
}

void apply_llama3(const RopeConfig& rope, RopeTable& table) {
    const double original = static_cast<double>(rope.original_max_position_embeddings);
    const double low_freq_wavelen = original / rope.low_freq_factor;
    const double high_freq_wavelen = original / rope.high_freq_factor;
    const float factor = static_cast<float>(rope.factor);
    for (float& f : table.inv_freq) {
        const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / f;
        if (wavelen < high_freq_wavelen) continue;
        if (wavelen > low_freq_wavelen) {
            f = f / factor;
            continue;
        }
        const float smooth =
            (static_cast<float>(original) / wavelen - static_cast<float>(rope.low_freq_factor)) /
            static_cast<float>(rope.high_freq_factor - rope.low_freq_factor);
        f = (1.0f - smooth) * f / factor + smooth * f;
    }
}

}  // namespace

Result<RopeTable> compute_rope_table(const RopeConfig& rope) {
    const int64_t dim = rope.rotary_dim;
    if (dim < 2 || dim % 2 != 0)
        return invalid_argument("rope: rotary_dim must be even and ≥ 2, got " + std::to_string(dim));
    if (!(rope.theta > 0.0))
        return invalid_argument("rope: rope_theta must be > 0, got " + std::to_string(rope.theta));
    if (!(rope.factor > 0.0))
        return invalid_argument("rope: factor must be > 0, got " + std::to_string(rope.factor));
    RopeTable table;
    table.inv_freq.resize(static_cast<size_t>(dim / 2));
    if (rope.type == RopeType::kYarn) {
        if (rope.original_max_position_embeddings <= 0) {
            return invalid_argument("rope: yarn needs original_max_position_embeddings > 0");
        }
        apply_yarn(rope, dim, table);
        return table;
    }
    const std::vector<float> freqs = pos_freqs(rope.theta, dim);
    for (int64_t i = 0; i < dim / 2; ++i) table.inv_freq[i] = 1.0f / freqs[i];
    if (rope.type == RopeType::kLinear) {
        for (float& f : table.inv_freq) f /= static_cast<float>(rope.factor);
    } else if (rope.type == RopeType::kLlama3) {
        if (rope.original_max_position_embeddings <= 0) {
            return invalid_argument("rope: llama3 needs original_max_position_embeddings > 0");
        }
        apply_llama3(rope, table);
    }
    return table;
}

float mla_softmax_scale(const ModelConfig& config) {
    double scale = std::pow(static_cast<double>(config.qk_nope_head_dim + config.qk_rope_head_dim), -0.5);
    if (config.rope.type != RopeType::kDefault && config.rope.mscale_all_dim != 0.0) {
        const double mscale = get_mscale(config.rope.factor, config.rope.mscale_all_dim);
        scale = scale * mscale * mscale;
    }
    return static_cast<float>(scale);
}

}  // namespace epinfer
