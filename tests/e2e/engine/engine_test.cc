// The serving engine (engine/engine.h) on the bundled tiny checkpoints: continuous batching (requests
// joining mid-flight), chunked prefill, preemption on a tiny KV pool, stop conditions, aborts and request
// checks, each compared token for token with the request run alone (and with the transformers golden
// greedy continuation where it applies); then the threaded front (engine/engine_loop.h).
#include "engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint/safetensors.h"
#include "engine/engine_loop.h"
#include "engine/generate.h"
#include "models/model.h"

namespace epinfer {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGoldenNewTokens = 6;
// A bound on every wait for the loop thread (never reached unless the loop hangs).
constexpr double kWaitSeconds = 300.0;

std::string fixture_dir(const std::string& name) {
    return std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + name;
}

struct Golden {
    std::vector<std::vector<int32_t>> prompts;     // [2][P]
    std::vector<std::vector<int32_t>> new_tokens;  // [2][6] greedy continuation
};

Golden load_golden(const std::string& dir) {
    Golden g;
    auto file = SafetensorsFile::open(dir + "/golden.safetensors");
    EXPECT_TRUE(file.is_ok()) << file.status().to_string();
    if (!file.is_ok()) return g;
    std::vector<std::vector<int32_t>> greedy;
    for (const TensorInfo& info : (*file)->tensors()) {
        if (info.name != "input_ids" && info.name != "greedy") continue;
        std::vector<int64_t> flat(static_cast<size_t>(info.numel()));
        std::memcpy(flat.data(), (*file)->data(info), flat.size() * sizeof(int64_t));
        auto& rows = info.name == "input_ids" ? g.prompts : greedy;
        rows.assign(static_cast<size_t>(info.shape[0]), {});
        for (int64_t r = 0; r < info.shape[0]; ++r)
            for (int64_t c = 0; c < info.shape[1]; ++c)
                rows[static_cast<size_t>(r)].push_back(static_cast<int32_t>(flat[r * info.shape[1] + c]));
    }
    for (size_t i = 0; i < greedy.size() && i < g.prompts.size(); ++i)
        g.new_tokens.emplace_back(greedy[i].begin() + static_cast<int64_t>(g.prompts[i].size()),
                                  greedy[i].end());
    return g;
}

EngineOptions engine_options(int64_t num_kv_blocks, int64_t block_size = 4, int64_t max_step_tokens = 2048,
                             int64_t max_running = 256) {
    EngineOptions o;
    o.num_kv_blocks = num_kv_blocks;
    o.block_size = block_size;
    o.max_step_tokens = max_step_tokens;
    o.max_running = max_running;
    return o;
}

std::unique_ptr<Engine> make_engine(Model& model, const EngineOptions& options) {
    auto engine = Engine::create(model, options);
    EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
    return engine.is_ok() ? std::move(engine).value() : nullptr;
}

RequestParams greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
    RequestParams p;
    p.prompt_ids = std::move(prompt);
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    return p;
}

struct Finished {
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::kNone;
    int64_t completion_tokens = 0;
    int64_t num_outputs = 0;
};

