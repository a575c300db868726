// The one table of numeric tolerances for every test (STYLE.md R14), keyed by op and dtype.
//
// Metrics (tests/common/compare.h): nmse = Σ(got − want)² / Σ want²; max_rel = max |got − want| / max |want|
// (the worst error relative to the tensor's scale, never a bare absolute difference). The dtype is that
// of the op's weights or inputs; the reference is computed in double (op tests) or by transformers in
// fp32 (goldens), so the bounds measure fp32 summation-order error only. Routing ids, permutation maps
// and greedy tokens are compared exactly, not here.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "core/dtype.h"

namespace epinfer::test {

struct Tolerance {
    double max_nmse = 0.0;
    double max_rel = 0.0;
};

struct ToleranceEntry {
    std::string_view op;
    DType dtype;
    Tolerance tolerance;
};

inline constexpr ToleranceEntry kTolerances[] = {
    // CPU reference ops against a double-precision evaluation of the same formula.
    {"embedding", DType::kBF16, {0.0, 0.0}},  // a copy: exact
    {"embedding", DType::kF16, {0.0, 0.0}},
    {"embedding", DType::kF32, {0.0, 0.0}},
    {"rms_norm", DType::kBF16, {1e-12, 2e-6}},
    {"rms_norm", DType::kF16, {1e-12, 2e-6}},
    {"rms_norm", DType::kF32, {1e-12, 2e-6}},
    {"matmul", DType::kBF16, {1e-12, 5e-6}},
    {"matmul", DType::kF16, {1e-12, 5e-6}},
    {"matmul", DType::kF32, {1e-12, 5e-6}},
    {"rope", DType::kF32, {1e-12, 2e-6}},
    {"attention", DType::kF32, {1e-12, 5e-6}},
    {"silu_mul", DType::kF32, {1e-13, 1e-6}},
    {"add_sigmoid_gated", DType::kF32, {1e-13, 1e-6}},
    // MLA's absorbed attention against its expanded form (tests/unit/models/mla_attention_test.cc, CPU, fp32
    // cache): the same scores and weighted sums with the kv_b_proj products reassociated. Measured: nmse
    // 1.5e-14, max_rel 7.3e-8. Bounds ~10×.
    {"mla_absorbed", DType::kF32, {2e-13, 1e-6}},
    // Tiny checkpoints (bf16 weights, fp32 compute) against transformers 5.17 in fp32 (tests/e2e/golden).
    // Measured on all 11 fixtures (CPU backend): nmse ≤ 1.3e-12, max_rel ≤ 1.7e-6.
    {"logits", DType::kBF16, {1e-10, 1e-5}},
    {"mlp_out", DType::kBF16, {1e-10, 1e-5}},
    {"hidden", DType::kBF16, {1e-10, 1e-5}},
    // The same checkpoints under a parallel layout (tests/mpi/model) against one rank: TP/EP/PP change only
    // the grouping of fp32 sums (row-parallel partial sums, all-reduce, EP combine order). Measured over the
    // eleven layouts of tests/mpi/CMakeLists.txt × 11 fixtures: nmse ≤ 2.7e-13, max_rel ≤ 8.7e-7 (pp alone:
    // bit-identical).
    {"logits_multi_rank", DType::kBF16, {1e-10, 1e-5}},
    // One synthetic fp32 MoE block under a layout against one rank (tests/mpi/model/moe_probe_test.cc).
    // Measured over the same layouts: nmse ≤ 1e-14, max_rel ≤ 2e-7.
    {"moe_block_multi_rank", DType::kF32, {1e-12, 1e-5}},
    // CUDA backend (tests/unit/cuda) against the CPU reference.
    // Router weights: ids are exact; weights differ only through exp (glibc expf is off by one ulp on
    // ~1 in 13,000 inputs, the GPU's double-precision exp rounds correctly), ≤ a few ulp after the
    // softmax sum and the renormalisation.
    {"moe_router_weights", DType::kF32, {1e-12, 1e-6}},
    // The MoE layer in bf16 storage (x, h, y bf16; fp32 accumulation) against a reference that rounds at
    // the same points: fp32 accumulation order flips an occasional bf16 rounding of h or y (2^-8 relative).
    {"moe_layer_cuda", DType::kBF16, {1e-6, 1e-2}},
    // One grouped GEMM (bf16 out, fp32 accumulation) against double dot products rounded to bf16: an
    // occasional bf16 rounding flip (2^-8 relative).
    {"moe_grouped_gemm_cuda", DType::kBF16, {1e-6, 1e-2}},
    // CUDA backend ops (tests/unit/cuda/test_cuda_backend_ops.cc) against the CPU backend on the same inputs:
    // fp32 summation order (block trees, cuBLAS SGEMM without TF32) and CUDA's expf/sincosf vs glibc.
    // Measured on the H200 (max over every case of the test): rms_norm nmse 5.0e-15, max_rel 2.0e-7;
    // matmul (K ≤ 1001; T ≤ 16: kernels/matmul_small_t.cuh, F16/F32 with T > 16: SGEMM) 8.0e-14, 3.9e-7; rope 2.5e-15, 1.4e-7; attention (S ≤ 517) 6.4e-13, 1.3e-6;
    // silu_mul 8.8e-17, 5.6e-8; add_sigmoid_gated 1.6e-15, 1.1e-7; embedding and add bit-exact.
    // Bounds: about 10× the measurement.
    {"embedding_cuda", DType::kBF16, {0.0, 0.0}},  // a copy: exact
    {"embedding_cuda", DType::kF16, {0.0, 0.0}},
    {"embedding_cuda", DType::kF32, {0.0, 0.0}},
    {"rms_norm_cuda", DType::kBF16, {5e-14, 2e-6}},
    {"rms_norm_cuda", DType::kF16, {5e-14, 2e-6}},
    {"rms_norm_cuda", DType::kF32, {5e-14, 2e-6}},
    {"matmul_cuda", DType::kBF16, {1e-12, 5e-6}},
    {"matmul_cuda", DType::kF16, {1e-12, 5e-6}},
    {"matmul_cuda", DType::kF32, {1e-12, 5e-6}},
    {"rope_cuda", DType::kF32, {3e-14, 2e-6}},
    {"attention_cuda", DType::kF32, {1e-11, 1.5e-5}},
    // Flash attention over a bf16 KV cache (tests/unit/cuda/test_attention_bf16_kv_cuda.cc) against the CPU
    // backend reading the same bf16 K/V: q and the probabilities are rounded to bf16 for the tensor cores
    // (2^-9 relative each, as FlashAttention), sums in fp32. Measured on the H200 (every case of the test:
    // decode and prefill, head dims 64/128, groups 1–32): nmse ≤ 5.1e-6, max_rel ≤ 3.9e-3. Bounds ~10×.
    {"attention_cuda", DType::kBF16, {5e-5, 4e-2}},
    // The fused GQA preparation (qk_norm_rope_kv_store) against the CPU's six ops: rms_norm's and rope's
    // errors together. F32 (q, k and an fp32 cache): measured on the H200 nmse 9.9e-15, max_rel 2.9e-7.
    // BF16 (a bf16 cache): a value next to a rounding boundary may round to the neighbouring bf16, so the
    // bound is one bf16 step (2^-8) at the tensor's scale; measured nmse 1.2e-11, max_rel 7.6e-5.
    {"qk_norm_rope_kv_store_cuda", DType::kF32, {5e-14, 2e-6}},
    {"qk_norm_rope_kv_store_cuda", DType::kBF16, {1e-10, 4e-3}},
    {"silu_mul_cuda", DType::kF32, {1e-15, 6e-7}},
    {"add_cuda", DType::kF32, {0.0, 0.0}},  // one fp32 add: exact
    {"add_sigmoid_gated_cuda", DType::kF32, {2e-14, 1.2e-6}},
    // CUDA matmul with T > 16 rows and BF16 weights (cuda_backend.h): x is rounded to bf16 before the tensor-
    // core GEMM (relative error ≤ 2^-9 per element), accumulation in fp32. Measured on the H200 (T 17…100,
    // K ≤ 1001): nmse 2.6e-6, max_rel 2.0e-3.
    {"matmul_bf16_activations_cuda", DType::kBF16, {1e-5, 5e-3}},
    // The routed-experts op (tests/unit/cuda/test_moe_experts_cuda.cc) against the CPU backend. BF16: the
    // grouped path rounds x, h and y to bf16 (three roundings of ≤ 2^-9 relative), fp32 accumulation;
    // measured nmse 1.1e-5, max_rel 5.8e-3. F16/F32: the general path in fp32 activations (the matmul op's
    // summation order); measured nmse 4.9e-14, max_rel 3.2e-7.
    {"moe_experts_cuda", DType::kBF16, {5e-5, 1.5e-2}},
    {"moe_experts_cuda", DType::kF16, {5e-13, 3e-6}},
    {"moe_experts_cuda", DType::kF32, {5e-13, 3e-6}},
    // Every golden fixture end to end on the CUDA backend (tests/unit/cuda/test_golden_cuda.cc), every
    // decode step's logits against the CPU backend, up to the first routing flip (a near-tied router
    // choice that bf16 rounding upstream changes; the test probes for it): the MoE experts and the matmuls
    // of more than 16 rows round activations to bf16. Measured on the H200 over the 14 fixtures: one
    // sequence per forward nmse 1.2e-5, max_rel 4.5e-3; both prompts per forward (2·11-row prefill: bf16
    // GEMMs throughout) nmse 5.0e-5, max_rel 8.6e-3; since 2026-11-30 with the bf16 KV cache (the CUDA
    // default) against the CPU's fp32 cache: nmse ≤ 6.9e-5, max_rel ≤ 1.05e-2. Greedy tokens must equal the goldens wherever the
    // top-1 margin exceeds 2 · max_rel · max |logit| (no error within the bound can flip the top-1 there).
    {"logits_cuda", DType::kBF16, {2e-4, 2e-2}},
    // The same with CudaBackendOptions::fp32_activations: fp32 summation order only (greedy tokens equal
    // the goldens exactly). Measured: nmse 6.8e-13, max_rel 1.1e-6.
    {"logits_cuda_fp32", DType::kBF16, {1e-11, 1e-5}},
};

// The entry of (op, dtype); a missing entry is a bug in the test: abort with its name.
inline const Tolerance& tolerance(std::string_view op, DType dtype) {
    for (const ToleranceEntry& e : kTolerances)
        if (e.op == op && e.dtype == dtype) return e.tolerance;
    std::fprintf(stderr, "tolerances.h: no entry for op '%.*s' dtype %s\n", static_cast<int>(op.size()),
                 op.data(), dtype_name(dtype));
    std::abort();
}

}  // namespace epinfer::test
