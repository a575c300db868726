// The CUDA backend: every op of backend/backend.h on one GPU, on a stream it owns. fp32 activations
// between ops and F32/F16/BF16 weights read in place, as the CPU reference (op_args.h); fp32 accumulation;
// inside matmul (T > 16) and moe_experts activations are rounded to bf16 as said below, unless
// CudaBackendOptions::fp32_activations. No CUDA type appears here, so code without CUDA headers can hold
// one (built only with -DEPINFER_CUDA=ON).
//
// Memory is device memory from a stream-ordered pool the backend owns (cudaMallocFromPoolAsync /
// cudaFreeAsync on its stream, release threshold UINT64_MAX: freed memory stays in the pool for the next
// alloc; an alloc that fails trims the pool and retries once), so the per-layer temporaries of a forward
// cost no cudaMalloc and no synchronisation; host_accessible() is false. copy_to_device / copy_to_host
// return when the copy is done (the host buffer may be reused at once); copy_on_device,
// copy_rows_on_device and the ops are ordered on the backend's stream and finish by synchronize().
// Every entry point first makes the backend's GPU the calling thread's current device, so any thread may
// issue ops (the engine loop's thread of a rank on GPU 3, say).
// Data-dependent errors (a token id outside [0, V), an attention position outside [0, S)) are found on
// the GPU: the affected rows are written as zeros and the next synchronize() returns kInvalidArgument.
// matmul, by the number of rows T:
//   T ≤ 16 (decode): kernels/matmul_small_t.cuh reads F32/F16/BF16 weights in place with 16-byte loads,
//     fp32 activations and accumulation (fp32 summation order differs from the CPU reference only);
//   T > 16, BF16 weights: x is rounded to bf16 once (round to nearest even), cublasGemmEx on tensor cores
//     with fp32 accumulation and fp32 output (relative error ≤ 2^-9 per product from x's rounding:
//     tests/common/tolerances.h "matmul_bf16_activations_cuda"); with fp32_activations as F16 below;
//   T > 16, F32 weights: cuBLAS SGEMM in full fp32 (no TF32); F16 weights: upcast to an fp32 scratch from
//     the pool, then SGEMM.
// moe_experts: cuda_moe_experts.h (bf16 x, h, y on the grouped path; fp32 on the general path).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/status.h"

namespace epinfer {

struct CudaBackendOptions {
    int device = 0;
    // fp32 activations everywhere, for tests that must match the fp32 goldens exactly: matmul with T > 16
    // rows runs SGEMM on weights upcast to an fp32 scratch, moe_experts its general path (fp32 rows,
    // per-expert matmuls). Slower (weights read as fp32 copies, a host synchronisation per MoE layer);
    // off by default.
    bool fp32_activations = false;
};

// A backend on CUDA device `device` (bf16 activations where the header comment says). Errors:
// kNotSupported "no CUDA GPU: ..." without a usable GPU or when `device` does not exist; kInternal naming
// the CUDA/cuBLAS call that failed.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device = 0);
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options);

// The cudaStream_t every op of `backend` runs on, for communicators that must run in the same order
// (NcclOptions::stream); nullptr when `backend` is not a CUDA backend.
void* cuda_stream_of(Backend& backend);

}  // namespace epinfer
