// `epinfer serve --tp 2` started outside MPI, as a user runs it: the process is mpirun's supervisor
// (tools/epinfer/mpi_launch.h), which turns SIGTERM into SIGUSR1 for every rank. A SIGTERM drains: the
// running stream gets all its tokens, new requests get 503 (or no connection once the server closed), and
// every rank and the supervisor exit 0; a second SIGTERM cuts the drain short (finish_reason "abort"). A
// SIGTERM sent to a follower rank itself ends the run with a non-zero exit. A follower that is stopped
// (SIGSTOP) while a request runs turns /health into 503 after --health-stall-s, and 200 once it goes on. A
// follower killed by a signal is one error line.
// Run by ctest as mpi_serve_drain_tp2 (label MPI; the test starts mpirun itself).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_runner.h"
#include "serve_process.h"
#include "server_test_util.h"

namespace epinfer::testing {
namespace {

const std::string kQwenTiny = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/qwen3_moe_tiny";

// Random weights at qwen3_moe_tiny's config with a large vocabulary (tens of ms per step) and a longer
// context, so that a request is still running when the signals come; the config file lives in the returned
// folder.
std::filesystem::path write_slow_config() {
    const std::filesystem::path dir = cli_scratch_dir("epinfer_serve_mpi_config");
    json config = json::parse(read_text_file(kQwenTiny + "/config.json"));
    config["vocab_size"] = int64_t{1} << 20;
    config["max_position_embeddings"] = 4096;
    std::ofstream(dir / "config.json") << config.dump();
    return dir;
}

std::vector<std::string> serve_tp2_args(const std::filesystem::path& config_dir) {
    return {"serve",
            "--config",
            (config_dir / "config.json").string(),
            "--random-weights",
            "--tp",
            "2",
            "--port",
            "0",
            "--threads",
            "1",
            "--kv-cache-tokens",
            "4096",
            "--max-running",
            "2",
            "--drain-timeout-s",
            "600"};
}

json stream_body(int64_t max_tokens) {
    return {{"prompt", {5, 6, 7}},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"ignore_eos", true},
            {"stream", true}};
}

// The pids of the children of `parent` (from /proc/PID/stat).
std::vector<pid_t> child_pids(pid_t parent) {
    std::vector<pid_t> children;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
        const std::string name = entry.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream stat(entry.path() / "stat");
        std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        const size_t paren = text.rfind(')');
        if (paren == std::string::npos) continue;
        std::istringstream fields(text.substr(paren + 1));
        std::string state;
        pid_t ppid = 0;
        if (fields >> state >> ppid && ppid == parent)
            children.push_back(static_cast<pid_t>(std::stoi(name)));
    }
    return children;
}

// The pid of world rank `rank` of the supervisor's mpirun (its child with OMPI_COMM_WORLD_RANK=rank in
// its environment); -1 if there is none.
pid_t rank_pid(pid_t supervisor, int rank) {
    const std::string wanted = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
    for (const pid_t mpirun : child_pids(supervisor)) {
        for (const pid_t child : child_pids(mpirun)) {
            std::ifstream environ_file("/proc/" + std::to_string(child) + "/environ");
            for (std::string var; std::getline(environ_file, var, '\0');)
                if (var == wanted) return child;
        }
    }
    return -1;
}

int64_t streamed_tokens(const StreamReply& stream) {
    int64_t n = 0;
    for (const json& chunk : stream.chunks) n += chunk.at("choices").at(0).at("token_ids").size();
    return n;
}

TEST(ServeMpi, SigtermDrainsEveryRankAndExitsZero) {
    const std::filesystem::path config_dir = write_slow_config();
    ServeProcess serve(serve_tp2_args(config_dir));
    ASSERT_GT(serve.pid(), 0);
    const int port = serve.wait_for_port(240.0);
    ASSERT_GT(port, 0) << serve.err();

    constexpr int64_t kMaxTokens = 600;
    BackgroundStream client(port, stream_body(kMaxTokens));
    EXPECT_TRUE(client.wait_started());
    ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
    EXPECT_TRUE(serve.wait_for_err(
        "epinfer serve: SIGTERM/SIGINT at mpirun's supervisor (SIGUSR1): draining (at most 600 s", 120.0))
        << serve.err();
    // Draining, or (the stream done) already closed: no new work either way.
    const HttpReply late = http_post(port, "/v1/completions", stream_body(4).dump());
    EXPECT_TRUE(late.status == 503 || late.status == -1) << late.status << " " << late.body;
    if (late.status == 503) {
        EXPECT_NE(late.body.find("the server is shutting down"), std::string::npos) << late.body;
    }

    EXPECT_EQ(serve.wait_exit(300.0), 0) << serve.err();
    client.join();
    std::filesystem::remove_all(config_dir);
    const StreamReply& stream = client.reply;
    EXPECT_EQ(stream.status, 200) << stream.transport_error;
    EXPECT_TRUE(stream.done);
    EXPECT_FALSE(stream.malformed);
    ASSERT_FALSE(stream.chunks.empty());
    const json& last = stream.chunks.back();
    EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "length") << last.dump();
    EXPECT_EQ(last.at("usage").at("completion_tokens"), kMaxTokens) << last.dump();
    EXPECT_EQ(streamed_tokens(stream), kMaxTokens);
    const std::string err = serve.err();
    EXPECT_NE(err.find("epinfer serve: stopped"), std::string::npos) << err;
    EXPECT_EQ(err.find("epinfer: error"), std::string::npos) << err;
    EXPECT_EQ(err.find("mpirun did not exit"), std::string::npos) << err;
}

