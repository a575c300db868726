// Runs the built `epinfer` binary (EPINFER_CLI_PATH) as a user would and captures what it prints.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace epinfer::testing {

struct CliResult {
    int exit_code = -1;
    std::string out;       // stdout
    std::string err;       // stderr
    double seconds = 0.0;  // wall time of the whole command
};

inline std::string read_text_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// A folder of this test process under the temp dir, created on first use: `name` keeps tests apart.
inline std::filesystem::path cli_scratch_dir(const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir;
}

struct CliOptions {
    std::string env;  // assignments put before the command, e.g. "EPINFER_PROFILES_DIR='/x'"
    std::string cwd;  // working directory; empty = the test's own
};

// The epinfer binary the tests run: $EPINFER_CLI when set (a test binary carried to another machine with
// its epinfer, bench/gpu_bins.sh), else the one built next to the tests (EPINFER_CLI_PATH).
inline std::string epinfer_cli_path() {
    const char* carried = std::getenv("EPINFER_CLI");
    return carried != nullptr && carried[0] != '\0' ? std::string(carried) : std::string(EPINFER_CLI_PATH);
}

// Runs `epinfer ARGS` (shell words, quoted where needed); stdout and stderr go through files in a scratch
// folder named after the running test.
inline CliResult run_epinfer(const std::string& args, const CliOptions& options = {}) {
    const auto dir = cli_scratch_dir(std::string("epinfer_cli_") +
                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::string cmd;
    if (!options.cwd.empty()) cmd += "cd '" + options.cwd + "' && ";
    if (!options.env.empty()) cmd += options.env + " ";
    // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on a chain of "'" + std::string.
    for (const std::string& piece :
         {std::string("'"), epinfer_cli_path(), std::string("' "), args, std::string(" > '"),
          (dir / "out").string(), std::string("' 2> '"), (dir / "err").string(), std::string("'")}) {
        cmd += piece;
    }
    const auto start = std::chrono::steady_clock::now();
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_text_file(dir / "out");
    r.err = read_text_file(dir / "err");
    std::filesystem::remove_all(dir);
    return r;
}

// Exit status 1, exactly one stderr line "epinfer: error: ..." that contains `needle`, nothing on stdout.
inline void expect_one_line_error(const CliResult& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("epinfer: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "'" << needle << "' not in: " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace epinfer::testing
