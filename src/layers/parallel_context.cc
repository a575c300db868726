#include "layers/parallel_context.h"

#include <string>

namespace epinfer {

namespace {

Result<std::unique_ptr<Communicator>> split_group(Communicator& world, const ParallelLayout& layout,
                                                  GroupKind kind) {
    const SplitKey key = layout.split_key(kind, world.rank());
    return world.split(key.color, key.key, group_kind_name(kind));
}

}  // namespace

Result<std::unique_ptr<ParallelContext>> create_parallel_context(Communicator& world,
                                                                 const ParallelLayout& layout,
                                                                 const LayoutModelDims& dims,
                                                                 Communicator* device_world) {
    EPI_RETURN_IF_ERROR(validate_layout(layout, dims, world.size()));
    Communicator& data = device_world != nullptr ? *device_world : world;
    if (data.size() != world.size() || data.rank() != world.rank()) {
        return invalid_argument("parallel context: the device world (rank " + std::to_string(data.rank()) + " of " +
                                std::to_string(data.size()) + ") is not the world (rank " +
                                std::to_string(world.rank()) + " of " + std::to_string(world.size()) + ")");
    }
    auto ctx = std::make_unique<ParallelContext>();
    ctx->layout = layout;
    ctx->coords = layout.coords(world.rank());
    ctx->world = &world;
    ctx->device_world = device_world;
    EPI_ASSIGN_OR_RETURN(ctx->stage, split_group(data, layout, GroupKind::kStage));
    EPI_ASSIGN_OR_RETURN(ctx->attn_tp, split_group(data, layout, GroupKind::kAttnTp));
    EPI_ASSIGN_OR_RETURN(ctx->moe_tp, split_group(data, layout, GroupKind::kMoeTp));
    EPI_ASSIGN_OR_RETURN(ctx->moe_ep, split_group(data, layout, GroupKind::kMoeEp));
    EPI_ASSIGN_OR_RETURN(ctx->pipeline, split_group(data, layout, GroupKind::kPipeline));
    EPI_ASSIGN_OR_RETURN(ctx->host_pipeline, split_group(world, layout, GroupKind::kPipeline));
    EPI_ASSIGN_OR_RETURN(ctx->host_moe_ep, split_group(world, layout, GroupKind::kMoeEp));
    if (dims.n_routed_experts > 0) {
        EPI_ASSIGN_OR_RETURN(ctx->placement,
                             ExpertPlacement::contiguous(dims.n_routed_experts, layout.moe_ep));
    }
    EPI_ASSIGN_OR_RETURN(const std::vector<PipelineStage> stages,
                         pipeline_stages(dims.num_hidden_layers, layout.pp));
    ctx->pipeline_stage = stages[static_cast<size_t>(ctx->coords.pp_rank)];
    return ctx;
}

Status all_reduce_sum_f32(Communicator* comm, float* buf, int64_t count) {
    if (comm == nullptr || comm->size() == 1 || count == 0) return Status::ok();
    return comm->all_reduce(buf, buf, count, DType::kF32, ReduceOp::kSum);
}

}  // namespace epinfer