// Adds the outputs of one step to `results`, checking their bookkeeping.
void collect(const std::vector<RequestOutput>& outputs, std::map<RequestId, Finished>& results) {
    for (const RequestOutput& o : outputs) {
        Finished& f = results[o.id];
        EXPECT_EQ(f.finish, FinishReason::kNone) << "output after the last one of request " << o.id;
        f.tokens.insert(f.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        f.finish = o.finish;
        f.completion_tokens = o.completion_tokens;
        ++f.num_outputs;
        EXPECT_EQ(o.completion_tokens, static_cast<int64_t>(f.tokens.size())) << "request " << o.id;
        EXPECT_LE(o.new_token_ids.size(), 1u);
    }
}

// Steps the engine until it has nothing left (at most max_steps steps).
void run_until_done(Engine& engine, std::map<RequestId, Finished>& results, int max_steps = 5000) {
    for (int s = 0; s < max_steps && engine.has_unfinished(); ++s) {
        auto outputs = engine.step();
        ASSERT_TRUE(outputs.is_ok()) << outputs.status().to_string();
        collect(*outputs, results);
    }
    EXPECT_FALSE(engine.has_unfinished()) << "not done after " << max_steps << " steps";
}

// The tokens of `params` run alone on an engine with room for it.
std::vector<int32_t> run_alone(Model& model, const RequestParams& params) {
    const int64_t tokens = static_cast<int64_t>(params.prompt_ids.size()) + params.max_tokens;
    std::unique_ptr<Engine> engine = make_engine(model, engine_options((tokens + 3) / 4));
    if (engine == nullptr) return {};
    auto id = engine->add_request(params);
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    std::map<RequestId, Finished> results;
    run_until_done(*engine, results);
    EXPECT_EQ(engine->stats().preemptions, 0);
    return results[*id].tokens;
}

// Eight prompts of different lengths: the two golden prompts (11 tokens) among deterministic others.
std::vector<RequestParams> eight_requests(const Golden& g) {
    const int64_t lengths[8] = {1, 3, 5, 8, 0, 0, 17, 24};  // 0: a golden prompt
    const int64_t max_tokens[8] = {6, 4, 9, 3, kGoldenNewTokens, kGoldenNewTokens, 7, 5};
    std::vector<RequestParams> requests;
    uint32_t x = 12345;
    size_t golden = 0;
    for (int i = 0; i < 8; ++i) {
        std::vector<int32_t> prompt;
        if (lengths[i] == 0) {
            prompt = g.prompts[golden++];
        } else {
            for (int64_t t = 0; t < lengths[i]; ++t) {
                x = x * 1664525u + 1013904223u;
                prompt.push_back(static_cast<int32_t>(2 + (x >> 8) % 300));
            }
        }
        requests.push_back(greedy(prompt, max_tokens[i]));
    }
    return requests;
}

class EngineTest : public ::testing::TestWithParam<const char*> {
protected:
    void SetUp() override {
        backend_ = make_cpu_backend(2);
        auto model = Model::load(fixture_dir(GetParam()), *backend_);
        ASSERT_TRUE(model.is_ok()) << model.status().to_string();
        model_ = std::move(model).value();
        golden_ = load_golden(fixture_dir(GetParam()));
        ASSERT_EQ(golden_.prompts.size(), 2u);
        ASSERT_EQ(golden_.new_tokens[0].size(), static_cast<size_t>(kGoldenNewTokens));
    }

    // Runs `requests` together on one engine and checks each against its run alone; returns the stats.
    EngineStats expect_same_as_alone(const EngineOptions& options,
                                     const std::vector<RequestParams>& requests) {
        std::unique_ptr<Engine> engine = make_engine(*model_, options);
        if (engine == nullptr) return {};
        std::vector<RequestId> ids;
        for (const RequestParams& p : requests) {
            auto id = engine->add_request(p);
            EXPECT_TRUE(id.is_ok()) << id.status().to_string();
            ids.push_back(id.is_ok() ? *id : 0);
        }
        std::map<RequestId, Finished> results;
        run_until_done(*engine, results);
        for (size_t i = 0; i < requests.size(); ++i) {
            const Finished& f = results[ids[i]];
            EXPECT_EQ(f.tokens, run_alone(*model_, requests[i])) << "request " << i;
            EXPECT_EQ(f.finish, FinishReason::kLength) << "request " << i;
            EXPECT_EQ(f.completion_tokens, requests[i].max_tokens) << "request " << i;
        }
        const EngineStats stats = engine->stats();
        EXPECT_EQ(stats.kv_blocks_used, 0);
        EXPECT_EQ(stats.running + stats.waiting, 0);
        int64_t total = 0;
        for (const RequestParams& p : requests) total += p.max_tokens;
        EXPECT_EQ(stats.tokens_generated, total);
        return stats;
    }

    std::unique_ptr<Backend> backend_;
    std::unique_ptr<Model> model_;
    Golden golden_;
};

// Eight concurrent greedy requests of different lengths: each gets the tokens it gets alone, and the
// golden prompts get the transformers greedy continuation.
TEST_P(EngineTest, ConcurrentRequestsEqualEachAloneAndTheGoldens) {
    const std::vector<RequestParams> requests = eight_requests(golden_);
    const EngineStats stats = expect_same_as_alone(engine_options(128), requests);
    EXPECT_EQ(stats.preemptions, 0);
    EXPECT_EQ(stats.steps, 9);  // one prefill step (every prompt), then 8 decode steps (max_tokens 9)
    EXPECT_EQ(run_alone(*model_, requests[4]), golden_.new_tokens[0]);
    EXPECT_EQ(run_alone(*model_, requests[5]), golden_.new_tokens[1]);
}

// A budget of 5 tokens per step (prompts up to 24 tokens) and 3 running sequences at most.
TEST_P(EngineTest, ChunkedPrefillGivesTheSameTokens) {
    const EngineStats stats = expect_same_as_alone(engine_options(128, 4, 5, 3), eight_requests(golden_));
    EXPECT_EQ(stats.preemptions, 0);
    EXPECT_GT(stats.steps, 20);
}

// 10 blocks of 4 tokens: the largest request (24 + 5) just fits, most requests cannot run together.
TEST_P(EngineTest, TinyPoolPreemptsAndEveryRequestStillGetsItsTokens) {
    const EngineStats stats = expect_same_as_alone(engine_options(10), eight_requests(golden_));
    EXPECT_GT(stats.preemptions, 0);
}

// Seeded sampling: a sequence's Sampler survives preemption (the recomputed prefix samples nothing).
TEST_P(EngineTest, SeededSamplingSurvivesPreemption) {
    std::vector<RequestParams> requests = eight_requests(golden_);
    for (size_t i = 0; i < requests.size(); ++i) {
        requests[i].sampling.temperature = 0.9;
        requests[i].sampling.top_k = 40;
        requests[i].sampling.top_p = 0.95;
        requests[i].sampling.seed = 1000 + i;
    }
    const EngineStats stats = expect_same_as_alone(engine_options(10), requests);
    EXPECT_GT(stats.preemptions, 0);
}

// Greedy, temperature-only, top-k and top-p requests share steps: each row of the token-choice op carries
// its own draw (TokenDraw), so each request's tokens are those it gets alone, also across preemption.
TEST_P(EngineTest, MixedDrawsInOneStepEachGetTheirTokensAlone) {
    std::vector<RequestParams> requests = eight_requests(golden_);
    for (size_t i = 0; i < requests.size(); ++i) {
        if (i % 4 == 0) continue;  // greedy
        requests[i].sampling.temperature = 0.9;
        if (i % 4 == 2) requests[i].sampling.top_k = 5;
        if (i % 4 == 3) requests[i].sampling.top_p = 0.8;
        requests[i].sampling.seed = 2000 + i;
    }
    const EngineStats stats = expect_same_as_alone(engine_options(10), requests);
    EXPECT_GT(stats.preemptions, 0);
}

// A request added after three steps joins the running batch: the next step decodes the first request
// and prefills the new one, and both outputs come from that step.
TEST_P(EngineTest, RequestAddedMidFlightJoinsTheRunningBatch) {
    std::unique_ptr<Engine> engine = make_engine(*model_, engine_options(64));
    ASSERT_NE(engine, nullptr);
    const RequestParams a = greedy(golden_.prompts[0], 10), b = greedy(golden_.prompts[1], kGoldenNewTokens);
    auto id_a = engine->add_request(a);
    ASSERT_TRUE(id_a.is_ok());
    std::map<RequestId, Finished> results;
    for (int s = 0; s < 3; ++s) {
        auto out = engine->step();
        ASSERT_TRUE(out.is_ok()) << out.status().to_string();
        collect(*out, results);
    }
    EXPECT_EQ(results[*id_a].tokens.size(), 3u);
    auto id_b = engine->add_request(b);
    ASSERT_TRUE(id_b.is_ok());
    EXPECT_EQ(engine->stats().waiting, 1);
    auto out = engine->step();
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    ASSERT_EQ(out->size(), 2u);
    EXPECT_EQ((*out)[0].id, *id_a);
    EXPECT_EQ((*out)[1].id, *id_b);
    EXPECT_EQ(engine->stats().running, 2);
    EXPECT_EQ(engine->stats().steps, 4);
    collect(*out, results);
    run_until_done(*engine, results);
    EXPECT_EQ(results[*id_a].tokens, run_alone(*model_, a));
    EXPECT_EQ(results[*id_b].tokens, golden_.new_tokens[1]);
}

TEST_P(EngineTest, StopsAtMaxTokensAndStopTokenIds) {
    const std::vector<int32_t> full = run_alone(*model_, greedy(golden_.prompts[0], 8));
    ASSERT_EQ(full.size(), 8u);
    std::unique_ptr<Engine> engine = make_engine(*model_, engine_options(64));
    ASSERT_NE(engine, nullptr);
    RequestParams stop = greedy(golden_.prompts[0], 8);
    stop.stop_token_ids = {full[3], 319};
    auto id_stop = engine->add_request(stop);
    auto id_len = engine->add_request(greedy(golden_.prompts[0], 5));
    ASSERT_TRUE(id_stop.is_ok() && id_len.is_ok());
    std::map<RequestId, Finished> results;
    run_until_done(*engine, results);
    const std::vector<int32_t> want_stop(full.begin(), std::find(full.begin(), full.end(), full[3]) + 1);
    EXPECT_EQ(results[*id_stop].tokens, want_stop);
    EXPECT_EQ(results[*id_stop].finish, FinishReason::kStop);
    EXPECT_EQ(results[*id_len].tokens, std::vector<int32_t>(full.begin(), full.begin() + 5));
    EXPECT_EQ(results[*id_len].finish, FinishReason::kLength);
    EXPECT_EQ(results[*id_len].num_outputs, 5);
    EXPECT_STREQ(finish_reason_name(FinishReason::kStop), "stop");
    EXPECT_STREQ(finish_reason_name(FinishReason::kLength), "length");
    EXPECT_STREQ(finish_reason_name(FinishReason::kAborted), "abort");
    EXPECT_STREQ(finish_reason_name(FinishReason::kNone), "");
}

// A copy of the fixture whose generation_config.json names the third golden token as EOS: a request
// stops there (kStop), unless ignore_eos.
TEST_P(EngineTest, StopsAtEosFromGenerationConfigUnlessIgnored) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() /
                         ("epinfer_engine_eos_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    for (const char* f : {"config.json", "model.safetensors"})
        fs::copy_file(fixture_dir(GetParam()) + "/" + f, dir / f, fs::copy_options::overwrite_existing);
    const int32_t eos = golden_.new_tokens[0][2];
    std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": [" << eos << "]}";
    auto model = Model::load(dir.string(), *backend_);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    std::unique_ptr<Engine> engine = make_engine(**model, engine_options(64));
    ASSERT_NE(engine, nullptr);
    RequestParams stops = greedy(golden_.prompts[0], kGoldenNewTokens);
    stops.ignore_eos = false;
    auto id_stops = engine->add_request(stops);
    auto id_ignores = engine->add_request(greedy(golden_.prompts[0], kGoldenNewTokens));
    ASSERT_TRUE(id_stops.is_ok() && id_ignores.is_ok());
    std::map<RequestId, Finished> results;
    run_until_done(*engine, results);
    const std::vector<int32_t>& g = golden_.new_tokens[0];
    EXPECT_EQ(results[*id_stops].tokens,
              std::vector<int32_t>(g.begin(), std::find(g.begin(), g.end(), eos) + 1));
    EXPECT_EQ(results[*id_stops].finish, FinishReason::kStop);
    EXPECT_EQ(results[*id_ignores].tokens, g);
    EXPECT_EQ(results[*id_ignores].finish, FinishReason::kLength);
    fs::remove_all(dir);
}

// An abort finishes the request at the next step with kAborted and frees its blocks; a queued request
// can be aborted too; unknown ids are ignored.
TEST_P(EngineTest, AbortFreesBlocksAtTheNextStep) {
    std::unique_ptr<Engine> engine = make_engine(*model_, engine_options(64, 4, 2048, 2));
    ASSERT_NE(engine, nullptr);
    const RequestParams b = greedy(golden_.prompts[1], 12);
    auto id_a = engine->add_request(greedy(golden_.prompts[0], 40));  // 11 + 40 tokens
    auto id_b = engine->add_request(b);
    auto id_c = engine->add_request(greedy({5, 6, 7}, 4));  // waits: max_running 2
    ASSERT_TRUE(id_a.is_ok() && id_b.is_ok() && id_c.is_ok());
    std::map<RequestId, Finished> results;
    for (int s = 0; s < 6; ++s) {
        auto out = engine->step();
        ASSERT_TRUE(out.is_ok());
        collect(*out, results);
    }
    // 11 + 5 = 16 KV rows each (the 6th token is not fed yet): 4 blocks each.
    EXPECT_EQ(engine->stats().kv_blocks_used, 8);
    EXPECT_EQ(engine->stats().waiting, 1);
    engine->abort(*id_a);
    engine->abort(*id_c);
    engine->abort(9999);
    auto out = engine->step();
    ASSERT_TRUE(out.is_ok());
    collect(*out, results);
    EXPECT_EQ(results[*id_a].finish, FinishReason::kAborted);
    EXPECT_EQ(results[*id_a].tokens.size(), 6u);
    EXPECT_EQ(results[*id_c].finish, FinishReason::kAborted);
    EXPECT_TRUE(results[*id_c].tokens.empty());
    EXPECT_EQ(results.count(9999), 0u);
    EXPECT_EQ(engine->stats().kv_blocks_used, 5);  // b alone: 11 + 6 rows after this step's decode
    EXPECT_EQ(engine->stats().running, 1);
    EXPECT_EQ(engine->stats().waiting, 0);
    run_until_done(*engine, results);
    EXPECT_EQ(results[*id_b].tokens, run_alone(*model_, b));
    EXPECT_EQ(engine->stats().kv_blocks_used, 0);
    engine->abort(*id_b);  // finished: ignored
    auto none = engine->step();
    ASSERT_TRUE(none.is_ok());
    EXPECT_TRUE(none->empty());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineTest, ::testing::Values("deepseek_v3_tiny", "qwen3_moe_tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                             return std::string(info.param);
                         });

class EngineChecks : public ::testing::Test {
protected:
    void SetUp() override {
        backend_ = make_cpu_backend(1);
        auto model = Model::load(fixture_dir("deepseek_v3_tiny"), *backend_);
        ASSERT_TRUE(model.is_ok()) << model.status().to_string();
        model_ = std::move(model).value();
    }
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<Model> model_;
};

TEST_F(EngineChecks, BadOptionsAndRequestsAreRefusedNamingTheValue) {
    auto bad = Engine::create(*model_, engine_options(8, 0));
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr("block_size must be ≥ 1, got 0"));
    bad = Engine::create(*model_, engine_options(0));
    EXPECT_THAT(bad.status().message(), HasSubstr("num_kv_blocks must be ≥ 1, got 0"));

    EngineOptions options = engine_options(4);
    options.max_waiting = 2;
    std::unique_ptr<Engine> engine = make_engine(*model_, options);
    ASSERT_NE(engine, nullptr);
    const auto expect_invalid = [&](const RequestParams& p, const std::string& text) {
        auto id = engine->add_request(p);
        ASSERT_FALSE(id.is_ok()) << text;
        EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument) << id.status().message();
        EXPECT_THAT(id.status().message(), HasSubstr(text));
    };
    expect_invalid(
        greedy(std::vector<int32_t>(10, 3), 7),
        "prompt of 10 tokens + max_tokens 7 = 17 tokens need 5 KV blocks of 4 tokens, but the pool "
        "has 4");
    expect_invalid(greedy({}, 2), "prompt_ids is empty");
    expect_invalid(greedy({5, 320}, 2), "prompt id 320 is outside [0, vocab_size 320)");
    expect_invalid(greedy({5}, 0), "max_tokens must be ≥ 1, got 0");
    expect_invalid(greedy({5}, 600), "exceeds max_position_embeddings 512");
    RequestParams p = greedy({5}, 2);
    p.stop_token_ids = {-1};
    expect_invalid(p, "stop token id -1");
    p = greedy({5}, 2);
    p.sampling.top_p = 0;
    expect_invalid(p, "top_p");

    ASSERT_TRUE(engine->add_request(greedy({5}, 2)).is_ok());
    ASSERT_TRUE(engine->add_request(greedy({6}, 2)).is_ok());
    auto full = engine->add_request(greedy({7}, 2));
    EXPECT_EQ(full.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(full.status().message(), HasSubstr("max_waiting 2"));
    ASSERT_TRUE(engine->shutdown().is_ok());
    ASSERT_TRUE(engine->shutdown().is_ok());  // idempotent
    EXPECT_EQ(engine->add_request(greedy({7}, 2)).status().code(), StatusCode::kUnavailable);
    EXPECT_FALSE(engine->run_follower().is_ok());  // the driver does not follow
}

