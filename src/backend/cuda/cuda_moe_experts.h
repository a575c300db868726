// The routed-experts op (backend/moe_experts_args.h) on one GPU, behind CudaBackend::moe_experts.
//
// Grouped path: BF16 weights, H and I multiples of 8, every weight 16-byte aligned:
//   x [T, H] fp32 ─ to bf16 ─► permutation plan from the device ids (moe_permute: CUB / one block)
//   ─► grouped gate_up GEMM with fused SwiGLU ─► h [S, I] bf16 ─► grouped down GEMM ─► y [S, H] bf16
//   ─► moe_combine (fp32, k order) ─► out [T, H] fp32
// The GEMMs read each expert's own gate/up/down tensors through a device table of pointers
// (MoeGroupedGemmArgs::weight_ptrs), built once per expert table (content-keyed cache) and reused, so no
// weight is copied or stacked. Tiling as CudaMoeLayer (moe_step_tiling). No host synchronisation once the
// table is cached. Precision: x, h and y are rounded to bf16 (round to nearest even) as in CudaMoeLayer,
// products accumulate in fp32, the combine is fp32 in k order (bit-exact with moe_combine_rows for the
// same bf16 y).
// General path (F32/F16 weights, H or I not a multiple of 8, unaligned weights): the same plan, the expert
// offsets copied to the host (one synchronisation), rows gathered in fp32, per expert with slots the
// backend's matmul and silu_mul ops, fp32 combine in k order: fp32 activations, the matmul op's precision.
// Both paths: E ≤ kRouterMaxExperts.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace epinfer::cuda {

class CudaMoeExperts {
public:
    // narrow_max_rows: the grouped path's kNarrow limit (CudaMoeLayerConfig::narrow_max_rows_per_expert).
    CudaMoeExperts(int num_sms, int64_t narrow_max_rows) : num_sms_(num_sms), narrow_max_rows_(narrow_max_rows) {}
    // Frees the cached pointer tables; the caller has synchronised the stream they were used on.
    ~CudaMoeExperts();
    CudaMoeExperts(const CudaMoeExperts&) = delete;
    CudaMoeExperts& operator=(const CudaMoeExperts&) = delete;

    // Runs the op on `stream`. backend: the CUDA backend that owns `stream` (temporaries come from its
    // stream-ordered alloc/free; the general path runs its matmul and silu_mul ops). fp32_activations:
    // always the general path (CudaBackendOptions::fp32_activations).
    // @pre moe_experts_check(args) is OK. Errors: kNotSupported for E > kRouterMaxExperts; CUDA errors;
    // kOutOfMemory.
    Status run(Backend& backend, const MoeExpertsArgs& args, cudaStream_t stream,
               bool fp32_activations = false);

    // Tables cached so far (tests).
    size_t num_cached_tables() const { return tables_.size(); }

private:
    struct Table {
        std::vector<const void*> host;  // [E, 3]: gate, up, down of each expert
        const void** device = nullptr;  // [E, 3] the same pointers, device (cudaMalloc'd)
        bool aligned = false;           // every pointer 16-byte aligned
    };
    Result<const Table*> table_of(const MoeExpertsArgs& args, cudaStream_t stream);
    Status run_grouped(Backend& backend, const MoeExpertsArgs& args, const Table& table, cudaStream_t stream);
    Status run_general(Backend& backend, const MoeExpertsArgs& args, cudaStream_t stream);
    void clear_tables();

    int num_sms_;
    int64_t narrow_max_rows_;
    std::unordered_map<const void*, Table> tables_;  // keyed by the first expert's gate pointer
};

}  // namespace epinfer::cuda
