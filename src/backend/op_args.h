// Argument structs of the backend ops (STYLE.md R3, R8): POD, raw device pointers, sizes and dtypes only.
//
// Every tensor field says `[shape] dtype`, outermost dimension first, row-major. "device" means memory of
// the backend running the op (host memory for the CPU backend). Strides are in elements. Weights may be
// F32, F16 or BF16 and are read in place (no up-front fp32 copy); activations are fp32.
// Each op family has a <op>_check() that validates shapes and pointers with a one-line kInvalidArgument
// naming the field; every backend calls it before running.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace epinfer {

// out[t, :] = float(table[token_ids[t], :]).
struct EmbeddingArgs {
    const int32_t* token_ids = nullptr;  // [T] int32, device; each in [0, V)
    const void* table = nullptr;         // [V, H] table_dtype, device
    DType table_dtype = DType::kBF16;
    float* out = nullptr;     // [T, H] fp32, device
    int64_t num_tokens = 0;   // T (0 allowed)
    int64_t vocab_size = 0;   // V
    int64_t hidden_size = 0;  // H
};

// RMSNorm over rows of any width (full hidden, per head, whole projection), as transformers *RMSNorm in
// fp32: out = weight · (x · rsqrt(mean(x²) + eps)).
// With `residual` (vLLM's fused_add_rms_norm: a decoder layer's residual add and the next norm in one op):
// s = x + residual (fp32, the add op's sum) is written to sum_out and out = weight · (s · rsqrt(mean(s²) +
// eps)), so the sum and the norm equal an add followed by rms_norm bit for bit.
struct RmsNormArgs {
    const float* x = nullptr;      // [R, W] fp32, device, row stride x_row_stride
    const void* weight = nullptr;  // [W] weight_dtype, device
    DType weight_dtype = DType::kBF16;
    float* out = nullptr;        // [R, W] fp32, device, row stride out_row_stride; may equal x
    int64_t num_rows = 0;        // R (0 allowed)
    int64_t width = 0;           // W
    int64_t x_row_stride = 0;    // ≥ W
    int64_t out_row_stride = 0;  // ≥ W
    float eps = 1e-6f;
    const float* residual = nullptr;  // [R, W] fp32, device, row stride x_row_stride, or nullptr
    float* sum_out = nullptr;  // [R, W] fp32, device, row stride x_row_stride: x + residual (with residual
                               // only); may equal x; out must not overlap x, residual or sum_out
};

// y = x · Wᵀ + bias (nn.Linear), accumulated in fp32.
struct MatmulArgs {
    const float* x = nullptr;  // [T, K] fp32, device, row stride x_row_stride
    const void* w = nullptr;   // [N, K] w_dtype, device, row-major (nn.Linear.weight)
    DType w_dtype = DType::kBF16;
    const void* bias = nullptr;  // [N] bias_dtype, device, or nullptr
    DType bias_dtype = DType::kBF16;
    float* y = nullptr;        // [T, N] fp32, device, row stride y_row_stride; must not overlap x
    int64_t num_rows = 0;      // T (0 allowed)
    int64_t out_features = 0;  // N
    int64_t in_features = 0;   // K
    int64_t x_row_stride = 0;  // ≥ K
    int64_t y_row_stride = 0;  // ≥ N
};

// Projections of the same rows in one op: q, k and v; gate and up. Defined as the matmul op on each entry in
// order; every entry has the same x, x_row_stride, num_rows and in_features. Where the entries are stacked —
// each weight right after the previous one in memory, in one dtype (as vLLM's QKVParallelLinear concatenates
// them at load; model_weights.cc binds q, k and v so), each y the columns right after the previous one's in
// rows of one stride, biases stacked too or all null — a backend may run them as one matmul of the
// concatenated weights (CudaBackend: one cuBLAS GEMM instead of one per entry).
struct MatmulGroupArgs {
    static constexpr int kMaxMatmuls = 4;
    MatmulArgs matmuls[kMaxMatmuls];
    int num_matmuls = 0;  // 1 … kMaxMatmuls
};

