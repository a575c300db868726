// Programmatic dependent launch: see pdl.cuh.
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {

bool pdl_supported() {
    thread_local int device = -1;
    thread_local bool supported = false;
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) return false;
    if (current != device) {
        int major = 0;
        supported = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current) == cudaSuccess &&
                    major >= 9;
        device = current;
    }
    return supported;
}

}  // namespace epinfer::cuda
