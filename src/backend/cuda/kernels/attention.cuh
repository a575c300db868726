// Causal attention of the CUDA backend (AttentionArgs, op_args.h) over contiguous or paged fp32 or bf16 K/V
// on the CUDA cores — every shape flash_attention.cuh does not take (fp32 K/V, MLA's expanded heads of
// 192/128 dims) — and the paged KV-cache write (KvCacheStoreArgs). One kernel for prefill and decode of every sequence of a
// batch: a block per (query token, KV head, chunk of ≤ 8 query heads of that KV head's group), so each key
// and value row is read once for the whole group (GQA). Its warps take tiles of 32 keys (a lane per key
// for q·k, then the tile's probabilities broadcast by shuffle for p·v), each warp with an online softmax
// (running max and sum, Milakov & Gimelshein 2018), merged across warps at the end. No T×S score matrix
// in memory. When those blocks would not cover the GPU twice (decode at small batch), the keys are split
// over more blocks (flash-decoding: each split writes a partial output with its max and sum, a second
// kernel combines them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/op_args.h"

namespace epinfer::cuda {

// Largest head_dim_v the kernel takes (each lane keeps Dv / 32 accumulators per query head in registers).
inline constexpr int64_t kAttentionMaxHeadDimV = 512;

// Flash-decoding key splits of one attention op whose grid has `blocks` blocks without splitting: the keys
// [0, S) of every query cut into num_splits ranges of keys_per_split keys (a multiple of tile_keys), as
// many as make blocks · num_splits reach target_blocks (none when blocks ≥ enough_blocks), each keeping at
// least min_keys keys; workspace_bytes: T · Nh · num_splits · (Dv + 2) fp32 for the partials when split.
struct KeySplitPlan {
    int num_splits = 1;
    int64_t keys_per_split = 0;
    size_t workspace_bytes = 0;
};
struct KeySplitTarget {
    int64_t enough_blocks = 0;
    int64_t target_blocks = 0;
    int64_t min_keys = 0;
    int64_t tile_keys = 0;
};
KeySplitPlan plan_key_splits(const AttentionArgs& args, int64_t blocks, const KeySplitTarget& target);

// For blocks of equal work (decode: every query sees its sequence's keys): the split count that minimises the
// modelled time ⌈blocks · splits / wave⌉ · (keys per split + overhead_keys) — blocks run in whole waves (a
// part-filled last wave costs about a whole one) and each pays a fixed start and merge — fewer splits on
// ties, at most kMaxKeySplits. E.g. 256 blocks over 4096 keys with waves of 396 blocks and tiles of 64:
// 3 splits (2 waves of 1408 keys), not 4 (3 waves of 1024).
struct WholeWaveTarget {
    int64_t wave = 0;           // blocks the GPU runs at once
    int64_t min_keys = 0;       // keys per split at least
    int64_t tile_keys = 0;      // keys per split a multiple of this
    int64_t overhead_keys = 0;  // a block's start and merge, in the time of this many keys
};
inline constexpr int64_t kMaxKeySplits = 256;
KeySplitPlan plan_whole_wave_splits(const AttentionArgs& args, int64_t blocks, const WholeWaveTarget& target);

// What the kernels of a split launch read: split s takes keys [s · keys_per_split, (s + 1) ·
// keys_per_split) and, with more than one split, writes its unnormalised partial output and its (max in
// natural-log units, sum of exponentials) to the partials, carved from the launch's workspace.
struct KeySplit {
    int num_splits = 1;
    int64_t keys_per_split = 0;
    float* partial_acc = nullptr;  // [T, Nh, num_splits, Dv] fp32, device; nullptr unsplit
    float* partial_ml = nullptr;   // [T, Nh, num_splits, 2] fp32, device; nullptr unsplit
};
// @pre workspace: plan.workspace_bytes, device.
KeySplit key_split_in(const AttentionArgs& args, const KeySplitPlan& plan, void* workspace);

// The flash-decoding merge: out[t, h] from the num_splits partial outputs of each (t, h) (a split that saw
// no key has sum 0) as Σ_s acc_s · e^(m_s − m) / Σ_s l_s · e^(m_s − m).
// @pre split.num_splits > 1 and its partials written.
cudaError_t launch_attention_combine(const AttentionArgs& args, const KeySplit& split, cudaStream_t stream);

// The launch shape of one attention op on a GPU of num_sms SMs, and the workspace it needs.
struct AttentionPlan {
    int num_chunks = 1;  // blocks per (token, KV head): ⌈group / 8⌉
    KeySplitPlan split;  // keys_per_split a multiple of 32
};
AttentionPlan plan_attention(const AttentionArgs& args, int num_sms);

// Queries whose position is outside [0, S) or whose token_sequence is outside [0, num_sequences) get
// zeros and set *error_flag to 1 (never cleared here); a negative block id a query reaches also sets it
// (that key is skipped).
// @pre attention_check(args) is OK, head_dim_v ≤ kAttentionMaxHeadDimV; plan = plan_attention(args, ·);
// workspace: plan.split.workspace_bytes, device (stream-ordered); error_flag: [1] int32, device.
cudaError_t launch_attention(const AttentionArgs& args, const AttentionPlan& plan, void* workspace,
                             int32_t* error_flag, cudaStream_t stream);

// A slot outside [0, num_pool_rows) skips its row and sets *error_flag to 1 (never cleared here).
// @pre kv_cache_store_check(args) is OK; error_flag: [1] int32, device.
cudaError_t launch_kv_cache_store(const KvCacheStoreArgs& args, int32_t* error_flag, cudaStream_t stream);

}  // namespace epinfer::cuda
