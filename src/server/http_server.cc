#include "server/http_server.h"

#include <dirent.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "core/splitmix64.h"
#include "core/timeout.h"
#include "engine/engine_loop.h"
#include "server/openai_protocol.h"
#include "server/server_metrics.h"

namespace epinfer::server {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int kMaxHttpThreads = 4096;
// After cancel(), how long a request's final (aborted) output may take to arrive.
constexpr std::chrono::seconds kCancelGrace{10};
// A stream with nothing new for this long gets an SSE comment line, which also notices a gone client.
constexpr std::chrono::seconds kStreamKeepAlive{5};
// A non-streaming request checks this often whether its client is still connected.
constexpr std::chrono::milliseconds kDisconnectPoll{100};
// The status a non-streaming request whose client went away is logged with (nginx's "client closed
// request"; nobody reads the response).
constexpr int kClientClosedStatus = 499;
// shutdown(): how long responses still being written may take after the engine loop stopped.
constexpr std::chrono::seconds kResponseWriteGrace{10};
// How long shutdown waits for the listen thread to have started (it starts within microseconds).
constexpr std::chrono::seconds kListenStartTimeout{10};
// After stop(), how long the listen thread may take to join its connection threads: past the library's
// 5 s keep-alive timeout, so an idle keep-alive connection ends on its own; a client still sending its
// headers a byte at a time would hold it for ever (the library has no header deadline).
constexpr std::chrono::seconds kListenStopTimeout{8};

Clock::duration seconds_duration(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

// The splitmix64 value that follows state x (x itself unchanged).
uint64_t splitmix64_after(uint64_t x) {
    return splitmix64(x);
}

// What the engine loop thread hands to the HTTP thread of one request.
struct PendingRequest {
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<RequestOutput> outputs;  // produced, not yet taken by the HTTP thread
    bool finished = false;               // the last output (finish != kNone) has been produced
    Clock::time_point arrival;
    Clock::time_point first_token;  // of the first output with tokens; epoch until then
    Clock::time_point last_token;

    // Waits until the request finished or `deadline`; true when finished.
    bool wait_finished(Clock::time_point deadline) {
        std::unique_lock<std::mutex> lock(mutex);
        return cv.wait_until(lock, deadline, [&] { return finished; });
    }
};

// A streaming response in progress (shared by its content provider and its releaser).
struct StreamState {
    std::shared_ptr<PendingRequest> pending;
    RequestId id = 0;
    CompletionIds ids;
    Clock::time_point deadline;
    bool cancelled_for_timeout = false;
    bool done = false;                // the last chunk and [DONE] were written
    int64_t prompt_tokens = 0;        // as far as the outputs told
    int64_t completion_tokens = 0;
};

// cpp-httplib 0.11 listens with a backlog of 5: a burst of connections then overflows the accept queue and
// clients fail with read errors. This exposes its socket so that listen() can be called again, larger.
class BacklogServer : public httplib::Server {
public:
    socket_t listening_socket() const { return svr_sock_; }
};
constexpr int kListenBacklog = 1024;  // the kernel caps it at net.core.somaxconn

void set_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(dump_json(body), "application/json");
}

void set_error(httplib::Response& res, int status, const std::string& message) {
    set_json(res, status, error_json(status, message));
}

// The routes install_routes() registers and the one method each answers; another method on one of these
// paths → 405 with Allow.
struct Route {
    const char* method;
    const char* path;
};
constexpr Route kRoutes[] = {
    {"POST", "/v1/completions"}, {"GET", "/v1/models"}, {"GET", "/health"}, {"GET", "/metrics"}};

// The method `path` answers, or null for an unknown path.
const char* route_method(const std::string& path) {
    for (const Route& route : kRoutes)
        if (path == route.path) return route.method;
    return nullptr;
}

// A method that may carry a body on a path that does not answer it, answered before the HTTP library reads
// a body: otherwise one sent without Content-Length (`curl -X POST .../health`) would wait for a body until
// the read timeout, then get 400. A body that is announced is read and dropped (the connection stays
// usable). Status 404 → the error handler (install_routes): 405 with Allow on a known path.
void answer_no_such_route(const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) {
    const auto drop = [](const char*, size_t) { return true; };
    if (req.is_multipart_form_data()) {
        reader([](const httplib::MultipartFormData&) { return true; }, drop);
    } else if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
        reader(drop);
    }
    res.status = 404;
}

