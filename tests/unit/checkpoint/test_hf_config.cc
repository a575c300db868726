// config.json → ModelConfig over every real config in tests/data/configs and every fixture.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"

namespace epinfer {
namespace {

const std::string kData = EPINFER_TEST_DATA_DIR;

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

ModelConfig parse_ok(const std::string& path) {
    Result<ModelConfig> r = parse_hf_config(read_file(path), path);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? *r : ModelConfig{};
}

ModelConfig real(const std::string& name) {
    return parse_ok(kData + "/configs/" + name + ".json");
}

ModelConfig fixture(const std::string& name) {
    Result<ModelConfig> r = load_hf_config(kData + "/fixtures/" + name);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? *r : ModelConfig{};
}

std::vector<bool> dense_first(int64_t num_dense, int64_t num_layers) {
    std::vector<bool> out(num_layers, true);
    for (int64_t l = 0; l < num_dense; ++l) out[l] = false;
    return out;
}

TEST(HfConfig, EveryRealConfigParses) {
    int parsed = 0;
    for (const auto& entry : std::filesystem::directory_iterator(kData + "/configs")) {
        const std::string path = entry.path().string();
        Result<ModelConfig> r = parse_hf_config(read_file(path), path);
        EXPECT_TRUE(r.is_ok()) << path << ": " << r.status().message();
        if (r.is_ok()) {
            EXPECT_EQ(static_cast<int64_t>(r->layer_is_moe.size()), r->num_hidden_layers) << path;
        }
        ++parsed;
    }
    EXPECT_EQ(parsed, 10);
}

// gpt-oss-120b as GptOssConfig/GptOssAttention/GptOssTopKRouter read it (transformers 5.17): every layer
// MoE (128 experts 2880 wide, top-4, softmax over the 4 picked logits = renormalised), sliding-window
// layers of 128 positions alternating with full ones (sliding first), sinks and biases, mxfp4 experts.
TEST(HfConfig, GptOss120b) {
    const ModelConfig c = real("gpt_oss_120b");
    EXPECT_EQ(c.architecture, Architecture::kGptOss);
    EXPECT_STREQ(architecture_name(c.architecture), "GptOssForCausalLM");
    EXPECT_EQ(c.model_type, "gpt_oss");
    EXPECT_EQ(c.attention, AttentionKind::kGqa);
    EXPECT_EQ(c.num_attention_heads, 64);
    EXPECT_EQ(c.num_key_value_heads, 8);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_TRUE(c.attention_bias);
    EXPECT_TRUE(c.attention_out_bias);
    EXPECT_TRUE(c.attention_sinks);
    EXPECT_EQ(c.qk_norm, QkNormKind::kNone);
    EXPECT_EQ(c.sliding_window, 128);
    ASSERT_EQ(c.layer_is_sliding.size(), 36u);
    for (size_t l = 0; l < 36; ++l) EXPECT_EQ(c.layer_is_sliding[l], l % 2 == 0) << l;
    EXPECT_EQ(c.n_routed_experts, 128);
    EXPECT_EQ(c.moe_intermediate_size, 2880);
    EXPECT_EQ(c.num_moe_layers(), 36);
    EXPECT_EQ(c.n_shared_experts, 0);
    EXPECT_EQ(c.router.num_experts_per_tok, 4);
    EXPECT_EQ(c.router.scoring_func, ScoringFunc::kSoftmax);
    EXPECT_EQ(c.router.topk_method, TopkMethod::kGreedy);
    EXPECT_TRUE(c.router.norm_topk_prob);
    EXPECT_TRUE(c.router_bias);
    EXPECT_TRUE(c.expert_bias);
    EXPECT_DOUBLE_EQ(c.swiglu_limit, 7.0);
    EXPECT_DOUBLE_EQ(c.swiglu_alpha, 1.702);
    EXPECT_EQ(c.quant_method, "mxfp4");
    EXPECT_EQ(c.rope.type, RopeType::kYarn);
    EXPECT_DOUBLE_EQ(c.rope.theta, 150000.0);
    EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
    EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
    EXPECT_EQ(c.rope.rotary_dim, 64);
    EXPECT_EQ(c.max_position_embeddings, 131072);
    EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(HfConfig, EveryFixtureLoads) {
    int loaded = 0;
    for (const auto& entry : std::filesystem::directory_iterator(kData + "/fixtures")) {
        if (!std::filesystem::exists(entry.path() / "config.json")) continue;
        Result<ModelConfig> r = load_hf_config(entry.path().string());
        EXPECT_TRUE(r.is_ok()) << entry.path() << ": " << r.status().message();
        ++loaded;
    }
    EXPECT_EQ(loaded, 14);
}

TEST(HfConfig, KimiK2) {
    const ModelConfig c = real("kimi_k2_instruct_0905");
    EXPECT_EQ(c.architecture, Architecture::kDeepseekV3);
    EXPECT_EQ(c.model_type, "kimi_k2");
    EXPECT_EQ(c.attention, AttentionKind::kMla);
    EXPECT_EQ(c.n_routed_experts, 384);
    EXPECT_EQ(c.router.num_experts_per_tok, 8);
    EXPECT_EQ(c.router.n_group, 1);
    EXPECT_EQ(c.router.topk_group, 1);
    EXPECT_EQ(c.router.scoring_func, ScoringFunc::kSigmoid);
    EXPECT_EQ(c.router.topk_method, TopkMethod::kNoauxTc);
    EXPECT_TRUE(c.router.has_correction_bias);
    EXPECT_TRUE(c.router.norm_topk_prob);
    EXPECT_DOUBLE_EQ(c.router.routed_scaling_factor, 2.827);
    EXPECT_EQ(c.n_shared_experts, 1);
    EXPECT_EQ(c.num_attention_heads, 64);
    EXPECT_EQ(c.q_lora_rank, 1536);
    EXPECT_EQ(c.kv_lora_rank, 512);
    EXPECT_EQ(c.head_dim, 192);
    EXPECT_EQ(c.layer_is_moe, dense_first(1, 61));
    EXPECT_EQ(c.num_moe_layers(), 60);
    EXPECT_EQ(c.rope.type, RopeType::kYarn);
    EXPECT_DOUBLE_EQ(c.rope.factor, 64.0);
    EXPECT_DOUBLE_EQ(c.rope.theta, 50000.0);
    EXPECT_DOUBLE_EQ(c.rope.beta_fast, 1.0);
    EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
    EXPECT_DOUBLE_EQ(c.rope.mscale, 1.0);
    EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1.0);
    EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
    EXPECT_EQ(c.rope.rotary_dim, 64);
    EXPECT_TRUE(c.rope.interleaved);
    EXPECT_EQ(c.quant_method, "fp8");
    EXPECT_EQ(c.num_nextn_predict_layers, 0);
    EXPECT_EQ(c.kv_cache_elems_per_token_per_layer(), 576);
}

TEST(HfConfig, DeepseekV3) {
    const ModelConfig c = real("deepseek_v3");
    EXPECT_EQ(c.architecture, Architecture::kDeepseekV3);
    EXPECT_EQ(c.layer_is_moe, dense_first(3, 61));
    EXPECT_EQ(c.num_moe_layers(), 58);
    EXPECT_EQ(c.n_routed_experts, 256);
    EXPECT_EQ(c.router.n_group, 8);
    EXPECT_EQ(c.router.topk_group, 4);
    EXPECT_DOUBLE_EQ(c.router.routed_scaling_factor, 2.5);
    EXPECT_EQ(c.intermediate_size, 18432);
    EXPECT_EQ(c.moe_intermediate_size, 2048);
    EXPECT_EQ(c.num_nextn_predict_layers, 1);
    EXPECT_EQ(c.rope.type, RopeType::kYarn);
    EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
    EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
    EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
    EXPECT_TRUE(c.rope.truncate);
    EXPECT_DOUBLE_EQ(c.rope.attention_factor, 0.0);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_FALSE(c.attention_bias);
    EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(HfConfig, DeepseekV2Lite) {
    const ModelConfig c = real("deepseek_v2_lite");
    EXPECT_EQ(c.architecture, Architecture::kDeepseekV2);
    EXPECT_EQ(c.q_lora_rank, 0);  // null: q_proj, no compression
    EXPECT_EQ(c.router.scoring_func, ScoringFunc::kSoftmax);
    EXPECT_EQ(c.router.topk_method, TopkMethod::kGreedy);
    EXPECT_FALSE(c.router.norm_topk_prob);
    EXPECT_FALSE(c.router.has_correction_bias);
    EXPECT_EQ(c.n_shared_experts, 2);
    EXPECT_EQ(c.router.num_experts_per_tok, 6);
    EXPECT_EQ(c.layer_is_moe, dense_first(1, 27));
    EXPECT_TRUE(c.rope.interleaved);
    EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 0.707);
}

TEST(HfConfig, Glm45) {
    const ModelConfig c = real("glm_4_5");
    EXPECT_EQ(c.architecture, Architecture::kGlm4Moe);
    EXPECT_EQ(c.attention, AttentionKind::kGqa);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.rope.rotary_dim, 64);  // partial_rotary_factor 0.5
    EXPECT_FALSE(c.rope.interleaved);
    EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
    EXPECT_TRUE(c.attention_bias);
    EXPECT_FALSE(c.attention_out_bias);
    EXPECT_EQ(c.qk_norm, QkNormKind::kPerHead);
    EXPECT_EQ(c.layer_is_moe, dense_first(3, 92));
    EXPECT_EQ(c.n_routed_experts, 160);
    EXPECT_EQ(c.router.scoring_func, ScoringFunc::kSigmoid);
    EXPECT_EQ(c.router.topk_method, TopkMethod::kNoauxTc);
    EXPECT_DOUBLE_EQ(c.router.routed_scaling_factor, 2.5);
    EXPECT_EQ(c.num_nextn_predict_layers, 1);
    EXPECT_EQ(c.kv_cache_elems_per_token_per_layer(), 2 * 8 * 128);

