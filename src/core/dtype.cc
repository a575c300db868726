#include "core/dtype.h"

#include <cmath>

namespace epinfer {

namespace {
struct DTypeInfo {
    DType dtype;
    const char* name;
    size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4},        {DType::kF16, "F16", 2},        {DType::kBF16, "BF16", 2},
    {DType::kF64, "F64", 8},        {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kI64, "I64", 8},        {DType::kI32, "I32", 4},        {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},          {DType::kU8, "U8", 1},          {DType::kBool, "BOOL", 1},
};
const DTypeInfo& info(DType dtype) {
    for (const auto& i : kDTypes)
        if (i.dtype == dtype) return i;
    return kDTypes[0];  // unreachable: every enumerator is listed
}
}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }
const char* dtype_name(DType dtype) { return info(dtype).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
    for (const auto& i : kDTypes)
        if (name == i.name) return i.dtype;
    return std::nullopt;
}

bool dtype_is_float_weight(DType dtype) {
    return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    float value;
    if (exp == 0) value = std::ldexp(static_cast<float>(mant), -24);
    else if (exp == 31) value = mant ? NAN : INFINITY;
    else value = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
    return sign ? -value : value;
}

uint16_t f32_to_f16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t abs_bits = bits & 0x7fffffffu;
    if (abs_bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
    if (abs_bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); // rounds to inf
    if (abs_bits < 0x38800000u) {                                              // subnormal or zero
        float a;
        std::memcpy(&a, &abs_bits, 4);
        const float scaled = a * 16777216.0f;  // 2^24: units of the smallest subnormal
        return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
    }
    uint32_t mant = abs_bits & 0x7fffffu;
    uint32_t exp = (abs_bits >> 23) - 112;
    uint32_t half = (exp << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
}

void convert_to_f32(DType dtype, const void* src, float* dst, size_t count) {
    switch (dtype) {
        case DType::kF32: std::memcpy(dst, src, count * 4); return;
        case DType::kBF16: {
            const auto* s = static_cast<const uint16_t*>(src);
            for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
            return;
        }
        case DType::kF16: {
            const auto* s = static_cast<const uint16_t*>(src);
            for (size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(s[i]);
            return;
        }
        default:
            for (size_t i = 0; i < count; ++i) dst[i] = NAN;  // callers check dtype_is_float_weight first
    }
}

}  // namespace epinfer
