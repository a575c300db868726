// Helpers shared by the CPU op tests: seeded random inputs, weights stored in a chosen dtype, and the
// double-precision reference values they are compared with (tests/common/tolerances.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace epinfer::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> out(n);
    for (float& v : out) v = dist(rng);
    return out;
}

// Values stored as `dtype` (raw bytes) and the exact fp32 values they represent.
struct StoredTensor {
    DType dtype = DType::kF32;
    std::vector<uint8_t> bytes;
    std::vector<float> values;  // what the stored elements mean, for the reference
    const void* data() const { return bytes.data(); }
};

inline StoredTensor store_as(DType dtype, const std::vector<float>& src) {
    StoredTensor t;
    t.dtype = dtype;
    t.bytes.resize(src.size() * dtype_size(dtype));
    for (size_t i = 0; i < src.size(); ++i) {
        if (dtype == DType::kF32) {
            std::memcpy(t.bytes.data() + 4 * i, &src[i], 4);
        } else {
            const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
            std::memcpy(t.bytes.data() + 2 * i, &h, 2);
        }
    }
    t.values.resize(src.size());
    convert_to_f32(dtype, t.bytes.data(), t.values.data(), src.size());
    return t;
}

inline const DType kWeightDtypes[] = {DType::kBF16, DType::kF16, DType::kF32};

}  // namespace epinfer::test