    const ModelConfig air = real("glm_4_5_air");
    EXPECT_EQ(air.qk_norm, QkNormKind::kNone);
    EXPECT_EQ(air.layer_is_moe, dense_first(1, 46));
    EXPECT_DOUBLE_EQ(air.router.routed_scaling_factor, 1.0);
}

TEST(HfConfig, Qwen3MoeAndMixtralAndOlmoe) {
    const ModelConfig q = real("qwen3_30b_a3b");
    EXPECT_EQ(q.architecture, Architecture::kQwen3Moe);
    EXPECT_EQ(q.n_routed_experts, 128);
    EXPECT_EQ(q.router.num_experts_per_tok, 8);
    EXPECT_EQ(q.head_dim, 128);  // not hidden / heads = 64
    EXPECT_EQ(q.num_key_value_heads, 4);
    EXPECT_EQ(q.rope.rotary_dim, 128);
    EXPECT_EQ(q.qk_norm, QkNormKind::kPerHead);
    EXPECT_TRUE(q.router.norm_topk_prob);
    EXPECT_EQ(q.router.scoring_func, ScoringFunc::kSoftmax);
    EXPECT_EQ(q.num_moe_layers(), 48);
    EXPECT_EQ(q.rope.type, RopeType::kDefault);  // rope_scaling null
    EXPECT_DOUBLE_EQ(q.rope.theta, 1e6);

    const ModelConfig m = real("mixtral_8x7b");
    EXPECT_EQ(m.n_routed_experts, 8);
    EXPECT_EQ(m.router.num_experts_per_tok, 2);
    EXPECT_EQ(m.moe_intermediate_size, 14336);
    EXPECT_TRUE(m.router.norm_topk_prob);
    EXPECT_EQ(m.head_dim, 128);
    EXPECT_EQ(m.num_key_value_heads, 8);
    EXPECT_DOUBLE_EQ(m.rms_norm_eps, 1e-5);
    EXPECT_EQ(m.num_moe_layers(), 32);

    const ModelConfig o = real("olmoe_1b_7b");
    EXPECT_EQ(o.qk_norm, QkNormKind::kFullProjection);
    EXPECT_FALSE(o.router.norm_topk_prob);
    EXPECT_EQ(o.n_routed_experts, 64);
    EXPECT_EQ(o.moe_intermediate_size, 1024);
    EXPECT_FALSE(o.attention_bias);
}

TEST(HfConfig, Fixtures) {
    const ModelConfig v3 = fixture("deepseek_v3_tiny");
    EXPECT_EQ(v3.router.n_group, 4);
    EXPECT_EQ(v3.router.topk_group, 2);
    EXPECT_EQ(v3.q_lora_rank, 48);
    EXPECT_EQ(v3.rope.type, RopeType::kDefault);
    EXPECT_EQ(v3.rope.rotary_dim, 8);
    EXPECT_TRUE(v3.rope.interleaved);
    EXPECT_EQ(v3.eos_token_ids, std::vector<int64_t>{1});
    EXPECT_EQ(v3.layer_is_moe, dense_first(1, 3));

    const ModelConfig k2 = fixture("kimi_k2_tiny_yarn");  // transformers 5 rope_parameters
    EXPECT_EQ(k2.rope.type, RopeType::kYarn);
    EXPECT_DOUBLE_EQ(k2.rope.factor, 32.0);
    EXPECT_EQ(k2.rope.original_max_position_embeddings, 64);
    EXPECT_DOUBLE_EQ(k2.rope.theta, 50000.0);
    EXPECT_DOUBLE_EQ(k2.rope.beta_fast, 1.0);
    EXPECT_DOUBLE_EQ(k2.rope.mscale_all_dim, 1.0);
    EXPECT_EQ(k2.n_routed_experts, 24);
    EXPECT_EQ(k2.router.num_experts_per_tok, 6);

    const ModelConfig v2 = fixture("deepseek_v2_tiny");
    EXPECT_EQ(v2.architecture, Architecture::kDeepseekV2);
    EXPECT_EQ(v2.n_routed_experts, 12);
    EXPECT_DOUBLE_EQ(v2.router.routed_scaling_factor, 1.5);
    EXPECT_EQ(v2.router.topk_method, TopkMethod::kGreedy);
    EXPECT_EQ(v2.eos_token_ids, std::vector<int64_t>{2});

    const ModelConfig lite = fixture("deepseek_v2_lite_tiny");
    EXPECT_EQ(lite.architecture, Architecture::kDeepseekV3);
    EXPECT_EQ(lite.q_lora_rank, 0);
    EXPECT_EQ(lite.n_shared_experts, 2);

    const ModelConfig glm = fixture("glm4_moe_qknorm_tiny");
    EXPECT_EQ(glm.qk_norm, QkNormKind::kPerHead);
    EXPECT_EQ(glm.router.n_group, 4);
    EXPECT_EQ(glm.router.topk_group, 2);
    EXPECT_EQ(glm.rope.rotary_dim, 8);  // head_dim 16 × 0.5
    EXPECT_TRUE(glm.eos_token_ids.empty());

    const ModelConfig sparse = fixture("qwen3_moe_sparse_step_tiny");
    EXPECT_EQ(sparse.layer_is_moe, (std::vector<bool>{false, true, true}));  // mlp_only_layers [0]
    EXPECT_TRUE(sparse.tie_word_embeddings);
    EXPECT_EQ(sparse.num_key_value_heads, 1);
    EXPECT_EQ(sparse.n_routed_experts, 12);  // spelled num_local_experts
    EXPECT_EQ(sparse.intermediate_size, 96);

    const ModelConfig qwen2 = fixture("qwen2_moe_tiny");
    EXPECT_EQ(qwen2.shared_expert_intermediate_size, 48);
    EXPECT_TRUE(qwen2.attention_bias);  // qkv_bias
    EXPECT_FALSE(qwen2.attention_out_bias);
    EXPECT_EQ(qwen2.qk_norm, QkNormKind::kNone);

    const ModelConfig olmoe = fixture("olmoe_tiny");
    EXPECT_EQ(olmoe.eos_token_ids, std::vector<int64_t>{50279});  // in both files, kept once

    const ModelConfig mixtral = fixture("mixtral_tiny");
    EXPECT_DOUBLE_EQ(mixtral.rope.theta, 1e6);
    EXPECT_EQ(mixtral.head_dim, 16);
    EXPECT_EQ(mixtral.moe_intermediate_size, 48);
}

// --- Synthetic configs: defaults, spellings, errors ---------------------------------------------

nlohmann::json minimal(const std::string& model_type) {
    nlohmann::json j = {{"model_type", model_type}, {"vocab_size", 320},          {"hidden_size", 64},
                        {"num_hidden_layers", 2},   {"num_attention_heads", 4},   {"num_experts_per_tok", 2},
                        {"intermediate_size", 96},  {"moe_intermediate_size", 32}};
    if (model_type == "deepseek_v3" || model_type == "deepseek_v2" || model_type == "glm4_moe")
        j["n_routed_experts"] = 16;
    else if (model_type == "mixtral")
        j["num_local_experts"] = 8;
    else
        j["num_experts"] = 8;
    if (model_type != "deepseek_v3" && model_type != "deepseek_v2") j["num_key_value_heads"] = 2;
    if (model_type == "deepseek_v3" || model_type == "deepseek_v2") {
        j.update({{"q_lora_rank", nullptr},
                  {"kv_lora_rank", 32},
                  {"qk_nope_head_dim", 16},
                  {"qk_rope_head_dim", 8},
                  {"v_head_dim", 16}});
    }
    return j;
}

Result<ModelConfig> parse(const nlohmann::json& j) {
    return parse_hf_config(j.dump(), "test/config.json");
}

// Parses `j`, expects `code` and a message containing `source` and every `parts`.
void expect_error(const nlohmann::json& j, StatusCode code, std::initializer_list<const char*> parts) {
    Result<ModelConfig> r = parse(j);
    ASSERT_FALSE(r.is_ok()) << j.dump();
    EXPECT_EQ(r.status().code(), code) << r.status().message();
    const std::string& msg = r.status().message();
    EXPECT_EQ(msg.rfind("test/config.json: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const char* part : parts)
        EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

TEST(HfConfig, FamilyDefaultsWhenKeysAreAbsent) {
    nlohmann::json qj = minimal("qwen3_moe");
    qj.erase("num_key_value_heads");
    Result<ModelConfig> q = parse(qj);
    ASSERT_TRUE(q.is_ok()) << q.status().message();
    EXPECT_DOUBLE_EQ(q->rms_norm_eps, 1e-6);
    EXPECT_DOUBLE_EQ(q->rope.theta, 10000.0);
    EXPECT_EQ(q->num_key_value_heads, 4);  // Qwen3MoeConfig default
    EXPECT_EQ(q->head_dim, 16);            // hidden / heads
    EXPECT_FALSE(q->router.norm_topk_prob);
    EXPECT_EQ(q->max_position_embeddings, 32768);

    Result<ModelConfig> m = parse(minimal("mixtral"));
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    EXPECT_DOUBLE_EQ(m->rope.theta, 1e6);  // MixtralConfig.default_theta
    EXPECT_DOUBLE_EQ(m->rms_norm_eps, 1e-5);
    EXPECT_EQ(m->moe_intermediate_size, 96);  // Mixtral experts are intermediate_size wide

    Result<ModelConfig> g = parse(minimal("glm4_moe"));
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    EXPECT_EQ(g->rope.rotary_dim, 8);  // partial_rotary_factor 0.5 by default
    EXPECT_EQ(g->router.n_group, 1);
    EXPECT_TRUE(g->router.norm_topk_prob);
    EXPECT_DOUBLE_EQ(g->router.routed_scaling_factor, 1.0);
    EXPECT_EQ(g->layer_is_moe, dense_first(1, 2));
    EXPECT_EQ(g->num_nextn_predict_layers, 1);

    nlohmann::json v3j = minimal("deepseek_v3");
    v3j["num_hidden_layers"] = 4;
    v3j["num_experts_per_tok"] = 8;
    v3j["n_routed_experts"] = 32;
    Result<ModelConfig> v3 = parse(v3j);
    ASSERT_TRUE(v3.is_ok()) << v3.status().message();
    EXPECT_EQ(v3->router.n_group, 8);
    EXPECT_EQ(v3->router.topk_group, 4);
    EXPECT_DOUBLE_EQ(v3->router.routed_scaling_factor, 2.5);
    EXPECT_EQ(v3->layer_is_moe, dense_first(3, 4));
    EXPECT_TRUE(v3->rope.interleaved);
    EXPECT_EQ(v3->n_shared_experts, 1);

    nlohmann::json v2j = minimal("deepseek_v2");
    Result<ModelConfig> v2 = parse(v2j);
    ASSERT_TRUE(v2.is_ok()) << v2.status().message();
    EXPECT_EQ(v2->layer_is_moe, dense_first(0, 2));
    EXPECT_EQ(v2->n_shared_experts, 2);
    EXPECT_DOUBLE_EQ(v2->router.routed_scaling_factor, 1.0);
}

TEST(HfConfig, GlmDefaultKvHeadsIsEight) {
    nlohmann::json j = minimal("glm4_moe");
    j["num_attention_heads"] = 16;
    j.erase("num_key_value_heads");
    Result<ModelConfig> g = parse(j);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    EXPECT_EQ(g->num_key_value_heads, 8);
}

TEST(HfConfig, RopeScalingAndRopeParametersAgree) {
    nlohmann::json old_style = minimal("deepseek_v3");
    old_style["n_group"] = 1;
    old_style["topk_group"] = 1;
    old_style["max_position_embeddings"] = 2048;
    old_style["rope_theta"] = 50000.0;
    old_style["rope_scaling"] = {
        {"type", "yarn"},         {"factor", 32},   {"original_max_position_embeddings", 64},
        {"beta_fast", 1},         {"beta_slow", 1}, {"mscale", 0.707},
        {"mscale_all_dim", 0.707}};
    nlohmann::json new_style = old_style;
    new_style.erase("rope_theta");
    new_style.erase("rope_scaling");
    new_style["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 50000.0},
                                    {"factor", 32.0},      {"original_max_position_embeddings", 64},
                                    {"beta_fast", 1.0},    {"beta_slow", 1.0},
                                    {"mscale", 0.707},     {"mscale_all_dim", 0.707}};
    for (const nlohmann::json& j : {old_style, new_style}) {
        Result<ModelConfig> c = parse(j);
        ASSERT_TRUE(c.is_ok()) << c.status().message();
        EXPECT_EQ(c->rope.type, RopeType::kYarn);
        EXPECT_DOUBLE_EQ(c->rope.theta, 50000.0);
        EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
        EXPECT_EQ(c->rope.original_max_position_embeddings, 64);
        EXPECT_DOUBLE_EQ(c->rope.beta_fast, 1.0);
        EXPECT_DOUBLE_EQ(c->rope.mscale, 0.707);
        EXPECT_DOUBLE_EQ(c->rope.mscale_all_dim, 0.707);
    }
    // A null factor: max_position_embeddings / original_max_position_embeddings (transformers 5 needs the
    // key: see RopeTypesWithoutTheirRequiredKeysAreRefused); beta defaults 32 / 1.
    new_style["rope_parameters"]["factor"] = nullptr;
    new_style["rope_parameters"].erase("beta_fast");
    new_style["rope_parameters"].erase("beta_slow");
    Result<ModelConfig> c = parse(new_style);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
    EXPECT_DOUBLE_EQ(c->rope.beta_fast, 32.0);
    EXPECT_DOUBLE_EQ(c->rope.beta_slow, 1.0);
    // rope_interleave false is honoured.
    new_style["rope_interleave"] = false;
    c = parse(new_style);
    ASSERT_TRUE(c.is_ok());
    EXPECT_FALSE(c->rope.interleaved);
}

TEST(HfConfig, PartialRotaryFactorTopLevelOrInRopeParameters) {
    nlohmann::json j = minimal("qwen3_moe");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}};
    Result<ModelConfig> c = parse(j);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->rope.rotary_dim, 4);
    EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
    j["partial_rotary_factor"] = 0.5;  // a top-level key wins, as standardize_rope_params copies it
    c = parse(j);
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(c->rope.rotary_dim, 8);
}

TEST(HfConfig, Llama3AndLinearRope) {
    nlohmann::json j = minimal("mixtral");
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
    Result<ModelConfig> c = parse(j);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->rope.type, RopeType::kLlama3);
    EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    c = parse(j);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->rope.type, RopeType::kLinear);
    EXPECT_DOUBLE_EQ(c->rope.factor, 2.0);
}

