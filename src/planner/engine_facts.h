// What epinfer's runtime does per forward step, as the planner prices it: element sizes, the kernels one
// layer launches and the activation bytes its kernels move. `epinfer plan` reads them (cost_model.h,
// memory_model.h defaults); the runtime's start-up memory check (tools/epinfer/model_setup.cc) sets the same
// activation size and the KV size of the --kv-cache-dtype it runs.
//
// Read off the engine (docs/planner.md §6 "Engine facts"); when the engine changes, change this file and
// tests/unit/planner/test_engine_facts.cc:
//   KV cache          k/v pools of --kv-cache-dtype (layers/kv_cache.h LayerKvCache::k_pool, v_pool, dtype):
//                     `auto` is bf16 on CUDA (2 bytes, what a GPU plan prices) and fp32 on the CPU backend
//                     (the exact reference); scores, softmax and the weighted sum are fp32 either way
//   activations       fp32 [T, width] rows between ops and on the wire (models/model.cc, all_reduce_sum_f32,
//                     ep_dispatch rows of H·4 bytes); the MoE's permuted rows, gate_up output and down output
//                     are bf16 (the grouped GEMM's operands, backend/cuda moe_experts)
//   small matmuls     up to 16 rows (up to 4 for bf16 weights of rows of ≥ 7168 elements, kMatmulLongK:
//                     cuBLAS above; counted here as at 16, so the plan misses one f32→bf16 kernel and a bf16
//                     copy of ≤ 16·K·2 B per such projection at 5–16 rows): one fp32-activation kernel that
//                     reads W once (backend/cuda/kernels/matmul_small_t.cuh kMatmulSmallTMaxRows); the
//                     projections of one input, GQA's q, k and v and a dense MLP's (or shared experts') gate
//                     and up, run as one launch of it (77f1e2f: Backend::matmul_group, layers/linear.h
//                     linear_group_forward); above, a group's x is converted f32→bf16 once (3658571) for
//                     its cuBLAS GEMMs, and GQA's q, k and v, stacked at load (models/model_weights.cc),
//                     are one GEMM into column blocks of one output (CudaBackend::bf16_gemms); gate and up
//                     stay two GEMMs
// Kernels per layer (one rank), `qkf` = 1 with q/k norms over the whole projection (OLMoE), `big` = 1 when
// rows > 16 (counted as the CUDA engine launches them, graph memset nodes included;
// backend/cuda/cuda_backend.cc). Since fdefb56 a block's residual add runs inside the next RMSNorm
// (RmsNormArgs::residual, vLLM's fused_add_rms_norm; models/model.cc Model::run_stage norm_hidden): the
// attention block's inside the post-attention norm, the MLP or MoE block's inside the next layer's input
// norm or the final norm, so no block launches an add of its own. On a pipeline stage that sends to the
// next, the last layer's add runs alone before the send (EngineKernels::stage_send); with an observer every
// MLP add does (tests only, not priced).
//   GQA attention  5 + 2·qkf + 2·big   input norm, [q, k, v] (one launch up to 16 rows; above, one
//                                       conversion and one GEMM), [q_norm, k_norm over the whole
//                                       projection], qk_norm_rope_kv_store (fdefb56, layers/attention_gqa.cc:
//                                       per-head q/k norms, rope q and k, kv store k and v in one kernel on
//                                       CUDA for half-split RoPE with rotary_dim ≤ 256 and head_dim −
//                                       rotary_dim ≤ 128, every GQA model here; per-head norms whose weights
//                                       differ in dtype or eps, in no checkpoint seen, run as 2 kernels
//                                       before it), attention (the flash-attention kernel on a bf16 KV cache,
//                                       kernels/flash_attention.cu), o_proj
//                  11 + 4·big          whole-projection q/k norms under attention TP (OLMoE at attn_tp > 1:
//                                       GqaAttentionParams::full_num_heads, project_full_then_slice): q, its
//                                       norm, the copy of this rank's heads (cudaMemcpy2DAsync), the same
//                                       three for k, then v, each alone (no group: a conversion and a GEMM
//                                       each past 16 rows), then as above
//   MLA attention  16 + 4·big (14 + 3·big without q_lora)   input norm, q_a, q_a norm, q_b, rope q, kv_a,
//                                       kv_a norm, rope latent, kv store, the absorbed form of decode rows
//                                       (layers/attention_mla.h: bf16 pack and batched GEMM of q_nope · W_UK,
//                                       the q_pe copy, attention, bf16 pack and batched GEMM · W_UVᵀ),
//                                       o_proj; a prompt chunk's expanded form is not counted
//   MoE            7 + big + permute    post norm, router, top-k, f32→bf16, permute, grouped gate_up,
//                                       grouped down, combine (cuda_moe_experts.cc run_grouped; no
//                                       f32→bf16 up to kEngineMoeGemvMaxTokens MoE tokens, where the
//                                       gemv tile reads the fp32 x, MoeGroupedGemmArgs::x_f32; split-K
//                                       partials are reduced inside the GEMM kernels); the permute of
//                                       p = rows·K picks (kernels/moe_permute.cu,
//                                       engine_moe_permute_kernels): 1 kernel up to 640 picks, 4 up to
//                                       4864, 7 + 2·passes beyond; none when the MoE step has one token:
//                                       pick mode (b47ccaa; cuda_moe_layer.cc moe_step_tiling,
//                                       CudaMoeTiling::picks) makes its K picks the gemv's rows, each
//                                       reading its expert from the top-k ids, with no permutation plan
//                  + 4 + 3·big per layer with shared experts ([gate, up] as one launch up to 16 rows,
//                                       silu·mul, down, and the add of their output into the routed one;
//                                       + 1 + big with a sigmoid shared-expert gate, a matmul alone)
//   dense MLP      4 + 3·big            post norm, [gate, up] (one launch up to 16 rows; above, one
//                                       conversion and two GEMMs), silu·mul, down
//   head           4 + big              embedding, final norm, LM head, argmax
// Not counted (they need the GPU's SM count, which profiles do not give, or the context):
//   - attention's combine kernel, launched when the keys are split over blocks: fewer blocks than the
//     kernel aims at (flash: 4 waves, query tiles · KV heads · ⌈group/16⌉ < 8 · SMs, a decode row being
//     one tile) and block tables spanning
//     more than 256 keys (64 for the CUDA-core kernel). Qwen3-30B-A3B decode on an H200: one more kernel
//     per layer at every row count up to 256 once the longest context passes 256 tokens, none at 1024 rows;
//   - the split-K tile counters' memset, one node when the narrow MoE tile splits K (a grid under 4 waves:
//     Qwen3-30B-A3B at 5–10 rows on 132 SMs; never with the ≤ 4-row kGemv tile or the wide tile).
// Qwen3-30B-A3B (contexts ≤ 256): 5 + 6 = 11 kernels per layer at 1 row (pick mode), 5 + 8 = 13 at 8,
// 7 + 9 = 16 at 64, 7 + 12 = 19 at 256, 7 + 17 = 24 at 1024 (past 16 rows 11 + … until 3658571 converted a
// group's x once, 9 + … until q, k and v were stacked); 48 × 11 + 4 = 532 per decode step at one row (580
// before the gemv read the fp32 x, the count h200_epinfer_2026-11-30d.json was fitted with).
// Before 77f1e2f (fdefb56's engine): q, k and v three launches at every row count, gate and up two
// (GQA attention 7 + 2·qkf + 4·big, shared experts + 5 + 3·big, dense MLP 5 + 3·big): 14, 15 per
// Qwen3-30B-A3B layer at 1 and 8 rows, 676 per decode step at one row, the count
// h200_epinfer_2026-11-30c.json was fitted with. Before fdefb56 (the engine of 7dc5532..ccc87c8): 21, 22,
// 27, 30, 35 per layer, GQA attention being
// 11 + 2·qkn + 4·big (q_norm and k_norm with any q/k norm, rope q, rope k, kv store k, kv store v and the
// residual add each a kernel) and every MoE, dense MLP and MLA block one add longer: 48 × 21 + 4 = 1012 per
// decode step at one row, the count h200_epinfer_2026-11-30b.json was fitted with. Nsight Compute listed
// 23 at batch 1 on 2026-11-29 (engine 6c868cd: the permute and a separate split-K reduction kernel after
// gate_up; the kGemv tile came on 2026-11-30, pick mode with b47ccaa).
//
// How a step is launched and synchronised (cost_model.h prices each of these):
//   decode graphs     a micro-batch replays a captured CUDA graph only when the model runs on one rank
//                     (no ParallelContext), samples greedily and every sequence brings one new token, at
//                     most kEngineMaxGraphRows of them (models/model_decode_graph.cc
//                     Model::decode_graph_fits; MLA's decode rows take the absorbed form, recordable too);
//                     every other forward (prompt chunks, > 256 rows, any layout of more than one rank)
//                     launches its kernels one by one from the host
//   collectives       every NCCL call of the engine (all-reduce, all-to-all, pipeline send/recv) returns
//                     once queued on the communicator's stream (comm/nccl_communicator.h; a watchdog thread
//                     bounds it), so the GPU runs it between the kernels around it; the host waits once
//                     per forward (Model::forward: synchronize() after the last micro-batch). Until
//                     2026-11-29 every call was host-polled to completion (the GPU drained and idled
//                     around it)
//   pipeline          a step's sequences split into pp micro-batches by count, in step order (decode
//                     sequences first, then prompt chunks; parallel/sharding.h split_evenly: the first ones
//                     get the extra); every rank runs micro-batches 0..pp−1 in order: receive from the
//                     previous stage, compute, send [T, H] fp32 to the next (one NCCL send/recv, which runs
//                     when both GPUs' streams reach it); an empty micro-batch is skipped; after the last
//                     one the last stage's sampled ids (and non-finite flags) are broadcast to every stage
//                     over MPI on the host (models/model.cc Model::forward). Nothing overlaps across steps.
//   DP attention's MoE on GPU ranks (attn_dp > 1: layers/moe/moe_dp_device.cc, ep_device.cc, ep_dispatch.cc)
//                     plans each MoE layer's dispatch on the host. Per MoE layer, on a rank with tokens:
//                       device→host  routing ids [T, K] and weights [T, K] (moe_route)                   2
//                       MPI          all_to_all_v of per-peer headers, then of the [rows, K slots + K
//                                    weights] records over the EP group (ep_dispatch)                    2
//                       host→device  one upload (ep_dispatch_device): the send rows' token index, the
//                                    received rows' local slots and weights, the combine's [moe_ep, T]
//                                    row_of index and its zero row (five uploads before 2026-11-30)      1
//                     Every backend copy is synchronous (CUDA: cudaMemcpyAsync, then a stream synchronize),
//                     so each of these 5 is a round trip in which the GPU idles while the host waits,
//                     copies or exchanges and launches again (kEngineDpMoeHostRoundTrips). Around them:
//                     one gather of the rows to send, an NCCL all_to_all_v (dispatch), the experts, an NCCL
//                     all_to_all_v (combine), then moe_ep gathers and moe_ep − 1 adds that sum the rows
//                     home: 2·moe_ep kernels more than the MoE of one rank (engine_dp_moe_kernels)
// Attention temporaries (engine_attention_temp_bytes): the peak of the buffers one attention block
// allocates on a rank and frees when it returns (layers/attention_mla.cc, attention_gqa.cc, the CUDA
// backend's matmul/batched_matmul). `a` = activation bytes (the fp32 buffers), `c` = the GEMM input copy
// (EngineDevice), copy(r, K) = c·r·K when r > kEngineSmallMatmulMaxRows (matmul; cuBLAS path), T rows,
// h = Nh/attn_tp query heads and kv KV heads on the rank, S = min(context_tokens, max_position_embeddings)
// (the engine refuses a request past the model's positions):
//   MLA  held      a·T·(h·(Dn + Dr) + R + Dr + h·Dv)     q [T, h, Dn+Dr], latent [T, R+Dr], out [T, h, Dv]
//        + the largest of, one after another:
//        q         a·T·q_lora + copy(T, max(H, q_lora))   q_a [T, q_lora] and q_a_proj's, q_b_proj's input
//                  (copy(T, H) for q_proj without q_lora); kv_a_proj_with_mqa copy(T, H)
//        absorbed  a·T·h·(2R + Dr) + c·T·h·max(Dn, R)   q_abs [n, h, R+Dr], attn_latent [n, h, R] and the
//                  batched GEMMs' bf16 inputs [n, h, Dn] (· W_UK), [n, h, R] (· W_UVᵀ); one call per run of
//                  absorbed sequences, n ≤ T rows (a step of short sequences fills it), when
//                  mla_absorb_max_rows ≥ 1
//        expanded  a·S·(R + Dr + h·(Dn + Dv) + h·(Dn + Dr)) + copy(S, R)   per sequence with more than
//                  mla_absorb_max_rows new rows (only when min(T, S) exceeds it): its S cached latent rows
//                  [S, R+Dr] gathered, kv_b_proj [S, h, Dn+Dv], keys [S, h, Dn+Dr], kv_b_proj's input
//        o_proj    copy(T, h·Dv)
//   GQA  held      a·T·(2·h·D + 2·kv·D)                  q, out [T, h, D]; k, v [T, kv, D]
//        + max(copy(T, H) (+ a·T·Nh·D: OLMoE's full q projection under attention TP), copy(T, h·D))
// DeepSeek-V3 at tp1 (h 128, R 512, Dr 64, Dn 128, Dv 128, q_lora 1536), T 2048 on a GPU with the latent
// kernel: held 340,262,912 B + absorbed 1,409,286,144 B = 1,749,549,056 B (1.63 GiB). Not counted (needs
// the SM count): the key splits' workspace of the attention kernels, T·h·splits·(Dv + 2)·4 B, zero for the
// latent kernel once T·⌈h/64⌉ ≥ SMs (a 2048-row chunk on any GPU), and where the kernels split (decode,
// flash on GQA prefill) under 2·(the blocks they aim at)·64·(Dv + 2)·4 B: about 70 MB on an H200.
#pragma once

