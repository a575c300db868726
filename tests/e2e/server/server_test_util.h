// Helpers of the HTTP server tests: an in-process serving stack (backend, model, engine, HttpServer on a
// free loopback port) and an httplib client that speaks /v1/completions, SSE streams and /metrics.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "checkpoint/hf_config.h"
#include "engine/engine.h"
#include "models/model.h"
#include "server/http_server.h"

namespace epinfer::testing {

using nlohmann::json;

inline const std::string kTinyModel = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/deepseek_v3_tiny";
constexpr int kCpuThreads = 2;
constexpr time_t kClientTimeoutS = 120;  // every client read/write is bounded by this

// Destroyed in reverse order: the server (and its engine loop) before the engine, model and backend.
struct ServingStack {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<server::HttpServer> server;
    int port() const { return server->port(); }
};

// The tiny fixture (real weights), or with vocab_size > 0 random weights at its config with that
// vocabulary (a large one makes every step slow enough that a test can act while a request runs).
inline std::unique_ptr<ServingStack> start_stack(const EngineOptions& engine_options,
                                                 const server::ServerOptions& server_options,
                                                 int64_t random_vocab_size = 0) {
    auto stack = std::make_unique<ServingStack>();
    stack->backend = make_cpu_backend(kCpuThreads);
    if (random_vocab_size > 0) {
        Result<ModelConfig> config = load_hf_config(kTinyModel);
        EXPECT_TRUE(config.is_ok()) << config.status().to_string();
        if (!config.is_ok()) return nullptr;
        config->vocab_size = random_vocab_size;
        Result<std::unique_ptr<Model>> model = Model::create_random(*config, *stack->backend, RandomWeightsOptions{});
        EXPECT_TRUE(model.is_ok()) << model.status().to_string();
        if (!model.is_ok()) return nullptr;
        stack->model = std::move(*model);
    } else {
        Result<std::unique_ptr<Model>> model = Model::load(kTinyModel, *stack->backend);
        EXPECT_TRUE(model.is_ok()) << model.status().to_string();
        if (!model.is_ok()) return nullptr;
        stack->model = std::move(*model);
    }
    Result<std::unique_ptr<Engine>> engine = Engine::create(*stack->model, engine_options);
    EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
    if (!engine.is_ok()) return nullptr;
    stack->engine = std::move(*engine);
    Result<std::unique_ptr<server::HttpServer>> server = server::HttpServer::start(*stack->engine, server_options);
    EXPECT_TRUE(server.is_ok()) << server.status().to_string();
    if (!server.is_ok()) return nullptr;
    stack->server = std::move(*server);
    return stack;
}

inline std::unique_ptr<httplib::Client> make_client(int port) {
    auto client = std::make_unique<httplib::Client>("127.0.0.1", port);
    client->set_connection_timeout(kClientTimeoutS, 0);
    client->set_read_timeout(kClientTimeoutS, 0);
    client->set_write_timeout(kClientTimeoutS, 0);
    return client;
}

struct HttpReply {
    int status = -1;  // -1: no response (transport error)
    std::string body;
    std::string content_type;
    std::string transport_error;  // httplib's error when status is -1
};

inline HttpReply http_post(int port, const std::string& path, const std::string& body,
                           const char* content_type = "application/json") {
    auto client = make_client(port);
    const httplib::Result r = client->Post(path.c_str(), body, content_type);
    if (!r) return HttpReply{-1, "", "", httplib::to_string(r.error())};
    return HttpReply{r->status, r->body, r->get_header_value("Content-Type"), ""};
}

inline HttpReply http_get(int port, const std::string& path) {
    auto client = make_client(port);
    const httplib::Result r = client->Get(path.c_str());
    if (!r) return HttpReply{-1, "", "", httplib::to_string(r.error())};
    return HttpReply{r->status, r->body, r->get_header_value("Content-Type"), ""};
}

// The events of a server-sent-event stream: the JSON of each `data:` line, and whether `data: [DONE]`
// came last.
struct StreamReply {
    int status = -1;
    std::string transport_error;  // httplib's error when the request failed
    std::vector<json> chunks;
    bool done = false;
    bool malformed = false;  // a data line that is not JSON, or data after [DONE]
};

// Parses complete events ("...\n\n") off the front of *buffer.
inline void take_sse_events(std::string* buffer, StreamReply* reply) {
    for (size_t end; (end = buffer->find("\n\n")) != std::string::npos;) {
        const std::string event = buffer->substr(0, end);
        buffer->erase(0, end + 2);
        if (event.rfind("data: ", 0) != 0) continue;  // a comment (": keep-alive")
        const std::string data = event.substr(6);
        if (reply->done) reply->malformed = true;
        if (data == "[DONE]") {
            reply->done = true;
            continue;
        }
        json j = json::parse(data, nullptr, false);
        if (j.is_discarded()) {
            reply->malformed = true;
        } else {
            reply->chunks.push_back(std::move(j));
        }
    }
}

// POSTs a streaming request and reads events; `keep_reading(reply)` is asked after each received piece,
// and false closes the connection (a client that goes away).
template <typename KeepReading>
StreamReply http_post_stream(int port, const json& body, KeepReading keep_reading) {
    StreamReply reply;
    std::string buffer;
    auto client = make_client(port);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.response_handler = [&](const httplib::Response& res) {
        reply.status = res.status;
        return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        buffer.append(data, n);
        if (reply.status == 200) take_sse_events(&buffer, &reply);
        return keep_reading(reply);
    };
    const httplib::Result r = client->send(req);
    if (r) {
        reply.status = r->status;
    } else {
        reply.transport_error = httplib::to_string(r.error());
    }
    return reply;
}

inline StreamReply http_post_stream(int port, const json& body) {
    return http_post_stream(port, body, [](const StreamReply&) { return true; });
}

// A streaming completion on its own thread (join() before reading reply), and whether its first chunk came.
struct BackgroundStream {
    std::atomic<bool> started{false};
    StreamReply reply;
    std::thread thread;

