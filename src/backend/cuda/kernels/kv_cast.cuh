// fp32 → KV cache element (fp32 or bf16), device code shared by the kernels that write the KV cache.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace epinfer::cuda {

template <typename KV>
__device__ __forceinline__ KV to_kv(float x);
template <>
__device__ __forceinline__ float to_kv<float>(float x) {
    return x;
}
// Round to nearest even, a NaN kept a (quiet) NaN of the same sign and payload's top bits: core/dtype.h
// f32_to_bf16 bit for bit (CUDA's __float2bfloat16_rn makes every NaN 0x7fff).
template <>
__device__ __forceinline__ __nv_bfloat16 to_kv<__nv_bfloat16>(float x) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return __ushort_as_bfloat16(static_cast<unsigned short>((bits >> 16) | 0x40));
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
}

}  // namespace epinfer::cuda
