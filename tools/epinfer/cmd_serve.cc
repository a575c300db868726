// epinfer serve: an OpenAI-compatible HTTP server over token ids (src/server/http_server.h).
//
//   epinfer serve --model DIR [model setup flags: --device --threads --tp --ep --dp --pp --kv-cache-tokens
//                 --kv-cache-dtype --block-size --max-running --max-step-tokens --max-waiting
//                 --memory-fraction]
//                 [--host 127.0.0.1] [--port 8000] [--served-model-name NAME] [--max-body-bytes N]
//                 [--request-timeout-s S] [--drain-timeout-s S] [--http-threads N] [--health-stall-s S]
//
// Rank 0 serves; under a layout the other ranks run the driver's engine steps (Engine::run_follower).
// When ready, one stderr line "epinfer serve: listening on http://HOST:PORT" (--port 0: a free port, the
// line names it; an IPv6 HOST in brackets). SIGTERM or SIGINT: new requests get 503, running ones finish
// (at most --drain-timeout-s, then they are aborted), the followers are released, exit status 0. A second
// SIGTERM or SIGINT during that drain cuts it short: the requests left are aborted at the next engine step
// (their clients get finish_reason "abort"), then the same orderly stop, exit status 0 (as when
// --drain-timeout-s runs out).
// A fatal engine error stops the server with "epinfer: error: ..." and exit status 1.
// Under a layout started outside MPI, the process started is mpirun's supervisor (mpi_launch.h): it
// turns each SIGTERM or SIGINT into a SIGUSR1 that mpirun forwards to every rank (a SIGTERM to mpirun
// would make it kill the ranks), and every rank takes SIGUSR1 as it takes SIGTERM: rank 0 drains (the
// first) or cuts the drain (the next), the followers run on until rank 0's shutdown releases them. The
// supervisor exits with mpirun's status, 0 after that orderly stop; if mpirun has not exited
// --drain-timeout-s + 60 s after the first signal, the supervisor ends it (SIGTERM, then SIGKILL).
// A stop signal that comes while the ranks load is kept: the server stops as soon as it is up, exit 0.
// A SIGTERM or SIGINT sent to a follower itself ends the whole run, exit 1 (run_follower below).
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "commands.h"
#include "core/timeout.h"
#include "engine/engine.h"
#include "flag_values.h"
#include "model_setup.h"
#include "server/http_server.h"

namespace epinfer::cli {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;       // the last SIGTERM, SIGINT or SIGUSR1
volatile std::sig_atomic_t g_num_stop_signals = 0;  // how many have come
volatile std::sig_atomic_t g_own_signal = 0;        // the last SIGTERM or SIGINT (not mpirun's SIGUSR1)
volatile std::sig_atomic_t g_num_own_signals = 0;   // how many have come

// The stop signals are blocked while it runs (install_stop_handlers), so the counts are not torn.
extern "C" void on_stop_signal(int signal_number) {
    g_stop_signal = signal_number;
    g_num_stop_signals = g_num_stop_signals + 1;
    if (signal_number == SIGUSR1) return;
    g_own_signal = signal_number;
    g_num_own_signals = g_num_own_signals + 1;
}

const char* signal_name(int signal_number) {
    return signal_number == SIGINT    ? "SIGINT"
           : signal_number == SIGUSR1 ? "SIGTERM/SIGINT at mpirun's supervisor (SIGUSR1)"
                                      : "SIGTERM";
}

// From the first stop signal, how long mpirun's supervisor waits beyond --drain-timeout-s for the ranks to
// exit: the responses being written, the engine's shutdown and MPI's teardown.
constexpr double kMpirunExitMarginS = 60.0;
// From a SIGTERM or SIGINT sent to a follower itself, how long it waits beyond --drain-timeout-s for rank 0
// to stop the run (rank 0 got it too, e.g. from srun or scancel) before it ends the run.
constexpr double kFollowerStopMarginS = 10.0;

struct ServeFlags {
    ModelSetupFlags setup;
    std::string host = "127.0.0.1";
    std::string port = "8000";
    std::optional<std::string>
        served_model_name;  // default: --model (or --config with --random-weights) as given
    std::string max_body_bytes = "1048576";
    std::string request_timeout_s = "600";
    std::string drain_timeout_s = "30";
    std::string http_threads = "1024";
    std::string health_stall_s = "60";
};

Result<double> parse_seconds_flag(const std::string& text, const char* flag, double lo) {
    EPI_ASSIGN_OR_RETURN(const double value, parse_flag_double(text, flag));
    if (value < lo) return invalid_argument(fmt::format("{} must be ≥ {}, got {}", flag, lo, text));
    if (value > kMaxTimeoutSeconds)
        return invalid_argument(fmt::format("{} must be ≤ {:g} s, got {}", flag, kMaxTimeoutSeconds, text));
    return value;
}

// Refuses, before the model loads, a --host the bind would refuse: a dotted number that is not an IPv4
// address (999.1.1.1), or a name that does not resolve as the bind resolves it.
// getaddrinfo for a listening TCP socket on host (and port, when given), as the server's bind resolves it;
// the caller frees *found when it returns 0.
int resolve_listen(const std::string& host, const char* port, addrinfo** found) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    return ::getaddrinfo(host.c_str(), port, &hints, found);
}

