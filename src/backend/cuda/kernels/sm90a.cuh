// Whether the wgmma kernels (kernels/*_sm90.cu) can run: their sm_90a code exists only in builds whose
// CMAKE_CUDA_ARCHITECTURES has 90a, and runs only on compute capability 9.0 (H100, H200).
#pragma once

namespace epinfer::cuda {

// True when this build carries sm_90a code and `device` is compute capability 9.0; false on any error.
bool sm90a_available(int device);

}  // namespace epinfer::cuda
