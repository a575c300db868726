// `epinfer serve` as a user runs it (the built binary, EPINFER_CLI_PATH): --port 0 prints the chosen port,
// /health and a completion answer, SIGTERM drains and exits 0, a second signal cuts the drain short; a bad
// flag is one error line.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
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

// A client that sends its request headers a line a second holds a connection thread the HTTP library cannot
// interrupt; SIGTERM still ends the server: after the drain and a bounded wait for connections (8 s), it
// says so and exits 0 (it stayed up as long as the client kept sending).
TEST(ServeCli, ExitsOnSigtermWhileAClientTricklesItsHeaders) {
    ServeProcess serve({"serve", "--model", kTinyModel, "--port", "0", "--threads", "2", "--kv-cache-tokens",
                        "4096", "--drain-timeout-s", "1"});
    ASSERT_GT(serve.pid(), 0);
    const int port = serve.wait_for_port(120.0);
    ASSERT_GT(port, 0) << serve.err();
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string start = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
    ASSERT_EQ(send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
    std::atomic<bool> done{false};
    std::thread trickle([&] {
        for (int i = 0; i < 60 && !done.load(); ++i) {
            const std::string line = "X-" + std::to_string(i) + ": a\r\n";
            if (send(fd, line.data(), line.size(), MSG_NOSIGNAL) <= 0) break;
            std::this_thread::sleep_for(std::chrono::seconds(1));
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
    const int code = serve.wait_exit(30.0);
    done.store(true);
    trickle.join();
    close(fd);
    EXPECT_EQ(code, 0) << serve.err();
    EXPECT_NE(serve.err().find("a connection is still sending its request: stopped without it"),
              std::string::npos)
        << serve.err();
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
    // Past the bound a deadline would overflow into the past (core/timeout.h): refused, not a timeout at
    // once. (The empty --served-model-name, checked after the timeouts, ends the command should the bound
    // not: no server is started.)
    for (const char* flag : {"--request-timeout-s", "--drain-timeout-s", "--health-stall-s"}) {
        expect_one_line_error(
            run_epinfer("serve --model " + kTinyModel + " " + flag + " 1e10 --served-model-name ''"),
            std::string(flag) + " must be ≤ 1e+09 s, got 1e10");
    }
    // A port in use: refused before the model loads (one line, no "ready" line first).
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(fd, 1), 0);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const int taken = ntohs(addr.sin_port);
    expect_one_line_error(run_epinfer("serve --model " + kTinyModel + " --port " + std::to_string(taken)),
                          "--port " + std::to_string(taken) + ": cannot listen on 127.0.0.1:" +
                              std::to_string(taken) + " (Address already in use)");
    close(fd);
}

}  // namespace
}  // namespace epinfer::testing
