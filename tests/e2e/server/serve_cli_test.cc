// `epinfer serve` as a user runs it (the built binary, EPINFER_CLI_PATH): --port 0 prints the chosen port,
// /health and a completion answer, SIGTERM drains and exits 0, a second signal cuts the drain short; a bad
// flag is one error line.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "serve_process.h"
#include "server_test_util.h"

namespace epinfer::testing {
namespace {

TEST(ServeCli, ServesOnAFreePortAndExitsCleanlyOnSigterm) {
    ServeProcess serve({"serve", "--model", kTinyModel, "--port", "0", "--threads", "2", "--kv-cache-tokens", "4096",
                        "--served-model-name", "tiny"});
    ASSERT_GT(serve.pid(), 0);
    const int port = serve.wait_for_port(120.0);
    ASSERT_GT(port, 0) << serve.err();

    const HttpReply health = http_get(port, "/health");
    EXPECT_EQ(health.status, 200) << health.body;
    const HttpReply reply = http_post(port, "/v1/completions",
                                      R"({"model": "tiny", "prompt": [12, 7, 99], "max_tokens": 3, "temperature": 0,
                                          "ignore_eos": true})");
    ASSERT_EQ(reply.status, 200) << reply.body;
    const json j = json::parse(reply.body);
    EXPECT_EQ(j.at("choices").at(0).at("token_ids").size(), 3u);
    EXPECT_EQ(j.at("usage").at("total_tokens"), 6);

    ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
    EXPECT_EQ(serve.wait_exit(60.0), 0) << serve.err();
    const std::string err = serve.err();
    EXPECT_NE(err.find("SIGTERM: draining"), std::string::npos) << err;
    EXPECT_NE(err.find("epinfer serve: stopped"), std::string::npos) << err;
}

// SIGTERM starts a drain that would wait for the running request (--drain-timeout-s 600); SIGINT during it
// aborts that request (its stream ends with finish_reason "abort") and the server stops, exit status 0.
TEST(ServeCli, SecondSignalCutsTheDrainShort) {
    // Random weights at the tiny config with a large vocabulary: each step is slow enough that a request
    // of 500 tokens is still running when the signals come.
    const std::filesystem::path config_path = cli_scratch_dir("epinfer_serve_cut") / "config.json";
    json config = json::parse(read_text_file(kTinyModel + "/config.json"));
    config["vocab_size"] = int64_t{1} << 18;
    {
        std::ofstream out(config_path);
        out << config.dump();
    }
    ServeProcess serve({"serve", "--config", config_path.string(), "--random-weights", "--port", "0", "--threads",
                        "2", "--kv-cache-tokens", "4096", "--max-running", "1", "--drain-timeout-s", "600"});
    ASSERT_GT(serve.pid(), 0);
    const int port = serve.wait_for_port(120.0);
    ASSERT_GT(port, 0) << serve.err();

    const json body = {{"prompt", {5, 6, 7}}, {"max_tokens", 500}, {"temperature", 0}, {"ignore_eos", true},
                       {"stream", true}};
    BackgroundStream client(port, body);
    EXPECT_TRUE(client.wait_started());
    EXPECT_EQ(kill(serve.pid(), SIGTERM), 0);
    EXPECT_TRUE(serve.wait_for_err("SIGTERM: draining", 60.0)) << serve.err();
    EXPECT_EQ(kill(serve.pid(), SIGINT), 0);
    EXPECT_EQ(serve.wait_exit(120.0), 0) << serve.err();
    client.join();
    const StreamReply& stream = client.reply;
    std::filesystem::remove_all(config_path.parent_path());

    const std::string err = serve.err();
    EXPECT_NE(err.find("SIGTERM: draining (at most 600 s"), std::string::npos) << err;
    EXPECT_NE(err.find("SIGINT during the drain: cut short, aborting the requests left"), std::string::npos) << err;
    EXPECT_NE(err.find("epinfer serve: stopped"), std::string::npos) << err;
    EXPECT_EQ(stream.status, 200) << stream.transport_error;
    EXPECT_TRUE(stream.done);
    ASSERT_FALSE(stream.chunks.empty());
    const json& last = stream.chunks.back();
    EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "abort") << last.dump();
    EXPECT_LT(last.at("usage").at("completion_tokens").get<int64_t>(), 500) << last.dump();
}

TEST(ServeCli, BadFlagIsOneErrorLine) {
    const CliResult r = run_epinfer("serve --model " + kTinyModel + " --port 70000");
    expect_one_line_error(r, "--port must be in [0, 65535], got 70000");
    // A dotted number that is no IPv4 address: refused before the model loads (no "ready" line first).
    expect_one_line_error(run_epinfer("serve --model " + kTinyModel + " --port 0 --host 999.1.1.1"),
                          "--host 999.1.1.1: not an IPv4 address");
    // A name that does not resolve: refused before the model loads too.
    expect_one_line_error(run_epinfer("serve --model " + kTinyModel + " --port 0 --host not_a_host"),
                          "--host not_a_host: not an address, nor a name that resolves");
    const CliResult t = run_epinfer("serve --model " + kTinyModel + " --request-timeout-s soon");
    expect_one_line_error(t, "--request-timeout-s 'soon' is not a finite number");
    const CliResult tp = run_epinfer("serve --model " + kTinyModel + " --tp 0");
    expect_one_line_error(tp, "--tp must be ≥ 1, got 0");
    expect_one_line_error(run_epinfer("serve --model " + kTinyModel + " --served-model-name ''"),
                          "--served-model-name must not be empty");
    expect_one_line_error(run_epinfer("serve --model " + kTinyModel + " --drain-timeout-s -1"),
                          "--drain-timeout-s must be ≥ 0, got -1");
}

}  // namespace
}  // namespace epinfer::testing