#include <cstdint>
#include <limits>

#include "planner/model_costs.h"

namespace epinfer::planner {

inline constexpr int kEngineKvBytesPerElement = 2;          // bf16 KV cache (CUDA's --kv-cache-dtype auto)
inline constexpr int kEngineActivationBytesPerElement = 4;  // fp32 activations
inline constexpr int kEngineExpertRowBytesPerElement = 2;   // bf16 rows inside the grouped expert GEMMs
inline constexpr int64_t kEngineSmallMatmulMaxRows = 16;    // matmul rows of the fp32 small-T kernel
inline constexpr int64_t kEngineMoeGemvMaxTokens = 4;       // MoE steps on the gemv tile (kGemvMaxRows)
inline constexpr int64_t kEngineMaxStepTokens = 2048;       // default --max-step-tokens (prefill chunk)
inline constexpr int64_t kEngineMaxGraphRows = 256;         // models/model.h Model::kMaxGraphRows
inline constexpr int64_t kEngineKvBlockTokens = 16;         // engine/engine.h EngineOptions::block_size
inline constexpr int kEngineGemmInputCopyBytesPerElement = 2;  // bf16 copy of a cuBLAS GEMM's fp32 input
// MlaAttentionParams::absorb_max_rows on a GPU with the latent-attention kernel: every chunk absorbed.
inline constexpr int64_t kEngineMlaAbsorbAllRows = std::numeric_limits<int64_t>::max();
inline constexpr int kEngineOutputBroadcasts = 2;           // pp > 1: sampled ids and non-finite flags
inline constexpr int kEngineDpMoeHostRoundTrips = 5;        // per MoE layer under DP attention (above)
// MoE permute (kernels/moe_permute.cu): up to this many picks, one block plans everything (kSmallPicks);
inline constexpr int64_t kEnginePermuteOneBlockPicks = 640;
// up to this many, CUB's radix sort is one single-tile kernel (256 threads × 19 keys on sm_90, CUDA 13's
// CUB); beyond, its onesweep path: 2 memsets, histogram, exclusive sum, then a memset and a kernel per
// 8-bit pass over the keys 0..E.
inline constexpr int64_t kEngineSortOneTilePicks = 4864;

// Whether one forward of a micro-batch with `decode_rows` one-token sequences and `prefill_rows` prompt
// rows replays a decode CUDA graph on a layout of `world_size` ranks (greedy sampling assumed, as bench).
bool engine_uses_decode_graph(const ModelCosts& model, int world_size, int64_t decode_rows,
                              int64_t prefill_rows);

// Kernels one layer (or the head) launches on one rank for `rows` token rows of the rank; `moe_tokens`:
// the tokens of the MoE step over the EP group (`rows` without DP attention; under it the rows of every DP
// group, which bound the rows a rank's experts receive). At one MoE token the experts run in pick mode: no
// permute. The permute's picks are counted at rows·K (under DP attention a rank may receive more).
// `attn_tp`: the layout's attention TP (with whole-projection q/k norms above 1, q, k and v run alone).
struct EngineKernels {
    int64_t attention = 0;   // GQA or MLA block, input norm to o_proj
    int64_t moe = 0;         // MoE block, post-attention norm to combine, shared experts included
    int64_t dense_mlp = 0;   // dense MLP block, post-attention norm to down
    int64_t head = 0;        // embedding, final norm, LM head, sampling
    int64_t stage_send = 0;  // once per forward on a pipeline stage that sends: its last add, run alone
};
EngineKernels engine_kernels(const ModelCosts& model, int64_t rows, int64_t moe_tokens, int attn_tp);

// Kernels and memsets the MoE permute launches for `picks` = rows · K picks over `num_experts` experts
// (the model's E; a rank's block under EP may need fewer key bits): 1 (≤ kEnginePermuteOneBlockPicks),
// 4 (keys, the one-tile sort, slots, finalize; ≤ kEngineSortOneTilePicks), else 7 + 2·⌈bits/8⌉ with bits
// the width of E (keys, 2 memsets, histogram, exclusive sum, a memset and a onesweep kernel per pass,
// slots, finalize). Qwen3-30B-A3B (K 8, E 128): 1 up to 128 rows, 4 at 256, 9 at 1024.
int64_t engine_moe_permute_kernels(int64_t picks, int64_t num_experts);

// Kernels DP attention's MoE adds per MoE layer on a rank with tokens (above): the dispatch's gather of the
// rows to send, and the combine's moe_ep gathers and moe_ep − 1 adds. 2·moe_ep.
int64_t engine_dp_moe_kernels(int moe_ep);

// How the engine runs attention on the device a memory plan is for.
struct EngineDevice {
    // The new rows of one sequence up to which MLA takes the absorbed form (MlaAttentionParams::
    // absorb_max_rows; models/model.h mla_absorb_max_rows): every chunk on a GPU whose backend has the
    // latent-attention kernel (sm_80, sm_90: what `epinfer plan` prices); elsewhere (the CPU backend,
    // sm_86/89/120) layers/attention_mla.h mla_absorb_max_rows, 170 for DeepSeek-V3 and Kimi K2.
    int64_t mla_absorb_max_rows = kEngineMlaAbsorbAllRows;
    // Bytes per element of the bf16 copy the CUDA backend makes of a GEMM's fp32 input on bf16 weights
    // (matmul above kEngineSmallMatmulMaxRows rows, batched_matmul at any); 0 on the CPU backend.
    int gemm_input_copy_bytes_per_element = kEngineGemmInputCopyBytesPerElement;
};

struct EngineAttentionTempArgs {
    int64_t rows = 0;               // T: rows of one forward on the rank (MemoryOptions::max_prefill_tokens)
    int64_t context_tokens = 0;     // keys of one sequence at most (MemoryOptions::context_tokens)
    int attn_tp = 1;                // query heads on the rank: Nh / attn_tp
    int64_t kv_heads_per_rank = 0;  // GQA KV heads on the rank (RankShare)
    int act = kEngineActivationBytesPerElement;  // bytes of the fp32 buffers
    EngineDevice device;
};
// Bytes of the attention block's own temporaries at their peak on one rank (the formula above); they are
// freed before the MoE or MLP block of the layer allocates its own. 0 for rows ≤ 0.
int64_t engine_attention_temp_bytes(const ModelCosts& model, const EngineAttentionTempArgs& args);

// Activation bytes one token's rows move through memory per layer on one rank (reads + writes of the
// engine's kernels, weights and KV reads excluded), by block. `act` = activation bytes per element,
// `e` = kEngineExpertRowBytesPerElement, widths of this rank: q_w = Nh·D/attn_tp (GQA; MLA Nh·(nope +
// rope)/attn_tp), kv_w = KV heads on the rank · D, v_w = Nh·v_head/attn_tp (MLA), F = MLP or shared width
// / attn_tp; `big` (rows > 16) adds, per projection input element, the cuBLAS path's bf16 copy written by
// the f32→bf16 kernel and read back by the GEMM (2 + 2 bytes). A block's residual add, run inside the next
// norm (above), is what that norm moves more than a plain one: it reads the residual and writes the sum,
// 2H (a fused norm 4H: x, residual, sum, out; the add alone moved 3H); the norm's own 2H stays with the
// block it opens. Since fdefb56 (before: GQA act·(9H + (6 + 2·qkn)·q_w + (8 + 2·qkn)·kv_w), every other
// block act·H more, the add's 3H):
//   GQA attention  act·(8H + (6 + 2·qkf)·q_w + (7 + 2·qkf)·kv_w) + big·4·(3H + q_w)
//                  H: input norm r/w, q, k, v read x (each its own x reads, in one launch or three:
//                  77f1e2f's group moved no byte), o_proj write, add; q_w: q written, read and written
//                  by qk_norm_rope_kv_store, read by attention, its output written and read by o_proj;
//                  kv_w: k and v written, read once by qk_norm_rope_kv_store, which writes k and the two
//                  cache rows (counted at act bytes, as the kv stores' were); qkf: the whole-projection
//                  norms' r/w of q and k
//   MLA attention  act·(7H + 4·q_lora + 4·q_w + 5·(kv_lora + rope) + 2·v_w) + big·4·(2H + q_lora + v_w)
//                  (without q_lora the q_lora terms drop)
//   MoE per token  act·(7H + 2E) + e·H + big·4·H                  norm, router, top-k, f32→bf16, combine, add
//     per routed (token, expert) pair on the rank  e·(5H + 2I/moe_tp)   permute r/w, gate_up r/w, down r/w,
//                                                                        combine read
//     shared experts  act·(6H + 6F) + big·4·(2H + F)   (their own add into the routed output, 3H;
//                                                       + act·H + big·4·H for a sigmoid gate)
//   dense MLP      act·(7H + 6F) + big·4·(2H + F)
//   head per row   act·(4H + 2·V/attn_tp) + big·4·H      embedding write, final norm, LM head read and fp32
//                                                       logits write, argmax read of the logits
//   stage send     act·H per token on a pipeline stage that sends: its last add run alone (3H, not 2H)
struct EngineActivationBytes {
    double attention_per_token = 0.0;
    double moe_per_token = 0.0;         // router to combine and the residual add, shared experts included
    double moe_per_pair = 0.0;          // per routed (token, expert) pair on the rank
    double dense_mlp_per_token = 0.0;   // dense layers
    double head_per_row = 0.0;          // per row whose logits are computed
    double stage_send_per_token = 0.0;  // a sending pipeline stage's unfused last add, once per forward
};
// `attn_tp`, `moe_tp`: the layout's splits; `kv_heads_per_rank` from RankShare (GQA); `act` bytes/element.
EngineActivationBytes engine_activation_bytes(const ModelCosts& model, int attn_tp, int moe_tp,
                                              int64_t kv_heads_per_rank, int act, int64_t rows);

}  // namespace epinfer::planner
