// mbarriers in shared memory (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier";
// try_wait needs sm_90): the "landed" and "read" signals of the stages of the wgmma kernels' cp.async
// pipelines, so that their warpgroups meet only where one waits for the other's data or reads, not at a CTA
// barrier per step. Device code only (include from .cu files).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace epinfer::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Arrives on bar once this thread's earlier cp.async copies have landed (an arrival of the expected count).
__device__ __forceinline__ void mbarrier_arrive_cp_async(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Waits until the phase of bar with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

}  // namespace epinfer::cuda