// The Content-Length a request declares: nullopt without one; saturated at UINT64_MAX past 2^64 − 1 (a
// valid length, larger than any limit). Error (kInvalidArgument, naming the value): a value that is not a
// decimal number (a sign, hex, empty), or several Content-Length headers that differ — the body's end is
// then unknown (RFC 9110 §8.6, RFC 9112 §6.3).
Result<std::optional<uint64_t>> declared_content_length(const httplib::Request& req) {
    const size_t count = req.get_header_value_count("Content-Length");
    if (count == 0) return std::optional<uint64_t>();
    const std::string value = req.get_header_value("Content-Length");
    for (size_t i = 1; i < count; ++i)
        if (req.get_header_value("Content-Length", i) != value)
            return invalid_argument("the Content-Length headers differ ('" + value + "', '" +
                                    req.get_header_value("Content-Length", i) + "')");
    if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
        return invalid_argument("the Content-Length '" + value + "' is not a decimal number of bytes");
    uint64_t n = 0;
    for (const char c : value) {
        const auto digit = static_cast<uint64_t>(c - '0');
        n = n > (UINT64_MAX - digit) / 10 ? UINT64_MAX : n * 10 + digit;
    }
    return std::optional<uint64_t>(n);
}

// Polls `done` every millisecond until it holds or `timeout` has passed.
template <typename Done>
void wait_for(std::chrono::steady_clock::duration timeout, Done done) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The numeric host and the port of a socket address, as cpp-httplib writes them into Request::remote_addr,
// remote_port, local_addr and local_port (getnameinfo with NI_NUMERICHOST); false for another family.
bool endpoint_of(const sockaddr_storage& addr, socklen_t addr_len, std::string& host, int& port) {
    if (addr.ss_family == AF_INET) {
        port = ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
    } else if (addr.ss_family == AF_INET6) {
        port = ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
    } else {
        return false;
    }
    char text[NI_MAXHOST] = {};
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), addr_len, text, sizeof(text), nullptr, 0,
                    NI_NUMERICHOST) != 0)
        return false;
    host = text;
    return true;
}

// Whether `fd` is a connected socket whose local and peer addresses are req's.
bool is_connection_of(int fd, const httplib::Request& req) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    std::string host;
    int port = -1;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        !endpoint_of(addr, len, host, port) || port != req.local_port || host != req.local_addr)
        return false;
    len = sizeof(addr);
    return getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
           endpoint_of(addr, len, host, port) && port == req.remote_port && host == req.remote_addr;
}

// The socket of the connection `req` came on, or -1 when none is found. cpp-httplib 0.11 gives a handler
// neither its socket nor a way to see the connection close (Request::is_connection_closed came later), so
// this looks through the process's open descriptors (/proc/self/fd) for the one TCP socket with req's two
// addresses. The socket stays open (and the same) until the handler returns.
int connection_socket(const httplib::Request& req) {
    if (req.local_port < 0 || req.remote_port < 0) return -1;
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    int found = -1;
    while (const dirent* entry = readdir(dir)) {
        char* end = nullptr;
        const long fd = std::strtol(entry->d_name, &end, 10);
        if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
        if (is_connection_of(static_cast<int>(fd), req)) {
            found = static_cast<int>(fd);
            break;
        }
    }
    closedir(dir);
    return found;
}

