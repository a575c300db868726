// Expected-tensor tables against every fixture's keys.txt and model.safetensors, parameter counts by hand
// and against published totals, and the checkpoint check.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weight_names.h"

namespace epinfer {
namespace {

const std::string kData = EPINFER_TEST_DATA_DIR;

ModelConfig load(const std::string& dir) {
    Result<ModelConfig> r = load_hf_config(dir);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? *r : ModelConfig{};
}

// keys.txt lines: "name\t[d0, d1]\ttorch.bfloat16".
std::map<std::string, std::vector<int64_t>> read_keys(const std::string& path) {
    std::map<std::string, std::vector<int64_t>> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string name, shape_text;
        std::getline(fields, name, '\t');
        std::getline(fields, shape_text, '\t');
        std::vector<int64_t> shape;
        std::string digits;
        for (char ch : shape_text) {
            if (ch >= '0' && ch <= '9')
                digits += ch;
            else if (!digits.empty())
                shape.push_back(std::stoll(digits)), digits.clear();
        }
        out[name] = shape;
    }
    return out;
}

std::vector<std::filesystem::path> model_fixtures() {
    std::vector<std::filesystem::path> out;
    for (const auto& entry : std::filesystem::directory_iterator(kData + "/fixtures"))
        if (std::filesystem::exists(entry.path() / "keys.txt")) out.push_back(entry.path());
    return out;
}

TEST(WeightNames, TableMatchesEveryFixtureKeysTxt) {
    const auto fixtures = model_fixtures();
    ASSERT_EQ(fixtures.size(), 14u);
    for (const auto& dir : fixtures) {
        SCOPED_TRACE(dir.filename().string());
        const auto keys = read_keys((dir / "keys.txt").string());
        ASSERT_FALSE(keys.empty());
        std::map<std::string, std::vector<int64_t>> table;
        int64_t numel_sum = 0;
        for (const ExpectedTensor& t : expected_tensors(load(dir.string()))) {
            EXPECT_TRUE(table.emplace(t.name, t.shape).second) << "duplicate " << t.name;
        }
        for (const auto& [name, shape] : keys) {
            auto it = table.find(name);
            if (it == table.end()) {
                ADD_FAILURE() << "in keys.txt, not in the table: " << name;
                continue;
            }
            EXPECT_EQ(it->second, shape) << name;
            int64_t n = 1;
            for (int64_t d : shape) n *= d;
            numel_sum += n;
        }
        for (const auto& [name, shape] : table)
            EXPECT_EQ(keys.count(name), 1u) << "in the table, not in keys.txt: " << name;
        EXPECT_EQ(count_parameters(load(dir.string())).total, numel_sum);
    }
}

TEST(WeightNames, EveryFixtureCheckpointPassesTheCheck) {
    for (const auto& dir : model_fixtures()) {
        SCOPED_TRACE(dir.filename().string());
        Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::open(dir.string());
        ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().message();
        std::vector<TensorInfo> tensors;
        for (const std::string& name : (*ckpt)->names()) tensors.push_back(*(*ckpt)->find(name).info);
        const Status s = validate_checkpoint_tensors(load(dir.string()), tensors);
        EXPECT_TRUE(s.is_ok()) << s.message();
    }
}

TEST(WeightNames, NamesPerFamily) {
    const ModelConfig mixtral = load(kData + "/fixtures/mixtral_tiny");
    EXPECT_EQ(expert_tensor_name(mixtral, 1, 7, ExpertProj::kGate),
              "model.layers.1.block_sparse_moe.experts.7.w1.weight");
    EXPECT_EQ(expert_tensor_name(mixtral, 1, 7, ExpertProj::kUp),
              "model.layers.1.block_sparse_moe.experts.7.w3.weight");
    EXPECT_EQ(expert_tensor_name(mixtral, 1, 7, ExpertProj::kDown),
              "model.layers.1.block_sparse_moe.experts.7.w2.weight");
    EXPECT_EQ(moe_block_prefix(mixtral, 0), "model.layers.0.block_sparse_moe");
    const ModelConfig v3 = load(kData + "/fixtures/deepseek_v3_tiny");
    EXPECT_EQ(expert_tensor_name(v3, 2, 15, ExpertProj::kDown),
              "model.layers.2.mlp.experts.15.down_proj.weight");
    EXPECT_EQ(moe_block_prefix(v3, 2), "model.layers.2.mlp");
    const std::vector<ExpectedTensor> table = expected_tensors(v3);
    EXPECT_EQ(table.front().name, "model.embed_tokens.weight");
    EXPECT_EQ(table.back().name, "lm_head.weight");
    for (const ExpectedTensor& t : table) {
        if (t.name == "model.layers.1.mlp.experts.3.up_proj.weight") {
            EXPECT_EQ(t.group, ParamGroup::kRoutedExpert);
            EXPECT_EQ(t.layer, 1);
            EXPECT_EQ(t.expert, 3);
        }
        if (t.name == "model.layers.2.mlp.gate.e_score_correction_bias") {
            EXPECT_EQ(t.group, ParamGroup::kRouter);
        }
    }
}

TEST(WeightNames, BiasesFollowTheFamily) {
    // DeepSeek attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj get a bias; Qwen2-MoE: q/k/v only.
    ModelConfig v3 = load(kData + "/fixtures/deepseek_v3_tiny");
    v3.attention_bias = v3.attention_out_bias = true;
    std::map<std::string, std::vector<int64_t>> table;
    for (const ExpectedTensor& t : expected_tensors(v3)) table[t.name] = t.shape;
    EXPECT_EQ(table["model.layers.0.self_attn.q_a_proj.bias"], std::vector<int64_t>{48});
    EXPECT_EQ(table["model.layers.0.self_attn.kv_a_proj_with_mqa.bias"], std::vector<int64_t>{40});
    EXPECT_EQ(table["model.layers.0.self_attn.o_proj.bias"], std::vector<int64_t>{64});
    EXPECT_EQ(table.count("model.layers.0.self_attn.q_b_proj.bias"), 0u);
    EXPECT_EQ(table.count("model.layers.0.self_attn.kv_b_proj.bias"), 0u);
}

// deepseek_v3_tiny by hand: V 320, H 64, 3 layers (layer 0 dense, 96 wide), 4 heads, q_lora 48,
// kv_lora 32, nope 16, rope 8, v 16; 16 experts of width 32, K 4, 1 shared expert.
TEST(WeightNames, ParameterCountsByHand) {
    const ParameterCounts n = count_parameters(load(kData + "/fixtures/deepseek_v3_tiny"));
    const int64_t embedding = 320 * 64, lm_head = 320 * 64;
    const int64_t attention_per_layer = 48 * 64 + 48 + 4 * 24 * 48  // q_a_proj, q_a_layernorm, q_b_proj
                                        + 40 * 64 + 32 +
                                        4 * 32 * 32     // kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
                                        + 64 * 4 * 16;  // o_proj
    const int64_t norms = 3 * 2 * 64 + 64;
    const int64_t dense = 3 * 96 * 64;
    const int64_t router = 2 * (16 * 64 + 16);
    const int64_t expert = 3 * 32 * 64;
    const int64_t shared = 2 * expert;  // one shared expert per MoE layer, 2 MoE layers
    const int64_t routed = 2 * 16 * expert;
    EXPECT_EQ(attention_per_layer, 18512);
    EXPECT_EQ(n.embedding, embedding);
    EXPECT_EQ(n.lm_head, lm_head);
    EXPECT_EQ(n.attention, 3 * attention_per_layer);
    EXPECT_EQ(n.norms, norms);
    EXPECT_EQ(n.dense_mlp, dense);
    EXPECT_EQ(n.router, router);
    EXPECT_EQ(n.shared_experts, shared);
    EXPECT_EQ(n.routed_experts, routed);
    EXPECT_EQ(n.total, 326352);
    EXPECT_EQ(n.total,
              embedding + lm_head + 3 * attention_per_layer + norms + dense + router + shared + routed);
    EXPECT_EQ(n.active, n.total - 2 * (16 - 4) * expert);
    EXPECT_EQ(n.active, 178896);

    // Tied embeddings: no lm_head.
    const ParameterCounts tied = count_parameters(load(kData + "/fixtures/qwen3_moe_sparse_step_tiny"));
    EXPECT_EQ(tied.lm_head, 0);
    EXPECT_EQ(tied.embedding, 320 * 64);
}

double billions(int64_t n) {
    return static_cast<double>(n) / 1e9;
}

ModelConfig real(const std::string& name) {
    const std::string path = kData + "/configs/" + name + ".json";
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    Result<ModelConfig> r = parse_hf_config(text.str(), path);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? *r : ModelConfig{};
}

// Published totals (FACTS.md A.4): DeepSeek-V3 671B main model (MTP excluded) / 37B active; Qwen3-30B-A3B
// 30.5B / 3.3B; Qwen3-235B-A22B 235B / 22B; Mixtral-8x7B 46.7B / 12.9B; OLMoE-1B-7B 6.9B / 1.3B. Active
// counts include the embedding and the LM head. (GLM-4.5 355B/32B and Kimi K2 1T/32B are published rounded
// or under another convention: this count gives 352.8B/33.6B and 1026.4B/32.9B.)
TEST(WeightNames, ParameterCountsMatchPublishedTotals) {
    struct Case {
        const char* config;
        double total_b, active_b;
    };
    for (const Case& c : {Case{"deepseek_v3", 671.0, 37.0}, Case{"qwen3_30b_a3b", 30.5, 3.3},
                          Case{"qwen3_235b_a22b", 235.0, 22.0}, Case{"mixtral_8x7b", 46.7, 12.9},
                          Case{"olmoe_1b_7b", 6.9, 1.3}}) {
        const ParameterCounts n = count_parameters(real(c.config));
        EXPECT_NEAR(billions(n.total), c.total_b, 0.02 * c.total_b) << c.config;
        EXPECT_NEAR(billions(n.active), c.active_b, 0.02 * c.active_b) << c.config;
    }
}

// gpt-oss-120b: 117B total, 5.1B active (FACTS.md A.4 [S21]); OpenAI counts the active parameters without
// the embedding (the count here includes it: 5.71B − 0.58B = 5.13B). Fused experts count K/E of themselves.
TEST(WeightNames, GptOss120bMatchesPublishedTotals) {
    const ModelConfig c = real("gpt_oss_120b");
    const ParameterCounts n = count_parameters(c);
    EXPECT_NEAR(billions(n.total), 117.0, 0.01 * 117.0);
    EXPECT_NEAR(billions(n.active - n.embedding), 5.1, 0.02 * 5.1);
    // 36 layers × 128 experts × (3·2880·2880 weights + 2·2880 + 2880 biases).
    EXPECT_EQ(n.routed_experts, 36LL * 128 * (3LL * 2880 * 2880 + 3 * 2880));
    EXPECT_EQ(n.router, 36LL * (128 * 2880 + 128));
    const std::vector<ExpectedTensor> table = expected_tensors(c);
    const auto has = [&](const std::string& name) {
        return std::any_of(table.begin(), table.end(), [&](const ExpectedTensor& t) { return t.name == name; });
    };
    EXPECT_TRUE(has("model.layers.0.self_attn.sinks"));
    EXPECT_TRUE(has("model.layers.0.self_attn.o_proj.bias"));
    EXPECT_TRUE(has("model.layers.35.mlp.router.bias"));
    EXPECT_TRUE(has("model.layers.35.mlp.experts.gate_up_proj_bias"));
    EXPECT_FALSE(has("model.layers.0.mlp.gate.weight"));
}

TEST(WeightNames, MixtralCountByFormula) {
    const int64_t v = 32000, h = 4096, layers = 32, kv = 8 * 128, e = 8, inter = 14336, k = 2;
    const int64_t per_layer_fixed = 2 * h * h + 2 * h * kv + 2 * h + e * h;  // q, o, k, v, 2 norms, router
    const int64_t expert = 3 * h * inter;
    const ParameterCounts n = count_parameters(real("mixtral_8x7b"));
    EXPECT_EQ(n.total, 2 * v * h + h + layers * (per_layer_fixed + e * expert));
    EXPECT_EQ(n.active, 2 * v * h + h + layers * (per_layer_fixed + k * expert));
}

// --- check_checkpoint_tensors ------------------------------------------------------------------

std::vector<TensorInfo> infos_of(const std::vector<ExpectedTensor>& table) {
    std::vector<TensorInfo> out;
    for (const ExpectedTensor& t : table) {
        TensorInfo info;
        info.name = t.name;
        info.dtype = DType::kBF16;
        info.shape = t.shape;
        out.push_back(info);
    }
    return out;
}

TensorInfo* find(std::vector<TensorInfo>& infos, const std::string& name) {
    for (TensorInfo& t : infos)
        if (t.name == name) return &t;
    return nullptr;
}

TEST(WeightNames, CheckFindsEveryKindOfIssue) {
    const ModelConfig c = load(kData + "/fixtures/deepseek_v3_tiny");  // num_nextn_predict_layers 1
    std::vector<TensorInfo> infos = infos_of(expected_tensors(c));
    ASSERT_TRUE(validate_checkpoint_tensors(c, infos).is_ok());

    // Tolerated: the MTP layer model.layers.3.*, rotary inv_freq buffers.
    TensorInfo mtp;
    mtp.name = "model.layers.3.eh_proj.weight";
    mtp.shape = {64, 128};
    infos.push_back(mtp);
    TensorInfo inv_freq;
    inv_freq.name = "model.layers.0.self_attn.rotary_emb.inv_freq";
    inv_freq.dtype = DType::kF32;
    inv_freq.shape = {4};
    infos.push_back(inv_freq);
    EXPECT_TRUE(validate_checkpoint_tensors(c, infos).is_ok());

    // Missing.
    std::vector<TensorInfo> missing = infos;
    missing.erase(missing.begin() + 1);
    const std::string gone = infos[1].name;
    Status s = validate_checkpoint_tensors(c, missing);
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_EQ(s.message(), gone + ": missing (expected shape " + shape_to_string(infos[1].shape) + ")");

    // Unexpected: a layer beyond the MTP range.
    std::vector<TensorInfo> extra = infos;
    TensorInfo beyond = mtp;
    beyond.name = "model.layers.4.eh_proj.weight";
    extra.push_back(beyond);
    s = validate_checkpoint_tensors(c, extra);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("model.layers.4.eh_proj.weight: unexpected tensor"), std::string::npos)
        << s.message();