// A second SIGTERM at the supervisor reaches the ranks as a second SIGUSR1: the drain (600 s) is cut, the
// running stream ends with finish_reason "abort", and everything still exits 0.
TEST(ServeMpi, SecondSigtermCutsTheDrainShort) {
    const std::filesystem::path config_dir = write_slow_config();
    ServeProcess serve(serve_tp2_args(config_dir));
    ASSERT_GT(serve.pid(), 0);
    const int port = serve.wait_for_port(240.0);
    ASSERT_GT(port, 0) << serve.err();

    constexpr int64_t kMaxTokens = 2000;
    BackgroundStream client(port, stream_body(kMaxTokens));
    EXPECT_TRUE(client.wait_started());
    ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
    EXPECT_TRUE(serve.wait_for_err("(SIGUSR1): draining", 120.0)) << serve.err();
    ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
    EXPECT_EQ(serve.wait_exit(300.0), 0) << serve.err();
    client.join();
    std::filesystem::remove_all(config_dir);

    const std::string err = serve.err();
    EXPECT_NE(err.find("(SIGUSR1) during the drain: cut short, aborting the requests left"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("epinfer serve: stopped"), std::string::npos) << err;
    const StreamReply& stream = client.reply;
    EXPECT_EQ(stream.status, 200) << stream.transport_error;
    EXPECT_TRUE(stream.done);
    ASSERT_FALSE(stream.chunks.empty());
    const json& last = stream.chunks.back();
    EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "abort") << last.dump();
    EXPECT_LT(last.at("usage").at("completion_tokens").get<int64_t>(), kMaxTokens) << last.dump();
}

// A SIGTERM that comes while the ranks load is kept until they are up: the server then stops at once, every
// rank and the supervisor exit 0 (it used to end the ranks through SIGUSR1's default action, exit 138).
// One layer of Qwen3-30B-A3B's shape (1.7 GiB of random weights per rank, one thread) keeps them loading
// for seconds after mpirun has started them.
TEST(ServeMpi, SigtermWhileTheRanksLoadStopsOnceUp) {
    const std::vector<std::string> args = {"serve",
                                           "--config",
                                           std::string(EPINFER_TEST_DATA_DIR) + "/configs/qwen3_30b_a3b.json",
                                           "--random-weights",
                                           "--num-layers",
                                           "1",
                                           "--tp",
                                           "2",
                                           "--port",
                                           "0",
                                           "--threads",
                                           "1",
                                           "--kv-cache-tokens",
                                           "4096"};
    ServeProcess serve(args);
    ASSERT_GT(serve.pid(), 0);
    std::this_thread::sleep_for(std::chrono::seconds(2));  // mpirun has started the ranks, which are loading
    ASSERT_EQ(serve.err().find("listening"), std::string::npos) << "up before the signal: " << serve.err();
    ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
    EXPECT_EQ(serve.wait_exit(300.0), 0) << serve.err();
    const std::string err = serve.err();
    EXPECT_NE(err.find("(SIGUSR1): draining"), std::string::npos) << err;
    EXPECT_NE(err.find("epinfer serve: stopped"), std::string::npos) << err;
    EXPECT_EQ(err.find("epinfer: error"), std::string::npos) << err;
}