// True when the peer of connected socket `fd` has closed the connection or shut down its sending side: its
// FIN or a reset has arrived. (A client that only shuts down its sending side and still reads counts as
// gone too: a server cannot tell the two apart.) Does not block.
bool peer_has_closed(int fd) {
    pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
    if (poll(&p, 1, 0) <= 0) return false;  // nothing new (or poll failed: assume still there)
    if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
    char byte;
    const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

bool write_text(httplib::DataSink& sink, const std::string& text) { return sink.write(text.data(), text.size()); }

// The request body through `reader`, at most max_bytes of it (a declared Content-Length past it was
// refused before routing, check_content_length; a chunked body is cut here). kTooLarge: longer (reading
// stops there; the caller answers 413); kUnreadable: cut off or malformed; kMultipart: a multipart form
// (read and dropped). `body` holds the body only with kOk.
enum class BodyRead { kOk, kTooLarge, kUnreadable, kMultipart };
BodyRead read_capped_body(const httplib::Request& req, const httplib::ContentReader& reader,
                          int64_t max_bytes, std::string& body) {
    if (req.is_multipart_form_data()) {
        reader([](const httplib::MultipartFormData&) { return true; },
               [](const char*, size_t) { return true; });
        return BodyRead::kMultipart;
    }
    bool too_large = false;
    const bool read = reader([&](const char* data, size_t n) {
        too_large = static_cast<int64_t>(body.size() + n) > max_bytes;
        if (!too_large) body.append(data, n);
        return !too_large;
    });
    if (read) return BodyRead::kOk;
    body.clear();
    return too_large ? BodyRead::kTooLarge : BodyRead::kUnreadable;
}

std::string sse_event(const json& data) { return "data: " + dump_json(data) + "\n\n"; }

}  // namespace

struct HttpServer::Impl {
    Impl(Engine& engine_in, const ServerOptions& options_in) : options(options_in), loop(engine_in) {
        const ModelConfig& config = engine_in.model().config();
        limits.model_name = options.model_name;
        limits.vocab_size = config.vocab_size;
        limits.max_context_tokens = config.max_position_embeddings;
        std::random_device rd;
        seed_base = (static_cast<uint64_t>(rd()) << 32) ^ rd();
        char prefix[17];
        std::snprintf(prefix, sizeof(prefix), "%016llx",
                      static_cast<unsigned long long>(splitmix64_after(seed_base)));
        id_prefix = prefix;
        created_unix_s = static_cast<int64_t>(std::time(nullptr));
    }
    ~Impl() {
        // A listen thread shutdown() gave up on must not end the process here (std::thread's destructor
        // would terminate it); the process is about to end (HttpServer::shutdown).
        if (!shutdown(0.0) && listen_thread.joinable()) listen_thread.detach();
    }

    ServerOptions options;
    CompletionLimits limits;
    EngineLoop loop;
    BacklogServer http;
    std::thread listen_thread;
    std::atomic<bool> listen_done{false};  // listen_after_bind() has returned
    ServerMetrics metrics;
    int port = 0;
    std::atomic<bool> draining{false};
    uint64_t seed_base = 0;
    std::atomic<uint64_t> seed_counter{0};
    std::string id_prefix;
    int64_t created_unix_s = 0;

    // Completion requests whose response is still being produced or written.
    std::mutex in_flight_mutex;
    std::condition_variable in_flight_cv;
    int64_t in_flight = 0;

    std::mutex shutdown_mutex;
    bool shut_down = false;

    void begin_in_flight() {
        std::lock_guard<std::mutex> lock(in_flight_mutex);
        ++in_flight;
    }
    void end_in_flight() {
        {
            std::lock_guard<std::mutex> lock(in_flight_mutex);
            --in_flight;
        }
        in_flight_cv.notify_all();
    }

    // Why GET /health answers 503, or empty while healthy.
    std::string health_problem() const {
        const Status error = loop.error();
        if (!error.is_ok()) return "the engine failed: " + error.message();
        if (draining.load()) return "the server is shutting down";
        const double in_step_s = loop.seconds_in_step();
        if (in_step_s > options.health_stall_s)
            return fmt::format("the engine has been in one step for {:.1f} s with requests pending (over "
                               "--health-stall-s {} s): a rank may be stuck",
                               in_step_s, options.health_stall_s);
        return "";
    }
    bool healthy() const { return health_problem().empty(); }

    uint64_t next_seed() { return splitmix64_after(seed_base + seed_counter.fetch_add(1)); }

