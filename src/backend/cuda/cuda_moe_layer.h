// One MoE layer on one GPU, the thin host wrapper over kernels/: router top-k → permutation plan →
// grouped gate_up GEMM with fused SwiGLU → grouped down GEMM → weighted combine (+ the shared expert).
//
//   logits [T, E] fp32 ─ moe_router_topk ─► ids/weights [T, K] ─ moe_permute ─► plan + GEMM schedule
//   x [T, H] bf16 ─ gate_up (gathered rows, SwiGLU) ─► h [rows, I] bf16 ─ down ─► y [rows, H] bf16
//   y ─ moe_combine (fp32, k order, + shared rows) ─► out [T, H] fp32
// GEMM rows are the S slots (expert, token, k order) and, with a shared expert, the T tokens once more at
// rows [T·K, T·K + T): the shared expert runs as one more group of the same launches. Every size stays on
// the device: a step issues its kernels with no host synchronisation, so it can be graph-captured.
// Tile choice per call (host, from T): kNarrow when T·K/E ≤ config.narrow_max_rows_per_expert (decode
// sizes, split-K when the tiles are too few to fill the GPU), else kWide (moe_default_narrow_max_rows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels/moe_grouped_gemm.cuh"
#include "core/router_types.h"
#include "core/status.h"

namespace epinfer::cuda {

struct CudaMoeLayerConfig {
    int64_t hidden = 0;               // H, a multiple of 8
    int64_t intermediate = 0;         // I, a multiple of 8
    int64_t num_experts = 0;          // E ≤ 4096
    int64_t top_k = 0;                // K
    int64_t shared_intermediate = 0;  // width of the unweighted shared expert; 0 = none; else must be I
    ScoringFunc scoring_func = ScoringFunc::kSoftmax;
    TopkMethod topk_method = TopkMethod::kGreedy;
    int64_t n_group = 1;
    int64_t topk_group = 1;
    bool norm_topk_prob = false;
    float routed_scaling_factor = 1.0f;
    int64_t max_tokens = 0;  // T_max: sizes the workspace
    // Tile choice: kNarrow while T·K/E ≤ this many rows per expert on average, else kWide;
    // −1: moe_default_narrow_max_rows of the device.
    int64_t narrow_max_rows_per_expert = -1;
};

struct CudaMoeWeights {
    const void* gate_up = nullptr;         // [E, 2I, H] bf16, device (gate rows, then up rows)
    const void* down = nullptr;            // [E, H, I] bf16, device
    const void* shared_gate_up = nullptr;  // [2I, H] bf16, device (config.shared_intermediate > 0)
    const void* shared_down = nullptr;     // [H, I] bf16, device
    const float* e_score_correction_bias = nullptr;  // [E] fp32, device, or nullptr
};

// Which stages a call runs.
struct CudaMoeStepOptions {
    bool route = true;   // false: use the ids/weights already in topk_ids()/topk_weights() (set_routing)
    bool shared = true;  // false: leave the shared expert out (routed experts only)
};

// Device views of the plan of the last call (valid after the step completes on its stream). A one-token
// step (pick mode, CudaMoeTiling::picks) writes only topk_ids, topk_weights, h and y: rows t·K + k.
struct CudaMoePlanView {
    const int32_t* topk_ids = nullptr;         // [T, K]
    const float* topk_weights = nullptr;       // [T, K]
    const int32_t* expert_counts = nullptr;    // [E]
    const int32_t* expert_offsets = nullptr;   // [E + 1]
    const int32_t* token_of_row = nullptr;     // [T·K + T]: [0, S) = token_of_slot
    const int32_t* k_of_slot = nullptr;        // [T·K]
    const int32_t* slot_of_token_k = nullptr;  // [T, K]
    const void* h = nullptr;                   // [T·K + T, I] bf16 (rows of the plan)
    const void* y = nullptr;                   // [T·K + T, H] bf16
};

// How a call of T tokens is tiled (for tests and the bench's report).
struct CudaMoeTiling {
    MoeGemmTile tile = MoeGemmTile::kNarrow;
    // GEMM rows per tile: the permutation's tile_rows (kGemv: the launch's gemv_rows).
    int64_t tile_rows = 64;
    // One token: the GEMMs' pick mode (MoeGemmPicks) and the combine's, no permutation plan.
    bool picks = false;
    int split_k_gate_up = 1;
    int split_k_down = 1;
};

// The narrow limit (rows per expert on average) a device is given by default: 16 where kWide runs on
// wgmma (sm90a_available), else 64. Crossovers measured on the H200 with bench moe
// --narrow-max-rows (docs/benchmarks/moe_h200.md): the wgmma tile wins from ~21 rows per expert on.
int64_t moe_default_narrow_max_rows(int device);

// The tiling of a grouped step of T tokens over E expert groups (+ num_extra_groups more, e.g. the shared
// expert): kGemv while T ≤ kGemvMaxRows (no group has more rows than T: tiles of moe_gemv_tile_rows(T)
// rows; at T = 1 in pick mode); kNarrow while T·K ≤
// narrow_max_rows_per_expert·E, with split-K when its tiles would not fill num_sms multiprocessors; else
// kWide.
CudaMoeTiling moe_step_tiling(int64_t num_tokens, int64_t top_k, int64_t num_experts, int64_t num_extra_groups,
                              int64_t hidden, int64_t intermediate, int64_t narrow_max_rows_per_expert,
                              int num_sms);

class CudaMoeLayer {
public:
    // Validates the config and allocates the workspace for config.max_tokens tokens on the current device.
    // Errors: kInvalidArgument naming the field; kNotSupported (sizes the kernels do not take, a shared
    // expert width other than I); kOutOfMemory; CUDA errors.
    static Result<std::unique_ptr<CudaMoeLayer>> create(const CudaMoeLayerConfig& config);

    // The layer on T ≤ max_tokens tokens, asynchronously on `stream`.
    // logits: [T, E] fp32 device (read when options.route); x: [T, H] bf16 device; out: [T, H] fp32 device.
    Status forward(const CudaMoeWeights& weights, const float* logits, const void* x, int64_t num_tokens,
                   float* out, cudaStream_t stream, CudaMoeStepOptions options = {});

    // Copies host routing (ids [T, K] int32, weights [T, K] fp32) into topk_ids()/topk_weights() (blocking).
    Status set_routing(const int32_t* topk_ids, const float* topk_weights, int64_t num_tokens);

    CudaMoeTiling tiling(int64_t num_tokens) const;
    CudaMoePlanView plan() const;
    const CudaMoeLayerConfig& config() const { return config_; }

private:
    explicit CudaMoeLayer(const CudaMoeLayerConfig& config) : config_(config) {}
    size_t partial_floats(int64_t num_tokens) const;

    CudaMoeLayerConfig config_;
    int num_sms_ = 0;
    CudaBuffer topk_ids_, topk_weights_;
    CudaBuffer expert_counts_, expert_offsets_, token_of_row_, k_of_slot_, slot_of_token_k_;
    CudaBuffer group_row_begin_, group_row_end_, group_tile_offsets_;
    CudaBuffer permute_workspace_, partials_, tile_counters_, h_, y_;
};

}  // namespace epinfer::cuda
