// Device helpers shared by the MoE and attention kernels: 16-byte async copies, ldmatrix, bf16 mma.sync (sm_80+), and
// fp32 arithmetic pinned to round-to-nearest so that results match the CPU reference bit for bit.
// Device code only (include from .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace epinfer::cuda {

using bf16 = __nv_bfloat16;

// Ceil division for positive integers.
template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
    return (a + b - 1) / b;
}

// The rank-local expert of a pick's global id when the rank holds experts [first_expert, first_expert +
// num_experts) (MoeExpertsArgs::first_expert), else −1: another rank's expert, or a dropped pick (−1).
__device__ __forceinline__ int64_t local_expert(int32_t id, int64_t first_expert, int64_t num_experts) {
    const int64_t e = int64_t{id} - first_expert;
    return e >= 0 && e < num_experts ? e : -1;
}

// exp(x) rounded to fp32 from a double-precision exp: correctly rounded except for inputs within ~1e-9
// of a rounding midpoint. glibc's expf (the CPU reference) agrees with this except on ~1 in 13,000
// inputs, where it is off by one ulp (measured over 6.4e8 floats in [−104, 89], docs/benchmarks/moe_h200.md).
__device__ __forceinline__ float exp_nearest(float x) {
    return static_cast<float>(exp(static_cast<double>(x)));
}

// 16-byte global → shared copy, bypassing L1; src_bytes = 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8×8 b16 matrices from shared memory; lane l gives the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The same, each matrix transposed (the B operand of p · V from a [keys, D] row-major tile).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Two fp32 values as one bf16 pair (round to nearest even), lo in the low half: an mma.sync A/B register.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a · b for one m16n8k16 tile: a [16, 16] bf16 row-major, b [16, 8] bf16 col-major, d [16, 8] fp32.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// silu(g) · u in fp32, as the CPU reference: g / (1 + exp(−g)) · u.
__device__ __forceinline__ float silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

}  // namespace epinfer::cuda
