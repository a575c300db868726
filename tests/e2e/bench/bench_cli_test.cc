// `epinfer bench` (the serving benchmark) as a user runs it (the built binary, EPINFER_CLI_PATH): offline on
// the tiny fixture and on random weights of a real config, as a client of an in-process HTTP server, and
// one-line errors for bad flags; `bench comm` still runs as a subcommand.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_runner.h"
#include "e2e/server/server_test_util.h"
#if EPINFER_WITH_CUDA
#include "backend/cuda/cuda_util.h"
#endif

namespace epinfer::testing {
namespace {

const std::string kConfigsDir = std::string(EPINFER_TEST_DATA_DIR) + "/configs";

// The JSON that `--json` wrote, or a discarded value.
json read_json(const std::filesystem::path& path) {
    return json::parse(read_text_file(path), nullptr, false);
}

// Fields of every level, and completed requests with their exact token counts.
void expect_levels(const json& j, const std::vector<int64_t>& concurrency, int64_t num_prompts,
                   int64_t input_len, int64_t output_len) {
    ASSERT_TRUE(j.contains("results")) << j.dump();
    ASSERT_EQ(j["results"].size(), concurrency.size()) << j.dump();
    for (size_t i = 0; i < concurrency.size(); ++i) {
        const json& r = j["results"][i];
        EXPECT_EQ(r["concurrency"], concurrency[i]);
        EXPECT_EQ(r["num_requests"], num_prompts);
        EXPECT_EQ(r["completed"], num_prompts);
        EXPECT_EQ(r["failed"], 0);
        EXPECT_EQ(r["input_tokens"], num_prompts * input_len);
        EXPECT_EQ(r["output_tokens"], num_prompts * output_len);
        for (const char* key :
             {"duration_s", "output_tok_per_s", "total_tok_per_s", "request_per_s", "ttft_p50_ms",
              "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "ttft_mean_ms", "tpot_mean_ms"}) {
            ASSERT_TRUE(r.contains(key) && r[key].is_number()) << key << " in " << r.dump();
            EXPECT_GE(r[key].get<double>(), 0.0) << key;
        }
        EXPECT_GT(r["output_tok_per_s"].get<double>(), 0.0);
        EXPECT_LE(r["ttft_p50_ms"].get<double>(), r["ttft_p99_ms"].get<double>());
        EXPECT_LE(r["tpot_p50_ms"].get<double>(), r["tpot_p99_ms"].get<double>());
    }
    EXPECT_EQ(j["input_len"], input_len);
    EXPECT_EQ(j["output_len"], output_len);
}

// The table on stdout: the preamble, the header, one row per level.
void expect_table(const std::string& out, size_t num_levels) {
    EXPECT_EQ(out.rfind("# epinfer bench: ", 0), 0u) << out;
    EXPECT_NE(out.find("concurrency"), std::string::npos) << out;
    EXPECT_NE(out.find("output_tok/s"), std::string::npos) << out;
    EXPECT_EQ(static_cast<size_t>(std::count(out.begin(), out.end(), '\n')), 3 + num_levels) << out;
}

TEST(BenchCli, OfflineOnTheTinyFixtureWritesJson) {
    const auto dir = cli_scratch_dir("epinfer_bench_offline");
    const auto json_path = dir / "bench.json";
    const CliResult r = run_epinfer("bench --model " + kTinyModel +
                                    " --concurrency 1,4 --input-len 8 --output-len 4 --num-prompts 6 --seed 3"
                                    " --threads 2 --kv-cache-tokens 1024 --json " +
                                    json_path.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_table(r.out, 2);
    // The KV cache the engine got: auto resolved (fp32 on the CPU), tokens per rank.
    EXPECT_NE(r.out.find(", tp1 ep1 pp1 dp1 on cpu, kv_cache_dtype fp32, kv_cache_tokens 1024, input_len 8,"),
              std::string::npos)
        << r.out;
    const json j = read_json(json_path);
    ASSERT_FALSE(j.is_discarded()) << read_text_file(json_path);
    EXPECT_EQ(j["bench"], "serving");
    EXPECT_EQ(j["mode"], "offline");
    EXPECT_EQ(j["model"], kTinyModel);
    EXPECT_EQ(j["layout"], "tp1 ep1 pp1 dp1");
    EXPECT_EQ(j["device"], "cpu");
    EXPECT_EQ(j["kv_cache_dtype"], "fp32");
    EXPECT_EQ(j["kv_cache_tokens"], 1024);
    EXPECT_EQ(j["random_weights"], false);
    EXPECT_EQ(j["num_layers"], 3);
    EXPECT_EQ(j["seed"], 3);
    EXPECT_NE(j["command_line"].get<std::string>().find("bench --model"), std::string::npos);
    EXPECT_EQ(j["date"].get<std::string>().size(), 20u);
    expect_levels(j, {1, 4}, 6, 8, 4);
    std::filesystem::remove_all(dir);
}

TEST(BenchCli, NumPromptsPerLevel) {
    const auto dir = cli_scratch_dir("epinfer_bench_prompts_per_level");
    const auto json_path = dir / "bench.json";
    const CliResult r =
        run_epinfer("bench --model " + kTinyModel +
                    " --concurrency 1,2 --num-prompts 2,5 --input-len 4 --output-len 2 --threads 2"
                    " --kv-cache-tokens 1000 --kv-cache-dtype bf16 --warmup 0 --json " +
                    json_path.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(", kv_cache_dtype bf16, kv_cache_tokens 992,"), std::string::npos) << r.out;
    const json j = read_json(json_path);
    EXPECT_EQ(j["kv_cache_dtype"], "bf16");
    EXPECT_EQ(j["kv_cache_tokens"], 992);  // what the engine got: whole blocks of 16
    ASSERT_EQ(j["results"].size(), 2u) << j.dump();
    EXPECT_EQ(j["results"][0]["num_requests"], 2);
    EXPECT_EQ(j["results"][1]["num_requests"], 5);
    EXPECT_EQ(j["results"][1]["completed"], 5);
    std::filesystem::remove_all(dir);
}

// olmoe_1b_7b cut to one layer: 1.3 GB of bf16 weights (the embedding, one MoE layer of 64 experts and
// the LM head), within the CPU test machine's memory.
TEST(BenchCli, RandomWeightsOfARealConfigAtOneLayer) {
    const auto dir = cli_scratch_dir("epinfer_bench_random");
    const auto json_path = dir / "bench.json";
    const CliResult r = run_epinfer("bench --config " + kConfigsDir +
                                    "/olmoe_1b_7b.json --random-weights --num-layers 1 --concurrency 2"
                                    " --input-len 6 --output-len 3 --num-prompts 2 --warmup 0 --threads 2"
                                    " --kv-cache-tokens 256 --json " +
                                    json_path.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_table(r.out, 1);
    EXPECT_NE(r.out.find("random weights, 1 layer)"), std::string::npos) << r.out;
    const json j = read_json(json_path);
    ASSERT_FALSE(j.is_discarded()) << read_text_file(json_path);
    EXPECT_EQ(j["random_weights"], true);
    EXPECT_EQ(j["num_layers"], 1);
    expect_levels(j, {2}, 2, 6, 3);
    std::filesystem::remove_all(dir);
}

TEST(BenchCli, ClientOfARunningServer) {
    EngineOptions engine_options;
    engine_options.num_kv_blocks = 256;
    auto stack = start_stack(engine_options, server::ServerOptions{});
    ASSERT_NE(stack, nullptr);
    const std::string url = "http://127.0.0.1:" + std::to_string(stack->port());
    const int64_t vocab = stack->model->config().vocab_size;
    const auto dir = cli_scratch_dir("epinfer_bench_client");
    const auto json_path = dir / "bench.json";
    // The root with a trailing slash, as browsers write it: the same server.
    const CliResult r = run_epinfer(
        "bench --url " + url + "/ --vocab-size " + std::to_string(vocab) +
        " --concurrency 1,3 --input-len 5 --output-len 3 --num-prompts 4 --json " + json_path.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_table(r.out, 2);
    const json j = read_json(json_path);
    ASSERT_FALSE(j.is_discarded()) << read_text_file(json_path);
    EXPECT_EQ(j["mode"], "client");
    EXPECT_EQ(j["url"], url);
    EXPECT_EQ(j["model"], "epinfer");  // the served model's id
    EXPECT_FALSE(j.contains("kv_cache_dtype")) << j.dump();  // the server's own, not known here
    EXPECT_EQ(r.out.find("kv_cache"), std::string::npos) << r.out;
    expect_levels(j, {1, 3}, 4, 5, 3);

    // A --vocab-size other than the one /v1/models reports is refused, naming both (it was silently
    // replaced by the server's).
    expect_one_line_error(run_epinfer("bench --url " + url + " --vocab-size " + std::to_string(vocab + 1) +
                                      " --concurrency 1 --input-len 2 --output-len 1"),
                          "--vocab-size " + std::to_string(vocab + 1) + ", but the server at " + url +
                              " reports vocab_size " + std::to_string(vocab));

    // Without --vocab-size the prompts need the server's vocabulary, which /v1/models may not report.
    const json models = json::parse(http_get(stack->port(), "/v1/models").body, nullptr, false);
    if (!models.is_discarded() && !models["data"][0].contains("vocab_size")) {
        expect_one_line_error(run_epinfer("bench --url " + url + " --concurrency 1"), "pass --vocab-size");
    }
    std::filesystem::remove_all(dir);
}

TEST(BenchCli, BadFlagsAreOneErrorLine) {
    const std::string model = " --model " + kTinyModel;
    expect_one_line_error(run_epinfer("bench"), "bench needs --model DIR");
    expect_one_line_error(run_epinfer("bench" + model + " --concurrency 1,0"),
                          "--concurrency '1,0': 0 is outside");
    expect_one_line_error(run_epinfer("bench" + model + " --concurrency 2,x"), "'x' is not an integer");
    expect_one_line_error(run_epinfer("bench" + model + " --concurrency 1,4 --num-prompts 1,2,3"),
                          "--num-prompts '1,2,3': 3 values for 2 --concurrency levels");
    expect_one_line_error(run_epinfer("bench" + model + " --concurrency 1,4 --num-prompts 2,x"),
                          "--num-prompts 'x' is not an integer");
    expect_one_line_error(run_epinfer("bench" + model + " --input-len 0"), "--input-len must be in [1,");
    expect_one_line_error(run_epinfer("bench" + model + " --output-len many"),
                          "--output-len 'many' is not an integer");
    expect_one_line_error(run_epinfer("bench" + model + " --timeout-s 0"),
                          "--timeout-s '0': must be a number of seconds in (0, 1e+09]");
    // Past the bound a deadline would overflow into the past (core/timeout.h): refused, not a timeout at
    // once.
    expect_one_line_error(run_epinfer("bench" + model + " --timeout-s 1e10"),
                          "--timeout-s '1e10': must be a number of seconds in (0, 1e+09]");
    expect_one_line_error(run_epinfer("bench" + model + " --temperature -1"),
                          "--temperature must be ≥ 0 (0: greedy), got -1");
    expect_one_line_error(run_epinfer("bench" + model + " --temperature nan"),
                          "--temperature 'nan' is not a finite number");
    expect_one_line_error(run_epinfer("bench" + model + " --temperature 1 --top-p 0"),
                          "--top-p must be in (0, 1], got 0");
    expect_one_line_error(run_epinfer("bench" + model + " --top-p 0.9"),
                          "--top-p 0.9 applies to sampled tokens: give --temperature > 0");
    expect_one_line_error(run_epinfer("bench" + model + " --top-k 20"),
                          "--top-k 20 applies to sampled tokens: give --temperature > 0");
    expect_one_line_error(run_epinfer("bench" + model + " --temperature 1 --top-k -3"),
                          "--top-k must be in [0, 9223372036854775807], got -3");
    expect_one_line_error(run_epinfer("bench" + model + " --vocab-size 10"),
                          "--vocab-size is used only with --url");
    expect_one_line_error(run_epinfer("bench" + model + " --input-len 4000 --output-len 200 --threads 2"),
                          "exceeds the model's context");
    expect_one_line_error(run_epinfer("bench --random-weights --concurrency 1"),
                          "--random-weights needs --config");
    expect_one_line_error(run_epinfer("bench --url ftp://host:1"),
                          "--url 'ftp://host:1': must start with http://");
    // A URL that cannot name a server says what is wrong with it, not "nothing listens there".
    expect_one_line_error(
        run_epinfer("bench --url http://127.0.0.1:9/v1"),
        "--url 'http://127.0.0.1:9/v1': give the server's root, http://HOST:PORT, without the "
        "path '/v1'");
    for (const char* port : {"abc", "-1", "99999", "0", ""}) {
        expect_one_line_error(run_epinfer("bench --url http://127.0.0.1:" + std::string(port)),
                              "port '" + std::string(port) + "' is not a number in 1..65535");
    }
    expect_one_line_error(run_epinfer("bench --url http://:8000"), "--url 'http://:8000': no host");
    expect_one_line_error(run_epinfer("bench --url http://[::1"), "an IPv6 host's '[' is not closed");
    expect_one_line_error(run_epinfer("bench --url http://127.0.0.1:9" + model),
                          "bench: --url drives a running server: --model does not apply");
    // Every model and engine flag given with --url is refused in one line (they were ignored, a bad
    // --kv-cache-dtype not even checked), before the server is asked.
    for (const char* flag :
         {"--config c.json", "--random-weights", "--num-layers 1", "--weights-seed 3", "--random-dtype f32",
          "--device cpu", "--threads 2", "--tp 2", "--ep 2", "--dp 2", "--pp 2", "--kv-cache-tokens 64",
          "--kv-cache-dtype fp16", "--block-size 32", "--max-running 4", "--no-decode-graphs",
          "--max-step-tokens 64", "--max-waiting 8", "--memory-fraction 0.5"}) {
        const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
        expect_one_line_error(run_epinfer("bench --url http://127.0.0.1:9 " + std::string(flag)),
                              "bench: --url drives a running server: " + name + " does not apply");
    }
    expect_one_line_error(
        run_epinfer("bench --url http://127.0.0.1:9 --memory-fraction 0.5 --ep 2 --kv-cache-dtype bf16"),
        "bench: --url drives a running server: --ep, --kv-cache-dtype, --memory-fraction do not apply");
    expect_one_line_error(run_epinfer("bench --url http://127.0.0.1:9 --timeout-s 5"),
                          "GET /v1/models failed: cannot connect");
    // A --json file that cannot be written is refused before the run (it was written after the whole run).
    const CliResult missing = run_epinfer("bench" + model + " --json /nonexistent-dir/x.json");
    expect_one_line_error(missing,
                          "--json /nonexistent-dir/x.json: cannot write into the folder /nonexistent-dir");
    EXPECT_EQ(missing.err.find("epinfer: ready"), std::string::npos) << "refused before the model loads";
    expect_one_line_error(run_epinfer("bench" + model + " --json /tmp"),
                          "--json /tmp: is a folder, not a file");
    expect_one_line_error(run_epinfer("bench moe --json /tmp"), "--json /tmp: is a folder, not a file");
    expect_one_line_error(run_epinfer("bench attention --json /nonexistent-dir/a.json"),
                          "--json /nonexistent-dir/a.json: cannot write into the folder");
    // --decode-sizes items are BATCHxCONTEXT, refused before any GPU work (so also without CUDA).
    for (const auto& [sizes, message] :
         {std::pair{"64x", "item '64x': expected BATCHxCONTEXT"}, std::pair{"0x64", "item '0x64': expected"},
          std::pair{"64*4096", "item '64*4096': expected"}, std::pair{"64x4096,", "has an empty item"},
          std::pair{"4096x4096", "4096 × 4096 cached tokens exceed the bench's 2097152"}}) {
        expect_one_line_error(run_epinfer(std::string("bench attention --decode-sizes ") + sizes), message);
    }
    expect_one_line_error(run_epinfer("bench comm --ranks 1 --json /tmp"),
                          "--json /tmp: is a folder, not a file");
}

// A server that takes the connection but never answers (a listening socket nothing accepts from): the
// read times out, and the error says so (it said the server closed the connection).
TEST(BenchCli, SilentServerIsNoAnswerWithinTheTimeout) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(fd, 4), 0);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    expect_one_line_error(run_epinfer("bench --url " + url + " --timeout-s 1"),
                          "--url " + url + ": GET /v1/models failed: no answer within 1 s");
    close(fd);
}

TEST(BenchCli, BenchEpBadFlagsAreOneLineBeforeAnyRankStarts) {
    expect_one_line_error(run_epinfer("bench ep --ranks 2 --tokens 8 --hidden 100000000000"),
                          "bench ep: --hidden 100000000000 is outside [1, 65536]");
    expect_one_line_error(run_epinfer("bench ep --ranks 9 --experts 8"), "--ranks 9 exceeds --experts 8");
    expect_one_line_error(run_epinfer("bench ep --warmup-iters -1"), "--warmup-iters -1 is outside");
    expect_one_line_error(run_epinfer("bench ep --tokens 1048576 --hidden 4096"),
                          "exceeds 2147483648 elements");
    // A list with an empty item, a word or a negative count: one line naming the value, before any rank
    // starts.
    expect_one_line_error(run_epinfer("bench ep --ranks 2 --tokens 1,,2"),
                          "bench ep: --tokens '1,,2' has an empty item");
    expect_one_line_error(run_epinfer("bench ep --ranks 2 --tokens 8,"),
                          "bench ep: --tokens '8,' has an empty item");
    expect_one_line_error(run_epinfer("bench ep --ranks 2 --tokens 8,x"),
                          "bench ep: --tokens '8,x': 'x' is not an integer");
    expect_one_line_error(run_epinfer("bench ep --ranks 2 --tokens 8,-1"),
                          "bench ep: --tokens -1 is outside [1, 1048576]");
    // No tokens: nothing to dispatch, and a dispatch/a2a ratio of two empty exchanges.
    expect_one_line_error(run_epinfer("bench ep --ranks 2 --tokens 0"),
                          "bench ep: --tokens 0 is outside [1, 1048576]");
    expect_one_line_error(run_epinfer("bench ep --ranks 2 --tokens 8,0,64"),
                          "bench ep: --tokens 0 is outside [1, 1048576]");
    // More host memory than any machine has (about 52 TiB over 256 CPU ranks): refused before they start.
    expect_one_line_error(
        run_epinfer("bench ep --ranks 256 --tokens 1048576 --hidden 2048"),
        "bench ep: --tokens 1048576 × --hidden 2048 on 256 CPU rank(s) needs about 53248.0 GiB of "
        "host memory, more than 80 % of this machine's");
}

// Negative or non-decimal sizes are refused in one line naming the flag and the value (CLI11's strtoull took
// "-1" as 18446744073709551615, "010" as 8 and "0x10" as 16).
TEST(BenchCli, BenchCommSizesAreDecimalByteCounts) {
    expect_one_line_error(run_epinfer("bench comm --ranks 1 --min-bytes -1"),
                          "--min-bytes: '-1' is not a byte count");
    expect_one_line_error(run_epinfer("bench comm --ranks 1 --max-bytes -4K"),
                          "--max-bytes: '-4K' is not a byte count");
    expect_one_line_error(run_epinfer("bench comm --ranks 1 --min-bytes abc"),
                          "--min-bytes: 'abc' is not a byte count");
    expect_one_line_error(run_epinfer("bench comm --ranks 1 --min-bytes 0x10"),
                          "--min-bytes: '0x10' is not a byte count");
    expect_one_line_error(run_epinfer("bench comm --ranks 1 --min-bytes 1.5K"),
                          "--min-bytes: '1.5K' is not a byte count");
    // 20 digits were clamped to 2^64 − 1 by strtoull and reported as that.
    expect_one_line_error(run_epinfer("bench comm --ranks 1 --min-bytes 99999999999999999999"),
                          "--min-bytes: '99999999999999999999' is too large (at most 1G)");
    // Leading zeros are decimal: 010 is 10 bytes, not octal 8.
    expect_one_line_error(run_epinfer("bench comm --ranks 1 --min-bytes 010 --max-bytes 8"),
                          "--min-bytes 10 and --max-bytes 8");
    expect_one_line_error(run_epinfer("bench moe --seed -1"), "--seed: '-1' is negative");
    // bench moe's flags are checked in every build, before the GPU is looked for.
    expect_one_line_error(run_epinfer("bench moe --routing flat"), "--routing flat: expected uniform or zipf");
    expect_one_line_error(run_epinfer("bench moe --tokens 0"), "--tokens 0: must be at least 1");
    // Lists are split by the command, not CLI11 (which dropped empty items: '--tokens 8,' ran as 8).
    for (const char* value : {"8,", ",8", "8,,64", ""}) {
        expect_one_line_error(run_epinfer(std::string("bench moe --tokens '") + value + "'"),
                              std::string("bench moe: --tokens '") + value + "' has an empty item");
    }
    expect_one_line_error(run_epinfer("bench moe --tokens 8,x"),
                          "bench moe: --tokens '8,x': 'x' is not an integer");
    expect_one_line_error(run_epinfer("bench moe --routing uniform,"),
                          "bench moe: --routing 'uniform,' has an empty item");
    expect_one_line_error(run_epinfer("bench moe --profile-out x.json"), "--profile-out x.json needs --base-profile");
    expect_one_line_error(run_epinfer("bench moe --base-profile h200_sxm"),
                          "--base-profile is used only with --profile-out");
    // A usage error of a bench command points at that command's help.
    expect_one_line_error(run_epinfer("bench attention --cases"), "(see 'epinfer bench attention --help')");
    const auto dir = cli_scratch_dir("epinfer_bench_comm_sizes");
    const auto json_path = dir / "comm.json";
    const CliResult r = run_epinfer("bench comm --ranks 1 --min-bytes 0004 --max-bytes 1k --iters 1 --json " +
                                    json_path.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = read_json(json_path);
    ASSERT_TRUE(j.contains("results") && !j["results"].empty()) << read_text_file(json_path);
    EXPECT_EQ(j["results"].front()["size_bytes"], 4) << j.dump();
    EXPECT_EQ(j["results"][4]["size_bytes"], 1024) << j.dump();  // 4, 16, 64, 256, 1024 per op
    std::filesystem::remove_all(dir);
}

// A --cases value with an empty item or a name that is not exactly a case's is refused in one line naming
// the value as given, before any GPU work, in every build (CLI11's ',' delimiter dropped empty items: 'decode,'
// ran the decode cases, ',' said only "--cases: 1 required TEXT missing").
TEST(BenchCli, BenchAttentionCasesHaveNoEmptyOrUnknownNames) {
    const std::string expected = " (expected a comma-separated list of: default, decode, prefill, mla)";
    for (const char* value : {",", "decode,", "", ",,", ",decode", "decode,,mla"}) {
        expect_one_line_error(
            run_epinfer(std::string("bench attention --cases '") + value + "'"),
            std::string("bench attention: --cases '") + value + "' has an empty item" + expected);
    }
    expect_one_line_error(run_epinfer("bench attention --cases decode --cases mla,"),
                          "bench attention: --cases 'mla,' has an empty item" + expected);
    expect_one_line_error(run_epinfer("bench attention --cases DECODE"),
                          "bench attention: --cases 'DECODE': unknown case name 'DECODE'" + expected);
    expect_one_line_error(run_epinfer("bench attention --cases 'decode, prefill'"),
                          "bench attention: --cases 'decode, prefill': unknown case name ' prefill'" + expected);
}

// Bad flag values are refused in one line before any GPU work, in every build; without the CUDA backend, or
// without a GPU, the benchmark is refused in one line (with a GPU it runs for minutes: not here).
TEST(BenchCli, BenchAttentionRefusals) {
    expect_one_line_error(run_epinfer("bench attention --repeats 0"),
                          "bench attention: --repeats 0: must be in [1, 10000]");
    expect_one_line_error(run_epinfer("bench attention --repeats 10001"),
                          "bench attention: --repeats 10001: must be in [1, 10000]");
    expect_one_line_error(run_epinfer("bench attention --cases decode,gqa"),
                          "bench attention: --cases 'decode,gqa': unknown case name 'gqa' (expected a "
                          "comma-separated list of: default, decode, prefill, mla)");
    expect_one_line_error(run_epinfer("bench attention --device cpu"), "bench attention: --device cpu: only cuda");
    expect_one_line_error(run_epinfer("bench attention --kv-dtype fp16"),
                          "bench attention: --kv-dtype 'fp16': expected bf16 or fp32");
    expect_one_line_error(run_epinfer("bench attention --repeats x"), "--repeats");
#if EPINFER_WITH_CUDA
    if (epinfer::cuda::cuda_require_device().is_ok()) GTEST_SKIP() << "a GPU is present: the benchmark would run";
    expect_one_line_error(run_epinfer("bench attention --repeats 1"), "bench attention: no CUDA GPU");
#else
    expect_one_line_error(run_epinfer("bench attention --repeats 1"),
                          "bench attention: this epinfer was built without the CUDA backend");
#endif
}

TEST(BenchCli, CommStillRunsAsASubcommand) {
    const CliResult r = run_epinfer("bench comm --ranks 1 --min-bytes 1K --max-bytes 4K --iters 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("# epinfer bench comm"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("# epinfer bench:"), std::string::npos) << r.out;  // the serving bench did not run
}

}  // namespace
}  // namespace epinfer::testing
