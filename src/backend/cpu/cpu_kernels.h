// CPU reference kernels behind CpuBackend (arguments already validated by <op>_check).
#pragma once

#include "backend/cpu/thread_pool.h"
#include "backend/op_args.h"

namespace epinfer {

// Returns kInvalidArgument naming the first token id outside [0, V).
Status cpu_embedding(const EmbeddingArgs& args, ThreadPool& pool);
void cpu_rms_norm(const RmsNormArgs& args, ThreadPool& pool);
void cpu_matmul(const MatmulArgs& args, ThreadPool& pool);
// Each y[t, b, n] is dot_f32 of x's row with W_b's n-th row (kNK) or column (kKN): the order of cpu_matmul.
void cpu_batched_matmul(const BatchedMatmulArgs& args, ThreadPool& pool);
void cpu_rope(const RopeArgs& args, ThreadPool& pool);
// Returns kInvalidArgument when a position is negative or ≥ S.
Status cpu_attention(const AttentionArgs& args, ThreadPool& pool);
Status cpu_kv_cache_store(const KvCacheStoreArgs& args);
void cpu_silu_mul(const SiluMulArgs& args);
void cpu_add(const AddArgs& args);
void cpu_add_sigmoid_gated(const AddSigmoidGatedArgs& args);
void cpu_cast(const CastArgs& args);

}  // namespace epinfer
