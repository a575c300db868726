#include "mpi_launch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
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
                                     "--stdin",  // in a process group of its own, mpirun must not read a terminal
                                     "none",
                                     "-np",
                                     std::to_string(num_ranks),
                                     program};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
}

namespace {

// After the process group of a mpirun that outlived its exit timeout got SIGTERM, how long before SIGKILL.
constexpr double kKillGraceS = 10.0;

const char* stop_signal_name(int signal_number) { return signal_number == SIGINT ? "SIGINT" : "SIGTERM"; }

// Waits for mpirun (pid, the leader of its own process group) to exit and returns the supervisor's exit
// status. `watched` (SIGTERM, SIGINT, SIGCHLD) is blocked in this thread and taken with sigtimedwait.
int supervise_mpirun(pid_t pid, const sigset_t& watched, const MpirunStop& stop) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    const auto elapsed_s = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    std::optional<double> deadline_s;  // elapsed_s() by which mpirun must exit; none before a stop signal
    int first_signal = 0;
    bool sent_sigterm = false;  // to its group, at the deadline; SIGKILL follows kKillGraceS later
    for (;;) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        // Wakes for a signal (SIGCHLD: mpirun exited), the deadline, or at least every second.
        const double wait_s = std::clamp(deadline_s ? *deadline_s - elapsed_s() : 1.0, 0.001, 1.0);
        const timespec wait{static_cast<time_t>(wait_s), static_cast<long>(std::fmod(wait_s, 1.0) * 1e9)};
        const int sig = sigtimedwait(&watched, nullptr, &wait);
        if (sig == SIGTERM || sig == SIGINT) {
            kill(pid, stop.signal);
            if (first_signal == 0) {
                first_signal = sig;
                deadline_s = elapsed_s() + std::max(0.0, stop.exit_timeout_s);
            }
        }
        if (!deadline_s || elapsed_s() < *deadline_s) continue;
        if (!sent_sigterm) {
            std::fprintf(stderr, "epinfer: mpirun did not exit within %g s of %s: sending it SIGTERM\n",
                         stop.exit_timeout_s, stop_signal_name(first_signal));
            killpg(pid, SIGTERM);
            deadline_s = elapsed_s() + kKillGraceS;
            sent_sigterm = true;
        } else {
            std::fprintf(stderr, "epinfer: mpirun did not exit within %g s of SIGTERM: sending it SIGKILL\n",
                         kKillGraceS);
            killpg(pid, SIGKILL);
            deadline_s.reset();  // SIGCHLD comes
        }
        std::fflush(stderr);
    }
}

}  // namespace

Status relaunch_under_mpirun_if_needed(int num_ranks, const MpirunStop& stop) {
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

    // The child reports a failed exec through this pipe (closed on a successful one).
    int exec_pipe[2];
    if (pipe2(exec_pipe, O_CLOEXEC) != 0)
        return internal_error(fmt::format("pipe to start {} failed: {}", mpirun, std::strerror(errno)));
    // Blocked from before the fork, so that no stop signal is lost before the supervisor waits for it;
    // the child unblocks them before exec.
    sigset_t watched, previous;
    sigemptyset(&watched);
    sigaddset(&watched, SIGTERM);
    sigaddset(&watched, SIGINT);
    sigaddset(&watched, SIGCHLD);
    pthread_sigmask(SIG_BLOCK, &watched, &previous);
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t supervisor = getpid();
    const pid_t pid = fork();
    if (pid == 0) {  // only async-signal-safe calls from here to exec
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != supervisor) _exit(127);  // the supervisor died before prctl
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
        execv(mpirun.c_str(), c_argv.data());
        const int exec_errno = errno;
        (void)!write(exec_pipe[1], &exec_errno, sizeof(exec_errno));
        _exit(127);
    }
    close(exec_pipe[1]);
    if (pid < 0) {
        const int fork_errno = errno;
        close(exec_pipe[0]);
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
        return internal_error(fmt::format("fork to start {} failed: {}", mpirun, std::strerror(fork_errno)));
    }
    setpgid(pid, pid);  // as the child does, whichever runs first (after its exec this fails, harmlessly)
    int exec_errno = 0;
    ssize_t n = 0;
    do {
        n = read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
    } while (n < 0 && errno == EINTR);
    close(exec_pipe[0]);
    if (n > 0) {
        waitpid(pid, nullptr, 0);
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
        return internal_error(fmt::format("exec {} failed: {}", mpirun, std::strerror(exec_errno)));
    }
    std::exit(supervise_mpirun(pid, watched, stop));
}

}  // namespace epinfer::cli