TEST(HfConfig, ArchitecturesAloneSelectTheFamily) {
    nlohmann::json j = minimal("olmoe");
    j.erase("model_type");
    j["architectures"] = {"OlmoeForCausalLM"};
    Result<ModelConfig> c = parse(j);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->architecture, Architecture::kOlmoe);
    EXPECT_EQ(c->model_type, "olmoe");
}

TEST(HfConfig, Qwen3DecoderSparseStep) {
    nlohmann::json j = minimal("qwen3_moe");
    j["num_hidden_layers"] = 6;
    j["decoder_sparse_step"] = 2;
    j["mlp_only_layers"] = {3};
    Result<ModelConfig> c = parse(j);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->layer_is_moe, (std::vector<bool>{false, true, false, false, false, true}));
}

nlohmann::json with(nlohmann::json j, const char* key, nlohmann::json value) {
    j[key] = std::move(value);
    return j;
}

nlohmann::json without(nlohmann::json j, const char* key) {
    j.erase(key);
    return j;
}

// The list names what the runtime runs; gpt_oss parses for `epinfer plan` only (a tester read it as
// runnable).
TEST(HfConfig, UnknownModelTypeListsWhatTheRuntimeRuns) {
    const char kList[] =
        "deepseek_v3, kimi_k2, deepseek_v2, qwen3_moe, qwen2_moe, mixtral, olmoe, glm4_moe; "
        "gpt_oss for epinfer plan only";
    const Result<ModelConfig> llama = parse(with(minimal("qwen3_moe"), "model_type", "llama"));
    EXPECT_EQ(llama.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(llama.status().message(),
              std::string("test/config.json: unsupported model_type 'llama' (supported model_types: ") +
                  kList + ")");
    const Result<ModelConfig> none =
        parse(without(without(minimal("qwen3_moe"), "model_type"), "architectures"));
    EXPECT_EQ(none.status().message(),
              std::string("test/config.json: missing required key 'model_type' (supported: ") + kList + ")");
    EXPECT_EQ(supported_model_types(),
              (std::vector<std::string>{"deepseek_v3", "kimi_k2", "deepseek_v2", "qwen3_moe", "qwen2_moe",
                                        "mixtral", "olmoe", "glm4_moe"}));
}

TEST(HfConfig, Errors) {
    const nlohmann::json v3 = minimal("deepseek_v3");
    const nlohmann::json qwen = minimal("qwen3_moe");
    expect_error(without(qwen, "hidden_size"), StatusCode::kInvalidArgument,
                 {"missing required key 'hidden_size'"});
    expect_error(without(qwen, "num_experts"), StatusCode::kInvalidArgument,
                 {"missing required key 'num_experts'"});
    expect_error(without(v3, "q_lora_rank"), StatusCode::kInvalidArgument,
                 {"missing required key 'q_lora_rank'"});
    expect_error(with(qwen, "hidden_size", "64"), StatusCode::kInvalidArgument,
                 {"key 'hidden_size' must be an integer", "string"});
    expect_error(with(qwen, "hidden_size", 64.5), StatusCode::kInvalidArgument, {"'hidden_size'", "integer"});
    expect_error(with(qwen, "norm_topk_prob", 1), StatusCode::kInvalidArgument,
                 {"'norm_topk_prob'", "boolean"});
    expect_error(with(qwen, "eos_token_id", "x"), StatusCode::kInvalidArgument, {"'eos_token_id'"});
    expect_error(with(qwen, "num_hidden_layers", -2), StatusCode::kInvalidArgument, {"'num_hidden_layers'"});
    expect_error(with(qwen, "rope_scaling", 3), StatusCode::kInvalidArgument, {"'rope_scaling'"});
    expect_error(with(qwen, "model_type", "llama"), StatusCode::kInvalidArgument,
                 {"unsupported model_type 'llama'", "deepseek_v3", "kimi_k2", "glm4_moe", "mixtral"});
    expect_error(without(without(qwen, "model_type"), "architectures"), StatusCode::kInvalidArgument,
                 {"'model_type'"});
    expect_error(with(qwen, "architectures", {"MixtralForCausalLM"}), StatusCode::kInvalidArgument,
                 {"architectures[0] 'MixtralForCausalLM'", "Qwen3MoeForCausalLM"});
    expect_error(with(with(v3, "n_group", 3), "topk_group", 1), StatusCode::kInvalidArgument,
                 {"expert count 16", "n_group 3"});
    expect_error(with(with(v3, "n_group", 4), "topk_group", 5), StatusCode::kInvalidArgument,
                 {"topk_group 5"});
    expect_error(with(qwen, "num_experts_per_tok", 9), StatusCode::kInvalidArgument,
                 {"num_experts_per_tok 9", "expert count 8"});
    expect_error(with(with(with(v3, "n_group", 4), "topk_group", 1), "num_experts_per_tok", 5),
                 StatusCode::kInvalidArgument, {"num_experts_per_tok 5", "kept groups (4)"});
    expect_error(with(qwen, "num_key_value_heads", 3), StatusCode::kInvalidArgument,
                 {"num_attention_heads 4", "num_key_value_heads 3"});
    expect_error(with(qwen, "mlp_only_layers", {5}), StatusCode::kInvalidArgument,
                 {"mlp_only_layers entry 5"});
    expect_error(with(qwen, "decoder_sparse_step", 0), StatusCode::kInvalidArgument, {"decoder_sparse_step"});
    expect_error(with(qwen, "rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}),
                 StatusCode::kNotSupported, {"'dynamic'"});
    expect_error(with(qwen, "rope_scaling", {{"type", "linear"}}), StatusCode::kInvalidArgument,
                 {"missing required key 'rope_scaling.factor'"});
    expect_error(with(qwen, "partial_rotary_factor", 1.5), StatusCode::kInvalidArgument,
                 {"key 'partial_rotary_factor' 1.5 is outside (0, 1]"});
    expect_error(with(with(minimal("mixtral"), "sliding_window", 256), "max_position_embeddings", 4096),
                 StatusCode::kNotSupported, {"sliding-window", "256 < max_position_embeddings 4096"});
    expect_error(with(qwen, "use_sliding_window", true), StatusCode::kNotSupported, {"sliding-window"});
    expect_error(with(minimal("olmoe"), "clip_qkv", 8.0), StatusCode::kNotSupported, {"clip_qkv"});
    // Absurd sizes fail in one line instead of exhausting memory (found by a tester: 1e12 layers).
    expect_error(with(minimal("olmoe"), "num_hidden_layers", int64_t{1000000000000}),
                 StatusCode::kInvalidArgument,
                 {"'num_hidden_layers' is 1000000000000, above the supported maximum 4096"});
    expect_error(with(minimal("olmoe"), "num_experts", int64_t{1} << 40), StatusCode::kInvalidArgument,
                 {"'n_routed_experts'", "above the supported maximum"});
    expect_error(with(minimal("olmoe"), "hidden_size", int64_t{1} << 40), StatusCode::kInvalidArgument,
                 {"'hidden_size'", "above the supported maximum"});
    expect_error(with(minimal("olmoe"), "rms_norm_eps", -1.0), StatusCode::kInvalidArgument,
                 {"config.json: key 'rms_norm_eps' -1 is outside (0, 1]"});
    expect_error(with(v3, "scoring_func", "softmax"), StatusCode::kInvalidArgument,
                 {"scoring_func 'softmax'"});
    expect_error(with(minimal("deepseek_v2"), "topk_method", "noaux_tc"), StatusCode::kInvalidArgument,
                 {"topk_method 'noaux_tc'"});
    expect_error(with(minimal("deepseek_v2"), "topk_method", "group_limited_greedy"),
                 StatusCode::kInvalidArgument, {"missing required key 'n_group'"});
    expect_error(with(without(qwen, "intermediate_size"), "mlp_only_layers", {0}),
                 StatusCode::kInvalidArgument, {"missing required key 'intermediate_size'"});

    Result<ModelConfig> r = parse_hf_config("{\"model_type\": \"mixtral\",", "bad/config.json");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind("bad/config.json: malformed JSON", 0), 0u) << r.status().message();
    r = parse_hf_config("[1, 2]", "bad/config.json");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("expected a JSON object"), std::string::npos);
}

