// MLA's absorbed attention over the bf16 latent cache on the tensor cores (AttentionArgs, op_args.h): the
// decode attention of layers/attention_mla.h, where every query head reads the same cached rows
// [c_kv (512) | k_pe (64)] — one KV head of width 576, V its first 512 — as FlashMLA's decode kernel does
// (DeepSeek, github.com/deepseek-ai/FlashMLA), here with mma.sync m16n8k16 (bf16 in, fp32 accumulate). On
// H100/H200 (sm_90a in the build) plan_mla_attention picks the wgmma kernel of mla_attention_sm90.cuh
// instead, 2.5–3× faster (docs/benchmarks/attention_h200.md); launch_mla_attention runs either.
//
// A block takes one query token and 64 of its heads (the MMA rows, 16 per row group); its eight warps are
// four row groups × two halves of the 512 output columns. Per tile of 32 keys (two-stage cp.async ring,
// 16-byte chunks XOR-swizzled): the two warps of a row group each take half of the 576-wide dot products,
// exchange their partial scores through shared memory and add them (both get the same sums: addition is
// commutative), run the same online softmax, and each accumulates p · V for its 256 columns. Q (bf16) stays
// in shared memory. Keys are split over blocks as whole waves of the GPU are best filled
// (plan_whole_wave_splits; flash-decoding: the combine kernel of attention.cuh merges the splits). Any
// number of query tokens (each a block row).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/op_args.h"

namespace epinfer::cuda {

inline constexpr int64_t kMlaLatentDim = 512;  // kv_lora_rank of DeepSeek-V2/V3 and Kimi K2: Dv
inline constexpr int64_t kMlaRopeDim = 64;     // qk_rope_head_dim: Dqk = 576

// Dynamic shared memory of the kernel (Q, a two-stage ring of 32-key tiles, the score exchange): 160 KiB,
// within sm_80's and sm_90's opt-in limit (163 and 227 KiB), above sm_86/89/120's 99 KiB.
inline constexpr size_t kMlaAttentionSmemBytes = size_t{64 + 2 * 32} * (kMlaLatentDim + kMlaRopeDim) * 2 +
                                                 size_t{8 * 16 * 32} * 4;

struct MlaAttentionPlan {
    int num_chunks = 0;  // ⌈num_heads / 64⌉ blocks per token and split
    bool sm90 = false;   // the wgmma kernel (mla_attention_sm90.cuh): keys_per_split a multiple of 64
    KeySplitPlan split;  // keys_per_split a multiple of 32
};

// True when args is MLA's absorbed attention this kernel takes: a bf16 cache, one KV head, head_dim_qk 576
// and head_dim_v 512 with V the first 512 of K's rows (v == k, the same token stride), K 16-byte aligned,
// its token stride a multiple of 8 below 2^31, positions and block ids within int32.
bool mla_attention_supports(const AttentionArgs& args);

// sm90a: the device runs the wgmma kernels (sm90a.cuh); the plan then takes mla_attention_sm90.cuh's kernel.
MlaAttentionPlan plan_mla_attention(const AttentionArgs& args, int num_sms, bool sm90a);

// Bad positions, sequences and block ids as launch_flash_attention (zeros, *error_flag = 1).
// @pre mla_attention_supports(args); plan = plan_mla_attention(args, ·, ·); workspace:
// plan.split.workspace_bytes, device; error_flag: [1] int32, device.
cudaError_t launch_mla_attention(const AttentionArgs& args, const MlaAttentionPlan& plan, void* workspace,
                                 int32_t* error_flag, cudaStream_t stream);

}  // namespace epinfer::cuda
