// The groups of every layout that fits the world, formed with Communicator::split(layout.split_key(...)),
// hold exactly the ranks ParallelLayout::group() lists, in the same order.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "mpi_test_world.h"
#include "parallel/layout.h"

namespace epinfer::mpi_test {
namespace {

// Every layout from --tp/--ep/--dp/--pp flags (values 1..4) whose world size is `ranks`.
std::vector<ParallelLayout> layouts_of_size(int ranks) {
    std::vector<ParallelLayout> out;
    for (int tp = 1; tp <= ranks; ++tp) {
        for (int ep = 1; ep <= tp; ++ep) {
            for (int dp = 1; dp <= tp; ++dp) {
                for (int pp = 1; pp <= ranks; ++pp) {
                    Result<ParallelLayout> l = layout_from_flags({.tp = tp, .ep = ep, .dp = dp, .pp = pp});
                    if (l.is_ok() && l->world_size() == ranks &&
                        std::find(out.begin(), out.end(), *l) == out.end()) {
                        out.push_back(*l);
                    }
                }
            }
        }
    }
    return out;
}

TEST(LayoutGroups, SplitMatchesTheLayoutTables) {
    Communicator& w = world();
    const std::vector<ParallelLayout> layouts = layouts_of_size(w.size());
    ASSERT_FALSE(layouts.empty());
    for (const ParallelLayout& layout : layouts) {
        for (GroupKind kind : {GroupKind::kStage, GroupKind::kAttnTp, GroupKind::kAttnDp, GroupKind::kMoeTp,
                               GroupKind::kMoeEp, GroupKind::kPipeline}) {
            const SplitKey key = layout.split_key(kind, w.rank());
            Result<std::unique_ptr<Communicator>> g = w.split(key.color, key.key, group_kind_name(kind));
            ASSERT_TRUE(g.is_ok()) << g.status().message();
            const std::vector<int> expected = layout.group(kind, w.rank());
            ASSERT_EQ((*g)->size(), static_cast<int>(expected.size())) << layout.to_string();
            EXPECT_EQ((*g)->rank(), layout.group_rank(kind, w.rank()));
            std::vector<int32_t> members(expected.size(), -1);
            const int32_t mine = w.rank();
            ASSERT_TRUE((*g)->all_gather(&mine, members.data(), 1, DType::kI32).is_ok());
            EXPECT_EQ(std::vector<int>(members.begin(), members.end()), expected)
                << layout.to_string() << " " << group_kind_name(kind);
        }
    }
}

}  // namespace
}  // namespace epinfer::mpi_test