// Values the runtime does not implement are refused at parse time (found by a user trial: `epinfer
// generate` accepted them and gave wrong output).
TEST(HfConfig, RefusesValuesTheRuntimeDoesNotImplement) {
    const nlohmann::json qwen = minimal("qwen3_moe");  // vocab_size 320
    expect_error(with(qwen, "hidden_act", "gelu"), StatusCode::kNotSupported,
                 {"hidden_act 'gelu' is not supported (supported: silu)"});
    expect_error(with(minimal("deepseek_v3"), "hidden_act", "bogus"), StatusCode::kNotSupported,
                 {"hidden_act 'bogus' is not supported (supported: silu)"});
    expect_error(with(qwen, "hidden_act", 1), StatusCode::kInvalidArgument,
                 {"key 'hidden_act' must be a string"});
    expect_error(with(qwen, "max_position_embeddings", 0), StatusCode::kInvalidArgument,
                 {"key 'max_position_embeddings' must be >= 1, got 0"});
    expect_error(with(qwen, "max_position_embeddings", -4096), StatusCode::kInvalidArgument,
                 {"key 'max_position_embeddings' must be >= 1, got -4096"});
    expect_error(with(qwen, "torch_dtype", "bogus"), StatusCode::kInvalidArgument,
                 {"torch_dtype 'bogus' is not a known dtype", "float32, float16, bfloat16"});
    expect_error(with(qwen, "dtype", "bf16"), StatusCode::kInvalidArgument,
                 {"dtype 'bf16' is not a known dtype"});
    expect_error(with(qwen, "dtype", 16), StatusCode::kInvalidArgument, {"key 'dtype' must be a string"});
}

