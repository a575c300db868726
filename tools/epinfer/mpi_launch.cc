#include "mpi_launch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include <regex>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

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

// Open MPI 4's mpirun follows a rank's non-zero exit (after the rank's own one-line error) with two boxed
// messages, "Primary job terminated normally, but 1 process returned a non-zero exit code..." and "mpirun
// detected that one or more processes exited with non-zero status...", which add nothing to that line and
// the exit status. mpirun has no switch for these two only: -q (orte_execute_quiet, also passed to the
// ranks) silences every Open MPI message, a rank killed by a signal and MPI's own errors in the ranks
// included. So mpirun's stderr passes through this filter, which drops exactly those boxes, and an
// "epinfer: error: " line that repeats one already passed on (every rank failing the same way). The box of a
// rank killed by a signal ("mpirun noticed that process rank 1 with PID 0 on node h exited on signal 9
// (Killed).") becomes the one error line the rank could not write.
class MpirunStderrFilter {
public:
    // Takes bytes read from mpirun's stderr; returns those to write now (whole lines, boxes once closed).
    std::string feed(std::string_view bytes) {
        std::string out;
        partial_.append(bytes);
        size_t begin = 0;
        for (size_t end; (end = partial_.find('\n', begin)) != std::string::npos; begin = end + 1)
            take_line(partial_.substr(begin, end + 1 - begin), out);
        partial_.erase(0, begin);
        return out;
    }
    // Returns what is held: a line without its newline yet, a box not closed (mpirun writes a box at once,
    // so one still open after a pause is not a box).
    std::string flush() {
        std::string out;
        for (const std::string& line : box_) out += line;
        box_.clear();
        out += partial_;
        partial_.clear();
        return out;
    }

private:
    static constexpr size_t kMaxBoxLines = 64;

    // A box's top or bottom line: dashes only.
    static bool is_rule(std::string_view line) {
        while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
        return line.size() >= 20 && line.find_first_not_of('-') == std::string_view::npos;
    }
    static bool is_exit_status_box(const std::string& text) {
        const auto has = [&](const char* words) { return text.find(words) != std::string::npos; };
        return (has("terminated normally, but") && has("non-zero exit code")) ||
               has("detected that one or more processes exited with non-zero status");
    }

    void take_line(std::string line, std::string& out) {
        if (box_.empty() && !is_rule(line)) {
            if (line.starts_with("epinfer: error: ") && !error_lines_.insert(line).second) return;
            out += line;
            return;
        }
        const bool closes = !box_.empty() && is_rule(line);
        box_.push_back(std::move(line));
        if (!closes && box_.size() < kMaxBoxLines) return;
        std::string text;
        for (const std::string& l : box_) text += l;
        box_.clear();
        if (closes && is_exit_status_box(text)) return;
        static const std::regex killed(
            R"(mpirun noticed that process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+) \(([^)]*)\))");
        std::smatch m;
        if (closes && std::regex_search(text, m, killed)) {
            out += fmt::format("epinfer: error: rank {} (on {}) was killed by signal {} ({})\n", m[1].str(),
                               m[2].str(), m[3].str(), m[4].str());
            return;
        }
        out += text;
    }

    std::string partial_;
    std::vector<std::string> box_;  // from a rule line on, until the next rule line
    std::set<std::string> error_lines_;  // "epinfer: error: " lines passed on
};

void write_stderr(const std::string& text) {
    for (size_t done = 0; done < text.size();) {
        const ssize_t n = write(STDERR_FILENO, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        done += static_cast<size_t>(n);
    }
}

// Copies mpirun's stderr (the read end `fd`, closed here) to this process's stderr through
// MpirunStderrFilter until its end, or at most kStderrDrainS after `mpirun_exited` is set (a rank left
// behind may still hold it open).
constexpr double kStderrDrainS = 2.0;
void forward_mpirun_stderr(int fd, const std::atomic<bool>& mpirun_exited) {
    using Clock = std::chrono::steady_clock;
    MpirunStderrFilter filter;
    std::optional<Clock::time_point> exited_at;
    char buffer[4096];
    for (;;) {
        if (!exited_at && mpirun_exited.load()) exited_at = Clock::now();
        if (exited_at && std::chrono::duration<double>(Clock::now() - *exited_at).count() > kStderrDrainS)
            break;
        pollfd p{fd, POLLIN, 0};
        const int ready = poll(&p, 1, 200);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) {  // a pause: what is held goes out
            write_stderr(filter.flush());
            continue;
        }
        const ssize_t n = ready > 0 ? read(fd, buffer, sizeof(buffer)) : -1;
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        write_stderr(filter.feed(std::string_view(buffer, static_cast<size_t>(n))));
    }
    write_stderr(filter.flush());
    close(fd);
}

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
    // mpirun's stderr, read by forward_mpirun_stderr.
    int err_pipe[2];
    if (pipe2(err_pipe, O_CLOEXEC) != 0) {
        const int pipe_errno = errno;
        close(exec_pipe[0]);
        close(exec_pipe[1]);
        return internal_error(fmt::format("pipe to start {} failed: {}", mpirun, std::strerror(pipe_errno)));
    }
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
        if (dup2(err_pipe[1], STDERR_FILENO) < 0) _exit(127);
        execv(mpirun.c_str(), c_argv.data());
        const int exec_errno = errno;
        (void)!write(exec_pipe[1], &exec_errno, sizeof(exec_errno));
        _exit(127);
    }
    close(exec_pipe[1]);
    close(err_pipe[1]);
    if (pid < 0) {
        const int fork_errno = errno;
        close(exec_pipe[0]);
        close(err_pipe[0]);
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
        close(err_pipe[0]);
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
        return internal_error(fmt::format("exec {} failed: {}", mpirun, std::strerror(exec_errno)));
    }
    // Started with the stop signals blocked (as this thread), so that they reach supervise_mpirun.
    std::atomic<bool> mpirun_exited{false};
    std::thread forwarder(forward_mpirun_stderr, err_pipe[0], std::cref(mpirun_exited));
    const int exit_status = supervise_mpirun(pid, watched, stop);
    mpirun_exited.store(true);
    forwarder.join();
    std::exit(exit_status);
}

}  // namespace epinfer::cli
