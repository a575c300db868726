// Programmatic dependent launch (PDL; CUDA programming guide, "Programmatic Dependent Launch and
// Synchronization"; PTX griddepcontrol, sm_90+): a kernel launched with launch_pdl may be scheduled while the
// kernel before it in the stream (or the CUDA graph) is still running, so its blocks are resident when that
// one finishes instead of paying the launch gap (measured on an H200: ~0.2 µs per kernel boundary of a
// batch-1 decode step, docs/benchmarks/serving.md). Such a kernel must call pdl_begin() before it touches
// memory that an earlier kernel may write (activations, caches, plans): it waits until the previous kernel
// has completed with its writes visible, then lets the next kernel be scheduled. Before it, a kernel may read
// its constant operands (weights; no kernel writes them) or prefetch them (prefetch_l2): that DRAM latency then
// overlaps the previous kernel. Below sm_90 launch_pdl is a plain launch and pdl_begin() does nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace epinfer::cuda {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Prefetches the bytes [src, src + bytes) into L2 (cp.async.bulk.prefetch.L2, sm_90+; elsewhere nothing), for
// a kernel's constant operands before pdl_begin(). src 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}

// True when the current device runs PDL (compute capability 9.0 or later); cached per host thread.
bool pdl_supported();

// As launch_pdl, and with thread-block clusters of cluster_x blocks along x when cluster_x ≥ 1 (grid.x a
// multiple of it; cluster_x 0: no cluster attribute). Clusters need sm_90, as PDL does: where PDL is not
// supported this is a plain launch, so a caller that needs clusters passes 1 there.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl_cluster(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, unsigned cluster_x, size_t smem,
                               cudaStream_t stream, Args&&... args) {
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = 1;
    attrs[1].id = cudaLaunchAttributeClusterDimension;
    attrs[1].val.clusterDim.x = cluster_x;
    attrs[1].val.clusterDim.y = 1;
    attrs[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attrs;
    config.numAttrs = !pdl_supported() ? 0 : (cluster_x > 0 ? 2 : 1);
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization where supported.
// @pre kernel calls pdl_begin() before it touches memory that an earlier kernel may write.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
    return launch_pdl_cluster(kernel, grid, block, 0, smem, stream, std::forward<Args>(args)...);
}

}  // namespace epinfer::cuda
