// A running `epinfer serve` (the built binary, EPINFER_CLI_PATH) as a child process of the test, for the
// tests that start it as a user would (tests/e2e/server/serve_cli_test.cc, tests/mpi/serve/).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_runner.h"

extern char** environ;

namespace epinfer::testing {

// A running `epinfer serve`, stdout and stderr in files; killed (SIGKILL) if a test leaves it running (under
// a layout that is mpirun's supervisor, and mpirun then gets SIGTERM and ends the ranks).
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

    // Whether stderr contains `needle` within timeout_s.
    bool wait_for_err(const std::string& needle, double timeout_s) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
        while (err().find(needle) == std::string::npos) {
            if (std::chrono::steady_clock::now() >= deadline) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return true;
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

}  // namespace epinfer::testing
