// Hopper warpgroup MMA (wgmma, sm_90a) helpers shared by the wgmma kernels (moe_grouped_gemm_sm90.cu,
// flash_prefill_sm90.cu, mla_attention_sm90.cu): shared-memory matrix descriptors of the 128-byte swizzle,
// the fences and waits of the asynchronous MMA, and the instruction shapes those kernels issue. PTX ISA,
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (matrix descriptor format; canonical layouts;
// register fragments).
//
// The 128-byte swizzle: an operand tile is stored as rows of 64 bf16 (128 bytes), 16-byte chunk c of row r
// at chunk c ^ (r mod 8), 8-row atoms of 1024 bytes aligned to 1024 bytes.
//   K-major (A, or B given as [N, K]):    rows are M (or N) indices, the 64 elements of a row are K.
//   MN-major (B given as [K, N], transposed in the MMA): rows are K indices, the 64 elements are N; atoms of
//   64 N × 8 K repeat along N every `lbo` bytes and along K every 1024 bytes.
// Accumulator fragment of .m64nNk16 (fp32): warp w of the warpgroup holds rows 16w + lane/4 (+8); for each 8
// columns j, d[4j + 2h + v] is row +8h, column 8j + 2·(lane mod 4) + v — mma.sync m16n8's layout, so a
// `float[N / 8][4]` view of it is the fragment flash_softmax.cuh works on. The register A operand of k16
// (four bf16 pairs) has the layout of two such 8-column blocks: {d[8k], d[8k+1]}, {d[8k+2], d[8k+3]},
// {d[8k+4], d[8k+5]}, {d[8k+6], d[8k+7]} of an accumulator become the A operand of its columns 16k … 16k+15.
// Device code only (include from .cu files); everything but the descriptors needs sm_90a
// (__CUDA_ARCH_FEAT_SM90_ALL).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace epinfer::cuda {

// Element offset (bf16) of 16-byte chunk c of row r in a tile of kRows rows stored in that swizzle:
// 64-element panels of kRows rows (panel c / 8), chunk (c mod 8) ^ (r mod 8) of the row.
template <int kRows>
__device__ __forceinline__ int swizzled_offset(int r, int c) {
    return (c >> 3) * (kRows * 64) + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

// Descriptor of a K-major operand in the 128-byte swizzle at shared-memory address addr (start address;
// leading byte offset unused by this layout: 16; stride byte offset 1024, one 8-row atom; swizzle mode 1).
// addr may point 32, 64 or 96 bytes into a row (the k16 steps of a 64-wide row).
__device__ __forceinline__ uint64_t smem_descriptor_at(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{16 >> 4} << 16) |
           (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ uint64_t smem_descriptor(const void* p) {
    return smem_descriptor_at(static_cast<uint32_t>(__cvta_generic_to_shared(p)));
}

// Descriptor of an MN-major operand in the 128-byte swizzle at shared-memory address addr (an atom's
// start): leading byte offset `lbo` between the 64-element blocks along N (< 2^18, a multiple of 16), stride
// byte offset 1024 between the 8-row groups along K.
__device__ __forceinline__ uint64_t smem_descriptor_mn_at(uint32_t addr, uint32_t lbo) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{(lbo & 0x3FFFF) >> 4} << 16) |
           (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// The descriptor d with its start address moved `bytes` (a multiple of 16) further: one add on the 14-bit
// address field (bits 0–13, addr / 16), which does not carry for shared-memory addresses below 256 KiB. Lets
// a kernel make each k-step's descriptor from a base with a constant, instead of again from the address.
__device__ __forceinline__ uint64_t smem_descriptor_plus(uint64_t d, uint32_t bytes) {
    return d + (bytes >> 4);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Shared-memory writes of the generic proxy (st.shared, cp.async) made visible to wgmma's reads (async
// proxy).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accesses of d across an in-flight wgmma.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The operand lists of the fp32 accumulators d[0 … N − 1] of an .m64nNk16 instruction, as the asm's
// output operands %0 … %(N − 1) (the instruction's register list is the string of the same name).
#define EPINFER_WGMMA_D8(b)                                                                     \
    "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), \
        "+f"(d[b + 6]), "+f"(d[b + 7])
#define EPINFER_WGMMA_D16(b) EPINFER_WGMMA_D8(b), EPINFER_WGMMA_D8(b + 8)
#define EPINFER_WGMMA_D32(b) \
    EPINFER_WGMMA_D8(b), EPINFER_WGMMA_D8(b + 8), EPINFER_WGMMA_D8(b + 16), EPINFER_WGMMA_D8(b + 24)
#define EPINFER_WGMMA_D64 EPINFER_WGMMA_D32(0), EPINFER_WGMMA_D32(32)
#define EPINFER_WGMMA_D128 EPINFER_WGMMA_D64, EPINFER_WGMMA_D32(64), EPINFER_WGMMA_D32(96)
#define EPINFER_WGMMA_REGS16                                               \
    "{"                                                                    \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
    "}"
#define EPINFER_WGMMA_REGS64                                                                          \
    "{"                                                                                               \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
    "%59, %60, %61, %62, %63"                                                                         \
    "}"
#define EPINFER_WGMMA_REGS128                                                                         \
    "{"                                                                                               \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
    "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
    "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, " \
    "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, "   \
    "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"        \
    "}"

// d[64 × N] (+)= a[64 × 16] · b[N × 16]ᵀ, both K-major bf16 in shared memory (kTransB: b given as [16, N],
// MN-major, transposed by the MMA), fp32 accumulators; accumulate false: d = a · bᵀ.
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 bool accumulate = true) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " EPINFER_WGMMA_REGS128
        ", %128, %129, p, 1, 1, 0, %131;\n}\n"
        : EPINFER_WGMMA_D128
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0), "n"(kTransB));
}
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " EPINFER_WGMMA_REGS64
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : EPINFER_WGMMA_D64
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0));
}
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " EPINFER_WGMMA_REGS16
        ", %16, %17, p, 1, 1, 0, 0;\n}\n"
        : EPINFER_WGMMA_D16(0)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

// d[64 × N] += a[64 × 16] · b[16 × N]: a in registers (the fragment above, four bf16 pairs), b MN-major
// bf16 in shared memory (transposed by the MMA), fp32 accumulators.
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4],
                                                    uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " EPINFER_WGMMA_REGS128
        ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : EPINFER_WGMMA_D128
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " EPINFER_WGMMA_REGS64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : EPINFER_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

#undef EPINFER_WGMMA_D8
#undef EPINFER_WGMMA_D16
#undef EPINFER_WGMMA_D32
#undef EPINFER_WGMMA_D64
#undef EPINFER_WGMMA_D128
#undef EPINFER_WGMMA_REGS16
#undef EPINFER_WGMMA_REGS64
#undef EPINFER_WGMMA_REGS128

#endif

}  // namespace epinfer::cuda