    // Runs on the engine loop thread: records the request's times at its end (before the HTTP thread can
    // answer, so that /metrics counts a request once its response is out) and hands the output over.
    OutputCallback make_callback(const std::shared_ptr<PendingRequest>& pending) {
        return [this, pending](const RequestOutput& output) {
            const Clock::time_point now = Clock::now();
            const bool last = output.finish != FinishReason::kNone;
            double ttft_s = -1.0, tpot_s = -1.0;
            {
                std::lock_guard<std::mutex> lock(pending->mutex);
                if (!output.new_token_ids.empty()) {
                    if (pending->first_token == Clock::time_point{}) pending->first_token = now;
                    pending->last_token = now;
                }
                if (last && output.completion_tokens >= 1 && pending->first_token != Clock::time_point{})
                    ttft_s = seconds_between(pending->arrival, pending->first_token);
                if (last && output.completion_tokens >= 2)
                    tpot_s = seconds_between(pending->first_token, pending->last_token) /
                             static_cast<double>(output.completion_tokens - 1);
            }
            if (last) metrics.observe_finished(output.finish, ttft_s, tpot_s);
            {
                std::lock_guard<std::mutex> lock(pending->mutex);
                pending->outputs.push_back(output);
                pending->finished = last;
            }
            pending->cv.notify_all();
        };
    }

    void handle_completion(const httplib::Request& req, httplib::Response& res,
                           const httplib::ContentReader& reader) {
        std::string body;
        switch (read_capped_body(req, reader, options.max_body_bytes, body)) {
            case BodyRead::kTooLarge:
                // The rest of the body is left unread: the client is asked to close.
                res.set_header("Connection", "close");
                return set_error(res, 413, too_large_message());
            case BodyRead::kUnreadable:
                res.set_header("Connection", "close");
                return set_error(res, 400, "the request body was cut off or is not valid chunked encoding");
            case BodyRead::kMultipart:
                return set_error(res, 400,
                                 "the body is a multipart form: send the request as JSON "
                                 "(Content-Type: application/json)");
            case BodyRead::kOk:
                break;
        }
        if (draining.load()) return set_error(res, 503, "the server is shutting down");
        Result<CompletionRequest> parsed = parse_completion_request(body, limits, next_seed());
        if (!parsed.is_ok()) return set_error(res, http_status_of(parsed.status()), parsed.status().message());

        auto pending = std::make_shared<PendingRequest>();
        pending->arrival = Clock::now();
        const Result<RequestId> id = loop.submit(parsed->params, make_callback(pending));
        if (!id.is_ok()) return set_error(res, http_status_of(id.status()), id.status().message());
        const CompletionIds ids{"cmpl-" + id_prefix + "-" + std::to_string(*id),
                                static_cast<int64_t>(std::time(nullptr)), options.model_name};
        const Clock::time_point deadline = pending->arrival + seconds_duration(options.request_timeout_s);
        if (parsed->stream) {
            start_stream(res, pending, *id, ids, deadline);
        } else {
            begin_in_flight();
            complete_blocking(req, res, *pending, *id, ids, deadline);
            end_in_flight();
        }
    }

    // How a non-streaming request's wait for its last output ended.
    enum class WaitEnd { kFinished, kTimedOut, kClientGone };

    // Waits until the request finished or `deadline`, checking every kDisconnectPoll whether the client
    // that sent `req` is still connected (kClientGone once it is not).
    static WaitEnd wait_while_connected(const httplib::Request& req, PendingRequest& pending,
                                        Clock::time_point deadline) {
        // The connection's socket; -2: not looked up yet (a request done within one poll never is).
        int fd = -2;
        for (;;) {
            if (pending.wait_finished(std::min(deadline, Clock::now() + kDisconnectPoll)))
                return WaitEnd::kFinished;
            if (Clock::now() >= deadline) return WaitEnd::kTimedOut;
            if (fd == -2) fd = connection_socket(req);
            if (fd >= 0 && peer_has_closed(fd)) return WaitEnd::kClientGone;
        }
    }

