// ParallelContext: what one rank needs to run its part of the model under a ParallelLayout
// (parallel/layout.h, ARCHITECTURE.md §5): its coordinates, the communicators of its groups, the expert
// placement and its pipeline stage. Made once per run, after validate_layout and before any weight is read.
//
// The layers use it as follows (all-reduces are fp32 sums over the named group):
//   attention      heads split across attn_tp; all-reduce over attn_tp after o_proj
//   dense MLP      I split across attn_tp; all-reduce over attn_tp
//   MoE, attn_dp 1 tokens replicated in the stage: every rank routes all tokens, runs its local experts
//                  (moe_ep block, I split across moe_tp) and its shared-expert slice; all-reduce over the
//                  stage
//   MoE, attn_dp>1 each attention-DP group owns its tokens: ep_dispatch over moe_ep → local grouped FFN →
//                  all-reduce over moe_tp → ep_combine; + shared-expert slice; all-reduce over attn_tp
//                  (when moe_tp does not divide attn_tp: gather the stage's tokens, as with attn_dp 1)
//   PP             stage s runs layers stage.layers; [T, H] activations go to the next stage by send/recv;
//                  the last stage broadcasts the step's logits or token ids over host_pipeline
// The groups that carry activations (stage, attn_tp, moe_tp, moe_ep, pipeline) work on the backend's memory:
// split from the MPI world for CPU ranks, from an NCCL world over the same ranks for GPU ranks (one GPU per
// rank, on the backend's stream). host_pipeline and host_moe_ep are always MPI groups (host memory): the
// pipeline's host outputs and DP attention's dispatch bookkeeping (layers/moe/moe_dp_device.h).
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "core/status.h"
#include "parallel/expert_placement.h"
#include "parallel/layout.h"
#include "parallel/pipeline_stages.h"

namespace epinfer {

struct ParallelContext {
    ParallelLayout layout;
    RankCoords coords;
    Communicator* world = nullptr;           // not owned
    Communicator* device_world = nullptr;    // not owned; the NCCL world the groups below come from (GPUs)
    std::unique_ptr<Communicator> stage;     // the W ranks of this pipeline stage
    std::unique_ptr<Communicator> attn_tp;   // split attention heads, dense MLP, shared experts
    std::unique_ptr<Communicator> moe_tp;    // split each routed expert's I
    std::unique_ptr<Communicator> moe_ep;    // split the routed experts
    std::unique_ptr<Communicator> pipeline;  // one rank per stage, same local rank
    std::unique_ptr<Communicator> host_pipeline;  // the pipeline group over host memory (world's backend)
    std::unique_ptr<Communicator> host_moe_ep;    // the moe_ep group over host memory (dispatch bookkeeping)
    ExpertPlacement placement;               // over moe_ep (empty when the model has no routed experts)
    PipelineStage pipeline_stage;            // this rank's layers

    bool dp_attention() const { return layout.attn_dp > 1; }
};

// Checks `layout` against `dims` and world.size() (validate_layout), then splits `world` into the groups
// of the layout (collective: every rank of `world` must call it with the same layout and dims).
// device_world: the world over device memory (NCCL, same ranks in the same order) the activation groups
// are split from; null: `world` serves for both (CPU ranks).
// Errors: kInvalidArgument with the numbers (validate_layout) or when device_world's size differs;
// errors of Communicator::split.
Result<std::unique_ptr<ParallelContext>> create_parallel_context(Communicator& world,
                                                                 const ParallelLayout& layout,
                                                                 const LayoutModelDims& dims,
                                                                 Communicator* device_world = nullptr);

// In-place fp32 sum over `comm`; a no-op for a null or one-rank communicator or count 0.
// buf: [count] fp32 in the communicator's memory (host for MPI, device for NCCL).
Status all_reduce_sum_f32(Communicator* comm, float* buf, int64_t count);

}  // namespace epinfer