// An eos_token_id past the vocabulary is accepted, as transformers accepts it (olmoe_tiny's 50279 with 320
// ids): such a token is never sampled.
TEST(HfConfig, AcceptsSiluTorchDtypesAndAnyEosId) {
    const nlohmann::json qwen = minimal("qwen3_moe");  // vocab_size 320
    for (const nlohmann::json& j :
         {qwen, with(qwen, "hidden_act", "silu"), with(qwen, "hidden_act", nullptr),
          with(with(qwen, "torch_dtype", "float32"), "dtype", "float16"), with(qwen, "dtype", "bfloat16"),
          with(qwen, "torch_dtype", "float8_e4m3fn"), with(qwen, "eos_token_id", {0, 319, 50279}),
          with(qwen, "max_position_embeddings", 1)}) {
        Result<ModelConfig> r = parse(j);
        EXPECT_TRUE(r.is_ok()) << j.dump() << ": " << r.status().message();
    }
}

class HfConfigDir : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = std::filesystem::temp_directory_path() /
               ("epinfer_hf_config_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::create_directories(dir_);
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
    std::filesystem::path dir_;
};

TEST_F(HfConfigDir, MissingConfigIsNotFound) {
    Result<ModelConfig> r = load_hf_config(dir_.string());
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find((dir_ / "config.json").string()), std::string::npos);
    // A folder that is not there is named as such (not as a missing config.json inside it).
    const std::string gone = (dir_ / "nope").string();
    Result<ModelConfig> missing = load_hf_config(gone);
    ASSERT_FALSE(missing.is_ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(missing.status().message(), gone + ": no such folder");
}