    // Answers a non-streaming request once it finished. A request past `deadline` is cancelled (504); one
    // whose client went away is cancelled too (its slot and KV blocks freed at the next engine step), as a
    // streaming one is when a write fails.
    void complete_blocking(const httplib::Request& req, httplib::Response& res, PendingRequest& pending,
                           RequestId id, const CompletionIds& ids, Clock::time_point deadline) {
        const WaitEnd end = wait_while_connected(req, pending, deadline);
        if (end != WaitEnd::kFinished) {
            loop.cancel(id);
            pending.wait_finished(Clock::now() + kCancelGrace);
            if (end == WaitEnd::kClientGone) {
                res.set_header("Connection", "close");
                return set_error(res, kClientClosedStatus,
                                 "the client closed the connection; the request was cancelled");
            }
            return set_error(res, 504,
                             "the request did not finish within --request-timeout-s = " +
                                 std::to_string(options.request_timeout_s) + " s and was cancelled");
        }
        std::vector<int32_t> tokens;
        FinishReason finish = FinishReason::kNone;
        int64_t prompt_tokens = 0, completion_tokens = 0;
        {
            std::lock_guard<std::mutex> lock(pending.mutex);
            for (const RequestOutput& out : pending.outputs) {
                tokens.insert(tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
                finish = out.finish;
                prompt_tokens = out.prompt_tokens;
                completion_tokens = out.completion_tokens;
            }
        }
        const Status engine_error = loop.error();
        if (finish == FinishReason::kAborted && !engine_error.is_ok())
            return set_error(res, 500, "the engine failed: " + engine_error.message());
        set_json(res, 200, completion_json(ids, tokens, finish, prompt_tokens, completion_tokens));
    }

    void start_stream(httplib::Response& res, const std::shared_ptr<PendingRequest>& pending, RequestId id,
                      const CompletionIds& ids, Clock::time_point deadline) {
        auto st = std::make_shared<StreamState>();
        st->pending = pending;
        st->id = id;
        st->ids = ids;
        st->deadline = deadline;
        begin_in_flight();
        res.status = 200;
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, st](size_t /*offset*/, httplib::DataSink& sink) { return stream_step(*st, sink); },
            [this, st](bool /*success*/) {
                if (!st->done) loop.cancel(st->id);  // the client went away or the server stopped
                end_in_flight();
            });
    }

    // One call of the stream's content provider: writes what the engine produced since the last call (or
    // a keep-alive comment); false (and the request cancelled) when the client is gone.
    bool stream_step(StreamState& st, httplib::DataSink& sink) {
        std::vector<RequestOutput> batch;
        {
            std::unique_lock<std::mutex> lock(st.pending->mutex);
            const Clock::time_point wake = std::min(st.deadline, Clock::now() + kStreamKeepAlive);
            st.pending->cv.wait_until(lock, wake, [&] { return !st.pending->outputs.empty(); });
            batch.swap(st.pending->outputs);
        }
        for (const RequestOutput& out : batch) {
            st.prompt_tokens = out.prompt_tokens;
            st.completion_tokens = out.completion_tokens;
            if (!write_text(sink, sse_event(stream_chunk_json(st.ids, out)))) {
                loop.cancel(st.id);
                return false;
            }
            if (out.finish != FinishReason::kNone) return finish_stream(st, sink);
        }
        if (!batch.empty()) return true;
        if (Clock::now() >= st.deadline) {
            if (!st.cancelled_for_timeout) {  // its aborted output ends the stream
                loop.cancel(st.id);
                st.cancelled_for_timeout = true;
                st.deadline = Clock::now() + kCancelGrace;
                return true;
            }
            RequestOutput last;  // the engine did not answer the cancel in time: end the stream here
            last.id = st.id;
            last.finish = FinishReason::kAborted;
            last.prompt_tokens = st.prompt_tokens;
            last.completion_tokens = st.completion_tokens;
            if (!write_text(sink, sse_event(stream_chunk_json(st.ids, last)))) return false;
            return finish_stream(st, sink);
        }
        if (!write_text(sink, ": keep-alive\n\n")) {
            loop.cancel(st.id);
            return false;
        }
        return true;
    }

    bool finish_stream(StreamState& st, httplib::DataSink& sink) {
        if (!write_text(sink, "data: [DONE]\n\n")) return false;
        st.done = true;
        sink.done();
        return true;
    }

    // The check of every request's Content-Length, before any route reads a body (pre-routing, and for
    // Expect: 100-continue): 400 for an invalid one (the body's end is unknown), 413 at once for one past
    // max_body_bytes (the body is not waited for: the HTTP library would read and drop all the declared
    // bytes first, until its read timeout when they never come). Both ask the client to close. Unhandled
    // otherwise.
    httplib::Server::HandlerResponse check_content_length(const httplib::Request& req,
                                                          httplib::Response& res) const {
        const Result<std::optional<uint64_t>> declared = declared_content_length(req);
        if (declared.is_ok() &&
            (!declared->has_value() || **declared <= static_cast<uint64_t>(options.max_body_bytes)))
            return httplib::Server::HandlerResponse::Unhandled;
        res.set_header("Connection", "close");
        if (!declared.is_ok()) {
            set_error(res, 400, declared.status().message());
        } else {
            set_error(res, 413, too_large_message());
        }
        return httplib::Server::HandlerResponse::Handled;
    }

    std::string too_large_message() const {
        return "the request body is larger than the limit of " + std::to_string(options.max_body_bytes) +
               " bytes (--max-body-bytes)";
    }

    json models_json() const {
        return {{"object", "list"},
                {"data", json::array({{{"id", options.model_name},
                                       {"object", "model"},
                                       {"created", created_unix_s},
                                       {"owned_by", "epinfer"},
                                       {"max_model_len", limits.max_context_tokens},
                                       {"vocab_size", limits.vocab_size}}})}};
    }

    void install_routes() {
        http.new_task_queue = [n = options.num_http_threads] { return new httplib::ThreadPool(n); };
        http.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
        http.set_tcp_nodelay(true);  // each streamed event leaves at once (no Nagle delay behind an ACK)
        // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second server bind
        // a port that is in use and silently share its connections.
        http.set_socket_options([](socket_t sock) {
            const int yes = 1;
            setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        });
        http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            return check_content_length(req, res);
        });
        // A client that waits for "100 Continue" before it sends its body (curl past 1 MiB) gets the same
        // answer instead, so it does not send a body that is refused. The library writes that answer
        // without the Content-Length it gives a routed response: set here.
        http.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (check_content_length(req, res) == httplib::Server::HandlerResponse::Unhandled) return 100;
            res.set_header("Content-Length", std::to_string(res.body.size()));
            return res.status;
        });
        http.Post("/v1/completions",
                  httplib::Server::HandlerWithContentReader(
                      [this](const httplib::Request& req, httplib::Response& res,
                             const httplib::ContentReader& reader) { handle_completion(req, res, reader); }));
        http.Get("/v1/models",
                 [this](const httplib::Request&, httplib::Response& res) { set_json(res, 200, models_json()); });
        http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
            const std::string problem = health_problem();
            if (!problem.empty()) return set_error(res, 503, problem);
            set_json(res, 200, {{"status", "ok"}});
        });
        http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics.render(loop.stats()), "text/plain; version=0.0.4; charset=utf-8");
        });
        // POST, PUT, PATCH and DELETE on a path that does not answer them: answer_no_such_route. (The POST
        // pattern leaves out POST's route.)
        const httplib::Server::HandlerWithContentReader no_such_route = answer_no_such_route;
        http.Post("(?!/v1/completions$).*", no_such_route);
        http.Put(".*", no_such_route);
        http.Patch(".*", no_such_route);
        http.Delete(".*", no_such_route);
        // Every status ≥ 400 passes here; a body set by a handler is kept.
        http.set_error_handler(httplib::Server::HandlerWithResponse(
            [this](const httplib::Request& req, httplib::Response& res) {
                if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
                std::string message;
                const char* allowed = res.status == 404 ? route_method(req.path) : nullptr;
                if (allowed != nullptr) {  // a known path, another method (HEAD goes with GET)
                    res.status = 405;
                    res.set_header("Allow", allowed);
                    message = req.method + " is not allowed on " + req.path + ": it answers " + allowed +
                              " only";
                } else if (res.status == 404) {
                    message = "no route for " + req.method + " " + req.path;
                } else if (res.status == 413) {
                    message = too_large_message();
                } else if (res.status == 400) {
                    message = "malformed HTTP request";
                } else {
                    message = "HTTP error " + std::to_string(res.status);
                }
                set_error(res, res.status, message);
                return httplib::Server::HandlerResponse::Handled;
            }));
        http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            std::string message = "internal error";
            try {
                if (ep) std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                message = std::string("internal error: ") + e.what();
            } catch (...) {
            }
            set_error(res, 500, message);
        });
        // Called once per response, after it is written (routing 404s and 405s, the library's 400s and
        // 413s, a stream once it ended), so every status is counted here and only here.
        http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
            metrics.count_response(res.status);
        });
    }

    bool shutdown(double drain_timeout_s) {
        std::lock_guard<std::mutex> lock(shutdown_mutex);
        if (shut_down) return !listen_thread.joinable();
        shut_down = true;
        draining.store(true);
        loop.drain_and_stop(std::max(0.0, drain_timeout_s));  // every request gets its final output
        {
            std::unique_lock<std::mutex> in_flight_lock(in_flight_mutex);
            in_flight_cv.wait_for(in_flight_lock, kResponseWriteGrace, [&] { return in_flight == 0; });
        }
        // httplib's stop() does nothing before listen_after_bind() has set it running: a server shut down
        // right after start() would leave the listen thread in accept() for ever. Wait (bounded) for it.
        wait_for(kListenStartTimeout,
                 [&] { return !listen_thread.joinable() || http.is_running() || listen_done; });
        http.stop();
        wait_for(kListenStopTimeout, [&] { return !listen_thread.joinable() || listen_done; });
        // A connection is still being read (a client sending its headers slowly): the caller exits.
        if (listen_thread.joinable() && !listen_done.load()) return false;
        if (listen_thread.joinable()) listen_thread.join();
        return true;
    }

};

