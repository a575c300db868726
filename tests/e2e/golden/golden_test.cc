// Every tiny checkpoint of tests/data/fixtures against the goldens transformers 5.17 computed in fp32
// (tests/data/fixtures/README.md): logits at every position of both prompts, each layer's MLP/MoE
// output and decoder-layer output, and the greedy continuation decoded with the KV cache (one forward per
// new token), which must match exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint/safetensors.h"
#include "common/compare.h"
#include "common/golden.h"
#include "engine/generate.h"
#include "engine/kv_block_pool.h"
#include "engine/sampler.h"
#include "models/model.h"

namespace epinfer {
namespace {

const char* const kFixtures[] = {
    "deepseek_v3_tiny",
    "qwen3_moe_tiny",
    "mixtral_tiny",
    "kimi_k2_tiny_yarn",
    "deepseek_v2_tiny",
    "deepseek_v2_lite_tiny",
    "glm4_moe_tiny",
    "glm4_moe_qknorm_tiny",
    "olmoe_tiny",
    "qwen2_moe_tiny",
    "qwen3_moe_sparse_step_tiny",
    "mixtral_3l_tiny",
    "olmoe_3l_tiny",
    "qwen2_moe_3l_tiny",
};
constexpr int64_t kNumNewTokens = 6;

std::string fixtures_dir() {
    return std::string(EPINFER_TEST_DATA_DIR) + "/fixtures";
}

using test::Golden;
using test::load_golden;

// One sequence's blocks in a KvBlockPool and its per-layer views for Model::forward (CPU backend: the
// host block table serves as the device one).
struct PagedSequence {
    KvBlockPool* pool = nullptr;
    std::vector<int32_t> table;    // block ids in position order
    std::vector<LayerKvCache> kv;  // [L] views into table

    int64_t num_tokens() const { return kv.empty() ? 0 : kv[0].num_tokens; }
    int64_t capacity() const { return static_cast<int64_t>(table.size()) * pool->block_size(); }
    // Allocates blocks until num_tokens fit and rebuilds the views (the filled positions are kept).
    Status reserve(int64_t tokens) {
        const int64_t missing = pool->blocks_for(tokens) - static_cast<int64_t>(table.size());
        if (missing > 0) EPI_RETURN_IF_ERROR(pool->allocate(missing, &table));
        kv = pool->views(table, num_tokens());
        return Status::ok();
    }
};

// A pool whose free list is shuffled, so that consecutive allocations get scattered block ids.
Result<KvBlockPool> shuffled_pool(const Model& model, int64_t num_blocks, int64_t block_size, uint32_t seed) {
    EPI_ASSIGN_OR_RETURN(KvBlockPool pool, KvBlockPool::create(model, num_blocks, block_size));
    std::vector<int32_t> all;
    EPI_RETURN_IF_ERROR(pool.allocate(num_blocks, &all));
    std::shuffle(all.begin(), all.end(), std::mt19937(seed));
    pool.release(&all);
    return pool;
}

class GoldenTest : public ::testing::TestWithParam<const char*> {
protected:
    void SetUp() override {
        dir_ = fixtures_dir() + "/" + GetParam();
        backend_ = make_cpu_backend(2);
        auto model = Model::load(dir_, *backend_);
        ASSERT_TRUE(model.is_ok()) << model.status().to_string();
        model_ = std::move(model).value();
        golden_ = load_golden(dir_);
        ASSERT_EQ(golden_.num_prompts, 2);
        ASSERT_EQ(golden_.greedy_len, golden_.prompt_len + kNumNewTokens);
    }

