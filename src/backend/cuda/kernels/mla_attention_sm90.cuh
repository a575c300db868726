// MLA's absorbed attention over the bf16 latent cache on wgmma (sm_90a): the kernel launch_mla_attention runs
// when plan_mla_attention chose it (MlaAttentionPlan::sm90; H100/H200 with sm_90a in the build). Same
// contract as mla_attention.cuh's; FlashMLA's decode layout (DeepSeek, github.com/deepseek-ai/FlashMLA).
//
// A CTA takes one query token, 64 of its heads (the MMA's M rows) and one key split, as two warpgroups:
//   warpgroup 0: S = Q·Kᵀ for a tile of 32 keys (wgmma.m64n32k16, Q and K from shared memory, 36 k16 steps
//                over the 576 dims), the online softmax, P (bf16) and the rows' rescale factors to shared
//                memory, then O[:, 0:256] += P·V with P from its registers;
//   warpgroup 1: copies the tiles (cp.async, four stages of 36 KiB: three tiles in flight while one is
//                used) and O[:, 256:512] += P·V with P from shared memory.
// V is the first 512 columns of the same tile (MN-major operand, transposed by the MMA). The warpgroups meet
// at two named barriers per tile (P written / P read) and the stages' mbarriers (landed / read by both).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/op_args.h"

namespace epinfer::cuda {

inline constexpr int64_t kMlaSm90TileKeys = 32;  // keys per tile; a split's keys are a multiple of it

// Dynamic shared memory: Q [64, 576] and four 32-key tiles of the latent (bf16), P [64, 64] bf16, 1 KiB of
// alignment slack: 225 KiB, within sm_90's 227 KiB opt-in limit.
inline constexpr size_t kMlaAttentionSm90SmemBytes = size_t{64 * 576 + 4 * 32 * 576 + 64 * 64} * 2 + 1024;

// out (or the split's partials) for every token t: blocks (t, split, ⌈heads / 64⌉ head chunks), the chunks
// of one (t, split) adjacent so that they read its keys from L2 once. block_shift: log2(kv_block_size) when
// a power of two, else −1. Bad positions, sequences and block ids as launch_mla_attention.
// @pre mla_attention_supports(args), sm90a_available(device), split.keys_per_split a multiple of
// kMlaSm90TileKeys; error_flag: [1] int32, device.
cudaError_t launch_mla_attention_sm90(const AttentionArgs& args, int num_chunks, int block_shift,
                                      const KeySplit& split, int32_t* error_flag, cudaStream_t stream);

}  // namespace epinfer::cuda
