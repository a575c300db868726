// Model::create_random (random weights at the real shapes of a config) and the load progress callback.
#include "models/random_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/weight_names.h"
#include "models/model.h"
#include "models/model_registry.h"
#include "models/model_weights.h"

namespace epinfer {
namespace {

namespace fs = std::filesystem;

// Random models larger than this (bf16 bytes of the 2-layer cut) are skipped: the CPU test machine is
// shared.
constexpr int64_t kMaxRandomModelBytes = int64_t{5} << 29;  // 2.5 GiB

std::string data_dir() {
    return EPINFER_TEST_DATA_DIR;
}

// Fixture folders with a config.json, and the real configs (file stems), sorted.
std::vector<std::string> fixture_names() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(data_dir() + "/fixtures"))
        if (fs::exists(e.path() / "config.json")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}
std::vector<std::string> real_config_names() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(data_dir() + "/configs"))
        if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
    std::sort(names.begin(), names.end());
    return names;
}

Result<ModelConfig> real_config(const std::string& name) {
    const std::string path = data_dir() + "/configs/" + name + ".json";
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return parse_hf_config(text.str(), path);
}

// One sequence's KV cache in one block per layer, on a host-memory backend.
struct OneBlockCache {
    std::vector<std::vector<float>> k, v;  // [L][capacity × width]
    std::vector<int32_t> table{0};
    std::vector<LayerKvCache> kv;  // [L]

    OneBlockCache(const Model& model, int64_t capacity) {
        const size_t L = static_cast<size_t>(model.config().num_hidden_layers);
        k.resize(L);
        v.resize(L);
        kv.resize(L);
        for (size_t l = 0; l < L; ++l) {
            k[l].resize(static_cast<size_t>(capacity * model.kv_k_width()));
            v[l].resize(static_cast<size_t>(capacity * std::max<int64_t>(1, model.kv_v_width())));
            kv[l].k_pool = k[l].data();
            kv[l].v_pool = model.kv_v_width() > 0 ? v[l].data() : nullptr;
            kv[l].block_table = table;
            kv[l].num_blocks = 1;
            kv[l].block_size = capacity;
        }
    }
};

// Logits [V] of the last token after a prefill of `prompt` and one decode step of `next`.
std::vector<float> prefill_then_decode(Model& model, const std::vector<int32_t>& prompt, int32_t next) {
    const int64_t V = model.config().vocab_size;
    OneBlockCache cache(model, static_cast<int64_t>(prompt.size()) + 1);
    std::vector<float> logits(static_cast<size_t>(V));
    for (const std::vector<int32_t>& ids : {prompt, std::vector<int32_t>{next}}) {
        const SequenceInput input{ids, cache.kv};
        ForwardArgs args;
        args.sequences = std::span<const SequenceInput>(&input, 1);
        args.logits = logits.data();
        const Status st = model.forward(args);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        if (!st.is_ok()) return {};
    }
    return logits;
}

std::vector<int32_t> test_prompt(int64_t vocab_size) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < 6; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 3) % vocab_size));
    return ids;
}

// Finite logits that are not all equal.
void expect_sane_logits(const std::vector<float>& logits, const std::string& what) {
    ASSERT_FALSE(logits.empty()) << what;
    for (size_t i = 0; i < logits.size(); ++i)
        ASSERT_TRUE(std::isfinite(logits[i])) << what << " logit " << i;
    const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
    EXPECT_GT(*hi - *lo, 1e-4f) << what << ": every logit is the same";
}

// A random model of `config` cut to 2 layers: finite logits after a prefill and a decode step.
void check_random_model(const ModelConfig& config, const std::string& what) {
    auto backend = make_cpu_backend(2);
    RandomWeightsOptions opts;
    opts.seed = 11;
    opts.num_layers = std::min<int64_t>(2, config.num_hidden_layers);
    auto model = Model::create_random(config, *backend, opts);
    ASSERT_TRUE(model.is_ok()) << what << ": " << model.status().to_string();
    EXPECT_EQ((*model)->config().num_hidden_layers, opts.num_layers);
    auto cut = config_first_layers(config, opts.num_layers);
    ASSERT_TRUE(cut.is_ok());
    EXPECT_EQ((*model)->weight_bytes(), count_parameters(*cut).total * 2) << what;
    const int32_t next = static_cast<int32_t>(config.vocab_size - 1);
    expect_sane_logits(prefill_then_decode(**model, test_prompt(config.vocab_size), next), what);
}

class RandomWeightsFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomWeightsFixture, FiniteLogits) {
    auto config = load_hf_config(data_dir() + "/fixtures/" + GetParam());
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    check_random_model(*config, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RandomWeightsFixture, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

class RandomWeightsRealConfig : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomWeightsRealConfig, FiniteLogitsOfTwoLayers) {
    auto config = real_config(GetParam());
    if (!config.is_ok() || !check_runtime_support(*config).is_ok()) {
        GTEST_SKIP() << GetParam() << " is not run by this build: "
                     << (config.is_ok() ? check_runtime_support(*config) : config.status()).to_string();
    }
    auto cut = config_first_layers(*config, 2);
    ASSERT_TRUE(cut.is_ok());
    const int64_t bytes = count_parameters(*cut).total * 2;
    if (bytes > kMaxRandomModelBytes) {
        GTEST_SKIP() << GetParam() << ": its 2-layer random model needs " << (bytes >> 20)
                     << " MiB, above the " << (kMaxRandomModelBytes >> 20) << " MiB this CPU test allows";
    }
    check_random_model(*config, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Configs, RandomWeightsRealConfig, ::testing::ValuesIn(real_config_names()),
                         [](const auto& info) { return info.param; });

std::vector<float> random_logits(const ModelConfig& config, uint64_t seed, DType dtype = DType::kBF16) {
    auto backend = make_cpu_backend(2);
    RandomWeightsOptions opts;
    opts.seed = seed;
    opts.dtype = dtype;
    auto model = Model::create_random(config, *backend, opts);
    EXPECT_TRUE(model.is_ok()) << model.status().to_string();
    if (!model.is_ok()) return {};
    return prefill_then_decode(**model, test_prompt(config.vocab_size), 1);
}

ModelConfig fixture_config(const std::string& name) {
    auto config = load_hf_config(data_dir() + "/fixtures/" + name);
    EXPECT_TRUE(config.is_ok()) << config.status().to_string();
    return config.is_ok() ? *config : ModelConfig{};
}

TEST(RandomWeights, SameSeedSameLogitsOtherSeedOthers) {
    for (const char* name : {"deepseek_v3_tiny", "qwen3_moe_tiny"}) {
        const ModelConfig config = fixture_config(name);
        const std::vector<float> a = random_logits(config, 5), b = random_logits(config, 5);
        const std::vector<float> c = random_logits(config, 6);
        ASSERT_EQ(a.size(), static_cast<size_t>(config.vocab_size)) << name;
        EXPECT_EQ(a, b) << name;
        ASSERT_EQ(c.size(), a.size()) << name;
        EXPECT_NE(a, c) << name;
    }
}

TEST(RandomWeights, F32AndF16Weights) {
    const ModelConfig config = fixture_config("mixtral_tiny");
    for (DType dtype : {DType::kF32, DType::kF16}) {
        auto backend = make_cpu_backend(2);
        RandomWeightsOptions opts;
        opts.dtype = dtype;
        auto model = Model::create_random(config, *backend, opts);
        ASSERT_TRUE(model.is_ok()) << model.status().to_string();
        EXPECT_EQ((*model)->weight_bytes(),
                  count_parameters(config).total * static_cast<int64_t>(dtype_size(dtype)));
        expect_sane_logits(prefill_then_decode(**model, test_prompt(config.vocab_size), 2),
                           dtype_name(dtype));
    }
}

TEST(RandomWeights, BadOptionsAreOneLineErrors) {
    const ModelConfig config = fixture_config("deepseek_v3_tiny");
    auto backend = make_cpu_backend(1);
    RandomWeightsOptions opts;
    opts.num_layers = config.num_hidden_layers + 1;
    auto too_many = Model::create_random(config, *backend, opts);
    ASSERT_FALSE(too_many.is_ok());
    EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(too_many.status().message().find("num_layers 4"), std::string::npos)
        << too_many.status().to_string();
    opts.num_layers = -1;
    EXPECT_EQ(Model::create_random(config, *backend, opts).status().code(), StatusCode::kInvalidArgument);
    opts.num_layers = 0;
    opts.dtype = DType::kI32;
    auto bad_dtype = Model::create_random(config, *backend, opts);
    ASSERT_FALSE(bad_dtype.is_ok());
    EXPECT_EQ(bad_dtype.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad_dtype.status().message().find("I32"), std::string::npos) << bad_dtype.status().to_string();
}

TEST(RandomWeights, ConfigFirstLayersCutsLayerFlags) {
    const ModelConfig config = fixture_config("deepseek_v3_tiny");  // layer 0 dense, 1 and 2 MoE
    auto cut = config_first_layers(config, 2);
    ASSERT_TRUE(cut.is_ok());
    EXPECT_EQ(cut->num_hidden_layers, 2);
    EXPECT_EQ(cut->layer_is_moe, (std::vector<bool>{false, true}));
    auto same = config_first_layers(config, 0);
    ASSERT_TRUE(same.is_ok());
    EXPECT_EQ(same->num_hidden_layers, 3);
}

// The values of the tensor source: ones, zeros, uniform in ±1/sqrt(K); slices equal the same part of the
// whole tensor, also across the pool's wrap; device writes equal host reads.
TEST(RandomWeights, TensorSourceValuesAndSlices) {
    auto config = real_config("qwen3_30b_a3b");
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    auto cut = config_first_layers(*config, 1);
    ASSERT_TRUE(cut.is_ok());
    auto backend = make_cpu_backend(1);
    RandomWeightsOptions opts;
    opts.seed = 3;
    auto source = make_random_tensor_source(*cut, opts, *backend);
    ASSERT_TRUE(source.is_ok()) << source.status().to_string();
    TensorSource& src = **source;
    EXPECT_EQ(src.find("model.layers.1.input_layernorm.weight"), nullptr);  // cut to one layer

    const auto read = [&](const TensorInfo& info, const TensorSlice& slice) {
        std::vector<uint16_t> out(tensor_slice_bytes(info, slice) / 2);
        EXPECT_TRUE(src.read_to_host(info, slice, out.data()).is_ok());
        return out;
    };
    const TensorInfo* norm = src.find("model.layers.0.self_attn.q_norm.weight");
    ASSERT_NE(norm, nullptr);
    for (uint16_t v : read(*norm, {})) ASSERT_EQ(bf16_to_f32(v), 1.0f);

    // q_proj [4096, 2048]: 8M elements, twice the smallest pool, so its rows wrap around it.
    const TensorInfo* q = src.find("model.layers.0.self_attn.q_proj.weight");
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(q->shape, (std::vector<int64_t>{4096, 2048}));
    ASSERT_GT(q->numel(), kRandomWeightsPoolElems);
    const std::vector<uint16_t> whole = read(*q, {});
    const float bound = 1.0f / std::sqrt(2048.0f);
    double sum = 0.0, sum_sq = 0.0;
    for (uint16_t bits : whole) {
        const float v = bf16_to_f32(bits);
        ASSERT_LE(std::fabs(v), bound * 1.01f);
        sum += v;
        sum_sq += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>(whole.size());
    EXPECT_NEAR(sum / n, 0.0, 0.01 * bound);
    EXPECT_NEAR(sum_sq / n, bound * bound / 3.0, 0.02 * bound * bound);  // variance of U(±b) is b²/3
    // Not one row repeated: rows 0 and 1 differ.
    EXPECT_FALSE(std::equal(whole.begin(), whole.begin() + 2048, whole.begin() + 2048));

    const TensorSlice rows{0, {1000, 2500}};
    const std::vector<uint16_t> row_part = read(*q, rows);
    EXPECT_TRUE(std::equal(row_part.begin(), row_part.end(), whole.begin() + 1000 * 2048));
    const TensorSlice cols{1, {512, 1024}};
    const std::vector<uint16_t> col_part = read(*q, cols);
    for (int64_t r = 0; r < 4096; ++r) {
        ASSERT_TRUE(std::equal(col_part.begin() + r * 1024, col_part.begin() + (r + 1) * 1024,
                               whole.begin() + r * 2048 + 512))
            << "row " << r;
    }
    std::vector<uint16_t> device(col_part.size());
    ASSERT_TRUE(src.write_to_device(*q, cols, device.data()).is_ok());
    EXPECT_EQ(device, col_part);
    std::vector<uint16_t> device_whole(whole.size());
    ASSERT_TRUE(src.write_to_device(*q, {}, device_whole.data()).is_ok());
    EXPECT_EQ(device_whole, whole);

    // Another tensor of the same shape starts elsewhere in the pool.
    const TensorInfo* o = src.find("model.layers.0.self_attn.o_proj.weight");  // [2048, 4096]
    const TensorInfo* k = src.find("model.layers.0.self_attn.k_proj.weight");  // [512, 2048]
    ASSERT_NE(k, nullptr);
    ASSERT_NE(o, nullptr);
    const std::vector<uint16_t> k_whole = read(*k, {});
    EXPECT_FALSE(std::equal(k_whole.begin(), k_whole.begin() + 2048, whole.begin()));
}

// The bound q, k and v projections (copies of the source) lie one right after another in memory, weights and
// biases, so that a backend may run them as one matmul (op_args.h MatmulGroupArgs); each holds its tensor.
TEST(RandomWeights, QkvProjectionsAreStacked) {
    for (const char* name : {"qwen2_moe_tiny", "qwen3_moe_tiny"}) {  // with and without attention biases
        const ModelConfig config = fixture_config(name);
        auto backend = make_cpu_backend(1);
        auto source = make_random_tensor_source(config, RandomWeightsOptions{}, *backend);
        ASSERT_TRUE(source.is_ok()) << source.status().to_string();
        auto weights = bind_model_weights(**source, config, *backend);
        ASSERT_TRUE(weights.is_ok()) << weights.status().to_string();
        for (size_t l = 0; l < (*weights)->layers.size(); ++l) {
            const GqaAttentionWeights& w = (*weights)->layers[l].gqa;
            const std::string prefix = "model.layers." + std::to_string(l) + ".self_attn.";
            const Linear* parts[] = {&w.q_proj, &w.k_proj, &w.v_proj};
            const char* names[] = {"q_proj", "k_proj", "v_proj"};
            for (int i = 0; i < 3; ++i) {
                const Linear& lin = *parts[i];
                const std::string what = std::string(name) + " layer " + std::to_string(l) + " " + names[i];
                const size_t bytes = static_cast<size_t>(lin.out_features * lin.in_features) * 2;
                if (i > 0) {
                    const Linear& prev = *parts[i - 1];
                    const size_t prev_bytes = static_cast<size_t>(prev.out_features * prev.in_features) * 2;
                    EXPECT_EQ(lin.weight, static_cast<const unsigned char*>(prev.weight) + prev_bytes)
                        << what;
                    EXPECT_EQ(lin.bias == nullptr, prev.bias == nullptr) << what;
                    if (lin.bias != nullptr) {
                        EXPECT_EQ(lin.bias,
                                  static_cast<const unsigned char*>(prev.bias) + prev.out_features * 2)
                            << what;
                    }
                }
                const TensorInfo* info = (*source)->find(prefix + names[i] + ".weight");
                ASSERT_NE(info, nullptr) << what;
                std::vector<unsigned char> want(bytes);
                ASSERT_TRUE((*source)->read_to_host(*info, {}, want.data()).is_ok());
                EXPECT_EQ(0, std::memcmp(lin.weight, want.data(), bytes)) << what;
            }
            EXPECT_EQ(w.q_proj.bias != nullptr, config.attention_bias) << name;
        }
    }
}

TEST(RandomWeights, CorrectionBiasIsZero) {
    const ModelConfig config = fixture_config("deepseek_v3_tiny");
    auto backend = make_cpu_backend(1);
    auto source = make_random_tensor_source(config, RandomWeightsOptions{}, *backend);
    ASSERT_TRUE(source.is_ok());
    const TensorInfo* bias = (*source)->find("model.layers.1.mlp.gate.e_score_correction_bias");
    ASSERT_NE(bias, nullptr);
    std::vector<uint16_t> values(static_cast<size_t>(bias->numel()), 0xffff);
    ASSERT_TRUE((*source)->read_to_host(*bias, {}, values.data()).is_ok());
    for (uint16_t v : values) EXPECT_EQ(bf16_to_f32(v), 0.0f);
}

// Progress calls: (0, total) first, (total, total) last, never decreasing; total = weight_bytes().
void expect_progress(const std::vector<std::pair<int64_t, int64_t>>& calls, int64_t weight_bytes) {
    ASSERT_GE(calls.size(), 3u);
    const int64_t total = calls.front().second;
    EXPECT_EQ(total, weight_bytes);
    EXPECT_EQ(calls.front().first, 0);
    EXPECT_EQ(calls.back().first, total);
    for (size_t i = 1; i < calls.size(); ++i) {
        EXPECT_EQ(calls[i].second, total);
        EXPECT_GE(calls[i].first, calls[i - 1].first);
        EXPECT_LE(calls[i].first, total);
    }
}

TEST(LoadProgress, ReachesTheTotalOnLoadAndOnRandomWeights) {
    auto backend = make_cpu_backend(1);
    std::vector<std::pair<int64_t, int64_t>> calls;
    const LoadProgress progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
    auto model = Model::load(data_dir() + "/fixtures/deepseek_v3_tiny", *backend, nullptr, &progress);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    expect_progress(calls, (*model)->weight_bytes());

    calls.clear();
    auto random =
        Model::create_random((*model)->config(), *backend, RandomWeightsOptions{}, nullptr, &progress);
    ASSERT_TRUE(random.is_ok()) << random.status().to_string();
    expect_progress(calls, (*random)->weight_bytes());
    EXPECT_EQ((*random)->weight_bytes(), (*model)->weight_bytes());  // both bf16 at the same shapes
}

}  // namespace
}  // namespace epinfer