    // Wrong shape.
    std::vector<TensorInfo> reshaped = infos;
    find(reshaped, "model.layers.1.mlp.gate.weight")->shape = {8, 64};
    s = validate_checkpoint_tensors(c, reshaped);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "model.layers.1.mlp.gate.weight: shape [8, 64], expected [16, 64]");

    // Not a float weight.
    std::vector<TensorInfo> fp8 = infos;
    find(fp8, "model.layers.1.mlp.experts.0.up_proj.weight")->dtype = DType::kF8E4M3;
    s = validate_checkpoint_tensors(c, fp8);
    EXPECT_EQ(s.code(), StatusCode::kNotSupported);
    EXPECT_NE(s.message().find("model.layers.1.mlp.experts.0.up_proj.weight: dtype F8_E4M3"),
              std::string::npos);

    // All issues at once, missing first; the Status counts the others, "1 more tensor issue" singular.
    std::vector<TensorInfo> all = missing;
    all.push_back(beyond);
    EXPECT_EQ(validate_checkpoint_tensors(c, all).message(), gone + ": missing (expected shape " +
                                                                 shape_to_string(infos[1].shape) +
                                                                 ") (and 1 more tensor issue)");
    find(all, "model.layers.1.mlp.gate.weight")->shape = {8, 64};
    const std::vector<TensorIssue> issues = check_checkpoint_tensors(c, all);
    ASSERT_EQ(issues.size(), 3u);
    EXPECT_EQ(issues[0].kind, TensorIssue::Kind::kMissing);
    EXPECT_EQ(issues[0].name, gone);
    EXPECT_NE(validate_checkpoint_tensors(c, all).message().find("(and 2 more tensor issues)"),
              std::string::npos);
}