// Per-head matmuls (torch.bmm over the B heads of a [T, B, K] activation; einsum "tbk,bkn->tbn"), fp32
// accumulation, for b < B and t < T:
//   w_layout kNK (nn.Linear's layout, W_b [N, K]):  y[t, b, :] = x[t, b, :] · W_bᵀ
//   w_layout kKN (W_b [K, N]):                      y[t, b, :] = x[t, b, :] · W_b
// W_b is the packed row-major matrix at w + b · w_batch_stride elements. MLA's absorbed attention uses it
// with the per-head blocks of kv_b_proj (DeepSeek-V2 paper §2.1.2, "W^UK can be absorbed into W^Q, and
// W^UV into W^O"; vLLM's MLACommonImpl W_UK_T / W_UV).
enum class BatchedWeightLayout { kNK, kKN };

struct BatchedMatmulArgs {
    const float* x = nullptr;  // [T, B, K] fp32, device: (t, b, k) at t·x_token_stride + b·x_batch_stride + k
    const void* w = nullptr;   // [B, N, K] (kNK) or [B, K, N] (kKN) w_dtype, device, w_batch_stride apart
    DType w_dtype = DType::kBF16;
    BatchedWeightLayout w_layout = BatchedWeightLayout::kNK;
    float* y = nullptr;          // [T, B, N] fp32, device: (t, b, n) at t·y_token_stride + b·y_batch_stride + n;
                                 // must not overlap x
    int64_t num_rows = 0;        // T (0 allowed)
    int64_t num_batches = 0;     // B
    int64_t out_features = 0;    // N
    int64_t in_features = 0;     // K
    int64_t x_token_stride = 0;
    int64_t x_batch_stride = 0;
    int64_t w_batch_stride = 0;  // ≥ N · K
    int64_t y_token_stride = 0;
    int64_t y_batch_stride = 0;
};

// Rotary position embedding, in place, on `rotary_dim` consecutive elements of each head starting at
// `rot_offset`. Angles are fp32 as transformers computes them: f_i = float(position) · inv_freq[i];
// cos/sin are scaled by attention_scaling (YaRN attention_factor, else 1).
//   half-split (interleaved = false, transformers rotate_half): pairs (i, i + d/2):
//     out[i] = x[i]·cos_i − x[i+d/2]·sin_i,  out[i+d/2] = x[i+d/2]·cos_i + x[i]·sin_i
//   interleaved (DeepSeek rope_interleave, apply_rotary_pos_emb_interleave): pairs (2i, 2i+1), written
//   de-interleaved as transformers does: out[i] = x[2i]·cos_i − x[2i+1]·sin_i,
//     out[i+d/2] = x[2i+1]·cos_i + x[2i]·sin_i  (q and k get the same layout, so q·k is unchanged).
struct RopeArgs {
    float* x = nullptr;  // [T, num_heads, head_stride] fp32, device, token stride token_stride
    const int32_t* positions = nullptr;  // [T] int32, device
    const float* inv_freq = nullptr;     // [rotary_dim / 2] fp32, device
    float attention_scaling = 1.0f;
    int64_t num_tokens = 0;  // T (0 allowed)
    int64_t num_heads = 0;
    int64_t token_stride = 0;  // elements between tokens
    int64_t head_stride = 0;   // elements between heads
    int64_t rot_offset = 0;    // first rotated element inside a head
    int64_t rotary_dim = 0;    // d, even
    bool interleaved = false;
};

