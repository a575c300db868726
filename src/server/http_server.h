// An OpenAI-compatible HTTP server over token ids (cpp-httplib), in front of an EngineLoop.
//
//   POST /v1/completions  a completion (server/openai_protocol.h); "stream": true → server-sent events:
//                         one `data: {chunk}` per engine step with that step's token ids, the last one with
//                         finish_reason and usage, then `data: [DONE]`
//   GET  /v1/models       the served model (with max_model_len and vocab_size)
//   GET  /health          200 {"status": "ok"} while the engine loop is healthy, else 503 with an error
//                         naming why: the engine failed, the server is draining, or the engine has been in
//                         one step for over health_stall_s with requests pending (a rank stuck or gone)
//   GET  /metrics         Prometheus text (server/server_metrics.h)
// Errors are {"error": {"message", "type", "code"}}: 400 bad request (JSON, field type, prompt, token id,
// context, max_tokens; a Content-Length that is not a decimal number), 404 unknown path or model, 405
// another method on a known path (with an `Allow:` header naming the route's method), 413 body over
// max_body_bytes (at once, unread, for a declared Content-Length over it), 503 queue full or draining, 504
// request timeout, 500 engine failure.
//
// Each request holds one HTTP worker thread while it runs. A client that goes away cancels its request, so
// its KV blocks are freed at the next engine step: a streaming one when a write fails, a non-streaming one
// when its connection's socket shows the close (polled every 0.1 s; the response, never read, is logged as
// 499). Every wait is bounded by request_timeout_s: past it the request is cancelled (non-streaming: 504;
// streaming: a last chunk with finish_reason "abort").
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "engine/engine.h"

namespace epinfer::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 0;                         // 0: a free port, see HttpServer::port()
    std::string model_name = "epinfer";   // the id /v1/models lists; a request's "model" must match it
    int64_t max_body_bytes = 1 << 20;     // ≥ 1; larger request bodies → 413
    double request_timeout_s = 600.0;     // > 0; bounds every wait of a request
    // ≥ 1; connections served at once (more wait for a thread). A streaming request holds its thread, so
    // this must exceed the streams expected at once, or /health, /metrics and 503s wait behind them.
    int num_http_threads = 1024;
    // > 0; GET /health answers 503 while the engine has been in one step this long with requests pending.
    // Far above a healthy step (one forward of at most max_step_tokens tokens), a fifth of
    // EPINFER_COMM_TIMEOUT_S's default (300 s, after which a stuck rank ends the run).
    double health_stall_s = 60.0;
};

// "HOST:PORT" as a URL writes it: an IPv6 literal (a host with a ':') in brackets, "[::1]:8000".
std::string host_port_text(const std::string& host, int port);

class HttpServer {
public:
    // Starts an EngineLoop over `engine` (driver rank; the engine must outlive the server), binds
    // host:port and serves on background threads. Errors: kInvalidArgument naming a bad option or the
    // address that cannot be listened on.
    static Result<std::unique_ptr<HttpServer>> start(Engine& engine, const ServerOptions& options);
    ~HttpServer();  // shutdown(0)
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    const std::string& host() const;
    int port() const;  // the bound port (the chosen one when options.port was 0)
    // False while GET /health answers 503: once draining, after a fatal engine error, or while the engine
    // has been in one step for over health_stall_s with requests pending.
    bool healthy() const;
    // The engine loop's first fatal error, or OK.
    Status engine_error() const;
    // Stops taking requests (503), lets running and queued ones finish for up to drain_timeout_s
    // (then aborts the rest), waits (bounded) for their responses to be written, shuts the engine down
    // (followers return from run_follower) and stops listening. False when a connection is still being
    // read 8 s after that (a client sending its headers slowly: the HTTP library has no deadline for them):
    // its thread still uses the server, so the caller must end the process (std::_Exit) rather than destroy
    // the server. Idempotent.
    bool shutdown(double drain_timeout_s);
    // Cuts a drain short from any thread (e.g. while another thread is in shutdown()) and returns at once:
    // the requests left are aborted at the engine's next step and get their final (aborted) response,
    // so shutdown() returns promptly. Called before shutdown(), that shutdown aborts at once.
    void cut_drain();

private:
    HttpServer() = default;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace epinfer::server
