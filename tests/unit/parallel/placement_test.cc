// Expert placement, pipeline stages and TP sharding, against hand-computed tables.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "parallel/expert_placement.h"
#include "parallel/pipeline_stages.h"
#include "parallel/sharding.h"

namespace epinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SplitEvenly, FirstPartsTakeTheRemainder) {
    EXPECT_EQ(split_evenly(16, 3, 0), (ShardRange{0, 6}));
    EXPECT_EQ(split_evenly(16, 3, 1), (ShardRange{6, 5}));
    EXPECT_EQ(split_evenly(16, 3, 2), (ShardRange{11, 5}));
    EXPECT_EQ(split_evenly(8, 4, 3), (ShardRange{6, 2}));
    EXPECT_EQ(split_evenly(2, 3, 2), (ShardRange{2, 0}));
    EXPECT_EQ(split_evenly(0, 2, 1), (ShardRange{0, 0}));
}

TEST(ExpertPlacement, Ep3Over16ExpertsIs6_5_5) {
    Result<ExpertPlacement> p = ExpertPlacement::contiguous(16, 3);
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_EQ(p->num_experts(), 16);
    EXPECT_EQ(p->ep_size(), 3);
    EXPECT_THAT(p->local_experts(0), ElementsAre(0, 1, 2, 3, 4, 5));
    EXPECT_THAT(p->local_experts(1), ElementsAre(6, 7, 8, 9, 10));
    EXPECT_THAT(p->local_experts(2), ElementsAre(11, 12, 13, 14, 15));
    EXPECT_EQ(p->max_local_slots(), 6);
    const ExpertReplica expected[16] = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {1, 0}, {1, 1},
                                        {1, 2}, {1, 3}, {1, 4}, {2, 0}, {2, 1}, {2, 2}, {2, 3}, {2, 4}};
    for (int e = 0; e < 16; ++e) {
        ASSERT_EQ(p->replicas(e).size(), 1u);
        EXPECT_EQ(p->primary(e), expected[e]) << "expert " << e;
    }
}

TEST(ExpertPlacement, OtherShapes) {
    Result<ExpertPlacement> p = ExpertPlacement::contiguous(8, 4);
    ASSERT_TRUE(p.is_ok());
    EXPECT_THAT(p->local_experts(3), ElementsAre(6, 7));
    EXPECT_EQ(p->primary(5), (ExpertReplica{2, 1}));
    p = ExpertPlacement::contiguous(10, 4);  // 3, 3, 2, 2
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->num_local_slots(0), 3);
    EXPECT_EQ(p->num_local_slots(1), 3);
    EXPECT_EQ(p->num_local_slots(2), 2);
    EXPECT_EQ(p->primary(6), (ExpertReplica{2, 0}));
    EXPECT_EQ(p->primary(9), (ExpertReplica{3, 1}));
    p = ExpertPlacement::contiguous(4, 4);  // one each
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->max_local_slots(), 1);
    p = ExpertPlacement::contiguous(4, 1);
    ASSERT_TRUE(p.is_ok());
    EXPECT_THAT(p->local_experts(0), ElementsAre(0, 1, 2, 3));
}

TEST(ExpertPlacement, Errors) {
    Result<ExpertPlacement> p = ExpertPlacement::contiguous(4, 5);
    ASSERT_FALSE(p.is_ok());
    EXPECT_THAT(p.status().message(), HasSubstr("ep 5 exceeds the 4 routed experts"));
    p = ExpertPlacement::contiguous(4, 0);
    ASSERT_FALSE(p.is_ok());
    EXPECT_THAT(p.status().message(), HasSubstr("ep 0 must be at least 1"));
    p = ExpertPlacement::contiguous(0, 1);
    ASSERT_FALSE(p.is_ok());
    EXPECT_THAT(p.status().message(), HasSubstr("0 routed experts"));
}

TEST(PipelineStages, EvenAndUneven) {
    Result<std::vector<PipelineStage>> s = pipeline_stages(4, 2);
    ASSERT_TRUE(s.is_ok());
    EXPECT_THAT(*s,
                ElementsAre(PipelineStage{0, {0, 2}, true, false}, PipelineStage{1, {2, 2}, false, true}));
    s = pipeline_stages(7, 3);  // 3, 2, 2
    ASSERT_TRUE(s.is_ok());
    EXPECT_THAT(*s, ElementsAre(PipelineStage{0, {0, 3}, true, false}, PipelineStage{1, {3, 2}, false, false},
                                PipelineStage{2, {5, 2}, false, true}));
    s = pipeline_stages(2, 1);
    ASSERT_TRUE(s.is_ok());
    EXPECT_THAT(*s, ElementsAre(PipelineStage{0, {0, 2}, true, true}));
    s = pipeline_stages(2, 3);
    ASSERT_FALSE(s.is_ok());
    EXPECT_THAT(s.status().message(), HasSubstr("pp 3 exceeds num_hidden_layers 2"));
    s = pipeline_stages(2, 0);
    ASSERT_FALSE(s.is_ok());
    EXPECT_THAT(s.status().message(), HasSubstr("pp 0 must be at least 1"));
}