// Causal scaled-dot-product attention of T queries of one or more sequences against their cached keys and
// values, as transformers eager_attention_forward: s_j = (q·k_j)·scale for j ≤ positions[t]; p = softmax(s)
// in fp32; out = Σ_j p_j v_j. GQA: query head h reads kv head h / (num_heads / num_kv_heads).
// Contiguous K/V (kv_block_tables null, one sequence): key/value j is row j of k and v.
// Paged K/V (vLLM's PagedAttention block tables): k and v are pools of blocks of kv_block_size rows; query
// t belongs to sequence s = token_sequence[t] (0 for every query when token_sequence is null) and its key
// / value j is pool row
//   kv_block_tables[s · block_table_stride + j / kv_block_size] · kv_block_size + j % kv_block_size
// (rows k_token_stride / v_token_stride elements apart, as without paging). Table entries past a sequence's
// blocks may be −1 (padding); a negative entry a query reaches is an error of the op.
// K and V are fp32 or bf16 (kv_dtype; a bf16 KV cache as vLLM's and SGLang's default "auto" cache dtype
// for bf16 models); scores, softmax and the weighted sum are fp32 either way.
struct AttentionArgs {
    const float* q = nullptr;            // [T, Nh, Dqk] fp32, device (strides below)
    const void* k = nullptr;             // [S, Nkv, Dqk] kv_dtype, device; paged: [num_blocks·bs, Nkv, Dqk]
    const void* v = nullptr;             // [S, Nkv, Dv] kv_dtype, device; paged: [num_blocks·bs, Nkv, Dv]
    DType kv_dtype = DType::kF32;        // kF32 or kBF16 (strides below count elements of this dtype)
    const int32_t* positions = nullptr;  // [T] int32, device; query t sees keys 0..positions[t] (< S)
    float* out = nullptr;                // [T, Nh, Dv] fp32, device; must not overlap q, k or v
    int64_t num_tokens = 0;              // T (0 allowed)
    int64_t num_kv_tokens = 0;           // S: positions are < S; paged: S ≤ block_table_stride · bs
    int64_t num_heads = 0;               // Nh
    int64_t num_kv_heads = 0;            // Nkv, divides Nh
    int64_t head_dim_qk = 0;             // Dqk
    int64_t head_dim_v = 0;              // Dv
    int64_t q_token_stride = 0, q_head_stride = 0;
    int64_t k_token_stride = 0, k_head_stride = 0;
    int64_t v_token_stride = 0, v_head_stride = 0;
    int64_t out_token_stride = 0, out_head_stride = 0;
    float scale = 1.0f;  // > 0, finite
    // Optional paging: [num_sequences, block_table_stride] int32, device, or nullptr for contiguous K/V.
    const int32_t* kv_block_tables = nullptr;
    const int32_t* token_sequence = nullptr;  // [T] int32, device, each in [0, num_sequences); or nullptr
    int64_t num_sequences = 0;                // rows of kv_block_tables (≥ 1 when set, else 0)
    int64_t block_table_stride = 0;           // entries per row (≥ 1 when set, else 0)
    int64_t kv_block_size = 0;                // bs ≥ 1 when kv_block_tables is set, else 0
};

// Paged KV-cache write (vLLM's reshape_and_cache with a slot mapping): pool row slot_mapping[t] ← row t
// of src, for every t, converted to pool_dtype (bf16: round to nearest even). The slots of one call must be
// distinct.
struct KvCacheStoreArgs {
    const float* src = nullptr;             // [T, width] fp32, device, rows src_row_stride elements apart
    void* pool = nullptr;                   // [num_pool_rows, width] pool_dtype, device (packed rows)
    DType pool_dtype = DType::kF32;         // kF32 or kBF16
    const int64_t* slot_mapping = nullptr;  // [T] int64, device, each in [0, num_pool_rows)
    int64_t num_tokens = 0;                 // T (0 allowed)
    int64_t width = 0;                      // elements per row, ≥ 1
    int64_t src_row_stride = 0;             // ≥ width
    int64_t num_pool_rows = 0;              // rows of the pool, ≥ 1
};