// The KV pool's dtype (EngineOptions::kv_cache_dtype, --kv-cache-dtype): a bf16 pool runs a request to
// max_tokens; another dtype is refused by the pool, naming it, through Engine::create and generate().
TEST_F(EngineChecks, Bf16KvCacheRunsAndAnotherDtypeIsRefused) {
    EngineOptions options = engine_options(16);
    options.kv_cache_dtype = DType::kBF16;
    std::unique_ptr<Engine> engine = make_engine(*model_, options);
    ASSERT_NE(engine, nullptr);
    auto id = engine->add_request(greedy({12, 7, 99}, 8));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    std::map<RequestId, Finished> results;
    run_until_done(*engine, results);
    EXPECT_EQ(results[*id].tokens.size(), 8u);
    EXPECT_EQ(results[*id].finish, FinishReason::kLength);

    options.kv_cache_dtype = DType::kF16;
    const auto bad = Engine::create(*model_, options);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr("dtype F16 is not supported (F32 or BF16)"));
    GenerateRequest request;
    request.prompt_ids = {12, 7, 99};
    request.max_new_tokens = 2;
    const auto generated = generate(*model_, std::span(&request, 1), {.dtype = DType::kF16});
    ASSERT_FALSE(generated.is_ok());
    EXPECT_THAT(generated.status().message(), HasSubstr("dtype F16 is not supported (F32 or BF16)"));
    EXPECT_TRUE(generate(*model_, std::span(&request, 1), {.dtype = DType::kBF16}).is_ok());
}

