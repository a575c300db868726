// The serving engine under one parallel layout (EPINFER_TEST_LAYOUT, e.g. "--dp 2 --ep 2"): rank 0 drives
// an Engine, the other ranks follow it (Engine::run_follower), and concurrent requests (the golden prompts
// among others, one with seeded sampling) must get the tokens each gets alone on one rank — with all
// requests queued at once, with a tiny KV pool (preemption), with chunked prefill and requests arriving
// mid-flight, and through the threaded EngineLoop with an idle gap longer than the world's comm timeout
// (the driver's keep-alive steps). A layout the fixture cannot take is reported as skipped.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "layers/parallel_context.h"
#include "models/model.h"
#include "model_layout_util.h"
#include "mpi_test_world.h"

namespace epinfer {
namespace {

std::vector<std::vector<int32_t>> golden_prompts(const std::string& dir) {
    std::vector<std::vector<int32_t>> prompts;
    auto file = SafetensorsFile::open(dir + "/golden.safetensors");
    EXPECT_TRUE(file.is_ok()) << file.status().to_string();
    if (!file.is_ok()) return prompts;
    const TensorInfo* info = (*file)->find("input_ids");
    EXPECT_NE(info, nullptr);
    if (info == nullptr) return prompts;
    std::vector<int64_t> flat(static_cast<size_t>(info->numel()));
    std::memcpy(flat.data(), (*file)->data(*info), flat.size() * sizeof(int64_t));
    for (int64_t r = 0; r < info->shape[0]; ++r) {
        prompts.emplace_back();
        for (int64_t c = 0; c < info->shape[1]; ++c)
            prompts.back().push_back(static_cast<int32_t>(flat[r * info->shape[1] + c]));
    }
    return prompts;
}

// Six requests: the two golden prompts and four others of 3, 7, 16 and 1 tokens; the last one samples.
std::vector<RequestParams> six_requests(const std::vector<std::vector<int32_t>>& golden) {
    const std::vector<std::vector<int32_t>> prompts = {
        golden[0],
        golden[1],
        {7, 8, 9},
        {40, 41, 42, 43, 44, 45, 46},
        {100, 3, 17, 250, 9, 61, 77, 5, 19, 203, 31, 8, 2, 144, 90, 66},
        {33}};
    const int64_t max_tokens[] = {6, 6, 5, 4, 3, 7};
    std::vector<RequestParams> requests;
    for (size_t i = 0; i < prompts.size(); ++i) {
        RequestParams p;
        p.prompt_ids = prompts[i];
        p.max_tokens = max_tokens[i];
        p.ignore_eos = true;
        requests.push_back(p);
    }
    requests.back().sampling.temperature = 0.8;
    requests.back().sampling.top_k = 20;
    requests.back().sampling.seed = 77;
    return requests;
}

EngineOptions options(int64_t num_kv_blocks, int64_t max_step_tokens) {
    EngineOptions o;
    o.block_size = 4;
    o.num_kv_blocks = num_kv_blocks;
    o.max_step_tokens = max_step_tokens;
    return o;
}

// Every rank: creates an engine on `model`; the driver adds requests [0, k) before the first step and the
// rest after `late_after_steps` steps, runs them to completion, checks the tokens against `want`, and
// shuts down; the followers follow. Returns the driver's stats (zeros on followers).
EngineStats run_layout(Model& model, const EngineOptions& opts, const std::vector<RequestParams>& requests,
                       const std::vector<std::vector<int32_t>>& want, size_t k, int late_after_steps) {
    auto created = Engine::create(model, opts);
    EXPECT_TRUE(created.is_ok()) << created.status().to_string();
    if (!created.is_ok()) return {};
    Engine& engine = **created;
    if (mpi_test::world().rank() != 0) {
        const Status st = engine.run_follower();
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        return {};
    }
    std::vector<RequestId> ids(requests.size(), 0);
    const auto add = [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) {
            auto id = engine.add_request(requests[i]);
            EXPECT_TRUE(id.is_ok()) << id.status().to_string();
            ids[i] = id.is_ok() ? *id : 0;
        }
    };
    add(0, k);
    std::map<RequestId, std::vector<int32_t>> got;
    std::map<RequestId, FinishReason> finish;
    for (int s = 0; s < 5000; ++s) {
        if (s == late_after_steps) add(k, requests.size());
        if (s > late_after_steps && !engine.has_unfinished()) break;
        auto outputs = engine.step();
        EXPECT_TRUE(outputs.is_ok()) << outputs.status().to_string();
        if (!outputs.is_ok()) return {};  // the followers fail or time out as well
        for (const RequestOutput& o : *outputs) {
            got[o.id].insert(got[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
            finish[o.id] = o.finish;
        }
    }
    for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_EQ(got[ids[i]], want[i]) << "request " << i;
        EXPECT_EQ(finish[ids[i]], FinishReason::kLength) << "request " << i;
    }
    const EngineStats stats = engine.stats();
    EXPECT_EQ(stats.kv_blocks_used, 0);
    const Status st = engine.shutdown();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return stats;
}

class EngineLayoutTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineLayoutTest, ConcurrentRequestsGetTheirOneRankTokens) {
    Communicator& world = mpi_test::world();
    const std::string dir = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + GetParam();
    const char* layout_text = std::getenv("EPINFER_TEST_LAYOUT");
    ASSERT_NE(layout_text, nullptr) << "EPINFER_TEST_LAYOUT is not set";
    auto layout = layout_from_flags(layout_flags_from_env());
    ASSERT_TRUE(layout.is_ok()) << layout.status().to_string();
    auto config = load_hf_config(dir);
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    const LayoutModelDims dims = layout_model_dims(*config);
    const Status valid = validate_layout(*layout, dims, world.size());
    if (!valid.is_ok())
        GTEST_SKIP() << "layout '" << layout_text << "' is invalid for " << GetParam() << ": "
                     << valid.message();
    auto ctx = create_parallel_context(world, *layout, dims);
    ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
    std::unique_ptr<Backend> backend = make_cpu_backend(1);
    auto ref = Model::load(dir, *backend);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    auto par = Model::load(dir, *backend, ctx->get());
    ASSERT_TRUE(par.is_ok()) << par.status().to_string();
    const std::vector<std::vector<int32_t>> golden = golden_prompts(dir);
    ASSERT_EQ(golden.size(), 2u);
    const std::vector<RequestParams> requests = six_requests(golden);