Status check_listen_host(const std::string& host) {
    const bool dotted = host.find_first_not_of("0123456789.") == std::string::npos;
    in_addr ipv4{};
    if (dotted && ::inet_pton(AF_INET, host.c_str(), &ipv4) != 1)
        return invalid_argument("--host " + host + ": not an IPv4 address");
    addrinfo* found = nullptr;
    const int rc = resolve_listen(host, nullptr, &found);
    if (rc != 0)
        return invalid_argument("--host " + host + ": not an address, nor a name that resolves (" +
                                ::gai_strerror(rc) + ")");
    ::freeaddrinfo(found);
    return Status::ok();
}

// Refuses, before the model loads, a --port already in use on --host: binds a socket there (SO_REUSEADDR,
// as the server) and closes it. A race with another process remains; the server's own bind reports it.
Status check_listen_port(const std::string& host, int port) {
    addrinfo* found = nullptr;
    if (resolve_listen(host, std::to_string(port).c_str(), &found) != 0)
        return Status::ok();  // check_listen_host has said what is wrong with the host
    const int fd = ::socket(found->ai_family, found->ai_socktype, found->ai_protocol);
    int error = 0;
    if (fd >= 0) {
        const int yes = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0) error = errno;
        ::close(fd);
    }
    ::freeaddrinfo(found);
    if (error == 0) return Status::ok();
    return invalid_argument(fmt::format("--port {}: cannot listen on {} ({})", port,
                                        server::host_port_text(host, port), std::strerror(error)));
}

struct ServeValues {
    server::ServerOptions server;
    double drain_timeout_s = 30.0;
};

Result<ServeValues> parse_serve_values(const ServeFlags& f) {
    ServeValues v;
    server::ServerOptions& o = v.server;
    if (f.host.empty()) return invalid_argument("--host is empty");
    EPI_RETURN_IF_ERROR(check_listen_host(f.host));
    o.host = f.host;
    EPI_ASSIGN_OR_RETURN(const int64_t port, parse_flag_int(f.port, "--port", 0, 65535));
    o.port = static_cast<int>(port);
    // A rank under a launcher leaves it to the server (only rank 0 listens, maybe on another node).
    if (o.port != 0 && !launched_by_mpi()) EPI_RETURN_IF_ERROR(check_listen_port(o.host, o.port));
    EPI_ASSIGN_OR_RETURN(o.max_body_bytes,
                         parse_flag_int(f.max_body_bytes, "--max-body-bytes", 1, int64_t{1} << 32));
    EPI_ASSIGN_OR_RETURN(o.request_timeout_s,
                         parse_seconds_flag(f.request_timeout_s, "--request-timeout-s", 0.001));
    EPI_ASSIGN_OR_RETURN(v.drain_timeout_s, parse_seconds_flag(f.drain_timeout_s, "--drain-timeout-s", 0.0));
    EPI_ASSIGN_OR_RETURN(const int64_t threads, parse_flag_int(f.http_threads, "--http-threads", 1, 4096));
    o.num_http_threads = static_cast<int>(threads);
    EPI_ASSIGN_OR_RETURN(o.health_stall_s, parse_seconds_flag(f.health_stall_s, "--health-stall-s", 0.001));
    if (f.served_model_name.has_value() && f.served_model_name->empty())
        return invalid_argument("--served-model-name must not be empty");
    o.model_name = f.served_model_name.has_value() ? *f.served_model_name
                   : !f.setup.model_dir.empty()    ? f.setup.model_dir
                                                   : f.setup.config_file;
    return v;
}

