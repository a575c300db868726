// `epinfer bench attention`: the CUDA backend's attention op (Backend::attention, kernels/attention.cuh)
// at real model shapes over a paged bf16 or fp32 KV cache, timed against the H200's speed of light.
//
// Per case the backend records one attention op into an op graph (Backend::begin_capture … end_capture;
// the op allocates its kernel's workspace from the backend's pool inside the graph, as in the engine's
// decode graphs) after one direct run, and the graph is replayed `repeats` times, each replay timed with
// events after an L2 flush (a 512 MiB memset); the median is reported. The backend's error flag (a query
// position or block id out of range) is checked by a synchronize() after the timed replays.
// Inputs: q (fp32), K and V (the cache dtype) uniform in [−1, 1) (never zeros), scale 1/√Dqk. K and V live
// in pools of kv_block_size-token blocks laid out as the engine's KvBlockPool ([num_blocks · bs, Nkv, D]); the
// blocks of all sequences are one random permutation of the pool, so a sequence's pages are not contiguous.
//   decode:  B sequences of S cached tokens, one query token each at position S − 1;
//   prefill: one sequence of T tokens at positions 0 … T − 1 over its own T cached rows (causal).
// MLA's latent cache (v_in_k): one pool of [c_kv (Dv) | k_pe] rows, K = the whole row, V = its first Dv
// (the absorbed decode of layers/attention_mla.h: Nh query heads over one KV head).
// Counts (attention_bench_counts):
//   kv_bytes      = the K and V rows the queries attend, each once: rows · Nkv · (Dqk + Dv) · element size
//                   (v_in_k: rows · Nkv · Dqk · element size), rows = B · S (decode) or T (prefill);
//   kv_bytes_bf16 = the same at 2 bytes per element (issue 4's decode target is defined on a bf16 cache);
//   flops         = 2 · (Dqk + Dv) · Nh · (keys summed over the queries): B · S (decode), T·(T + 1)/2
//                   (prefill, causal).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace epinfer::cuda {

enum class AttentionBenchPhase { kDecode, kPrefill };
const char* attention_bench_phase_name(AttentionBenchPhase phase);  // "decode" or "prefill"

struct AttentionBenchCase {
    std::string shape;  // e.g. "qwen3_30b_a3b"
    AttentionBenchPhase phase = AttentionBenchPhase::kDecode;
    int64_t num_heads = 0;     // Nh
    int64_t num_kv_heads = 0;  // Nkv, divides Nh
    int64_t head_dim_qk = 0;   // Dqk
    int64_t head_dim_v = 0;    // Dv
    int64_t batch = 1;         // B sequences (prefill: 1)
    int64_t context = 0;       // decode: S cached tokens per sequence; prefill: T tokens
    bool v_in_k = false;       // MLA latent cache: V is the first Dv of each K row (Dv ≤ Dqk, no V pool)
};

struct AttentionBenchCounts {
    int64_t num_tokens = 0;     // query tokens: B (decode) or T (prefill)
    double kv_bytes = 0;        // at the cache's dtype
    double kv_bytes_bf16 = 0;
    double flops = 0;
};
AttentionBenchCounts attention_bench_counts(const AttentionBenchCase& c, DType kv_dtype);

struct AttentionBenchOptions {
    int repeats = 20;            // ≥ 1
    int64_t kv_block_size = 16;  // tokens per KV block, ≥ 1 (the CLI passes the engine's default)
    DType kv_dtype = DType::kBF16;  // kBF16 (the engine's cache on GPUs) or kF32
};

struct AttentionBenchRow {
    AttentionBenchCase c;
    AttentionBenchCounts counts;
    std::string kernel;        // "flash" (kernels/flash_attention.cuh), "flash_sm90" (its prefill on wgmma,
                               // kernels/flash_prefill_sm90.cuh), "mla" (kernels/mla_attention.cuh) or
                               // "cuda_cores" (kernels/attention.cuh)
    int num_splits = 1;        // the kernel plan's key splits (flash-decoding) of the case
    double device_bytes = 0;   // q, out, K/V pools, block tables, positions and workspace
    double time_us = 0;        // median
};

// Runs `cases` in order on GPU 0 through a CUDA backend, calling on_row after each. Errors:
// kNotSupported without a GPU; kOutOfMemory naming the case when its buffers (device_bytes) exceed 80 % of
// the GPU's free memory; kInvalidArgument for a prefill case with batch ≠ 1 or when the op's error flag is
// set; CUDA errors. Each error names the case ("bench attention glm_4_5 decode B=64 S=4096: ...").
Status cuda_bench_attention(const std::vector<AttentionBenchCase>& cases, const AttentionBenchOptions& options,
                            const std::function<void(const AttentionBenchRow&)>& on_row);

}  // namespace epinfer::cuda