    BackgroundStream(int port, const json& body) {
        thread = std::thread([this, port, body] {
            reply = http_post_stream(port, body, [this](const StreamReply& s) {
                if (!s.chunks.empty()) started = true;
                return true;
            });
        });
    }
    ~BackgroundStream() {
        if (thread.joinable()) thread.join();
    }
    // Waits at most timeout_s for the first chunk; true when it came.
    bool wait_started(double timeout_s = 60.0) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
        while (!started.load() && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return started.load();
    }
    void join() { thread.join(); }
};

// The value of an unlabelled metric or of one exact `name{labels}` series; -1 when absent.
inline double metric_value(const std::string& text, const std::string& series) {
    size_t pos = 0;
    while ((pos = text.find(series + " ", pos)) != std::string::npos) {
        if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + series.size() + 1));
        pos += series.size();
    }
    return -1.0;
}

inline double get_metric(int port, const std::string& series) {
    const HttpReply r = http_get(port, "/metrics");
    return r.status == 200 ? metric_value(r.body, series) : -1.0;
}

// Polls /metrics until `series` equals `value` (at_least: is ≥ value); false after timeout_s.
inline bool wait_for_metric(int port, const std::string& series, double value, double timeout_s = 60.0,
                            bool at_least = false) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
        const double v = get_metric(port, series);
        if (v == value || (at_least && v > value)) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
}

// Polls GET /health every poll_ms until its status is 200 (healthy) or not (!healthy), for at most timeout_s;
// returns the last reply (whose status says whether the wait got there).
inline HttpReply wait_for_health(int port, bool healthy, double timeout_s, int poll_ms = 5) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    HttpReply reply = http_get(port, "/health");
    while ((reply.status == 200) != healthy && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
        reply = http_get(port, "/health");
    }
    return reply;
}

// Every KV block returned and no request left in the engine.
inline void expect_engine_idle(int port) {
    EXPECT_TRUE(wait_for_metric(port, "epinfer_kv_blocks_used", 0.0)) << http_get(port, "/metrics").body;
    EXPECT_TRUE(wait_for_metric(port, "epinfer_requests_running", 0.0));
    EXPECT_TRUE(wait_for_metric(port, "epinfer_requests_waiting", 0.0));
}

// The JSON error body of a non-2xx reply: {"error": {"message", "type", "code"}}.
inline void expect_json_error(const HttpReply& r, int status, const std::string& needle) {
    EXPECT_EQ(r.status, status) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.body;
    ASSERT_TRUE(j.contains("error")) << r.body;
    const json& e = j.at("error");
    EXPECT_EQ(e.at("code"), status) << r.body;
    EXPECT_EQ(e.at("type"), status >= 500 ? "server_error" : "invalid_request_error") << r.body;
    EXPECT_NE(e.at("message").get<std::string>().find(needle), std::string::npos)
        << "'" << needle << "' not in " << r.body;
    EXPECT_NE(r.content_type.find("application/json"), std::string::npos) << r.content_type;
}

}  // namespace epinfer::testing