// SIGTERM, SIGINT and SIGUSR1 (what mpirun's supervisor sends the ranks instead) stop the server.
// SA_RESTART: a signal that comes while a rank loads does not fail its reads or MPI's system calls.
void install_stop_handlers() {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (const int signal_number : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&action.sa_mask, signal_number);
    for (const int signal_number : {SIGTERM, SIGINT, SIGUSR1}) sigaction(signal_number, &action, nullptr);
}

// A follower runs rank 0's engine steps until rank 0's shutdown releases it (SIGUSR1 from mpirun's
// supervisor drains rank 0, which then releases it). A SIGTERM or SIGINT sent to the follower itself waits
// for that release at most --drain-timeout-s + kFollowerStopMarginS (the whole job may have got it: srun,
// scancel); then, or at a second SIGTERM or SIGINT, the rank exits 1 with one line and the launcher ends
// the other ranks (mpirun: at once; srun --kill-on-bad-exit, else their next step times out).
Status run_follower(Engine& engine, const Communicator& world, double drain_timeout_s) {
    const std::string rank = fmt::format("rank {}/{}", world.rank(), world.size());
    const double wait_s = drain_timeout_s + kFollowerStopMarginS;
    std::atomic<bool> released{false};
    std::thread guard([&] {
        using Clock = std::chrono::steady_clock;
        Clock::time_point first;
        int signals_seen = 0;
        for (; !released.load(); std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
            const int signals = g_num_own_signals;
            if (signals == 0) continue;
            const char* name = g_own_signal == SIGINT ? "SIGINT" : "SIGTERM";
            if (signals_seen == 0) {
                signals_seen = signals;
                first = Clock::now();
                std::fprintf(stderr,
                             "epinfer serve: %s: %s: waiting at most %g s for rank 0 to stop the run (a "
                             "second SIGTERM or SIGINT ends it at once)\n",
                             rank.c_str(), name, wait_s);
                std::fflush(stderr);
            }
            const bool expired = std::chrono::duration<double>(Clock::now() - first).count() >= wait_s;
            if (signals > signals_seen || expired) {
                std::fprintf(stderr, "epinfer: error: %s: %s: ending the run%s\n", rank.c_str(), name,
                             expired ? fmt::format(" (rank 0 did not stop it within {} s)", wait_s).c_str()
                                     : "");
                std::fflush(stderr);
                std::_Exit(1);
            }
        }
    });
    const Status status = engine.run_follower();
    released.store(true);
    guard.join();
    return status;
}