// GQA attention's work between the q/k/v projections and the attention op, as one op (TensorRT-LLM's QKV
// preprocessing, with Qwen3's per-head q/k RMSNorm first): per-head RMSNorm of q and k when q_norm is set,
// RoPE of the first rotary_dim elements of every q and k head, then the rows of k and v stored into the KV
// cache's pools. Defined as the six ops of qk_norm_rope_kv_store_parts() run in order: rms_norm of q and
// of k, rope of q and of k, kv_cache_store of k and of v (Backend's default implementation runs them).
struct QkNormRopeKvStoreArgs {
    float* q = nullptr;  // [T, Nh, D] fp32, device, token stride q_token_stride: normed and rotated in place
    float* k = nullptr;  // [T, Nkv, D] fp32, device, token stride k_token_stride: normed and rotated in place
    const float* v = nullptr;  // [T, Nkv, D] fp32, device, token stride v_token_stride
    // Elements between consecutive tokens' rows; 0: packed (Nh·D for q, Nkv·D for k and v). The GQA layer
    // passes q, k and v as column blocks of one [T, (Nh + 2·Nkv)·D] projection output (attention_gqa.cc).
    int64_t q_token_stride = 0, k_token_stride = 0, v_token_stride = 0;
    int64_t num_tokens = 0;        // T (0 allowed)
    int64_t num_heads = 0;         // Nh
    int64_t num_kv_heads = 0;      // Nkv
    int64_t head_dim = 0;          // D
    const void* q_norm = nullptr;  // [D] norm_dtype, device, or nullptr: no q/k norm (then k_norm too)
    const void* k_norm = nullptr;  // [D] norm_dtype, device, or nullptr
    DType norm_dtype = DType::kBF16;
    float norm_eps = 1e-6f;
    const int32_t* positions = nullptr;  // [T] int32, device
    const float* inv_freq = nullptr;     // [rotary_dim / 2] fp32, device
    float attention_scaling = 1.0f;
    int64_t rotary_dim = 0;  // even, ≤ D
    bool interleaved = false;
    void* k_pool = nullptr;                 // [num_pool_rows, Nkv · D] pool_dtype, device
    void* v_pool = nullptr;                 // [num_pool_rows, Nkv · D] pool_dtype, device
    DType pool_dtype = DType::kF32;         // kF32 or kBF16
    const int64_t* slot_mapping = nullptr;  // [T] int64, device, each in [0, num_pool_rows)
    int64_t num_pool_rows = 0;
};

// The ops QkNormRopeKvStoreArgs is defined as, in the order they run (q_norm/k_norm: num_rows 0 without
// norm weights). The norms' rows are those of packed q and k (T·Nh and T·Nkv rows of D); the default
// implementation runs strided q and k through packed copies.
struct QkNormRopeKvStoreParts {
    RmsNormArgs q_norm, k_norm;
    RopeArgs q_rope, k_rope;
    KvCacheStoreArgs k_store, v_store;
};
QkNormRopeKvStoreParts qk_norm_rope_kv_store_parts(const QkNormRopeKvStoreArgs& args);
// The token strides of q, k and v with 0 resolved to the packed widths.
struct QkvTokenStrides {
    int64_t q = 0, k = 0, v = 0;
};
QkvTokenStrides qkv_token_strides(const QkNormRopeKvStoreArgs& args);

// How one row's token is chosen (ArgmaxArgs::draws; the engine's Sampler fills it from a request's
// SamplingParams). Greedy when inv_temperature is 0 (the other fields unused). Otherwise a draw from
// softmax(logits · inv_temperature) restricted to the logits ≥ the row's floor (backend/sampling_floor.h:
// top_k, then top_p), by the Gumbel-max trick (backend/gumbel_noise.h).
struct TokenDraw {
    uint64_t noise_key = 0;        // the draw's key (sampling_noise_key)
    float inv_temperature = 0.0f;  // 1 / T ≥ 0; 0 = greedy
    float top_p = 1.0f;            // (0, 1]; 1 = no nucleus filter
    int32_t top_k = 0;             // ≥ 0; 0 or ≥ V = no top-k filter
};

