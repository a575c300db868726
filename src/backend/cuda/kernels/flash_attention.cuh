// Causal attention over a bf16 KV cache on the tensor cores (AttentionArgs, op_args.h, with kv_dtype
// kBF16): FlashAttention-2's loop (Dao 2023, arXiv:2307.08691) with mma.sync m16n8k16 (bf16 in, fp32
// accumulate) and the online softmax in fp32 registers; no T×S score matrix in memory.
//
// A block takes a tile of query rows — (query token, query head) pairs of one KV head's group, packed as
// the MMA's M side, as FlashInfer and FlashMLA pack GQA heads — and streams that KV head's keys and values
// through shared memory in tiles of 64 keys (cp.async: three stages, two in decode, which runs three blocks
// per SM instead of two unless its blocks walk ≥ 1024 keys; 16-byte chunks XOR-swizzled so ldmatrix is
// conflict-free), reading each key and
// value row once for the whole group. A thread copies one chunk column of 8 (D = 128) or 4 consecutive keys,
// so one block-table entry serves them when the block size is a power-of-two multiple of that.
//   decode  (every sequence brings one query token): a block's rows are the ≤ 16 heads of one token's group;
//           its four warps share those rows and take 16 keys each of every tile, merged at the end. The keys
//           are also split over blocks, as many splits as fill whole waves of the GPU best (flash-decoding:
//           each split writes a partial output with its max and sum; attention.cu's combine kernel merges
//           them).
//   prefill (otherwise): a block's 64 rows are consecutive tokens × the group's heads (≤ 16 per chunk), 16
//           rows per warp, each warp over every key; tokens of different sequences in one tile are taken one
//           sequence after the other; keys split over blocks only when the blocks fill fewer than two waves.
// Positions and paging as AttentionArgs. Q is rounded to bf16 for the MMA, and so are the probabilities
// before p·V (as FlashAttention); scores, max, sums and the output are fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/op_args.h"

namespace epinfer::cuda {

// The launch shape of one flash-attention op, and the workspace it needs.
struct FlashAttentionPlan {
    bool decode = false;         // decode layout (above) or prefill
    bool long_decode = false;  // decode blocks walk ≥ 1024 keys: the deeper pipeline (3 stages, 2 blocks/SM)
    bool sm90 = false;           // prefill on wgmma (flash_prefill_sm90.cuh; its own layout, no key splits)
    int heads_per_chunk = 0;     // query heads of one group in a block's rows (≤ 16)
    int num_chunks = 0;          // ⌈group / heads_per_chunk⌉
    int tokens_per_block = 0;    // 1 (decode) or ⌊64 / heads_per_chunk⌋
    KeySplitPlan split;          // per (token tile, KV head, chunk); keys_per_split a multiple of 64
};

// True when flash attention takes `args`: bf16 K/V, head_dim_qk = head_dim_v ∈ {64, 128}, K/V pointers
// 16-byte aligned and their strides multiples of 8 elements below 2^31. Otherwise attention.cuh's kernel
// runs. The kernel indexes pool rows (block id · kv_block_size + offset) in int32: a pool of 2^31 rows or
// more is outside its contract (the engine's pools hold a few million rows).
bool flash_attention_supports(const AttentionArgs& args);

// sm90a: the device runs the wgmma kernels (sm90a.cuh). Prefill at D = 128 then runs on
// flash_prefill_sm90.cuh when the batch averages at least kFlashSm90MinRowsPerSequence query tokens per
// sequence (prompts; a batch of mostly decode rows keeps this kernel, whose 64-row tiles waste less on them).
// @pre flash_attention_supports(args).
inline constexpr int64_t kFlashSm90MinRowsPerSequence = 16;
FlashAttentionPlan plan_flash_attention(const AttentionArgs& args, int num_sms, bool sm90a);

// Rows of queries whose position is outside [0, S) or whose token_sequence is outside [0, num_sequences)
// are zeros and set *error_flag to 1 (never cleared here); a negative block id a query reaches also sets it
// (that key's row reads as zeros).
// @pre flash_attention_supports(args); plan = plan_flash_attention(args, ·); workspace:
// plan.split.workspace_bytes, device; error_flag: [1] int32, device.
cudaError_t launch_flash_attention(const AttentionArgs& args, const FlashAttentionPlan& plan, void* workspace,
                                   int32_t* error_flag, cudaStream_t stream);

}  // namespace epinfer::cuda