// A folder, a FIFO or a dangling link named config.json is named as such (a tester saw "config.json: not
// found"); a FIFO is never opened (that would block). generation_config.json is optional, but when
// something is in its place it must be a file.
TEST_F(HfConfigDir, ConfigThatIsNoFileSaysWhatItIs) {
    const std::string config = (dir_ / "config.json").string();
    const auto expect_message = [&](const std::string& message) {
        Result<ModelConfig> r = load_hf_config(dir_.string());
        ASSERT_FALSE(r.is_ok());
        EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
        EXPECT_EQ(r.status().message(), message);
    };
    std::filesystem::create_directory(config);
    expect_message(config + ": is a directory, not a file");
    std::filesystem::remove(config);
    ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
    expect_message(config + ": is a FIFO, not a regular file");
    std::filesystem::remove(config);
    std::filesystem::create_symlink(dir_ / "nowhere.json", config);
    expect_message(config + ": is a dangling symbolic link");
    std::filesystem::remove(config);
    expect_message(config + ": not found");

    write("config.json", minimal("qwen3_moe").dump());
    const std::string gen = (dir_ / "generation_config.json").string();
    std::filesystem::create_directory(gen);
    expect_message(gen + ": is a directory, not a file");
}

TEST_F(HfConfigDir, EosIdsMergeInOrderWithoutDuplicates) {
    nlohmann::json j = minimal("qwen3_moe");
    j["eos_token_id"] = {7, 3, 7};
    write("config.json", j.dump());
    write("generation_config.json", R"({"eos_token_id": [3, 9], "bos_token_id": 1})");
    Result<ModelConfig> r = load_hf_config(dir_.string());
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{7, 3, 9}));

    write("generation_config.json", R"({"eos_token_id": 11})");
    r = load_hf_config(dir_.string());
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{7, 3, 11}));
}