    // One rank, each request alone (every rank computes it: the one-rank model needs no peer).
    std::vector<std::vector<int32_t>> want;
    for (const RequestParams& p : requests) {
        auto engine = Engine::create(**ref, options(16, 2048));
        ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
        ASSERT_TRUE((*engine)->add_request(p).is_ok());
        want.emplace_back();
        while ((*engine)->has_unfinished()) {
            auto out = (*engine)->step();
            ASSERT_TRUE(out.is_ok()) << out.status().to_string();
            for (const RequestOutput& o : *out)
                want.back().insert(want.back().end(), o.new_token_ids.begin(), o.new_token_ids.end());
        }
        ASSERT_EQ(static_cast<int64_t>(want.back().size()), p.max_tokens);
    }

    // All at once, room for everything.
    EngineStats stats = run_layout(**par, options(64, 2048), requests, want, requests.size(), 0);
    if (world.rank() == 0) {
        EXPECT_EQ(stats.preemptions, 0);
    }
    // A pool of 6 blocks per attention-DP group: the largest request (16 + 3 tokens) fits, not much more.
    stats = run_layout(**par, options(6, 2048), requests, want, requests.size(), 0);
    if (world.rank() == 0 && layout->attn_dp == 1) {
        EXPECT_GT(stats.preemptions, 0);
    }
    // Chunked prefill (4 tokens per step) and three requests joining after two steps.
    stats = run_layout(**par, options(64, 4), requests, want, 3, 2);
    if (world.rank() == 0) {
        EXPECT_GT(stats.steps, 8);
    }
}

// EngineLoop on the driver: requests from two threads, then an idle gap longer than the world's comm
// timeout (the loop's keep-alive steps keep the followers' waits short), then more requests.
TEST(EngineLayoutLoop, ServesThreadsAcrossAnIdleGap) {
    Communicator& world = mpi_test::world();
    const std::string fixture = "deepseek_v3_tiny";
    const std::string dir = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + fixture;
    auto layout = layout_from_flags(layout_flags_from_env());
    ASSERT_TRUE(layout.is_ok()) << layout.status().to_string();
    auto config = load_hf_config(dir);
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    const LayoutModelDims dims = layout_model_dims(*config);
    const Status valid = validate_layout(*layout, dims, world.size());
    if (!valid.is_ok()) GTEST_SKIP() << "layout invalid for " << fixture << ": " << valid.message();
    auto ctx = create_parallel_context(world, *layout, dims);
    ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
    std::unique_ptr<Backend> backend = make_cpu_backend(1);
    auto par = Model::load(dir, *backend, ctx->get());
    ASSERT_TRUE(par.is_ok()) << par.status().to_string();
    auto ref = Model::load(dir, *backend);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    const std::vector<RequestParams> requests = six_requests(golden_prompts(dir));
    auto engine = Engine::create(**par, options(64, 2048));
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();

    constexpr double kShortTimeoutS = 5.0, kIdleS = 6.0;
    const double saved_timeout = world.timeout_s();
    world.set_timeout_s(kShortTimeoutS);  // the plans and sampled tokens travel over the world
    if (world.rank() != 0) {
        const Status st = (*engine)->run_follower();
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        world.set_timeout_s(saved_timeout);
        return;
    }
    std::mutex mu;
    std::condition_variable cv;
    std::map<RequestId, std::vector<int32_t>> got;
    size_t num_finished = 0;
    const OutputCallback on_output = [&](const RequestOutput& o) {
        std::lock_guard<std::mutex> lock(mu);
        got[o.id].insert(got[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (o.finish != FinishReason::kNone) ++num_finished;
        cv.notify_all();
    };
    const auto wait_finished = [&](size_t n) {
        std::unique_lock<std::mutex> lock(mu);
        return cv.wait_for(lock, std::chrono::seconds(300), [&] { return num_finished >= n; });
    };
    std::vector<RequestId> ids(requests.size(), 0);
    {
        EngineLoop loop(**engine);
        loop.start();
        std::vector<std::thread> threads;
        for (size_t t = 0; t < 2; ++t) {
            threads.emplace_back([&, t] {
                for (size_t i = t; i < 4; i += 2) {
                    auto id = loop.submit(requests[i], on_output);
                    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
                    ids[i] = id.is_ok() ? *id : 0;
                }
            });
        }
        for (std::thread& th : threads) th.join();
        EXPECT_TRUE(wait_finished(4));
        std::this_thread::sleep_for(std::chrono::duration<double>(kIdleS));
        for (size_t i = 4; i < requests.size(); ++i) {
            auto id = loop.submit(requests[i], on_output);
            EXPECT_TRUE(id.is_ok()) << id.status().to_string();
            ids[i] = id.is_ok() ? *id : 0;
        }
        EXPECT_TRUE(wait_finished(requests.size()));
        loop.drain_and_stop(300);
        EXPECT_TRUE(loop.error().is_ok()) << loop.error().to_string();
    }
    world.set_timeout_s(saved_timeout);
    for (size_t i = 0; i < requests.size(); ++i) {
        auto alone = Engine::create(**ref, options(16, 2048));
        ASSERT_TRUE(alone.is_ok());
        ASSERT_TRUE((*alone)->add_request(requests[i]).is_ok());
        std::vector<int32_t> want;
        while ((*alone)->has_unfinished()) {
            auto out = (*alone)->step();
            ASSERT_TRUE(out.is_ok());
            for (const RequestOutput& o : *out)
                want.insert(want.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        }
        EXPECT_EQ(got[ids[i]], want) << "request " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineLayoutTest, ::testing::Values("deepseek_v3_tiny", "qwen3_moe_tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace epinfer
