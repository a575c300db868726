#include "parallel/layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace epinfer {

const char* group_kind_name(GroupKind kind) {
    switch (kind) {
        case GroupKind::kStage:
            return "stage";
        case GroupKind::kAttnTp:
            return "attn_tp";
        case GroupKind::kAttnDp:
            return "attn_dp";
        case GroupKind::kMoeTp:
            return "moe_tp";
        case GroupKind::kMoeEp:
            return "moe_ep";
        case GroupKind::kPipeline:
            return "pipeline";
    }
    return "unknown";
}

RankCoords ParallelLayout::coords(int rank) const {
    RankCoords c;
    c.pp_rank = rank / stage_size();
    c.local_rank = rank % stage_size();
    c.attn_tp_rank = c.local_rank % attn_tp;
    c.attn_dp_rank = c.local_rank / attn_tp;
    c.moe_tp_rank = c.local_rank % moe_tp;
    c.moe_ep_rank = c.local_rank / moe_tp;
    return c;
}

SplitKey ParallelLayout::split_key(GroupKind kind, int rank) const {
    const RankCoords c = coords(rank);
    switch (kind) {
        case GroupKind::kStage:
            return {c.pp_rank, c.local_rank};
        case GroupKind::kAttnTp:
            return {c.pp_rank * attn_dp + c.attn_dp_rank, c.attn_tp_rank};
        case GroupKind::kAttnDp:
            return {c.pp_rank * attn_tp + c.attn_tp_rank, c.attn_dp_rank};
        case GroupKind::kMoeTp:
            return {c.pp_rank * moe_ep + c.moe_ep_rank, c.moe_tp_rank};
        case GroupKind::kMoeEp:
            return {c.pp_rank * moe_tp + c.moe_tp_rank, c.moe_ep_rank};
        case GroupKind::kPipeline:
            return {c.local_rank, c.pp_rank};
    }
    return {};
}

int ParallelLayout::group_rank(GroupKind kind, int rank) const {
    return split_key(kind, rank).key;
}

std::vector<int> ParallelLayout::group(GroupKind kind, int rank) const {
    const int color = split_key(kind, rank).color;
    std::vector<int> members;
    for (int r = 0; r < world_size(); ++r) {
        if (split_key(kind, r).color == color) members.push_back(r);
    }
    std::sort(members.begin(), members.end(),
              [&](int a, int b) { return split_key(kind, a).key < split_key(kind, b).key; });
    return members;
}

int ParallelLayout::prev_stage_rank(int rank) const {
    const RankCoords c = coords(rank);
    return c.pp_rank == 0 ? -1 : rank_of(c.pp_rank - 1, c.local_rank);
}

int ParallelLayout::next_stage_rank(int rank) const {
    const RankCoords c = coords(rank);
    return c.pp_rank + 1 == pp ? -1 : rank_of(c.pp_rank + 1, c.local_rank);
}

std::string ParallelLayout::to_string() const {
    return fmt::format("{} ranks = pp {} × {} per stage (attn_tp {} × attn_dp {}, moe_tp {} × moe_ep {})",
                       world_size(), pp, stage_size(), attn_tp, attn_dp, moe_tp, moe_ep);
}

Result<ParallelLayout> layout_from_flags(const LayoutFlags& flags) {
    const std::pair<const char*, int> given[] = {
        {"--tp", flags.tp}, {"--ep", flags.ep}, {"--dp", flags.dp}, {"--pp", flags.pp}};
    for (const auto& [flag, value] : given) {
        if (value < 0) return invalid_argument(fmt::format("{} must be ≥ 1, got {}", flag, value));
    }
    const int ep = std::max(flags.ep, 1);
    const int dp = std::max(flags.dp, 1);
    const int w = flags.tp > 0 ? flags.tp : std::max(ep, dp);
    const std::string w_source =
        flags.tp > 0 ? fmt::format("--tp {}", flags.tp) : "the larger of --ep and --dp; give --tp for more";
    if (w % ep != 0) {
        return invalid_argument(
            fmt::format("--ep {} does not divide the {} ranks per stage ({}): moe_tp × moe_ep "
                        "must equal the ranks per stage",
                        ep, w, w_source));
    }
    if (w % dp != 0) {
        return invalid_argument(
            fmt::format("--dp {} does not divide the {} ranks per stage ({}): attn_tp × attn_dp "
                        "must equal the ranks per stage",
                        dp, w, w_source));
    }
    ParallelLayout layout;
    layout.pp = std::max(flags.pp, 1);
    layout.attn_dp = dp;
    layout.attn_tp = w / dp;
    layout.moe_ep = ep;
    layout.moe_tp = w / ep;
    return layout;
}