// generate() with a pool of its caller's size (epinfer generate --kv-cache-tokens): a request of more tokens
// than the pool holds is refused naming both; one that fits runs in it.
TEST_F(EngineChecks, GenerateTakesTheKvPoolItIsGiven) {
    GenerateRequest request;
    request.prompt_ids = {12, 7, 99};
    request.max_new_tokens = 6;
    request.ignore_eos = true;
    const auto refused = generate(*model_, std::span(&request, 1), {.num_kv_blocks = 2, .block_size = 4});
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(
        refused.status().message(),
        HasSubstr("request 0: prompt of 3 tokens + max_new_tokens 6 = 9 tokens exceed the KV pool of 8 "
                  "tokens (num_kv_blocks 2 × block_size 4)"));
    const auto ran = generate(*model_, std::span(&request, 1), {.num_kv_blocks = 3, .block_size = 4});
    ASSERT_TRUE(ran.is_ok()) << ran.status().to_string();
    EXPECT_EQ(ran->output_ids.front().size(), 6u);
}

// A copy of deepseek_v3_tiny whose final norm weight is NaN.
std::filesystem::path nan_checkpoint() {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("epinfer_engine_nan_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
        fs::copy_file(fixture_dir("deepseek_v3_tiny") + "/" + f, dir / f);
    const std::string path = (dir / "model.safetensors").string();
    uint64_t data_begin = 0, num_bytes = 0;
    DType dtype = DType::kF32;
    {
        auto file = SafetensorsFile::open(path);
        EXPECT_TRUE(file.is_ok()) << file.status().message();
        const TensorInfo* info = file.is_ok() ? (*file)->find("model.norm.weight") : nullptr;
        EXPECT_NE(info, nullptr);
        if (info == nullptr) return dir;
        data_begin = info->data_begin;
        num_bytes = info->num_bytes();
        dtype = info->dtype;
    }
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_bytes = 0;
    f.read(reinterpret_cast<char*>(&header_bytes), 8);
    f.seekp(static_cast<std::streamoff>(8 + header_bytes + data_begin));
    const uint16_t nan_bf16 = 0x7fc0;
    const float nan_f32 = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(dtype == DType::kBF16 || dtype == DType::kF32);
    for (uint64_t b = 0; b < num_bytes; b += dtype == DType::kBF16 ? 2 : 4) {
        if (dtype == DType::kBF16)
            f.write(reinterpret_cast<const char*>(&nan_bf16), 2);
        else
            f.write(reinterpret_cast<const char*>(&nan_f32), 4);
    }
    return dir;
}

TEST(EngineNonFinite, NonFiniteLogitsAreDataLossAndTheEngineStaysFailed) {
    const std::filesystem::path dir = nan_checkpoint();
    auto backend = make_cpu_backend(1);
    auto model = Model::load(dir.string(), *backend);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    std::unique_ptr<Engine> engine = make_engine(**model, engine_options(16));
    ASSERT_NE(engine, nullptr);
    auto id = engine->add_request(greedy({12, 7, 99}, 4));
    ASSERT_TRUE(id.is_ok());
    auto out = engine->step();
    ASSERT_FALSE(out.is_ok());
    EXPECT_EQ(out.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(out.status().message(), HasSubstr("request id " + std::to_string(*id) + ", new token 0"));
    EXPECT_THAT(out.status().message(), HasSubstr("non-finite"));
    auto again = engine->step();
    ASSERT_FALSE(again.is_ok());
    EXPECT_EQ(again.status().message(), out.status().message());
    std::filesystem::remove_all(dir);
}

// ---- EngineLoop

// Collects the callbacks of an EngineLoop (called on its delivery thread) and waits for them with a bound.
class Collector {
public:
    OutputCallback callback() {
        return [this](const RequestOutput& o) {
            std::lock_guard<std::mutex> lock(mu_);
            threads_.insert(std::this_thread::get_id());
            Finished& f = results_[o.id];
            if (f.finish != FinishReason::kNone) ++late_outputs_;
            f.tokens.insert(f.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
            f.finish = o.finish;
            f.completion_tokens = o.completion_tokens;
            ++f.num_outputs;
            if (o.finish != FinishReason::kNone) ++num_finished_;
            cv_.notify_all();
        };
    }
    // True when `n` requests have finished within kWaitSeconds.
    bool wait_finished(size_t n) {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_for(lock, std::chrono::duration<double>(kWaitSeconds),
                            [&] { return num_finished_ >= n; });
    }
    // True when request `id` has produced `n` tokens within kWaitSeconds.
    bool wait_tokens(RequestId id, size_t n) {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_for(lock, std::chrono::duration<double>(kWaitSeconds),
                            [&] { return results_[id].tokens.size() >= n; });
    }
    std::map<RequestId, Finished> results() {
        std::lock_guard<std::mutex> lock(mu_);
        return results_;
    }
    int late_outputs() {
        std::lock_guard<std::mutex> lock(mu_);
        return late_outputs_;
    }
    // The threads the callbacks ran on.
    std::set<std::thread::id> threads() {
        std::lock_guard<std::mutex> lock(mu_);
        return threads_;
    }

private:
    std::mutex mu_;
    std::set<std::thread::id> threads_;
    std::condition_variable cv_;
    std::map<RequestId, Finished> results_;
    size_t num_finished_ = 0;
    int late_outputs_ = 0;
};

TEST_F(EngineChecks, LoopServesRequestsSubmittedFromSeveralThreads) {
    std::unique_ptr<Engine> engine = make_engine(*model_, engine_options(256));
    ASSERT_NE(engine, nullptr);
    const Golden golden = load_golden(fixture_dir("deepseek_v3_tiny"));
    const std::vector<RequestParams> requests = eight_requests(golden);
    Collector collector;
    std::vector<RequestId> ids(requests.size());
    {
        EngineLoop loop(*engine);
        loop.start();
        std::vector<std::thread> threads;
        for (size_t t = 0; t < 4; ++t) {
            threads.emplace_back([&, t] {
                for (size_t i = t; i < requests.size(); i += 4) {
                    auto id = loop.submit(requests[i], collector.callback());
                    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
                    ids[i] = id.is_ok() ? *id : 0;
                }
            });
        }
        for (std::thread& th : threads) th.join();
        ASSERT_TRUE(collector.wait_finished(requests.size()));
        EXPECT_TRUE(loop.error().is_ok());
        EXPECT_EQ(loop.stats().tokens_generated, 6 + 4 + 9 + 3 + 6 + 6 + 7 + 5);
        loop.drain_and_stop(kWaitSeconds);
        EXPECT_EQ(loop.submit(requests[0], collector.callback()).status().code(), StatusCode::kUnavailable);
    }
    const std::map<RequestId, Finished> results = collector.results();
    for (size_t i = 0; i < requests.size(); ++i) {
        const Finished& f = results.at(ids[i]);
        EXPECT_EQ(f.tokens, run_alone(*model_, requests[i])) << "request " << i;
        EXPECT_EQ(f.finish, FinishReason::kLength);
        EXPECT_EQ(f.num_outputs, requests[i].max_tokens);
    }
    EXPECT_EQ(collector.late_outputs(), 0);
    // One delivery thread made every call (so each request's outputs came in step order, as the tokens show),
    // none of the submitting threads.
    const std::set<std::thread::id> threads = collector.threads();
    EXPECT_EQ(threads.size(), 1u);
    EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST_F(EngineChecks, LoopCancelAbortsOneRequest) {
    std::unique_ptr<Engine> engine = make_engine(*model_, engine_options(256));
    ASSERT_NE(engine, nullptr);
    EngineLoop loop(*engine);
    // The first output of the long request waits (bounded) until the test has cancelled it, so the
    // cancel reaches the engine before the request could finish.
    std::mutex mu;
    std::condition_variable cv;
    bool cancelled = false;
    Collector collector;
    OutputCallback collect = collector.callback();
    OutputCallback on_output = [&](const RequestOutput& o) {
        collect(o);
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::duration<double>(kWaitSeconds), [&] { return cancelled; });
    };
    auto long_id = loop.submit(greedy({3, 4, 5}, 400), on_output);
    auto short_id = loop.submit(greedy({6, 7}, 3), collector.callback());
    ASSERT_TRUE(long_id.is_ok() && short_id.is_ok());
    loop.start();
    ASSERT_TRUE(collector.wait_tokens(*long_id, 1));
    loop.cancel(*long_id);
    loop.cancel(12345);  // unknown: ignored
    {
        std::lock_guard<std::mutex> lock(mu);
        cancelled = true;
    }
    cv.notify_all();
    ASSERT_TRUE(collector.wait_finished(2));
    const std::map<RequestId, Finished> results = collector.results();
    EXPECT_EQ(results.at(*long_id).finish, FinishReason::kAborted);
    EXPECT_LT(results.at(*long_id).tokens.size(), 400u);
    EXPECT_EQ(results.at(*short_id).finish, FinishReason::kLength);
    EXPECT_EQ(results.at(*short_id).tokens, run_alone(*model_, greedy({6, 7}, 3)));
    loop.drain_and_stop(kWaitSeconds);
    EXPECT_TRUE(loop.error().is_ok());
    EXPECT_EQ(engine->stats().kv_blocks_used, 0);
}

// drain_and_stop lets queued requests finish; without start() it runs the loop on the caller's thread.
TEST_F(EngineChecks, LoopDrainFinishesEveryQueuedRequest) {
    std::unique_ptr<Engine> engine = make_engine(*model_, engine_options(64));
    ASSERT_NE(engine, nullptr);
    Collector collector;
    EngineLoop loop(*engine);
    for (int i = 0; i < 3; ++i)
        ASSERT_TRUE(loop.submit(greedy({static_cast<int32_t>(10 + i), 11}, 5), collector.callback()).is_ok());
    loop.drain_and_stop(kWaitSeconds);
    // Every callback was made before drain_and_stop returned: no waiting here.
    ASSERT_EQ(collector.results().size(), 3u);
    for (const auto& [id, f] : collector.results()) {
        EXPECT_EQ(f.finish, FinishReason::kLength) << id;
        EXPECT_EQ(f.tokens.size(), 5u) << id;
    }
    EXPECT_EQ(loop.submit(greedy({1}, 1), collector.callback()).status().code(), StatusCode::kUnavailable);
    loop.drain_and_stop(kWaitSeconds);  // idempotent
    loop.start();                       // no-op after stop
    EXPECT_EQ(engine->stats().running + engine->stats().waiting, 0);
}

TEST_F(EngineChecks, LoopStopAbortsEverythingAtOnce) {
    std::unique_ptr<Engine> engine = make_engine(*model_, engine_options(256));
    ASSERT_NE(engine, nullptr);
    Collector collector;
    {
        EngineLoop loop(*engine);
        for (int i = 0; i < 3; ++i)
            ASSERT_TRUE(
                loop.submit(greedy({static_cast<int32_t>(20 + i)}, 400), collector.callback()).is_ok());
        loop.stop();
    }
    ASSERT_TRUE(collector.wait_finished(3));
    for (const auto& [id, f] : collector.results()) {
        EXPECT_EQ(f.finish, FinishReason::kAborted) << id;
        EXPECT_TRUE(f.tokens.empty()) << id;
    }
    EXPECT_EQ(engine->stats().kv_blocks_used, 0);
}

// A fatal engine error (non-finite logits) ends every unfinished request with kAborted.
TEST(EngineLoopErrors, FatalErrorAbortsEveryRequest) {
    const std::filesystem::path dir = nan_checkpoint();
    auto backend = make_cpu_backend(1);
    auto model = Model::load(dir.string(), *backend);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    std::unique_ptr<Engine> engine = make_engine(**model, engine_options(16));
    ASSERT_NE(engine, nullptr);
    Collector collector;
    EngineLoop loop(*engine);
    ASSERT_TRUE(loop.submit(greedy({12, 7, 99}, 4), collector.callback()).is_ok());
    ASSERT_TRUE(loop.submit(greedy({12}, 4), collector.callback()).is_ok());
    loop.start();
    ASSERT_TRUE(collector.wait_finished(2));
    for (const auto& [id, f] : collector.results()) EXPECT_EQ(f.finish, FinishReason::kAborted) << id;
    loop.drain_and_stop(kWaitSeconds);
    EXPECT_EQ(loop.error().code(), StatusCode::kDataLoss);
    auto refused = loop.submit(greedy({1}, 1), collector.callback());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(refused.status().message(), HasSubstr("non-finite"));
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace epinfer
