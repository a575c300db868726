// Grouped expert GEMM for the MoE FFN: out[r, :] = act(x[x_row(r), :] · W_gᵀ) for every row r of every
// group g (an expert, or the shared expert as one more group), with per-group row ranges on the device
// (moe_permute.cuh), so no host synchronisation sits in the step. bf16 operands, fp32 accumulation
// (mma.sync m16n8k16: sm_80 and newer, no Hopper-only instruction), bf16 output.
//
// "Swap AB": the weight rows are the MMA's M side and the tokens its N side, so a tile with few tokens
// still reads its weights once, at full width, and MMAs on token columns past the group's last row are
// skipped (a decode-size group costs its weight bytes, not a padded tile's FLOPs).
//   kSwiGlu: weights [2I, Kd] (gate rows 0..I−1, then up rows I..2I−1, transformers' gate_up_proj);
//            out [rows, I] = silu(x·gateᵀ) · (x·upᵀ), computed from the fp32 accumulators.
//   kStore:  weights [N, Kd]; out [rows, N] = x·Wᵀ.
// Two tile shapes: kNarrow (128 weight rows × 32 tokens, 4 warps, 5 stages, 4 where a block gets less than
// 100 KB of shared memory; split-K for decode sizes,
// whose few tiles would otherwise not fill the GPU) and kWide (256 weight rows × 128 tokens; prefill). On
// H100/H200 with sm_90a in the build, kWide runs the wgmma kernel (moe_grouped_gemm_sm90.cuh: two
// warpgroups, 4 stages, 193 KiB of shared memory); elsewhere mma.sync with 8 warps of 64 × 64, 3 stages,
// 144 KiB (128 × 128 where a block cannot have that much, e.g. sm_120).
// Tiles run group by group, and inside a group in blocks of 16 weight tiles × every token tile, so
// weights and tokens are both reused from L2.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace epinfer::cuda {

enum class MoeGemmEpilogue { kSwiGlu, kStore };
// kGemv: tiles of gemv_rows ≤ kGemvMaxRows rows (moe_grouped_gemv.cuh: weight streaming on the CUDA
// cores, decode at one to four tokens), no split-K.
enum class MoeGemmTile { kNarrow, kWide, kGemv };
// The kernel of kWide tiles: kAuto: wgmma where sm90a_available(), else mma.sync;
// kMmaSync: mma.sync on every device (the portable kernel, so tests check it on Hopper too).
enum class MoeGemmKernel { kAuto, kMmaSync };

// Token rows per tile (the tile_rows of moe_permute.cuh) of each tile shape; kGemv: the most,
// kGemvMaxRows (a launch's tiles have MoeGroupedGemmArgs::gemv_rows).
int64_t moe_gemm_tile_rows(MoeGemmTile tile);
// Weight rows per kNarrow tile (kSwiGlu tiles hold half gate and half up rows, so cover half as many
// outputs); kWide: of the 256-row tile; kGemv: of one block.
int64_t moe_gemm_tile_features(MoeGemmTile tile);

// Pick mode (kGemv tiles of one row only): the GEMM rows are the (token, k) picks themselves, so the step
// needs no permutation plan (moe_permute.cuh) — for one token, whose K picks are K distinct experts, so no
// weights are read twice. Row r < T·K is pick r, of group expert_ids[r] − first_expert (an id outside
// [first_expert, first_expert + G_w), e.g. −1 or another rank's expert: the row is skipped and its output
// not written); row T·K + t is token t's row of the extra group (when extra_weights). GEMM row r reads x row
// r, or with x_per_token its token's (r / K, or r − T·K).
struct MoeGemmPicks {
    const int32_t* expert_ids = nullptr;  // [T, K] int32, device; nullptr: the plan's groups (group_* arrays)
    int64_t first_expert = 0;
    int64_t num_tokens = 0;  // T
    int64_t top_k = 0;       // K
    bool x_per_token = false;
};

