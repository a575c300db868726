// See sm90a.cuh.
#include <cuda_runtime.h>

#include "backend/cuda/kernels/sm90a.cuh"

namespace epinfer::cuda {

bool sm90a_available(int device) {
#if defined(EPINFER_CUDA_HAS_SM90A)
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
        return false;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return false;
    return major == 9 && minor == 0;
#else
    (void)device;
    return false;
#endif
}

}  // namespace epinfer::cuda