TEST(TpSlice, ColumnRowAndReplicated) {
    const std::vector<int64_t> gate = {32, 64};  // gate_proj [I, H]
    Result<TensorSlice> s = tp_slice("gate_proj", gate, TpSplit::kColumn, 2, 1);
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(*s, (TensorSlice{0, {16, 16}}));
    const std::vector<int64_t> down = {64, 32};  // down_proj [H, I]
    s = tp_slice("down_proj", down, TpSplit::kRow, 4, 3);
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(*s, (TensorSlice{1, {24, 8}}));
    const std::vector<int64_t> bias = {48};
    s = tp_slice("q_proj.bias", bias, TpSplit::kColumn, 3, 2);
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(*s, (TensorSlice{0, {32, 16}}));
    s = tp_slice("norm", bias, TpSplit::kReplicated, 3, 2);
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(*s, TensorSlice{});
}

TEST(TpSlice, Errors) {
    const std::vector<int64_t> gate = {32, 64};
    Result<TensorSlice> s =
        tp_slice("model.layers.0.mlp.experts.0.gate_proj.weight", gate, TpSplit::kColumn, 3, 0);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.status().message(),
              "tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' [32, 64]: dimension 0 of size 32 does "
              "not split "
              "into 3 equal TP shards");
    const std::vector<int64_t> bias = {48};
    s = tp_slice("o_proj.bias", bias, TpSplit::kRow, 2, 0);
    ASSERT_FALSE(s.is_ok());
    EXPECT_THAT(s.status().message(), HasSubstr("a row split needs 2 or more dimensions"));
    s = tp_slice("x", gate, TpSplit::kColumn, 2, 2);
    ASSERT_FALSE(s.is_ok());
    EXPECT_THAT(s.status().message(), HasSubstr("tp rank 2 is outside a TP group of 2"));
}

TEST(CopyTensorSlice, ExtractsTheBox) {
    // [3, 4] = 0..11; row split of 2 shards, shard 1: columns 2..3.
    std::vector<int32_t> full(12);
    for (int i = 0; i < 12; ++i) full[static_cast<size_t>(i)] = i;
    const std::vector<int64_t> shape = {3, 4};
    std::vector<int32_t> out(6, -1);
    copy_tensor_slice(full.data(), shape, 4, TensorSlice{1, {2, 2}}, out.data());
    EXPECT_THAT(out, ElementsAre(2, 3, 6, 7, 10, 11));
    out.assign(4, -1);
    copy_tensor_slice(full.data(), shape, 4, TensorSlice{0, {1, 1}}, out.data());
    EXPECT_THAT(out, ElementsAre(4, 5, 6, 7));
    // [2, 3, 2]: middle dim, range [1, 3).
    const std::vector<int64_t> shape3 = {2, 3, 2};
    out.assign(8, -1);
    copy_tensor_slice(full.data(), shape3, 4, TensorSlice{1, {1, 2}}, out.data());
    EXPECT_THAT(out, ElementsAre(2, 3, 4, 5, 8, 9, 10, 11));
    out.assign(12, -1);
    copy_tensor_slice(full.data(), shape, 4, TensorSlice{}, out.data());
    EXPECT_EQ(out, full);
}

TEST(KvHeads, SplitOrReplicate) {
    Result<ShardRange> r = kv_heads_of_tp_rank(8, 4, 3);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(*r, (ShardRange{6, 2}));
    r = kv_heads_of_tp_rank(4, 8, 5);  // each head on 2 ranks: rank 5 holds head 2
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(*r, (ShardRange{2, 1}));
    r = kv_heads_of_tp_rank(1, 4, 3);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(*r, (ShardRange{0, 1}));
    r = kv_heads_of_tp_rank(6, 4, 0);
    ASSERT_FALSE(r.is_ok());
    EXPECT_THAT(r.status().message(), HasSubstr("num_key_value_heads 6 and attention TP 4"));
}

}  // namespace
}  // namespace epinfer