TEST_F(HfConfigDir, MalformedGenerationConfigNamesTheFile) {
    write("config.json", minimal("qwen3_moe").dump());
    write("generation_config.json", "{\"eos_token_id\": ");
    Result<ModelConfig> r = load_hf_config(dir_.string());
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("generation_config.json: malformed JSON"), std::string::npos)
        << r.status().message();

    write("generation_config.json", R"({"eos_token_id": [1, "x"]})");
    r = load_hf_config(dir_.string());
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("generation_config.json: key 'eos_token_id'"), std::string::npos)
        << r.status().message();
}

// A window covering every accepted position changes nothing: accepted.
TEST(HfConfig, SlidingWindowCoveringEveryPositionIsAccepted) {
    Result<ModelConfig> r =
        parse(with(with(minimal("mixtral"), "sliding_window", 4096), "max_position_embeddings", 4096));
    ASSERT_TRUE(r.is_ok()) << r.status().message();
}

// transformers' DeepseekV2TopkRouter ignores norm_topk_prob (it only scales); so does epinfer.
TEST(HfConfig, DeepseekV2IgnoresNormTopkProbAsTransformersDoes) {
    Result<ModelConfig> r = parse(with(minimal("deepseek_v2"), "norm_topk_prob", true));
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_FALSE(r->router.norm_topk_prob);
}

// GptOssConfig defaults (head_dim 64, 8 KV heads, alternating layer_types, window 128, YaRN 32 over 4096
// with truncate false), OpenAI's experts_per_token spelling, and bad layer_types.
TEST(HfConfig, GptOssDefaultsAndErrors) {
    const nlohmann::json base = {{"model_type", "gpt_oss"}, {"vocab_size", 320},      {"hidden_size", 64},
                                 {"num_hidden_layers", 3},  {"num_attention_heads", 16}, {"num_local_experts", 8},
                                 {"experts_per_token", 2},  {"intermediate_size", 32}};
    Result<ModelConfig> r = parse(base);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->head_dim, 64);
    EXPECT_EQ(r->num_key_value_heads, 8);
    EXPECT_EQ(r->router.num_experts_per_tok, 2);
    EXPECT_EQ(r->layer_is_sliding, (std::vector<bool>{true, false, true}));
    EXPECT_EQ(r->sliding_window, 128);
    EXPECT_EQ(r->rope.type, RopeType::kYarn);
    EXPECT_FALSE(r->rope.truncate);
    EXPECT_DOUBLE_EQ(r->rope.theta, 150000.0);
    EXPECT_TRUE(r->quant_method.empty());

    Result<ModelConfig> full = parse(with(with(base, "sliding_window", nullptr), "layer_types",
                                          {"full_attention", "full_attention", "full_attention"}));
    ASSERT_TRUE(full.is_ok()) << full.status().message();
    EXPECT_TRUE(full->layer_is_sliding.empty());
    expect_error(with(base, "layer_types", {"full_attention"}), StatusCode::kInvalidArgument,
                 {"'layer_types'", "3"});
    expect_error(with(base, "layer_types", {"full_attention", "local", "full_attention"}),
                 StatusCode::kInvalidArgument, {"layer_types[1]", "local"});
}