Status validate_layout(const ParallelLayout& layout, const LayoutModelDims& dims, int world_size) {
    std::vector<std::string> errors;
    const std::pair<const char*, int> sizes[] = {{"pp", layout.pp},
                                                 {"attn_tp", layout.attn_tp},
                                                 {"attn_dp", layout.attn_dp},
                                                 {"moe_tp", layout.moe_tp},
                                                 {"moe_ep", layout.moe_ep}};
    for (const auto& [name, value] : sizes) {
        if (value < 1) errors.push_back(fmt::format("{} {} must be at least 1", name, value));
    }
    if (!errors.empty()) return invalid_argument(fmt::format("parallel layout: {}", fmt::join(errors, "; ")));

    const int w = layout.stage_size();
    if (layout.moe_tp * layout.moe_ep != w) {
        errors.push_back(fmt::format(
            "moe_tp {} × moe_ep {} = {} differs from attn_tp {} × attn_dp {} = {} ranks per "
            "stage",
            layout.moe_tp, layout.moe_ep, layout.moe_tp * layout.moe_ep, layout.attn_tp, layout.attn_dp, w));
    }
    if (layout.world_size() != world_size) {
        errors.push_back(
            fmt::format("the layout needs pp {} × {} ranks per stage = {} ranks, but the world has {}",
                        layout.pp, w, layout.world_size(), world_size));
    }
    const bool attn_tp_split = dims.num_attention_heads % layout.attn_tp != 0 ||
                               dims.dense_intermediate_size % layout.attn_tp != 0 ||
                               dims.shared_intermediate_size % layout.attn_tp != 0;
    if (dims.num_attention_heads % layout.attn_tp != 0) {
        errors.push_back(fmt::format("num_attention_heads {} is not divisible by attn_tp {}",
                                     dims.num_attention_heads, layout.attn_tp));
    }
    const int64_t kv = dims.num_key_value_heads;
    if (kv > 0 && kv % layout.attn_tp != 0 && layout.attn_tp % kv != 0) {
        errors.push_back(
            fmt::format("num_key_value_heads {} and attn_tp {}: one must divide the other (KV heads are "
                        "split, or replicated on attn_tp / num_key_value_heads ranks)",
                        kv, layout.attn_tp));
    }
    if (layout.moe_ep > 1 && layout.moe_ep > dims.n_routed_experts) {
        errors.push_back(
            fmt::format("ep {} exceeds the {} routed experts", layout.moe_ep, dims.n_routed_experts));
    }
    if (dims.n_routed_experts > 0 && dims.moe_intermediate_size % layout.moe_tp != 0) {
        errors.push_back(fmt::format("moe_intermediate_size {} is not divisible by moe_tp {}",
                                     dims.moe_intermediate_size, layout.moe_tp));
    }
    if (dims.dense_intermediate_size % layout.attn_tp != 0) {
        errors.push_back(fmt::format("dense intermediate_size {} is not divisible by attn_tp {}",
                                     dims.dense_intermediate_size, layout.attn_tp));
    }
    if (dims.shared_intermediate_size % layout.attn_tp != 0) {
        errors.push_back(fmt::format("shared expert intermediate size {} is not divisible by attn_tp {}",
                                     dims.shared_intermediate_size, layout.attn_tp));
    }
    if (layout.pp > dims.num_hidden_layers) {
        errors.push_back(
            fmt::format("pp {} exceeds num_hidden_layers {}", layout.pp, dims.num_hidden_layers));
    }
    if (errors.empty()) return Status::ok();
    // Expert parallelism alone (--ep N, no --dp) leaves attention tensor-parallel over the stage's ranks,
    // which a user asking for EP may not expect.
    if (attn_tp_split && layout.moe_ep > 1 && layout.attn_dp == 1) {
        errors.push_back(
            fmt::format("with --ep and no --dp, attention and dense MLPs are split over the {} ranks "
                        "per stage (attn_tp); --dp {} runs them data-parallel instead",
                        w, w));
    }
    return invalid_argument(
        fmt::format("parallel layout {}: {}", layout.to_string(), fmt::join(errors, "; ")));
}

}  // namespace epinfer
