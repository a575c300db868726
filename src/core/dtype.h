// Element types of checkpoint tensors and activations, with host conversions.
//
// Names follow safetensors ("BF16", "F8_E4M3", ...). bf16/fp16/fp8 values are converted on the host
// bit-exactly as PyTorch does (round-to-nearest-even when narrowing).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace epinfer {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kF8E4M3, kF8E5M2, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element.
size_t dtype_size(DType dtype);
// safetensors name, e.g. "BF16".
const char* dtype_name(DType dtype);
// Parses a safetensors dtype name; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);
// True for dtypes the compute path reads as weights today (F32, F16, BF16).
bool dtype_is_float_weight(DType dtype);

inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Round-to-nearest-even, NaN preserved (as torch.Tensor.to(torch.bfloat16)).
inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts `count` elements of `dtype` (F32, F16, BF16) at `src` to fp32 at `dst`.
void convert_to_f32(DType dtype, const void* src, float* dst, size_t count);

}  // namespace epinfer