// Every float key is checked where its JSON number is read, against the range its meaning allows and the
// fp32 the model computes in (found by a tester: rms_norm_eps 1e300 loaded and generated 0,0,0,0;
// routed_scaling_factor 1e39 or -1e300 failed only in the first forward, without naming config.json).
TEST(HfConfig, FloatKeysOutsideTheirRangeAreRefused) {
    const nlohmann::json v3 = minimal("deepseek_v3");
    const nlohmann::json qwen = minimal("qwen3_moe");
    const auto bad = StatusCode::kInvalidArgument;
    expect_error(with(v3, "rms_norm_eps", 1e300), bad, {"key 'rms_norm_eps' 1e+300 is outside (0, 1]"});
    expect_error(with(v3, "rms_norm_eps", 0.0), bad, {"key 'rms_norm_eps' 0 is outside (0, 1]"});
    expect_error(with(v3, "rms_norm_eps", 1e-50), bad,
                 {"key 'rms_norm_eps' 1e-50 is 0 in fp32 (below 1.4013e-45)"});
    expect_error(with(v3, "routed_scaling_factor", 1e39), bad,
                 {"key 'routed_scaling_factor' 1e+39 is outside (0, 1000]"});
    expect_error(with(v3, "routed_scaling_factor", -1e300), bad,
                 {"key 'routed_scaling_factor' -1e+300 is outside (0, 1000]"});
    expect_error(with(minimal("deepseek_v2"), "routed_scaling_factor", 0), bad,
                 {"key 'routed_scaling_factor' 0 is outside (0, 1000]"});
    expect_error(with(qwen, "rope_theta", 1e39), bad,
                 {"key 'rope_theta' 1e+39 is outside (1, 3.40282e+38 (fp32 max)]"});
    expect_error(with(qwen, "rope_theta", 1), bad, {"key 'rope_theta' 1 is outside (1, "});
    expect_error(with(qwen, "rope_parameters", {{"rope_type", "default"}, {"rope_theta", -5.0}}), bad,
                 {"key 'rope_parameters.rope_theta' -5 is outside (1, "});
    expect_error(with(qwen, "partial_rotary_factor", 0), bad,
                 {"key 'partial_rotary_factor' 0 is outside (0, 1]"});
    const nlohmann::json yarn = {
        {"rope_type", "yarn"}, {"factor", 40.0}, {"original_max_position_embeddings", 64}};
    expect_error(with(qwen, "rope_scaling", with(yarn, "factor", 1e39)), bad,
                 {"key 'rope_scaling.factor' 1e+39 is outside (0, 3.40282e+38 (fp32 max)]"});
    expect_error(with(qwen, "rope_scaling", with(yarn, "beta_fast", -1)), bad,
                 {"key 'rope_scaling.beta_fast' -1 is outside [0, "});
    expect_error(with(qwen, "rope_scaling", with(yarn, "mscale", 1e3)), bad,
                 {"key 'rope_scaling.mscale' 1000 is outside [0, 100]"});
    expect_error(with(qwen, "rope_scaling", with(yarn, "attention_factor", 0)), bad,
                 {"key 'rope_scaling.attention_factor' 0 is outside (0, 100]"});
    expect_error(with(qwen, "rope_scaling", {{"type", "linear"}, {"factor", 0}}), bad,
                 {"key 'rope_scaling.factor' 0 is outside (0, "});
    expect_error(
        with(
            qwen, "rope_scaling",
            {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", -1.0}, {"high_freq_factor", 4.0}}),
        bad, {"key 'rope_scaling.low_freq_factor' -1 is outside (0, "});
    // JSON has no inf: a literal beyond the double range is refused by the parser.
    std::string text = v3.dump();
    text.insert(1, "\"rms_norm_eps\": 1e400, ");
    Result<ModelConfig> r = parse_hf_config(text, "test/config.json");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message().rfind("test/config.json: malformed JSON: number overflow", 0), 0u)
        << r.status().message();
}

// The bounds themselves, the defaults the zeros stand for (YaRN beta 0 = 32 / 1, mscale 0 = absent), and
// integers spelled for floats are accepted.
TEST(HfConfig, FloatKeysAtTheirBoundsAreAccepted) {
    const nlohmann::json yarn = {{"rope_type", "yarn"},    {"factor", 4}, {"beta_fast", 0},
                                 {"beta_slow", 0},         {"mscale", 0}, {"mscale_all_dim", 100},
                                 {"attention_factor", 100}};
    for (const nlohmann::json& j : {with(minimal("deepseek_v3"), "rms_norm_eps", 1),
                                    with(minimal("deepseek_v3"), "rms_norm_eps", 1e-40),
                                    with(minimal("deepseek_v3"), "routed_scaling_factor", 1000),
                                    with(minimal("qwen3_moe"), "rope_theta", 3.4028234e38),
                                    with(minimal("qwen3_moe"), "rope_scaling", yarn),
                                    with(minimal("glm4_moe"), "partial_rotary_factor", 1)}) {
        Result<ModelConfig> r = parse(j);
        EXPECT_TRUE(r.is_ok()) << j.dump() << ": " << r.status().message();
    }
}

// Each RoPE type's keys that transformers 5 requires (_check_received_keys raises KeyError): a yarn dict
// without factor was accepted with a derived factor (found by a tester); linear and llama3 were already
// refused. rope_theta and original_max_position_embeddings are not required (standardize_rope_params
// fills them in).
TEST(HfConfig, RopeTypesWithoutTheirRequiredKeysAreRefused) {
    const nlohmann::json qwen = minimal("qwen3_moe");
    const auto bad = StatusCode::kInvalidArgument;
    const nlohmann::json yarn = {
        {"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"original_max_position_embeddings", 64}};
    Result<ModelConfig> r = parse(with(qwen, "rope_parameters", yarn));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(),
              "test/config.json: missing required key 'rope_parameters.factor' (rope_type yarn; null: "
              "max_position_embeddings / original_max_position_embeddings)");
    expect_error(with(qwen, "rope_scaling", {{"type", "yarn"}}), bad,
                 {"missing required key 'rope_scaling.factor'"});
    expect_error(with(qwen, "rope_scaling", {{"type", "linear"}}), bad,
                 {"missing required key 'rope_scaling.factor'"});
    const nlohmann::json llama3 = {
        {"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"}) {
        const std::string want = std::string("missing required key 'rope_scaling.") + key + "'";
        expect_error(with(qwen, "rope_scaling", without(llama3, key)), bad, {want.c_str()});
    }
    // What transformers 5 fills in or defaults is not required.
    for (const nlohmann::json& rope :
         {nlohmann::json{{"rope_type", "default"}}, nlohmann::json{{"rope_type", "yarn"}, {"factor", 4.0}},
          with(yarn, "factor", nullptr), llama3, nlohmann::json{{"rope_type", "linear"}, {"factor", 2.0}}}) {
        Result<ModelConfig> ok = parse(with(qwen, "rope_parameters", rope));
        EXPECT_TRUE(ok.is_ok()) << rope.dump() << ": " << ok.status().message();
    }
}

}  // namespace
}  // namespace epinfer
