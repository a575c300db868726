// layout_model_dims: the sizes of a ModelConfig that validate_layout checks, on two fixture configs.
#include <gtest/gtest.h>

#include <string>

#include "checkpoint/hf_config.h"
#include "models/model.h"

namespace epinfer {
namespace {

ModelConfig fixture_config(const std::string& name) {
    auto config = load_hf_config(std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + name);
    EXPECT_TRUE(config.is_ok()) << config.status().to_string();
    return config.is_ok() ? *config : ModelConfig{};
}

TEST(LayoutModelDims, DeepseekV3MlaWithDenseFirstLayerAndSharedExpert) {
    const LayoutModelDims d = layout_model_dims(fixture_config("deepseek_v3_tiny"));
    EXPECT_EQ(d.num_hidden_layers, 3);
    EXPECT_EQ(d.num_attention_heads, 4);
    EXPECT_EQ(d.num_key_value_heads, 0);  // MLA: no separate KV heads
    EXPECT_EQ(d.n_routed_experts, 16);
    EXPECT_EQ(d.moe_intermediate_size, 32);
    EXPECT_EQ(d.dense_intermediate_size, 96);   // first_k_dense_replace 1
    EXPECT_EQ(d.shared_intermediate_size, 32);  // n_shared_experts 1 × moe_intermediate_size 32
}

TEST(LayoutModelDims, Qwen2MoeGqaAllMoeWithGatedSharedExpert) {
    const LayoutModelDims d = layout_model_dims(fixture_config("qwen2_moe_tiny"));
    EXPECT_EQ(d.num_attention_heads, 4);
    EXPECT_EQ(d.num_key_value_heads, 2);
    EXPECT_EQ(d.n_routed_experts, 12);
    EXPECT_EQ(d.dense_intermediate_size, 0);  // every layer is MoE
    EXPECT_EQ(d.shared_intermediate_size, 48);
}

TEST(LayoutModelDims, RejectsTp3OnFourHeadsWithTheNumbers) {
    const LayoutModelDims d = layout_model_dims(fixture_config("qwen2_moe_tiny"));
    auto layout = layout_from_flags({3, 0, 0, 0});
    ASSERT_TRUE(layout.is_ok());
    const Status st = validate_layout(*layout, d, 3);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("num_attention_heads 4 is not divisible by attn_tp 3"), std::string::npos)
        << st.message();
}

}  // namespace
}  // namespace epinfer
