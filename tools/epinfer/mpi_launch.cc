#include "mpi_launch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "comm/communicator.h"
#include "core/env.h"

namespace epinfer::cli {

Result<std::vector<std::string>> own_arguments() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    if (!in) return internal_error("cannot read /proc/self/cmdline");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    std::string current;
    for (char c : text) {
        if (c == '\0') {
            args.push_back(current);
            current.clear();
        } else {
            current += c;
        }
    }
    if (args.empty()) return internal_error("/proc/self/cmdline is empty");
    args.erase(args.begin());
    return args;
}

Result<std::string> find_mpirun() {
    const std::string configured = env_mpirun();
    if (!configured.empty()) {
        if (access(configured.c_str(), X_OK) == 0) return configured;
        return not_found(fmt::format("EPINFER_MPIRUN={} is not an executable file", configured));
    }
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "");
    for (std::string dir; std::getline(dirs, dir, ':');) {
        if (dir.empty()) continue;
        const std::string candidate = (std::filesystem::path(dir) / "mpirun").string();
        if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return not_found(
        "more than one rank needs mpirun (Open MPI), which is not on PATH: install openmpi-bin, set "
        "EPINFER_MPIRUN, "
        "or start epinfer under mpirun yourself");
}

std::vector<std::string> mpirun_argv(const std::string& mpirun, int num_ranks, const std::string& program,
                                     const std::vector<std::string>& args) {
    // Root is how containers and CI run; --oversubscribe allows more ranks than cores; one host needs
    // only the shared-memory transport.
    std::vector<std::string> argv = {mpirun,
                                     "--allow-run-as-root",
                                     "--oversubscribe",
                                     "--mca",
                                     "btl",
                                     "self,vader",
                                     "-np",
                                     std::to_string(num_ranks),
                                     program};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
}

Status relaunch_under_mpirun_if_needed(int num_ranks) {
    if (num_ranks <= 1 || launched_by_mpi()) return Status::ok();
    EPI_ASSIGN_OR_RETURN(std::string mpirun, find_mpirun());
    EPI_ASSIGN_OR_RETURN(std::vector<std::string> args, own_arguments());
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return internal_error("cannot resolve /proc/self/exe to relaunch under mpirun: " + ec.message());
    // argv[0] without its directory: Open MPI derives an installation prefix from an absolute argv[0],
    // and refuses "/" (mpirun found as /bin/mpirun on merged-/usr systems).
    std::vector<std::string> argv =
        mpirun_argv(std::filesystem::path(mpirun).filename().string(), num_ranks, self.string(), args);
    std::vector<char*> c_argv;
    for (std::string& a : argv) c_argv.push_back(a.data());
    c_argv.push_back(nullptr);
    std::fflush(stdout);
    std::fflush(stderr);
    execv(mpirun.c_str(), c_argv.data());
    return internal_error(fmt::format("exec {} failed: {}", mpirun, std::strerror(errno)));
}

}  // namespace epinfer::cli