Status run_serve(const ServeFlags& flags) {
    EPI_ASSIGN_OR_RETURN(const ServeValues values, parse_serve_values(flags));
    ModelSetupFlags setup_flags = flags.setup;
    setup_flags.mpirun_stop = MpirunStop{SIGUSR1, values.drain_timeout_s + kMpirunExitMarginS};
    // A rank of a layout keeps a stop signal that comes while it loads (the server then stops as soon as
    // it is up, exit 0) instead of dying of SIGUSR1's default action; one rank alone still ends at once.
    if (launched_by_mpi()) install_stop_handlers();
    EPI_ASSIGN_OR_RETURN(ModelSetup setup, start_model(setup_flags));
    // From here a signal drains the server instead of killing the process (followers wait for the driver).
    install_stop_handlers();
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(*setup.model, setup.engine_options));
    if (!setup.is_driver()) return run_follower(*engine, *setup.world, values.drain_timeout_s);

    EPI_ASSIGN_OR_RETURN(std::unique_ptr<server::HttpServer> http,
                         server::HttpServer::start(*engine, values.server));
    std::fprintf(stderr, "epinfer serve: listening on http://%s\n",
                 server::host_port_text(http->host(), http->port()).c_str());
    std::fflush(stderr);
    while (g_stop_signal == 0 && http->engine_error().is_ok())
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g_stop_signal != 0) {
        std::fprintf(stderr,
                     "epinfer serve: %s: draining (at most %g s; a second SIGTERM or SIGINT stops at once)\n",
                     signal_name(g_stop_signal), values.drain_timeout_s);
        std::fflush(stderr);
    }
    // Any stop signal after the one that started the drain cuts it short (polled, as above; the watcher
    // ends with the drain).
    const int signals_at_drain = g_num_stop_signals == 0 ? 0 : 1;
    std::atomic<bool> drained{false};
    std::thread watcher([&] {
        while (!drained.load()) {
            if (g_num_stop_signals > signals_at_drain) {
                std::fprintf(stderr,
                             "epinfer serve: %s during the drain: cut short, aborting the requests left\n",
                             signal_name(g_stop_signal));
                std::fflush(stderr);
                http->cut_drain();
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    });
    const bool stopped = http->shutdown(values.drain_timeout_s);
    drained.store(true);
    watcher.join();
    if (!stopped) {
        // Every request has its final response; a client still sending its headers holds a connection
        // thread that the HTTP library cannot interrupt: end the process without waiting for it.
        std::fprintf(stderr,
                     "epinfer serve: a connection is still sending its request: stopped without it\n");
        std::fflush(stderr);
        std::_Exit(http->engine_error().is_ok() ? 0 : 1);
    }
    EPI_RETURN_IF_ERROR_CTX(http->engine_error(), "engine");
    std::fprintf(stderr, "epinfer serve: stopped\n");
    return Status::ok();
}

}  // namespace

void add_serve_command(CLI::App& app) {
    auto flags = std::make_shared<ServeFlags>();
    CLI::App* cmd =
        app.add_subcommand("serve", "OpenAI-compatible HTTP server over token ids (/v1/completions)");
    add_model_setup_flags(*cmd, flags->setup, /*allow_random_weights=*/true);
    cmd->add_option("--host", flags->host, "Address to listen on (default 127.0.0.1)");
    cmd->add_option("--port", flags->port, "Port; 0 = a free port, printed when ready (default 8000)");
    cmd->add_option("--served-model-name", flags->served_model_name,
                    "Model id of /v1/models and of requests' \"model\" (default: --model as given)");
    cmd->add_option("--max-body-bytes", flags->max_body_bytes,
                    "Largest request body; larger → 413 (default 1048576)");
    cmd->add_option("--request-timeout-s", flags->request_timeout_s,
                    "A request still running after this is cancelled (default 600)");
    cmd->add_option("--drain-timeout-s", flags->drain_timeout_s,
                    "On SIGTERM/SIGINT, running requests may finish for this long (default 30); a second "
                    "SIGTERM/SIGINT aborts them at once");
    cmd->add_option(
        "--http-threads", flags->http_threads,
        "Connections served at once; each streaming request holds one thread, so keep this above "
        "the streams expected at once, or /health and 503 replies wait behind them (default 1024)");
    cmd->add_option("--health-stall-s", flags->health_stall_s,
                    "GET /health answers 503 while the engine has been in one step this long with requests "
                    "pending, e.g. a rank of the layout is stuck (default 60; EPINFER_COMM_TIMEOUT_S, 300, "
                    "ends the run)");
    cmd->callback([flags] { exit_on_error(run_serve(*flags)); });
}

}  // namespace epinfer::cli
