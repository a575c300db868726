// `epinfer serve` as a user runs it (the built binary, EPINFER_CLI_PATH): --port 0 prints the chosen port,
// /health and a completion answer, SIGTERM drains and exits 0, a second signal cuts the drain short; a bad
// flag is one error line.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_runner.h"
#include "server_test_util.h"

extern char** environ;

namespace epinfer::testing {
namespace {

// A running `epinfer serve`, stdout and stderr in files; killed (SIGKILL) if a test leaves it running.
class ServeProcess {
public:
    explicit ServeProcess(const std::vector<std::string>& args) {
        dir_ = cli_scratch_dir("epinfer_serve_cli");
        err_path_ = (dir_ / "err").string();
        const std::string out_path = (dir_ / "out").string();
        std::vector<std::string> argv_strings = {EPINFER_CLI_PATH};
        argv_strings.insert(argv_strings.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& s : argv_strings) argv.push_back(s.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
        posix_spawn_file_actions_destroy(&actions);
    }
    ~ServeProcess() {
        if (pid_ > 0 && !exited_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        std::filesystem::remove_all(dir_);
    }
    pid_t pid() const { return pid_; }
    std::string err() const { return read_text_file(err_path_); }

    // The port of the "listening on http://127.0.0.1:PORT" line; -1 if it does not come within timeout_s
    // or the process exits first.
    int wait_for_port(double timeout_s) {
        const std::regex line(R"(epinfer serve: listening on http://127\.0\.0\.1:(\d+)\n)");
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
        while (std::chrono::steady_clock::now() < deadline) {
            std::smatch m;
            const std::string text = err();
            if (std::regex_search(text, m, line)) return std::stoi(m[1]);
            if (wait_exit(0.0) >= 0 || exited_) return -1;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return -1;
    }

    // The exit status once the process exits within timeout_s; -1 otherwise (or on a signal).
    int wait_exit(double timeout_s) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
        for (;;) {
            if (exited_) return exit_code_;
            int status = 0;
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                exited_ = true;
                exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
                return exit_code_;
            }
            if (std::chrono::steady_clock::now() >= deadline) return -1;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }

private:
    std::filesystem::path dir_;
    std::string err_path_;
    pid_t pid_ = -1;
    bool exited_ = false;
    int exit_code_ = -1;
};

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
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    EXPECT_TRUE(client.wait_started());
    EXPECT_EQ(kill(serve.pid(), SIGTERM), 0);
    while (serve.err().find("SIGTERM: draining") == std::string::npos && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
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