// A follower rank that stops answering (SIGSTOP) while a request runs: rank 0's step waits in a collective
// (up to EPINFER_COMM_TIMEOUT_S), so /health answers 503 once --health-stall-s (1 s) has passed; after
// SIGCONT the step ends, /health is 200 again and the stream runs to its end.
TEST(ServeMpi, StoppedFollowerMakesHealth503) {
    const std::filesystem::path config_dir = write_slow_config();
    std::vector<std::string> args = serve_tp2_args(config_dir);
    args.insert(args.end(), {"--health-stall-s", "1"});
    ServeProcess serve(args);
    ASSERT_GT(serve.pid(), 0);
    const int port = serve.wait_for_port(240.0);
    ASSERT_GT(port, 0) << serve.err();
    EXPECT_EQ(http_get(port, "/health").status, 200);
    const pid_t follower = rank_pid(serve.pid(), 1);
    ASSERT_GT(follower, 0);

    constexpr int64_t kMaxTokens = 300;
    BackgroundStream client(port, stream_body(kMaxTokens));
    ASSERT_TRUE(client.wait_started());
    ASSERT_EQ(kill(follower, SIGSTOP), 0);
    const HttpReply stalled = wait_for_health(port, /*healthy=*/false, /*timeout_s=*/20.0, /*poll_ms=*/100);
    ASSERT_EQ(kill(follower, SIGCONT), 0);
    expect_json_error(stalled, 503, "the engine has been in one step for ");
    EXPECT_NE(stalled.body.find("(over --health-stall-s 1 s): a rank may be stuck"), std::string::npos)
        << stalled.body;
    const HttpReply resumed = wait_for_health(port, /*healthy=*/true, /*timeout_s=*/20.0, /*poll_ms=*/100);
    EXPECT_EQ(resumed.status, 200) << resumed.body;
    client.join();
    std::filesystem::remove_all(config_dir);
    const StreamReply& stream = client.reply;
    EXPECT_EQ(stream.status, 200) << stream.transport_error;
    EXPECT_TRUE(stream.done);
    ASSERT_FALSE(stream.chunks.empty());
    const json& last = stream.chunks.back();
    EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "length") << last.dump();
    EXPECT_EQ(streamed_tokens(stream), kMaxTokens);
    ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
    EXPECT_EQ(serve.wait_exit(120.0), 0) << serve.err();
}

// A SIGTERM sent to a follower itself (not through the supervisor) used to be ignored. Now the follower
// waits --drain-timeout-s + 10 s for rank 0 to stop the run (as when the whole job gets it, from srun or
// scancel), then ends it: one line naming the rank and the signal, and a non-zero exit of everything.
TEST(ServeMpi, SigtermToAFollowerEndsTheRun) {
    ServeProcess serve({"serve", "--model", kTinyModel, "--tp", "2", "--port", "0", "--threads", "1",
                        "--drain-timeout-s", "0"});
    ASSERT_GT(serve.pid(), 0);
    ASSERT_GT(serve.wait_for_port(240.0), 0) << serve.err();
    const pid_t follower = rank_pid(serve.pid(), 1);
    ASSERT_GT(follower, 0);
    ASSERT_EQ(kill(follower, SIGTERM), 0);
    EXPECT_TRUE(serve.wait_for_err(
        "epinfer serve: rank 1/2: SIGTERM: waiting at most 10 s for rank 0 to stop the run", 30.0))
        << serve.err();
    const int status = serve.wait_exit(120.0);
    EXPECT_GT(status, 0) << serve.err();
    EXPECT_NE(serve.err().find(
                  "epinfer: error: rank 1/2: SIGTERM: ending the run (rank 0 did not stop it within 10 s)\n"),
              std::string::npos)
        << serve.err();
}

// A second SIGTERM or SIGINT at the follower ends the run at once.
TEST(ServeMpi, SecondSignalToAFollowerEndsTheRunAtOnce) {
    ServeProcess serve({"serve", "--model", kTinyModel, "--tp", "2", "--port", "0", "--threads", "1"});
    ASSERT_GT(serve.pid(), 0);
    ASSERT_GT(serve.wait_for_port(240.0), 0) << serve.err();
    const pid_t follower = rank_pid(serve.pid(), 1);
    ASSERT_GT(follower, 0);
    ASSERT_EQ(kill(follower, SIGTERM), 0);
    EXPECT_TRUE(serve.wait_for_err("rank 1/2: SIGTERM: waiting at most 40 s", 30.0)) << serve.err();
    ASSERT_EQ(kill(follower, SIGINT), 0);
    EXPECT_GT(serve.wait_exit(20.0), 0) << serve.err();  // not the 40 s
    EXPECT_NE(serve.err().find("epinfer: error: rank 1/2: SIGINT: ending the run\n"), std::string::npos)
        << serve.err();
}

// A rank killed by a signal cannot write its error line: the supervisor writes it in place of mpirun's boxed
// report, and exits non-zero.
TEST(ServeMpi, KilledFollowerIsOneErrorLine) {
    ServeProcess serve({"serve", "--model", kTinyModel, "--tp", "2", "--port", "0", "--threads", "1"});
    ASSERT_GT(serve.pid(), 0);
    ASSERT_GT(serve.wait_for_port(240.0), 0) << serve.err();
    const pid_t follower = rank_pid(serve.pid(), 1);
    ASSERT_GT(follower, 0);
    ASSERT_EQ(kill(follower, SIGKILL), 0);
    EXPECT_GT(serve.wait_exit(60.0), 0) << serve.err();
    const std::string err = serve.err();
    EXPECT_NE(err.find("epinfer: error: rank 1 (on "), std::string::npos) << err;
    EXPECT_NE(err.find(") was killed by signal 9 (Killed)\n"), std::string::npos) << err;
    EXPECT_EQ(err.find("mpirun noticed"), std::string::npos) << err;
    EXPECT_EQ(err.find("-----"), std::string::npos) << err;
}

}  // namespace
}  // namespace epinfer::testing