// Token choice on the device. Greedy row: out_ids[r] = the index of the largest of logits[r, :], ties to the
// lower index, NaN never winning unless the whole row is NaN (then 0) — the host sampler's argmax_token
// (engine/sampler.h). Drawn row (draws[r].inv_temperature > 0): the same over the scores
// gumbel_score(logits[r, i], inv_temperature, noise_key, i) of the logits ≥ floor[r], the row's
// floor (backend/sampling_floor.h; the op writes it into the floor workspace first: −inf for greedy and
// unfiltered rows). out_non_finite[r] = 1 when row r holds a NaN or ±inf, else 0 (the engine refuses such
// rows).
struct ArgmaxArgs {
    const float* logits = nullptr;    // [R, V] fp32, device, rows row_stride elements apart
    int32_t* out_ids = nullptr;       // [R] int32, device
    int32_t* out_non_finite = nullptr;  // [R] int32, device
    int64_t num_rows = 0;             // R (0 allowed)
    int64_t vocab_size = 0;           // V ≥ 1
    int64_t row_stride = 0;           // ≥ V
    const TokenDraw* draws = nullptr;  // [R] device, or nullptr: every row greedy
    float* floor = nullptr;            // [R] fp32, device workspace; required with draws
};

// out[i] = silu(gate[i]) · up[i], silu(x) = x / (1 + exp(−x)) (SwiGLU).
struct SiluMulArgs {
    const float* gate = nullptr;  // [n] fp32, device
    const float* up = nullptr;    // [n] fp32, device
    float* out = nullptr;         // [n] fp32, device; may equal gate or up
    int64_t num_elements = 0;     // n (0 allowed)
};

// out[i] = a[i] + b[i].
struct AddArgs {
    const float* a = nullptr;  // [n] fp32, device
    const float* b = nullptr;  // [n] fp32, device
    float* out = nullptr;      // [n] fp32, device; may equal a or b
    int64_t num_elements = 0;  // n (0 allowed)
};

// out[t, :] = a[t, :] + sigmoid(gate[t]) · b[t, :] (Qwen2-MoE shared expert gate).
struct AddSigmoidGatedArgs {
    const float* a = nullptr;     // [T, H] fp32, device
    const float* gate = nullptr;  // [T] fp32, device (pre-sigmoid)
    const float* b = nullptr;     // [T, H] fp32, device
    float* out = nullptr;         // [T, H] fp32, device; may equal a or b
    int64_t num_rows = 0;         // T (0 allowed)
    int64_t width = 0;            // H
};

// dst[i] = src[i] converted from src_dtype to dst_dtype: F32 → BF16 rounds to nearest even (NaN stays NaN,
// as torch .to(torch.bfloat16)); BF16 → F32 is exact. Rows of bf16 collectives (ep_device's bf16 wire).
struct CastArgs {
    const void* src = nullptr;  // [n] src_dtype, device
    DType src_dtype = DType::kF32;
    void* dst = nullptr;        // [n] dst_dtype, device; must not overlap src
    DType dst_dtype = DType::kBF16;
    int64_t num_elements = 0;   // n (0 allowed)
};

Status embedding_check(const EmbeddingArgs& args);
Status rms_norm_check(const RmsNormArgs& args);
Status matmul_check(const MatmulArgs& args);
// Each entry's matmul_check, and the entries' x, x_row_stride, num_rows and in_features equal.
Status matmul_group_check(const MatmulGroupArgs& args);
// y's rows (t, b) of N elements must be distinct and not overlap: y_batch_stride ≥ N and y_token_stride ≥
// B · y_batch_stride (or the same with the roles of the two strides exchanged). x's rows may overlap.
Status batched_matmul_check(const BatchedMatmulArgs& args);
Status rope_check(const RopeArgs& args);
Status attention_check(const AttentionArgs& args);
Status kv_cache_store_check(const KvCacheStoreArgs& args);
// Each part's check, and rotary_dim ≤ head_dim, q_norm and k_norm both set or both null.
Status qk_norm_rope_kv_store_check(const QkNormRopeKvStoreArgs& args);
Status argmax_check(const ArgmaxArgs& args);
Status silu_mul_check(const SiluMulArgs& args);
Status add_check(const AddArgs& args);
Status add_sigmoid_gated_check(const AddSigmoidGatedArgs& args);
// kNotSupported for a pair other than F32 → BF16 and BF16 → F32, naming both dtypes.
Status cast_check(const CastArgs& args);

}  // namespace epinfer