struct MoeGroupedGemmArgs {
    // Weights of group g: g < num_weight_groups: weights + g·weight_group_stride; else extra_weights.
    const void* weights = nullptr;        // [G_w, N_w, Kd] bf16, device (N_w = 2·N for kSwiGlu, else N)
    int64_t weight_group_stride = 0;      // elements between consecutive groups' weights
    int64_t num_weight_groups = 0;        // G_w
    const void* extra_weights = nullptr;  // [N_w, Kd] bf16, device: group G_w (the shared expert), or nullptr
    // Per-group weight pointers instead of weights + g·weight_group_stride (groups g < G_w), for experts
    // stored as separate tensors: weight_ptrs[g·weight_ptr_stride] holds rows [0, N) ([N, Kd] bf16, device),
    // and for kSwiGlu weight_ptrs[g·weight_ptr_stride + 1] the up rows [N, 2N) ([N, Kd] bf16, device).
    // Every pointer 16-byte aligned. nullptr: the stacked layout above.
    const void* const* weight_ptrs = nullptr;  // [G_w · weight_ptr_stride] device pointers, device
    int64_t weight_ptr_stride = 1;
    const void* x = nullptr;              // [rows_x, Kd] bf16, device (fp32 with x_f32)
    // kGemv only: x is fp32, each value rounded to bf16 (nearest even) as the tile reads it — the bits a
    // launch_f32_rows_to_bf16 copy would hold, without that launch (decode steps).
    bool x_f32 = false;
    const int32_t* x_row_of_row = nullptr;  // [rows] row of x that GEMM row r reads; nullptr: row r itself
    const int32_t* group_row_begin = nullptr;     // [G] int32, device
    const int32_t* group_row_end = nullptr;       // [G] int32, device
    const int32_t* group_tile_offsets = nullptr;  // [G + 1] int32, device, for the tile's rows
    int64_t num_groups = 0;     // G (G_w or G_w + 1)
    int64_t max_row_tiles = 0;  // upper bound of group_tile_offsets[G] (sizes the grid)
    int64_t out_features = 0;   // N: outputs per row
    int64_t in_features = 0;    // Kd, a multiple of 8
    void* out = nullptr;        // [rows, N] bf16, device, row stride N (rows where a group has a row)
    MoeGemmEpilogue epilogue = MoeGemmEpilogue::kStore;
    MoeGemmTile tile = MoeGemmTile::kNarrow;
    MoeGemmKernel kernel = MoeGemmKernel::kAuto;
    int gemv_rows = 4;  // kGemv: rows per tile, 1, 2 or 4 (moe_gemv_tile_rows; group_tile_offsets for it)
    // Pick mode instead of the group_* arrays (x_row_of_row then nullptr); max_row_tiles = T·K (+ T with an
    // extra group).
    MoeGemmPicks picks;
    // Split-K (kNarrow only): split_k > 1 writes fp32 partial sums to partials; the CTA of a tile's last
    // split to finish sums them in split order (deterministic) and applies the epilogue, counting the
    // tile's finished splits in tile_counters (which it leaves at zero again).
    int split_k = 1;
    float* partials = nullptr;   // [split_k, partial_rows, N_w] fp32, device (split_k > 1)
    int64_t partial_rows = 0;    // ≥ every row index + 1
    int32_t* tile_counters = nullptr;  // [moe_gemm_num_tiles(args)] int32, device, all zero (split_k > 1)
};

// An upper bound of group_tile_offsets[G] for `rows` GEMM rows in at most `groups` non-empty groups and
// tiles of tile_rows rows: Σ_g ceil(rows_g / tile_rows) ≤ rows / tile_rows + groups (exactly rows when
// tile_rows is 1).
int64_t moe_gemm_max_row_tiles(int64_t rows, int64_t groups, int64_t tile_rows);

// Tiles of a kNarrow launch of these arguments (weight tiles × max_row_tiles): the length of tile_counters.
int64_t moe_gemm_num_tiles(const MoeGroupedGemmArgs& args);

// Device workspace (none: partials are passed explicitly).
// Errors: cudaErrorInvalidValue for shapes the kernels do not take (Kd or N not a multiple of 8,
// split_k > 1 with kWide or kGemv, split_k > 1 without partials or tile_counters, pick mode other than on
// kGemv tiles of one row or with x_row_of_row).
cudaError_t launch_moe_grouped_gemm(const MoeGroupedGemmArgs& args, cudaStream_t stream);

// split_k for a launch with about `num_tiles` tiles of in_features Kd on a GPU of num_sms
// multiprocessors: enough units to fill it several times over, at least 8 k-steps each.
int moe_gemm_pick_split_k(int64_t num_tiles, int64_t in_features, int num_sms);

}  // namespace epinfer::cuda
