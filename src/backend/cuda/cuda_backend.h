// The CUDA backend: every op of backend/backend.h on one GPU, on a stream it owns. fp32 activations and
// F32/F16/BF16 weights read in place, as the CPU reference (op_args.h); fp32 accumulation. No CUDA type
// appears here, so code without CUDA headers can hold one (built only with -DEPINFER_CUDA=ON).
//
// Memory is cudaMalloc'd device memory (host_accessible() is false). copy_to_device / copy_to_host return
// when the copy is done (the host buffer may be reused at once); copy_on_device, copy_rows_on_device and
// the ops are ordered on the backend's stream and finish by synchronize().
// Data-dependent errors (a token id outside [0, V), an attention position outside [0, S)) are found on
// the GPU: the affected rows are written as zeros and the next synchronize() returns kInvalidArgument.
// matmul: cuBLAS SGEMM in full fp32 (no TF32); F16/BF16 weights are first upcast to an fp32 scratch
// buffer owned by the backend (a correct first step, not the bandwidth-bound path of issue 4).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/status.h"

namespace epinfer {

// A backend on CUDA device `device`. Errors: kNotSupported "no CUDA GPU: ..." without a usable GPU or
// when `device` does not exist; kInternal naming the CUDA/cuBLAS call that failed.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device = 0);

}  // namespace epinfer