    std::string dir_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<Model> model_;
    Golden golden_;
};

// Both prompts in one prefill forward (rows prompt-major, as the goldens): logits at every position,
// each layer's MLP output and layer output.
TEST_P(GoldenTest, PrefillMatchesLogitsAndLayerOutputs) {
    const ModelConfig& c = model_->config();
    const int64_t V = c.vocab_size, T = golden_.num_prompts * golden_.prompt_len;
    // Blocks of 3 tokens, allocated to the prompts in turn from a shuffled pool: scattered block tables.
    auto pool = shuffled_pool(*model_, 2 * (golden_.prompt_len / 3 + 1), 3, 7);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    std::vector<PagedSequence> caches(golden_.prompts.size(), PagedSequence{&*pool, {}, {}});
    for (int64_t filled = 0; filled < golden_.prompt_len; filled += 3)
        for (PagedSequence& cache : caches) ASSERT_TRUE(cache.reserve(filled + 1).is_ok());
    std::vector<SequenceInput> inputs;
    for (size_t s = 0; s < caches.size(); ++s) inputs.push_back({golden_.prompts[s], caches[s].kv});
    std::map<std::string, std::vector<float>> captured;
    const LayerObserver observer = [&](std::string_view what, int64_t layer, const float* rows, int64_t n) {
        captured[std::string(what) + "." + std::to_string(layer)].assign(rows, rows + n * c.hidden_size);
    };
    std::vector<float> logits(static_cast<size_t>(T * V));
    ForwardArgs args;
    args.sequences = inputs;
    args.logits_mode = LogitsMode::kAllRows;
    args.logits = logits.data();
    args.observer = &observer;
    const Status st = model_->forward(args);
    ASSERT_TRUE(st.is_ok()) << st.to_string();

    const test::Diff dl =
        test::compare(std::span<const float>(logits), std::span<const float>(golden_.logits));
    EXPECT_TRUE(test::within(dl, test::tolerance("logits", DType::kBF16)));
    for (int64_t row = 0; row < T; ++row) {
        const std::span<const float> got(logits.data() + row * V, static_cast<size_t>(V));
        const std::span<const float> want(golden_.logits.data() + row * V, static_cast<size_t>(V));
        EXPECT_EQ(argmax_token(got), argmax_token(want)) << "top-1 differs at row " << row;
    }
    // transformers' last hidden state is taken after the final norm.
    const int64_t L = c.num_hidden_layers;
    for (int64_t l = 0; l < L; ++l) {
        for (const char* what : {"mlp_out", "hidden"}) {
            const std::string key = std::string(what) + "." + std::to_string(l);
            const std::string ours =
                (l == L - 1 && key.rfind("hidden", 0) == 0) ? "final_norm." + std::to_string(L) : key;
            ASSERT_TRUE(golden_.per_layer.count(key)) << key;
            const test::Diff d = test::compare(std::span<const float>(captured[ours]),
                                               std::span<const float>(golden_.per_layer[key]));
            EXPECT_TRUE(test::within(d, test::tolerance(what, DType::kBF16))) << key;
        }
    }
    for (const PagedSequence& cache : caches) EXPECT_EQ(cache.num_tokens(), golden_.prompt_len);
}

std::vector<int32_t> golden_new_tokens(const Golden& g, size_t prompt) {
    return {g.greedy[prompt].begin() + g.prompt_len, g.greedy[prompt].end()};
}

// Greedy decoding with the KV cache, both prompts batched in every forward: the exact golden tokens.
TEST_P(GoldenTest, GreedyBatchedMatchesExactly) {
    std::vector<GenerateRequest> requests;
    for (const auto& prompt : golden_.prompts) {
        GenerateRequest r;
        r.prompt_ids = prompt;
        r.max_new_tokens = kNumNewTokens;
        r.ignore_eos = true;  // the goldens do not stop at EOS
        requests.push_back(r);
    }
    auto out = generate(*model_, requests);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    for (size_t p = 0; p < requests.size(); ++p)
        EXPECT_EQ(out->output_ids[p], golden_new_tokens(golden_, p)) << p;
    EXPECT_EQ(out->stats.prefill_tokens, golden_.num_prompts * golden_.prompt_len);
    EXPECT_EQ(out->stats.decode_tokens, golden_.num_prompts * (kNumNewTokens - 1));
}

// The same, one prompt per call (a batch of one).
TEST_P(GoldenTest, GreedySingleSequenceMatchesExactly) {
    for (size_t p = 0; p < golden_.prompts.size(); ++p) {
        GenerateRequest r;
        r.prompt_ids = golden_.prompts[p];
        r.max_new_tokens = kNumNewTokens;
        r.ignore_eos = true;
        auto out = generate(*model_, std::span(&r, 1));
        ASSERT_TRUE(out.is_ok()) << out.status().to_string();
        EXPECT_EQ(out->output_ids[0], golden_new_tokens(golden_, p)) << p;
    }
}

// A hand-written decode loop on a block table that starts with one block of 2 tokens and grows as it
// fills, from a shuffled pool (scattered, non-monotone block ids): the golden greedy tokens, and per-step
// logits equal to those of one full forward over the whole sequence in one block (the cache changes
// nothing but the amount of work).
TEST_P(GoldenTest, DecodeWithGrowingBlockTableMatchesFullRecompute) {
    const int64_t V = model_->config().vocab_size, P = golden_.prompt_len;
    const std::vector<int32_t>& prompt = golden_.prompts[1];
    auto pool = shuffled_pool(*model_, (P + kNumNewTokens) / 2 + 1, 2, 11);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    PagedSequence cache{&*pool, {}, {}};
    ASSERT_TRUE(cache.reserve(1).is_ok());
    std::vector<int32_t> tokens = prompt;
    std::vector<float> step_logits;  // [N, V]: logits that chose each new token
    std::vector<float> logits(static_cast<size_t>(V));
    std::span<const int32_t> feed = prompt;
    for (int64_t step = 0; step < kNumNewTokens; ++step) {
        ASSERT_TRUE(cache.reserve(cache.num_tokens() + static_cast<int64_t>(feed.size())).is_ok());
        const SequenceInput input{feed, cache.kv};
        ForwardArgs args;
        args.sequences = std::span(&input, 1);
        args.logits = logits.data();
        const Status st = model_->forward(args);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        step_logits.insert(step_logits.end(), logits.begin(), logits.end());
        tokens.push_back(argmax_token(logits));
        feed = std::span<const int32_t>(&tokens.back(), 1);
    }
    EXPECT_EQ(std::vector<int32_t>(tokens.begin() + P, tokens.end()), golden_new_tokens(golden_, 1));
    EXPECT_EQ(cache.num_tokens(), P + kNumNewTokens - 1);
    EXPECT_EQ(cache.capacity(), (P + kNumNewTokens - 1 + 1) / 2 * 2);
    std::vector<int32_t> sorted = cache.table;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_NE(sorted, cache.table) << "the shuffled pool handed out ascending block ids";

    auto fresh_pool = KvBlockPool::create(*model_, 1, P + kNumNewTokens);
    ASSERT_TRUE(fresh_pool.is_ok());
    PagedSequence fresh{&*fresh_pool, {}, {}};
    ASSERT_TRUE(fresh.reserve(P + kNumNewTokens).is_ok());
    const std::span<const int32_t> all(tokens.data(), tokens.size() - 1);  // the last token was never fed
    const SequenceInput input{all, fresh.kv};
    std::vector<float> full(all.size() * static_cast<size_t>(V));
    ForwardArgs args;
    args.sequences = std::span(&input, 1);
    args.logits_mode = LogitsMode::kAllRows;
    args.logits = full.data();
    ASSERT_TRUE(model_->forward(args).is_ok());
    const std::span<const float> full_tail(full.data() + (P - 1) * V, static_cast<size_t>(kNumNewTokens * V));
    EXPECT_TRUE(test::within(test::compare(std::span<const float>(step_logits), full_tail),
                             test::tolerance("logits", DType::kBF16)));
}

// Bad forward input is refused with a message naming the value, and the cache is left as it was.
TEST(ModelForward, RejectsBadInputWithoutAdvancingTheCache) {
    auto backend = make_cpu_backend(1);
    auto model = Model::load(fixtures_dir() + "/deepseek_v3_tiny", *backend);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    auto pool = KvBlockPool::create(**model, 1, 2);
    ASSERT_TRUE(pool.is_ok());
    PagedSequence cache{&*pool, {}, {}};
    ASSERT_TRUE(cache.reserve(2).is_ok());
    std::vector<float> logits(320);
    const auto run = [&](std::vector<int32_t> ids) {
        const SequenceInput input{ids, cache.kv};
        ForwardArgs args;
        args.sequences = std::span(&input, 1);
        args.logits = logits.data();
        return (*model)->forward(args);
    };
    Status st = run({5, 320});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("320"), std::string::npos) << st.message();
    st = run({5, 6, 7});  // capacity 2
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("KV cache of 2 tokens"), std::string::npos) << st.message();
    EXPECT_EQ(cache.num_tokens(), 0);
    EXPECT_TRUE(run({5, 6}).is_ok());
    EXPECT_EQ(cache.num_tokens(), 2);
}

