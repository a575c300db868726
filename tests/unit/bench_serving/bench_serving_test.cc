// The serving benchmark's measurements (engine/bench_serving.h): percentiles, level statistics, the table,
// the JSON, the flag parsing and random prompts; and the offline driver on the tiny fixture.
#include "engine/bench_serving.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "models/model.h"

namespace epinfer {
namespace {

using nlohmann::json;

TEST(BenchPercentile, InterpolatesLikeNumpy) {
    // numpy.percentile([1, 2, 3, 4, 5], [0, 50, 99, 100]) = [1, 3, 4.96, 5].
    const std::vector<double> v = {5, 1, 4, 2, 3};
    EXPECT_DOUBLE_EQ(bench_percentile(v, 0), 1.0);
    EXPECT_DOUBLE_EQ(bench_percentile(v, 50), 3.0);
    EXPECT_NEAR(bench_percentile(v, 99), 4.96, 1e-12);
    EXPECT_DOUBLE_EQ(bench_percentile(v, 100), 5.0);
    // numpy.percentile([10, 20], [50, 99]) = [15, 19.9].
    EXPECT_DOUBLE_EQ(bench_percentile({20, 10}, 50), 15.0);
    EXPECT_NEAR(bench_percentile({20, 10}, 99), 19.9, 1e-12);
    EXPECT_DOUBLE_EQ(bench_percentile({7}, 99), 7.0);
    EXPECT_TRUE(std::isnan(bench_percentile({}, 50)));
}

BenchRequestTiming timing(double submit, double first, double finish, int64_t prompt, int64_t output) {
    BenchRequestTiming t;
    t.submit_s = submit;
    t.first_token_s = first;
    t.finish_s = finish;
    t.prompt_tokens = prompt;
    t.output_tokens = output;
    t.ok = true;
    return t;
}

TEST(BenchLevelStats, ThroughputTtftAndTpot) {
    std::vector<BenchRequestTiming> r = {
        timing(0.0, 0.1, 1.1, 10, 11),  // TTFT 100 ms, TPOT (1.0 s / 10) = 100 ms
        timing(0.0, 0.3, 0.8, 10, 6),   // TTFT 300 ms, TPOT 0.5 s / 5 = 100 ms
        timing(0.5, 0.7, 1.9, 10, 5),   // TTFT 200 ms, TPOT 1.2 s / 4 = 300 ms
        timing(1.0, 1.5, 1.5, 10, 1),   // TTFT 500 ms, no TPOT (one token)
    };
    BenchRequestTiming failed;
    failed.error = "HTTP 503: queue full";
    r.push_back(failed);
    const BenchLevelStats s = summarize_bench_level(4, r, 2.0);
    EXPECT_EQ(s.concurrency, 4);
    EXPECT_EQ(s.num_requests, 5);
    EXPECT_EQ(s.completed, 4);
    EXPECT_EQ(s.failed, 1);
    EXPECT_EQ(s.first_error, "HTTP 503: queue full");
    EXPECT_EQ(s.input_tokens, 40);
    EXPECT_EQ(s.output_tokens, 23);
    EXPECT_DOUBLE_EQ(s.request_per_s, 2.0);
    EXPECT_DOUBLE_EQ(s.output_tok_per_s, 11.5);
    EXPECT_DOUBLE_EQ(s.total_tok_per_s, 31.5);
    EXPECT_NEAR(s.ttft_mean_ms, 275.0, 1e-9);
    EXPECT_NEAR(s.ttft_p50_ms, 250.0, 1e-9);  // of 100, 200, 300, 500
    EXPECT_NEAR(s.ttft_p99_ms, 300.0 + 0.97 * 200.0, 1e-9);
    EXPECT_NEAR(s.tpot_p50_ms, 100.0, 1e-9);  // of 100, 100, 300
    EXPECT_NEAR(s.tpot_p99_ms, 100.0 + 0.98 * 200.0, 1e-9);
    EXPECT_NEAR(s.tpot_mean_ms, 500.0 / 3.0, 1e-9);
}

TEST(BenchLevelStats, NoCompletedRequestGivesNaNLatencies) {
    BenchRequestTiming failed;
    const BenchLevelStats s = summarize_bench_level(1, std::vector<BenchRequestTiming>{failed}, 0.0);
    EXPECT_EQ(s.completed, 0);
    EXPECT_EQ(s.failed, 1);
    EXPECT_EQ(s.first_error, "failed");
    EXPECT_TRUE(std::isnan(s.ttft_p50_ms));
    EXPECT_TRUE(std::isnan(s.tpot_p99_ms));
    EXPECT_EQ(s.output_tok_per_s, 0.0);
}

TEST(BenchTable, OneFixedWidthRowPerLevel) {
    const std::vector<BenchRequestTiming> r = {timing(0.0, 0.1, 1.1, 10, 11)};
    const BenchLevelStats s = summarize_bench_level(8, r, 1.25);
    const std::string header = bench_table_header(), row = bench_table_row(s);
    EXPECT_EQ(header.size(), row.size());
    EXPECT_NE(header.find("output_tok/s"), std::string::npos);
    EXPECT_NE(header.find("ttft_p99"), std::string::npos);
    EXPECT_NE(header.find("tpot_p50"), std::string::npos);
    EXPECT_EQ(row.find('\n'), std::string::npos);
    EXPECT_NE(row.find(" 8 "), std::string::npos) << row;
    EXPECT_NE(row.find("1.25"), std::string::npos) << row;   // duration
    EXPECT_NE(row.find("8.8"), std::string::npos) << row;    // 11 tokens / 1.25 s
    EXPECT_NE(row.find("100.0"), std::string::npos) << row;  // TTFT
    BenchRequestTiming failed;
    const std::string empty_row = bench_table_row(summarize_bench_level(1, std::vector{failed}, 0.0));
    EXPECT_NE(empty_row.find(" -"), std::string::npos) << empty_row;
}

TEST(BenchJson, RunInfoAndOneObjectPerLevel) {
    BenchRunInfo info;
    info.command_line = "epinfer bench --model m";
    info.date_utc = bench_utc_now();
    info.mode = "offline";
    info.model = "m";
    info.layout = "tp1 ep1 pp1 dp1";
    info.device = "cpu";
    info.num_layers = 3;
    info.input_len = 16;
    info.output_len = 4;
    info.seed = 9;
    BenchRequestTiming failed;
    const std::vector<BenchLevelStats> levels = {
        summarize_bench_level(1, std::vector{timing(0.0, 0.1, 0.4, 16, 4)}, 0.4),
        summarize_bench_level(2, std::vector{failed}, 0.0)};
    const json j = json::parse(bench_json(info, levels));
    EXPECT_EQ(j["bench"], "serving");
    EXPECT_EQ(j["command_line"], "epinfer bench --model m");
    EXPECT_EQ(j["mode"], "offline");
    EXPECT_EQ(j["model"], "m");
    EXPECT_EQ(j["layout"], "tp1 ep1 pp1 dp1");
    EXPECT_EQ(j["device"], "cpu");
    EXPECT_EQ(j["num_layers"], 3);
    EXPECT_EQ(j["input_len"], 16);
    EXPECT_EQ(j["output_len"], 4);
    EXPECT_EQ(j["seed"], 9);
    EXPECT_FALSE(j.contains("url"));
    const std::string date = j["date"];
    EXPECT_EQ(date.size(), 20u) << date;  // 2026-11-29T11:05:44Z
    EXPECT_EQ(date.back(), 'Z');
    ASSERT_EQ(j["results"].size(), 2u);
    const json& a = j["results"][0];
    EXPECT_EQ(a["concurrency"], 1);
    EXPECT_EQ(a["completed"], 1);
    EXPECT_EQ(a["output_tokens"], 4);
    EXPECT_NEAR(a["duration_s"].get<double>(), 0.4, 1e-12);
    EXPECT_NEAR(a["output_tok_per_s"].get<double>(), 10.0, 1e-9);
    EXPECT_NEAR(a["total_tok_per_s"].get<double>(), 50.0, 1e-9);
    EXPECT_NEAR(a["ttft_p50_ms"].get<double>(), 100.0, 1e-9);
    EXPECT_NEAR(a["tpot_p99_ms"].get<double>(), 100.0, 1e-9);
    for (const char* key : {"num_requests", "failed", "input_tokens", "request_per_s", "ttft_mean_ms",
                            "ttft_p99_ms", "tpot_mean_ms", "tpot_p50_ms"}) {
        EXPECT_TRUE(a.contains(key)) << key;
    }
    const json& b = j["results"][1];
    EXPECT_EQ(b["failed"], 1);
    EXPECT_TRUE(b["ttft_p50_ms"].is_null());  // NaN → null
    EXPECT_EQ(b["first_error"], "failed");
}

TEST(BenchFlags, ConcurrencyList) {
    auto ok = parse_concurrency_list("1,8,32", "--concurrency", 1024);
    ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
    EXPECT_EQ(*ok, (std::vector<int64_t>{1, 8, 32}));
    for (const char* bad : {"", "1,,2", "0", "a", "4,4", "2000", "3,", "-1", "1.5"}) {
        auto r = parse_concurrency_list(bad, "--concurrency", 1024);
        ASSERT_FALSE(r.is_ok()) << bad;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
        EXPECT_EQ(r.status().message().rfind("--concurrency '", 0), 0u) << r.status().message();
    }
}

TEST(BenchFlags, DefaultNumPrompts) {
    EXPECT_EQ(bench_default_num_prompts(1), 32);
    EXPECT_EQ(bench_default_num_prompts(8), 32);
    EXPECT_EQ(bench_default_num_prompts(64), 256);
    EXPECT_EQ(bench_default_num_prompts(1024), 4096);
    EXPECT_EQ(bench_default_num_prompts(2048), 4096);
    EXPECT_EQ(bench_default_num_prompts(5000), 5000);
}

TEST(BenchPrompts, DeterministicAndInTheVocabulary) {
    const auto a = bench_random_prompts(3, 4, 7, 50), b = bench_random_prompts(3, 4, 7, 50);
    const auto c = bench_random_prompts(4, 4, 7, 50);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    ASSERT_EQ(a.size(), 4u);
    EXPECT_NE(a[0], a[1]);
    for (const auto& p : a) {
        ASSERT_EQ(p.size(), 7u);
        for (int32_t id : p) {
            EXPECT_GE(id, 0);
            EXPECT_LT(id, 50);
        }
    }
}

// The offline driver on the tiny fixture: every request produces exactly output_len tokens, with
// consistent times, and the level's statistics count them.
TEST(BenchDriver, RunsALevelThroughTheEngineLoop) {
    auto backend = make_cpu_backend(2);
    auto model = Model::load(std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/deepseek_v3_tiny", *backend);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    EngineOptions options;
    options.num_kv_blocks = 64;
    auto engine = Engine::create(**model, options);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    EngineLoop loop(**engine);
    loop.start();
    const auto prompts = bench_random_prompts(1, 5, 6, (*model)->config().vocab_size);
    BenchLevelArgs args;
    args.concurrency = 2;
    args.prompts = prompts;
    args.output_len = 4;
    args.sampling.temperature = 1.0;
    args.timeout_s = 300.0;
    auto run = run_bench_level(loop, args);
    ASSERT_TRUE(run.is_ok()) << run.status().to_string();
    ASSERT_EQ(run->requests.size(), 5u);
    for (const BenchRequestTiming& r : run->requests) {
        EXPECT_TRUE(r.ok) << r.error;
        EXPECT_EQ(r.prompt_tokens, 6);
        EXPECT_EQ(r.output_tokens, 4);
        EXPECT_GE(r.first_token_s, r.submit_s);
        EXPECT_GE(r.finish_s, r.first_token_s);
    }
    EXPECT_GT(run->duration_s, 0.0);
    const BenchLevelStats s = summarize_bench_level(2, run->requests, run->duration_s);
    EXPECT_EQ(s.completed, 5);
    EXPECT_EQ(s.output_tokens, 20);
    EXPECT_TRUE(std::isfinite(s.ttft_p99_ms));
    EXPECT_TRUE(std::isfinite(s.tpot_p50_ms));

    args.output_len = 0;
    EXPECT_EQ(run_bench_level(loop, args).status().code(), StatusCode::kInvalidArgument);
    loop.drain_and_stop(60.0);
}

}  // namespace
}  // namespace epinfer