// An MTP layer (DeepSeek-V3's model.layers.61 with num_nextn_predict_layers 1) is tolerated as a whole: its
// MTP tensors (enorm, hnorm, eh_proj, shared_head) and its decoder block. A layer in that range without
// eh_proj is a decoder layer that config.json does not count: unexpected (found by a tester: lowering
// num_hidden_layers 3 → 2 of a checkpoint with num_nextn_predict_layers 1 silently dropped layer 2).
TEST(WeightNames, LayersPastNumHiddenLayersAreUnexpectedUnlessAnMtpLayer) {
    const ModelConfig c = load(kData + "/fixtures/deepseek_v3_tiny");  // 3 layers, num_nextn_predict_layers 1
    ASSERT_EQ(c.num_nextn_predict_layers, 1);
    std::vector<TensorInfo> infos = infos_of(expected_tensors(c));
    // The MTP layer 3: layer 2's block renamed, plus the MTP module's own tensors.
    std::vector<TensorInfo> mtp_layer;
    for (const TensorInfo& t : infos) {
        if (t.name.rfind("model.layers.2.", 0) != 0) continue;
        TensorInfo copy = t;
        copy.name = "model.layers.3." + t.name.substr(std::string("model.layers.2.").size());
        mtp_layer.push_back(copy);
    }
    ASSERT_FALSE(mtp_layer.empty());
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"model.layers.3.enorm.weight", {64}},
             {"model.layers.3.hnorm.weight", {64}},
             {"model.layers.3.eh_proj.weight", {64, 128}},
             {"model.layers.3.shared_head.norm.weight", {64}}}) {
        TensorInfo t;
        t.name = name;
        t.shape = shape;
        mtp_layer.push_back(t);
    }
    std::vector<TensorInfo> with_mtp = infos;
    with_mtp.insert(with_mtp.end(), mtp_layer.begin(), mtp_layer.end());
    EXPECT_TRUE(validate_checkpoint_tensors(c, with_mtp).is_ok());

    // The same layer without eh_proj: every tensor of it is unexpected, and the message says why.
    std::vector<TensorInfo> no_marker = infos;
    for (const TensorInfo& t : mtp_layer)
        if (t.name != "model.layers.3.eh_proj.weight") no_marker.push_back(t);
    const std::vector<TensorIssue> issues = check_checkpoint_tensors(c, no_marker);
    EXPECT_EQ(issues.size(), mtp_layer.size() - 1);
    for (const TensorIssue& issue : issues)
        EXPECT_EQ(issue.kind, TensorIssue::Kind::kUnexpected) << issue.message;
    const Status s = validate_checkpoint_tensors(c, no_marker);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(
        s.message(),
        "model.layers.3.input_layernorm.weight: unexpected tensor (shape [64], BF16) not in the "
        "DeepseekV3ForCausalLM layout of config.json (layer 3 >= num_hidden_layers 3; not an MTP layer: "
        "no model.layers.3.eh_proj.weight) (and " +
            std::to_string(issues.size() - 1) + " more tensor issues)");
}

TEST(WeightNames, TiedLmHeadMayBePresent) {
    const ModelConfig c = load(kData + "/fixtures/qwen3_moe_sparse_step_tiny");
    std::vector<TensorInfo> infos = infos_of(expected_tensors(c));
    TensorInfo head;
    head.name = "lm_head.weight";
    head.shape = {320, 64};
    infos.push_back(head);
    EXPECT_TRUE(validate_checkpoint_tensors(c, infos).is_ok());
    infos.back().shape = {64, 320};
    EXPECT_EQ(validate_checkpoint_tensors(c, infos).message(),
              "lm_head.weight: shape [64, 320], expected [320, 64]");
}

}  // namespace
}  // namespace epinfer