// EOS stops a sequence unless ignore_eos: a copy of deepseek_v3_tiny whose generation_config.json names
// the first golden greedy token of prompt 0 as EOS stops prompt 0 after that token, while prompt 1 (in
// the same batch) runs to max_new_tokens unless it meets the same token.
TEST(GenerateEos, StopsAtEosUnlessIgnored) {
    namespace fs = std::filesystem;
    const fs::path src = fixtures_dir() + "/deepseek_v3_tiny";
    const fs::path dir = fs::temp_directory_path() / ("epinfer_eos_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    for (const char* f : {"config.json", "model.safetensors"})
        fs::copy_file(src / f, dir / f, fs::copy_options::overwrite_existing);
    const Golden g = load_golden(src.string());
    const int32_t eos = golden_new_tokens(g, 0)[0];
    std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": " << eos << "}";

    auto backend = make_cpu_backend(2);
    auto model = Model::load(dir.string(), *backend);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    std::vector<GenerateRequest> requests(2);
    for (size_t p = 0; p < 2; ++p) {
        requests[p].prompt_ids = g.prompts[p];
        requests[p].max_new_tokens = kNumNewTokens;
    }
    auto out = generate(**model, requests);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(out->output_ids[0], std::vector<int32_t>{eos});
    std::vector<int32_t> want1 = golden_new_tokens(g, 1);
    const auto hit = std::find(want1.begin(), want1.end(), eos);
    if (hit != want1.end()) want1.erase(hit + 1, want1.end());
    EXPECT_EQ(out->output_ids[1], want1);

    for (GenerateRequest& r : requests) r.ignore_eos = true;
    out = generate(**model, requests);
    ASSERT_TRUE(out.is_ok());
    EXPECT_EQ(out->output_ids[0], golden_new_tokens(g, 0));
    fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                             return std::string(info.param);
                         });

// No fixture with goldens is left out of the list above.
TEST(GoldenFixtures, EveryFixtureWithGoldensIsTested) {
    const std::set<std::string> listed(std::begin(kFixtures), std::end(kFixtures));
    int found = 0;
    for (const auto& entry : std::filesystem::directory_iterator(fixtures_dir())) {
        if (!std::filesystem::exists(entry.path() / "golden.safetensors")) continue;
        ++found;
        EXPECT_TRUE(listed.count(entry.path().filename().string())) << entry.path();
    }
    EXPECT_EQ(found, static_cast<int>(listed.size()));
}

}  // namespace
}  // namespace epinfer