std::string host_port_text(const std::string& host, int port) {
    const bool ipv6 = host.find(':') != std::string::npos;
    return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(Engine& engine, const ServerOptions& options) {
    if (options.port < 0 || options.port > 65535)
        return invalid_argument("--port must be in [0, 65535], got " + std::to_string(options.port));
    if (options.max_body_bytes < 1)
        return invalid_argument("--max-body-bytes must be ≥ 1, got " + std::to_string(options.max_body_bytes));
    if (!(options.request_timeout_s > 0.0) || !(options.request_timeout_s <= kMaxTimeoutSeconds))
        return invalid_argument(fmt::format("--request-timeout-s must be in (0, {:g}] s, got {}",
                                            kMaxTimeoutSeconds, options.request_timeout_s));
    if (options.num_http_threads < 1 || options.num_http_threads > kMaxHttpThreads)
        return invalid_argument("--http-threads must be in [1, " + std::to_string(kMaxHttpThreads) + "], got " +
                                std::to_string(options.num_http_threads));
    if (!(options.health_stall_s > 0.0) || !(options.health_stall_s <= kMaxTimeoutSeconds))
        return invalid_argument(fmt::format("--health-stall-s must be in (0, {:g}] s, got {}",
                                            kMaxTimeoutSeconds, options.health_stall_s));
    if (options.model_name.empty()) return invalid_argument("the served model name is empty");

    std::unique_ptr<HttpServer> server(new HttpServer());
    server->impl_ = std::make_unique<Impl>(engine, options);
    Impl& impl = *server->impl_;
    impl.install_routes();
    if (options.port == 0) {
        impl.port = impl.http.bind_to_any_port(options.host);
    } else if (impl.http.bind_to_port(options.host, options.port)) {
        impl.port = options.port;
    } else {
        impl.port = -1;
    }
    if (impl.port <= 0)
        return invalid_argument("cannot listen on " + host_port_text(options.host, options.port) +
                                " (the port is in use, or the host is not an address of this machine)");
    if (::listen(impl.http.listening_socket(), kListenBacklog) != 0)
        return internal_error("listen() on " + host_port_text(options.host, impl.port) + " failed");
    impl.loop.start();
    impl.listen_thread = std::thread([&impl] {
        impl.http.listen_after_bind();
        impl.listen_done.store(true);
    });
    return server;
}

HttpServer::~HttpServer() = default;

const std::string& HttpServer::host() const { return impl_->options.host; }
int HttpServer::port() const { return impl_->port; }
bool HttpServer::healthy() const { return impl_->healthy(); }
Status HttpServer::engine_error() const { return impl_->loop.error(); }
bool HttpServer::shutdown(double drain_timeout_s) {
    return impl_->shutdown(drain_timeout_s);
}
void HttpServer::cut_drain() { impl_->loop.cut_drain(); }

}  // namespace epinfer::server
