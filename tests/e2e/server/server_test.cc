// The HTTP server over loopback with a real client (httplib::Client), in process, on the bundled
// deepseek_v3_tiny checkpoint (CPU backend): concurrent greedy completions equal generate(), every bad
// request gets its status and JSON error (405 with Allow for another method on a known path), a client
// that goes away mid-stream frees its KV blocks, a full queue answers 503, draining finishes running
// requests, a step that outlasts the health bound turns /health into 503, and a load loop leaves no block
// behind; a non-streaming client that goes away frees its KV blocks too, a bad or over-limit Content-Length
// is answered at once, and an omitted max_tokens fits the context.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "engine/generate.h"
#include "server/openai_protocol.h"
#include "server_test_util.h"

namespace epinfer::testing {
namespace {

const std::string kModelName = "tiny";

server::ServerOptions tiny_server_options() {
    server::ServerOptions o;
    o.model_name = kModelName;
    o.max_body_bytes = 16 * 1024;
    o.request_timeout_s = 120.0;
    o.num_http_threads = 80;
    return o;
}

EngineOptions tiny_engine_options() {
    EngineOptions o;
    o.num_kv_blocks = 512;
    o.block_size = 16;
    return o;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t length, int64_t vocab) {
    std::uniform_int_distribution<int32_t> id(2, static_cast<int32_t>(vocab) - 1);
    std::vector<int32_t> p(static_cast<size_t>(length));
    for (int32_t& t : p) t = id(rng);
    return p;
}

std::vector<int32_t> stream_tokens(const StreamReply& r) {
    std::vector<int32_t> tokens;
    for (const json& c : r.chunks) {
        const auto ids = c.at("choices").at(0).at("token_ids").get<std::vector<int32_t>>();
        tokens.insert(tokens.end(), ids.begin(), ids.end());
    }
    return tokens;
}

// Checks the OpenAI shape of a stream and returns its last chunk (or null).
json check_stream_shape(const StreamReply& r) {
    EXPECT_EQ(r.status, 200) << r.transport_error;
    EXPECT_TRUE(r.done) << "no [DONE]";
    EXPECT_FALSE(r.malformed);
    if (r.chunks.empty()) {
        ADD_FAILURE() << "no chunk";
        return nullptr;
    }
    const std::string id = r.chunks.front().at("id");
    EXPECT_EQ(id.rfind("cmpl-", 0), 0u) << id;
    for (size_t i = 0; i < r.chunks.size(); ++i) {
        const json& c = r.chunks[i];
        EXPECT_EQ(c.at("id"), id);
        EXPECT_EQ(c.at("object"), "text_completion");
        EXPECT_EQ(c.at("model"), kModelName);
        const bool last = i + 1 == r.chunks.size();
        EXPECT_EQ(c.at("choices").at(0).at("finish_reason").is_null(), !last) << c.dump();
        EXPECT_EQ(c.contains("usage"), last) << c.dump();
    }
    return r.chunks.back();
}

class TinyServer : public ::testing::Test {
protected:
    static void SetUpTestSuite() { stack_ = start_stack(tiny_engine_options(), tiny_server_options()).release(); }
    static void TearDownTestSuite() {
        delete stack_;
        stack_ = nullptr;
    }
    void SetUp() override { ASSERT_NE(stack_, nullptr); }
    int port() const { return stack_->port(); }
    const ModelConfig& config() const { return stack_->model->config(); }

    static ServingStack* stack_;
};

ServingStack* TinyServer::stack_ = nullptr;

TEST_F(TinyServer, ConcurrentGreedyRequestsEqualGenerate) {
    constexpr int kRequests = 64;
    // The reference: generate() on its own copy of the model, one prompt at a time.
    std::unique_ptr<Backend> ref_backend = make_cpu_backend(kCpuThreads);
    Result<std::unique_ptr<Model>> ref_model = Model::load(kTinyModel, *ref_backend);
    ASSERT_TRUE(ref_model.is_ok()) << ref_model.status().to_string();
    std::mt19937 rng(7);
    std::vector<GenerateRequest> requests(kRequests);
    std::vector<std::vector<int32_t>> want(kRequests);
    for (int i = 0; i < kRequests; ++i) {
        GenerateRequest& g = requests[i];
        g.prompt_ids = random_prompt(rng, 1 + (i * 7) % 23, config().vocab_size);
        g.max_new_tokens = 1 + i % 12;
        g.ignore_eos = i % 3 == 0;
        Result<GenerateOutput> out = generate(**ref_model, std::span(&g, 1));
        ASSERT_TRUE(out.is_ok()) << out.status().to_string();
        want[i] = out->output_ids.front();
    }

    std::vector<json> replies(kRequests);
    std::vector<StreamReply> streams(kRequests);
    std::vector<HttpReply> plain(kRequests);
    std::vector<std::thread> threads;
    for (int i = 0; i < kRequests; ++i) {
        threads.emplace_back([&, i] {
            json body = {{"model", kModelName},
                         {"prompt", requests[i].prompt_ids},
                         {"max_tokens", requests[i].max_new_tokens},
                         {"temperature", 0},
                         {"ignore_eos", requests[i].ignore_eos},
                         {"stream", i % 2 == 1}};
            if (i % 4 == 2) body["prompt"] = json::array({requests[i].prompt_ids});  // [[ids]]
            if (i % 2 == 1) {
                streams[i] = http_post_stream(port(), body);
            } else {
                plain[i] = http_post(port(), "/v1/completions", body.dump());
            }
        });
    }
    for (std::thread& t : threads) t.join();

    const std::vector<int64_t>& eos = config().eos_token_ids;
    for (int i = 0; i < kRequests; ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        std::vector<int32_t> tokens;
        json usage, finish;
        if (i % 2 == 1) {
            const json last = check_stream_shape(streams[i]);
            if (last.is_null()) continue;
            tokens = stream_tokens(streams[i]);
            usage = last.at("usage");
            finish = last.at("choices").at(0).at("finish_reason");
        } else {
            ASSERT_EQ(plain[i].status, 200) << plain[i].body << plain[i].transport_error;
            const json j = json::parse(plain[i].body);
            EXPECT_EQ(j.at("object"), "text_completion");
            EXPECT_EQ(j.at("model"), kModelName);
            EXPECT_EQ(j.at("id").get<std::string>().rfind("cmpl-", 0), 0u);
            EXPECT_GT(j.at("created").get<int64_t>(), 0);
            const json& choice = j.at("choices").at(0);
            EXPECT_EQ(choice.at("index"), 0);
            EXPECT_EQ(choice.at("text"), "");
            tokens = choice.at("token_ids").get<std::vector<int32_t>>();
            usage = j.at("usage");
            finish = choice.at("finish_reason");
        }
        EXPECT_EQ(tokens, want[i]);
        const int64_t prompt_tokens = static_cast<int64_t>(requests[i].prompt_ids.size());
        EXPECT_EQ(usage.at("prompt_tokens"), prompt_tokens);
        EXPECT_EQ(usage.at("completion_tokens"), static_cast<int64_t>(tokens.size()));
        EXPECT_EQ(usage.at("total_tokens"), prompt_tokens + static_cast<int64_t>(tokens.size()));
        const bool ended_on_eos = !requests[i].ignore_eos && !tokens.empty() &&
                                  std::find(eos.begin(), eos.end(), tokens.back()) != eos.end();
        if (static_cast<int64_t>(tokens.size()) < requests[i].max_new_tokens) {
            EXPECT_EQ(finish, "stop");
        } else if (!ended_on_eos) {
            EXPECT_EQ(finish, "length");
        }
    }
    expect_engine_idle(port());
    const HttpReply metrics = http_get(port(), "/metrics");
    // Responses are counted once written, which can be just after the client has read them.
    EXPECT_TRUE(wait_for_metric(port(), "epinfer_requests_total{status=\"200\"}", kRequests, 60.0, true));
    EXPECT_GE(metric_value(metrics.body, "epinfer_ttft_seconds_count"), kRequests);
    EXPECT_GE(metric_value(metrics.body, "epinfer_generated_tokens_total"), kRequests);
}

TEST_F(TinyServer, BadRequestsGetStatusAndJsonError) {
    const std::string too_long = json{{"prompt", std::vector<int32_t>(500, 5)}, {"max_tokens", 100}}.dump();
    const std::string whole_context =
        json{{"prompt", std::vector<int32_t>(static_cast<size_t>(config().max_position_embeddings), 5)}}.dump();
    struct Case {
        std::string body;
        int status;
        std::string needle;
    };
    const std::vector<Case> cases = {
        {"{not json", 400, "not valid JSON"},
        {"", 400, "not valid JSON"},
        {R"({"prompt": [1], "temperature": 1e400})", 400, "not valid JSON: number overflow parsing '1e400'"},
        {"[1, 2]", 400, "JSON object"},
        {R"({"max_tokens": 4})", 400, "'prompt' is required"},
        {R"({"prompt": null})", 400, "'prompt' is required"},
        {R"({"prompt": "hello"})", 400, "tokenizer"},
        {R"({"prompt": 7})", 400, "'prompt' must be an array"},
        {R"({"prompt": []})", 400, "empty"},
        {R"({"prompt": [[]]})", 400, "empty"},
        {R"({"prompt": [1, "a"]})", 400, "'prompt[1]' must be an integer"},
        {R"({"prompt": [1, 2.5]})", 400, "'prompt[1]' must be an integer"},
        {R"({"prompt": [1, 320]})", 400, "'prompt[1]' = 320 is outside the vocabulary [0, 320)"},
        {R"({"prompt": [-1]})", 400, "outside the vocabulary"},
        {R"({"prompt": [[1, 2], [3]]})", 400, "one prompt per request"},
        {R"({"prompt": [1], "max_tokens": 0})", 400, "'max_tokens' must be ≥ 1"},
        {R"({"prompt": [1], "max_tokens": -3})", 400, "'max_tokens' must be ≥ 1"},
        {R"({"prompt": [1], "max_tokens": "4"})", 400, "'max_tokens' must be an integer, got a string"},
        {R"({"prompt": [1], "max_tokens": 99999999999999999999})", 400,
         "'max_tokens' must be an integer, got a number 1e+20"},
        {R"({"prompt": [1], "max_tokens": 1.5})", 400, "'max_tokens' must be an integer"},
        {too_long, 400, "exceeds the model's context of 512 tokens"},
        {whole_context, 400, "the prompt has 512 tokens"},
        {R"({"prompt": [1], "temperature": -1})", 400, "'temperature'"},
        {R"({"prompt": [1], "temperature": "hot"})", 400, "'temperature' must be a number"},
        {R"({"prompt": [1], "top_p": 0})", 400, "'top_p'"},
        {R"({"prompt": [1], "top_k": -2})", 400, "'top_k'"},
        {R"({"prompt": [1], "seed": "x"})", 400, "'seed' must be an integer"},
        {R"({"prompt": [1], "seed": -1})", 400, "'seed' must be ≥ 0 (omit it for a fresh seed), got -1"},
        {R"({"prompt": [1], "seed": 18446744073709551616})", 400, "'seed' must be an integer"},
        {R"({"prompt": [1], "stream": "yes"})", 400, "'stream' must be a boolean"},
        {R"({"prompt": [1], "ignore_eos": 1})", 400, "'ignore_eos' must be a boolean"},
        {R"({"prompt": [1], "stop_token_ids": 3})", 400, "'stop_token_ids' must be an array"},
        {R"({"prompt": [1], "stop_token_ids": [999]})", 400, "'stop_token_ids[0]' = 999"},
        {R"({"prompt": [1], "stop": ["x"]})", 400, "stop_token_ids"},
        {R"({"prompt": [1], "n": 2})", 400, "'n' must be 1"},
        {R"({"prompt": [1], "echo": true})", 400, "'echo'"},
        {R"({"prompt": [1], "presence_penalty": 1.5})", 400, "'presence_penalty' is not supported"},
        {R"({"prompt": [1], "frequency_penalty": -0.5})", 400, "'frequency_penalty' is not supported"},
        {R"({"prompt": [1], "repetition_penalty": 1.1})", 400, "'repetition_penalty' is not supported"},
        {R"({"prompt": [1], "min_p": 0.1})", 400, "'min_p' is not supported"},
        {R"({"prompt": [1], "typical_p": 0.9})", 400, "'typical_p' is not supported"},
        {R"({"prompt": [1], "logit_bias": {"5": 100}})", 400, "'logit_bias' is not supported"},
        {R"({"prompt": [1], "model": 3})", 400, "'model' must be a string"},
        {R"({"prompt": [1], "model": "other"})", 404, "'other' does not exist"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.body.substr(0, 80));
        expect_json_error(http_post(port(), "/v1/completions", c.body), c.status, c.needle);
    }
    expect_json_error(http_get(port(), "/v1/nothing"), 404, "no route for GET /v1/nothing");
    expect_json_error(http_post(port(), "/v1/chat/completions", "{}"), 404, "no route for POST");
    expect_json_error(http_get(port(), "/v1/completions"), 405, "GET is not allowed on /v1/completions");
    const std::string big = json{{"prompt", std::vector<int32_t>(10000, 5)}}.dump();  // > 16 KiB
    ASSERT_GT(big.size(), 16u * 1024);
    expect_json_error(http_post(port(), "/v1/completions", big), 413, "16384 bytes");
    // curl -d's default type: read as JSON up to --max-body-bytes like any body (the HTTP library's own
    // 8192-byte cap on form-encoded bodies does not apply), so this one gets to the prompt check.
    const std::string mid = json{{"prompt", std::vector<int32_t>(4500, 5)}}.dump();  // 8-16 KiB
    ASSERT_GT(mid.size(), 8192u);
    ASSERT_LT(mid.size(), 16384u);
    expect_json_error(http_post(port(), "/v1/completions", mid, "application/x-www-form-urlencoded"), 400,
                      "the prompt has 4500 tokens");

    // The accepted forms next to them, and the other endpoints.
    const HttpReply ok = http_post(port(), "/v1/completions",
                                   R"({"model": "tiny", "prompt": [[5, 6]], "max_tokens": 2, "temperature": 0,
                                       "top_k": -1, "stop": [], "n": 1, "logprobs": null, "user": "x",
                                       "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1,
                                       "min_p": 0, "typical_p": 1, "logit_bias": {},
                                       "seed": 18446744073709551615})");
    ASSERT_EQ(ok.status, 200) << ok.body;
    EXPECT_EQ(json::parse(ok.body).at("usage").at("prompt_tokens"), 2);
    const HttpReply models = http_get(port(), "/v1/models");
    ASSERT_EQ(models.status, 200);
    EXPECT_EQ(json::parse(models.body).at("data").at(0).at("id"), kModelName);
    EXPECT_EQ(json::parse(models.body).at("data").at(0).at("max_model_len"), 512);
    EXPECT_EQ(json::parse(models.body).at("data").at(0).at("vocab_size"), 320);
    const HttpReply health = http_get(port(), "/health");
    EXPECT_EQ(health.status, 200);
    EXPECT_EQ(json::parse(health.body).at("status"), "ok");
    const HttpReply metrics = http_get(port(), "/metrics");
    ASSERT_EQ(metrics.status, 200);
    EXPECT_NE(metrics.content_type.find("text/plain"), std::string::npos);
    for (const char* series : {"epinfer_requests_running", "epinfer_requests_waiting", "epinfer_kv_blocks_used",
                               "epinfer_kv_blocks_total", "epinfer_generated_tokens_total",
                               "epinfer_ttft_seconds_bucket{le=\"+Inf\"}", "epinfer_ttft_seconds_sum",
                               "epinfer_ttft_seconds_count", "epinfer_tpot_seconds_bucket{le=\"0.001\"}",
                               "epinfer_tpot_seconds_count", "epinfer_requests_total{status=\"400\"}",
                               "epinfer_requests_total{status=\"404\"}", "epinfer_requests_total{status=\"413\"}",
                               "epinfer_requests_finished_total{finish_reason=\"abort\"}"})
        EXPECT_GE(metric_value(metrics.body, series), 0.0) << series << " missing in\n" << metrics.body;
    EXPECT_EQ(metric_value(metrics.body, "epinfer_kv_blocks_total"), 512.0);
    EXPECT_NE(metrics.body.find("# TYPE epinfer_ttft_seconds histogram"), std::string::npos);
    expect_engine_idle(port());
}

// `method` on `path` (a JSON body "{}" unless GET or HEAD), and the reply's Allow header.
struct MethodReply {
    HttpReply reply;
    std::string allow;
};
MethodReply http_method(int port, const std::string& method, const std::string& path) {
    auto client = make_client(port);
    httplib::Request req;
    req.method = method;
    req.path = path;
    if (method != "GET" && method != "HEAD") {
        req.body = "{}";
        req.set_header("Content-Type", "application/json");
    }
    const httplib::Result r = client->send(req);
    if (!r) return {HttpReply{-1, "", "", httplib::to_string(r.error())}, ""};
    return {HttpReply{r->status, r->body, r->get_header_value("Content-Type"), ""},
            r->get_header_value("Allow")};
}

TEST_F(TinyServer, WrongMethodOnAKnownPathIs405WithAllow) {
    struct Case {
        const char* method;
        const char* path;
        const char* allow;
    };
    const Case cases[] = {
        {"GET", "/v1/completions", "POST"}, {"PUT", "/v1/completions", "POST"},
        {"DELETE", "/v1/completions", "POST"}, {"POST", "/health", "GET"},
        {"POST", "/metrics", "GET"}, {"POST", "/v1/models", "GET"},
        {"PATCH", "/v1/models", "GET"}, {"OPTIONS", "/health", "GET"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(std::string(c.method) + " " + c.path);
        const MethodReply r = http_method(port(), c.method, c.path);
        expect_json_error(r.reply, 405,
                          std::string(c.method) + " is not allowed on " + c.path + ": it answers " + c.allow + " only");
        EXPECT_EQ(r.allow, c.allow);
    }
    // HEAD is answered like GET (no body): 405 on the POST route, 200 on a GET route.
    const MethodReply head = http_method(port(), "HEAD", "/v1/completions");
    EXPECT_EQ(head.reply.status, 405);
    EXPECT_EQ(head.allow, "POST");
    EXPECT_EQ(http_method(port(), "HEAD", "/health").reply.status, 200);
    // Unknown paths stay 404, without Allow, whatever the method.
    for (const char* method : {"GET", "POST"}) {
        for (const char* path : {"/v1/chat/completions", "/v1/completions/", "/healthz"}) {
            SCOPED_TRACE(std::string(method) + " " + path);
            const MethodReply r = http_method(port(), method, path);
            expect_json_error(r.reply, 404, std::string("no route for ") + method + " " + path);
            EXPECT_EQ(r.allow, "");
        }
    }
    // The routes still answer their own method; the 405s are counted (each once written).
    EXPECT_EQ(http_get(port(), "/health").status, 200);
    EXPECT_TRUE(wait_for_metric(port(), "epinfer_requests_total{status=\"405\"}", 9.0, 60.0, true))
        << http_get(port(), "/metrics").body;
}

// A loopback TCP connection to `port` whose reads and writes give up after timeout_s; -1 on failure.
int connect_loopback(int port, time_t timeout_s = kClientTimeoutS) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    const timeval timeout{timeout_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// Sends each request (raw HTTP/1.1 text) on one keep-alive connection after the previous reply has been
// read, and returns the replies (head and Content-Length body); stops at the first reply that does not come
// within timeout_s.
std::vector<std::string> raw_http_exchange(int port, const std::vector<std::string>& requests,
                                           time_t timeout_s = kClientTimeoutS) {
    std::vector<std::string> replies;
    const int fd = connect_loopback(port, timeout_s);
    if (fd < 0) return replies;
    std::string pending;  // received, not yet returned
    for (const std::string& request : requests) {
        const ssize_t sent = send(fd, request.data(), request.size(), MSG_NOSIGNAL);
        if (sent != static_cast<ssize_t>(request.size())) break;
        size_t head_end = std::string::npos;
        size_t reply_size = 0;
        while (reply_size == 0 || pending.size() < reply_size) {
            if (head_end == std::string::npos && (head_end = pending.find("\r\n\r\n")) != std::string::npos) {
                const size_t at = pending.find("Content-Length: ");
                const size_t body_bytes = at < head_end ? std::stoul(pending.substr(at + 16)) : 0;
                reply_size = head_end + 4 + body_bytes;
                continue;
            }
            char buf[4096];
            const ssize_t n = recv(fd, buf, sizeof(buf), 0);
            if (n <= 0) break;
            pending.append(buf, static_cast<size_t>(n));
        }
        if (reply_size == 0 || pending.size() < reply_size) break;
        replies.push_back(pending.substr(0, reply_size));
        pending.erase(0, reply_size);
    }
    close(fd);
    return replies;
}

// A POST without Content-Length or body on a GET route (`curl -X POST .../health`) gets its 405 at once, as
// with a body, instead of the HTTP library waiting for a body and answering 400; announced bodies are read
// and dropped, so the connection goes on with the next request.
TEST_F(TinyServer, BodilessWrongMethodIs405AndTheConnectionGoesOn) {
    const std::vector<std::string> replies = raw_http_exchange(
        port(), {"POST /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
                 "PUT /v1/models HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello",
                 "DELETE /v1/completions HTTP/1.1\r\nHost: localhost\r\n\r\n",
                 "POST /healthz HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "3\r\nabc\r\n0\r\n\r\n",
                 "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"});
    ASSERT_EQ(replies.size(), 5u);
    const auto expect_reply = [](const std::string& reply, const std::string& status_line,
                                 const std::string& allow, const std::string& needle) {
        EXPECT_EQ(reply.rfind(status_line + "\r\n", 0), 0u) << reply;
        EXPECT_EQ(reply.find("\r\nAllow: " + allow + "\r\n") != std::string::npos, !allow.empty()) << reply;
        EXPECT_NE(reply.find(needle), std::string::npos) << "'" << needle << "' not in " << reply;
    };
    const std::string k405 = "HTTP/1.1 405 Method Not Allowed";
    expect_reply(replies[0], k405, "GET", "POST is not allowed on /health: it answers GET only");
    expect_reply(replies[1], k405, "GET", "PUT is not allowed on /v1/models");
    expect_reply(replies[2], k405, "POST", "DELETE is not allowed on /v1/completions");
    expect_reply(replies[3], "HTTP/1.1 404 Not Found", "", "no route for POST /healthz");
    expect_reply(replies[4], "HTTP/1.1 200 OK", "", R"({"status":"ok"})");
}

// A chunked body is held to --max-body-bytes as one with a Content-Length: past it, 413 at once (the rest is
// never read: a 300 MB chunked body was read whole before); within it, served. A malformed chunk is a 400.
TEST_F(TinyServer, ChunkedBodiesAreCappedAtMaxBodyBytes) {
    const auto chunked = [](const std::string& body) {
        char size[32];
        std::snprintf(size, sizeof size, "%zx", body.size());
        return "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n" +
               std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
    };
    const std::string ok = json{{"prompt", {1, 2, 3}}, {"max_tokens", 2}}.dump();
    std::vector<std::string> replies = raw_http_exchange(port(), {chunked(ok)});
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << replies[0];
    // 20 KiB in one chunk against the fixture's 16 KiB: 413 once the cap is passed, the reply asking the
    // client to close (the rest of the body is not read; the library would parse it as a next request).
    const std::string big = json{{"prompt", std::vector<int32_t>(12000, 5)}}.dump();
    ASSERT_GT(big.size(), 16u * 1024);
    replies = raw_http_exchange(port(), {chunked(big)});
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].rfind("HTTP/1.1 413 Payload Too Large\r\n", 0), 0u) << replies[0];
    EXPECT_NE(replies[0].find("16384 bytes (--max-body-bytes)"), std::string::npos) << replies[0];
    EXPECT_NE(replies[0].find("Connection: close"), std::string::npos) << replies[0];
    // A chunk that announces more than it sends, then the end of the stream: 400.
    replies =
        raw_http_exchange(port(), {"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: "
                                   "chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"});
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << replies[0];
}

// A Content-Length that is not a decimal number (or several that differ) is a 400, one past --max-body-bytes
// a 413, both answered before any body byte is read and asking the client to close: the body of an invalid
// one has no known end, and an over-limit one is not waited for (the HTTP library would read and drop the
// declared bytes first, until its 5 s read timeout when they never come; the replies must come well before
// that). Other routes and methods get the same answers.
TEST_F(TinyServer, BadOrOverLimitContentLengthIsAnsweredAtOnce) {
    struct Case {
        std::string head;  // request line and headers, without the blank line
        std::string body;
        std::string status_line;
        std::string needle;
    };
    const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n";
    const std::vector<Case> cases = {
        {post + "Content-Length: -5", "{}", "HTTP/1.1 400 Bad Request",
         "the Content-Length '-5' is not a decimal number of bytes"},
        {post + "Content-Length: +2", "{}", "HTTP/1.1 400 Bad Request", "the Content-Length '+2' is not"},
        {post + "Content-Length: 0x10", "", "HTTP/1.1 400 Bad Request", "the Content-Length '0x10' is not"},
        {post + "Content-Length: 2\r\nContent-Length: 3", "{}", "HTTP/1.1 400 Bad Request",
         "the Content-Length headers differ ('2', '3')"},
        {post + "Content-Length: 16385", "", "HTTP/1.1 413 Payload Too Large",
         "16384 bytes (--max-body-bytes)"},
        {post + "Content-Length: 99999999999999999999999", "", "HTTP/1.1 413 Payload Too Large",
         "16384 bytes (--max-body-bytes)"},
        {"PUT /v1/models HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1", "", "HTTP/1.1 400 Bad Request",
         "the Content-Length '-1' is not"},
        {"POST /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: 20000", "",
         "HTTP/1.1 413 Payload Too Large", "16384 bytes"},
        // A client waiting for "100 Continue" before it sends the body (curl past 1 MiB) gets the 413
        // instead.
        {post + "Expect: 100-continue\r\nContent-Length: 20000", "", "HTTP/1.1 413 Payload Too Large",
         "16384 bytes (--max-body-bytes)"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.head);
        const std::vector<std::string> replies =
            raw_http_exchange(port(), {c.head + "\r\n\r\n" + c.body}, /*timeout_s=*/3);
        if (replies.size() != 1) {
            ADD_FAILURE() << "no reply within 3 s";
            continue;
        }
        const std::string& reply = replies[0];
        EXPECT_EQ(reply.rfind(c.status_line + "\r\n", 0), 0u) << reply;
        EXPECT_NE(reply.find("\r\nConnection: close\r\n"), std::string::npos) << reply;
        EXPECT_NE(reply.find("Content-Type: application/json"), std::string::npos) << reply;
        EXPECT_NE(reply.find(c.needle), std::string::npos) << "'" << c.needle << "' not in " << reply;
        EXPECT_EQ(reply.find("Content-Length:"), reply.rfind("Content-Length:")) << "not one:\n" << reply;
    }
    // A valid length is still read and served (after a "100 Continue" when the client asks for one).
    const std::string ok = json{{"prompt", {1, 2, 3}}, {"max_tokens", 2}}.dump();
    const std::string ok_head = post + "Content-Length: " + std::to_string(ok.size()) + "\r\n";
    std::vector<std::string> replies = raw_http_exchange(port(), {ok_head + "\r\n" + ok});
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << replies[0];
    replies = raw_http_exchange(port(), {ok_head + "Expect: 100-continue\r\n\r\n" + ok});
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].rfind("HTTP/1.1 100 Continue\r\n", 0), 0u) << replies[0];
}

// An omitted max_tokens is 16 cut to the room the prompt leaves in the context (512 tokens here), as
// vLLM's default; a given one that does not fit stays a 400 naming the context.
TEST_F(TinyServer, OmittedMaxTokensFitsTheRoomLeftInTheContext) {
    for (const auto& [prompt_tokens, want_tokens] :
         {std::pair<size_t, int64_t>{509, 3}, {500, 12}, {496, 16}, {20, 16}}) {
        SCOPED_TRACE(prompt_tokens);
        const json body = {
            {"prompt", std::vector<int32_t>(prompt_tokens, 5)}, {"temperature", 0}, {"ignore_eos", true}};
        const HttpReply r = http_post(port(), "/v1/completions", body.dump());
        ASSERT_EQ(r.status, 200) << r.body;
        const json reply = json::parse(r.body);
        EXPECT_EQ(reply.at("usage").at("completion_tokens"), want_tokens) << r.body;
        EXPECT_EQ(reply.at("choices").at(0).at("finish_reason"), "length") << r.body;
    }
    json body = {{"prompt", std::vector<int32_t>(509, 5)}, {"max_tokens", nullptr}};
    EXPECT_EQ(http_post(port(), "/v1/completions", body.dump()).status, 200);  // null: as omitted
    body["max_tokens"] = 4;
    expect_json_error(http_post(port(), "/v1/completions", body.dump()), 400,
                      "prompt (509 tokens) + max_tokens (4) exceeds the model's context of 512 tokens");
    expect_engine_idle(port());
}

// /metrics counts every response by status, routing 404s and 405s too. One keep-alive connection: its
// requests are served in turn, so each response has been counted before the next request is read.
TEST(ServerMetrics, EveryResponseIsCountedByStatus) {
    auto stack = start_stack(tiny_engine_options(), tiny_server_options());
    ASSERT_NE(stack, nullptr);
    const std::string completion = R"({"prompt": [5, 6], "max_tokens": 2})";
    const std::vector<std::string> replies = raw_http_exchange(
        stack->port(), {"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n",
                        "GET /v1/completions HTTP/1.1\r\nHost: localhost\r\n\r\n",
                        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                        "\r\nContent-Length: " +
                            std::to_string(completion.size()) + "\r\n\r\n" + completion,
                        "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"});
    ASSERT_EQ(replies.size(), 4u);
    EXPECT_EQ(replies[0].rfind("HTTP/1.1 404 ", 0), 0u) << replies[0];
    EXPECT_EQ(replies[1].rfind("HTTP/1.1 405 ", 0), 0u) << replies[1];
    EXPECT_EQ(replies[2].rfind("HTTP/1.1 200 ", 0), 0u) << replies[2];
    ASSERT_EQ(replies[3].rfind("HTTP/1.1 200 ", 0), 0u) << replies[3];
    std::vector<std::string> counted;  // the epinfer_requests_total lines, in order
    for (size_t pos = 0; (pos = replies[3].find("\nepinfer_requests_total{", pos)) != std::string::npos;) {
        ++pos;
        counted.push_back(replies[3].substr(pos, replies[3].find('\n', pos) - pos));
    }
    EXPECT_EQ(counted, (std::vector<std::string>{"epinfer_requests_total{status=\"200\"} 1",
                                                 "epinfer_requests_total{status=\"404\"} 1",
                                                 "epinfer_requests_total{status=\"405\"} 1"}))
        << replies[3];
}

TEST_F(TinyServer, LoadLoopLeavesNoKvBlocks) {
    constexpr int kThreads = 8;
    constexpr int kPerThread = 40;  // 320 requests
    std::atomic<int> ok{0}, failed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            std::mt19937 rng(100 + t);
            for (int k = 0; k < kPerThread; ++k) {
                json body = {{"prompt", random_prompt(rng, 1 + rng() % 16, 320)},
                             {"max_tokens", 1 + rng() % 4},
                             {"temperature", (k % 3) * 0.7},
                             {"top_p", 0.9},
                             {"top_k", static_cast<int>(rng() % 8)},
                             {"seed", k},
                             {"stop_token_ids", {static_cast<int>(rng() % 320)}}};
                bool good = false;
                if (k % 2 == 0) {
                    body["stream"] = true;
                    const StreamReply r = http_post_stream(port(), body);
                    good = r.status == 200 && r.done && !r.malformed && !r.chunks.empty() &&
                           r.chunks.back().contains("usage");
                } else {
                    const HttpReply r = http_post(port(), "/v1/completions", body.dump());
                    good = r.status == 200 && json::parse(r.body, nullptr, false).contains("usage");
                }
                (good ? ok : failed)++;
            }
        });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(ok.load(), kThreads * kPerThread);
    EXPECT_EQ(failed.load(), 0);
    EXPECT_EQ(http_get(port(), "/health").status, 200);
    expect_engine_idle(port());
}

TEST(ServerSampling, SeededRequestsRepeat) {
    auto stack = start_stack(tiny_engine_options(), tiny_server_options());
    ASSERT_NE(stack, nullptr);
    const std::string body =
        R"({"prompt": [3, 4, 5], "max_tokens": 8, "temperature": 1.0, "top_p": 0.95, "seed": 1234, "ignore_eos": true})";
    const HttpReply a = http_post(stack->port(), "/v1/completions", body);
    const HttpReply b = http_post(stack->port(), "/v1/completions", body);
    ASSERT_EQ(a.status, 200) << a.body;
    ASSERT_EQ(b.status, 200) << b.body;
    const auto ta = json::parse(a.body).at("choices").at(0).at("token_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(ta.size(), 8u);
    EXPECT_EQ(ta, json::parse(b.body).at("choices").at(0).at("token_ids").get<std::vector<int32_t>>());
}

// A model whose every step is slow (random weights, a 2^18-token vocabulary: the LM head dominates), so
// that a test can act while a request is still running; one request runs at a time, one may wait.
constexpr int64_t kSlowVocab = int64_t{1} << 18;

EngineOptions slow_engine_options() {
    EngineOptions o;
    o.num_kv_blocks = 128;
    o.max_running = 1;
    o.max_waiting = 1;
    return o;
}

server::ServerOptions slow_server_options() {
    server::ServerOptions o = tiny_server_options();
    o.num_http_threads = 8;
    return o;
}

const json kLongStream = {{"prompt", {5, 6, 7}}, {"max_tokens", 400}, {"temperature", 0},
                          {"ignore_eos", true},  {"stream", true}};

TEST(SlowServer, ClientThatLeavesMidStreamFreesItsKvBlocks) {
    auto stack = start_stack(slow_engine_options(), slow_server_options(), kSlowVocab);
    ASSERT_NE(stack, nullptr);
    const int port = stack->port();
    // Reads two token chunks, then closes the connection.
    const StreamReply r = http_post_stream(port, kLongStream, [](const StreamReply& s) { return s.chunks.size() < 2; });
    EXPECT_EQ(r.status, 200);
    EXPECT_FALSE(r.done);
    ASSERT_GE(r.chunks.size(), 2u);
    expect_engine_idle(port);
    EXPECT_TRUE(wait_for_metric(port, "epinfer_requests_finished_total{finish_reason=\"abort\"}", 1.0));
    EXPECT_LT(get_metric(port, "epinfer_generated_tokens_total"), 400.0);
    EXPECT_EQ(get_metric(port, "epinfer_requests_finished_total{finish_reason=\"length\"}"), 0.0);
    // The server goes on serving.
    const HttpReply next = http_post(port, "/v1/completions", R"({"prompt": [1, 2], "max_tokens": 2})");
    EXPECT_EQ(next.status, 200) << next.body;
}

// A non-streaming client that closes its connection while its request runs (curl -m, a client-side timeout)
// cancels it as a streaming one does: its slot and KV blocks are freed, and the next request is served.
TEST(SlowServer, NonStreamingClientThatLeavesIsCancelled) {
    auto stack = start_stack(slow_engine_options(), slow_server_options(), kSlowVocab);
    ASSERT_NE(stack, nullptr);
    const int port = stack->port();
    const std::string body =
        json{{"prompt", {5, 6, 7}}, {"max_tokens", 500}, {"temperature", 0}, {"ignore_eos", true}}.dump();
    const std::string request =
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n" + body;
    const int fd = connect_loopback(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    // The request runs (one slot, max_running 1) and has produced a token; then the client goes away.
    EXPECT_TRUE(wait_for_metric(port, "epinfer_requests_running", 1.0));
    EXPECT_TRUE(wait_for_metric(port, "epinfer_generated_tokens_total", 1.0, 60.0, /*at_least=*/true));
    close(fd);
    EXPECT_TRUE(wait_for_metric(port, "epinfer_requests_finished_total{finish_reason=\"abort\"}", 1.0))
        << http_get(port, "/metrics").body;
    expect_engine_idle(port);
    EXPECT_LT(get_metric(port, "epinfer_generated_tokens_total"), 500.0);
    EXPECT_EQ(get_metric(port, "epinfer_requests_finished_total{finish_reason=\"length\"}"), 0.0);
    const HttpReply next = http_post(port, "/v1/completions", R"({"prompt": [1, 2], "max_tokens": 2})");
    EXPECT_EQ(next.status, 200) << next.body;
}

TEST(SlowServer, FullQueueAnswers503) {
    auto stack = start_stack(slow_engine_options(), slow_server_options(), kSlowVocab);
    ASSERT_NE(stack, nullptr);
    const int port = stack->port();
    std::atomic<bool> release_first{false};
    std::atomic<int> first_chunks{0};
    // A runs (max_running 1) until this test lets it go; B then waits in the queue (max_waiting 1).
    std::thread a([&] {
        http_post_stream(port, kLongStream, [&](const StreamReply& s) {
            first_chunks = static_cast<int>(s.chunks.size());
            return !release_first.load();
        });
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (first_chunks.load() == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_GT(first_chunks.load(), 0);
    HttpReply b_reply;
    std::thread b([&] { b_reply = http_post(port, "/v1/completions", R"({"prompt": [9], "max_tokens": 1})"); });
    // B is queued once a whole engine step has passed since it showed up as waiting (it may first be
    // counted while still in the engine's intake).
    EXPECT_TRUE(wait_for_metric(port, "epinfer_requests_waiting", 1.0));
    const double steps = get_metric(port, "epinfer_engine_steps_total");
    EXPECT_TRUE(wait_for_metric(port, "epinfer_engine_steps_total", steps + 1.0, 60.0, /*at_least=*/true));
    EXPECT_EQ(get_metric(port, "epinfer_requests_waiting"), 1.0);
    expect_json_error(http_post(port, "/v1/completions", R"({"prompt": [9], "max_tokens": 1})"), 503, "");
    release_first = true;
    a.join();
    b.join();
    EXPECT_EQ(b_reply.status, 200) << b_reply.body;
    expect_engine_idle(port);
    EXPECT_TRUE(wait_for_metric(port, "epinfer_requests_total{status=\"503\"}", 1.0));
}

TEST(SlowServer, ShutdownRefusesNewRequestsAndFinishesRunningOnes) {
    auto stack = start_stack(slow_engine_options(), slow_server_options(), kSlowVocab);
    ASSERT_NE(stack, nullptr);
    const int port = stack->port();
    json body = kLongStream;
    body["max_tokens"] = 200;
    BackgroundStream client(port, body);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    ASSERT_TRUE(client.wait_started());
    std::thread stopper([&] { stack->server->shutdown(/*drain_timeout_s=*/120.0); });
    while (stack->server->healthy() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(http_get(port, "/health").status, 503);
    expect_json_error(http_post(port, "/v1/completions", R"({"prompt": [9], "max_tokens": 1})"), 503,
                      "shutting down");
    client.join();
    stopper.join();
    const StreamReply& running = client.reply;
    const json last = check_stream_shape(running);
    ASSERT_FALSE(last.is_null());
    EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "length");
    EXPECT_EQ(stream_tokens(running).size(), 200u);
    EXPECT_EQ(http_get(port, "/health").status, -1);  // no longer listening
}

TEST(SlowServer, CutDrainAbortsTheRequestsLeft) {
    auto stack = start_stack(slow_engine_options(), slow_server_options(), kSlowVocab);
    ASSERT_NE(stack, nullptr);
    const int port = stack->port();
    json body = kLongStream;
    body["max_tokens"] = 500;
    BackgroundStream client(port, body);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    EXPECT_TRUE(client.wait_started());
    // A drain that would let the request run to its end, cut short while it runs (as a second SIGTERM
    // does in epinfer serve).
    std::thread stopper([&] { stack->server->shutdown(/*drain_timeout_s=*/600.0); });
    while (stack->server->healthy() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stack->server->cut_drain();
    stopper.join();
    client.join();
    const StreamReply& running = client.reply;
    const json last = check_stream_shape(running);
    ASSERT_FALSE(last.is_null());
    EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "abort");
    EXPECT_LT(stream_tokens(running).size(), 500u);
    EXPECT_EQ(last.at("usage").at("completion_tokens"), static_cast<int64_t>(stream_tokens(running).size()));
    EXPECT_EQ(http_get(port, "/health").status, -1);  // no longer listening
}

TEST(SlowServer, RequestsPastTheTimeoutAreCancelled) {
    server::ServerOptions options = slow_server_options();
    options.request_timeout_s = 0.2;
    auto stack = start_stack(slow_engine_options(), options, kSlowVocab);
    ASSERT_NE(stack, nullptr);
    const int port = stack->port();
    json body = kLongStream;
    body["max_tokens"] = 500;
    const StreamReply streamed = http_post_stream(port, body);
    const json last = check_stream_shape(streamed);
    ASSERT_FALSE(last.is_null());
    EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "abort");
    EXPECT_LT(stream_tokens(streamed).size(), 500u);
    EXPECT_EQ(last.at("usage").at("completion_tokens"), static_cast<int64_t>(stream_tokens(streamed).size()));
    body["stream"] = false;
    expect_json_error(http_post(port, "/v1/completions", body.dump()), 504, "--request-timeout-s");
    expect_engine_idle(port);
    EXPECT_EQ(get_metric(port, "epinfer_requests_finished_total{finish_reason=\"abort\"}"), 2.0);
}

// A step that outlasts --health-stall-s while a request runs (here every step of the slow engine outlasts
// 1 ms; in production a rank that stopped answering) turns /health into 503 with a one-line reason; idle
// steps never count, so it is 200 before the request and again once it finished.
TEST(SlowServer, HealthIs503WhileAStepOutlastsTheStallBound) {
    server::ServerOptions options = slow_server_options();
    options.health_stall_s = 0.001;
    auto stack = start_stack(slow_engine_options(), options, kSlowVocab);
    ASSERT_NE(stack, nullptr);
    const int port = stack->port();
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past an idle step (EngineLoop: 0.5 s)
    EXPECT_EQ(http_get(port, "/health").status, 200);
    json body = kLongStream;
    body["max_tokens"] = 200;
    BackgroundStream client(port, body);
    ASSERT_TRUE(client.wait_started());
    const HttpReply stalled = wait_for_health(port, /*healthy=*/false, /*timeout_s=*/30.0);
    expect_json_error(stalled, 503, "the engine has been in one step for ");
    EXPECT_NE(stalled.body.find("with requests pending (over --health-stall-s 0.001 s): a rank may be stuck"),
              std::string::npos)
        << stalled.body;
    EXPECT_EQ(stalled.body.find('\n'), std::string::npos) << stalled.body;
    client.join();
    const json last = check_stream_shape(client.reply);
    ASSERT_FALSE(last.is_null());
    EXPECT_EQ(last.at("choices").at(0).at("finish_reason"), "length");
    expect_engine_idle(port);
    EXPECT_EQ(http_get(port, "/health").status, 200);
    EXPECT_TRUE(stack->server->healthy());
}

TEST(ServerOptions, BadOptionsAreRejected) {
    std::unique_ptr<Backend> backend = make_cpu_backend(1);
    Result<std::unique_ptr<Model>> model = Model::load(kTinyModel, *backend);
    ASSERT_TRUE(model.is_ok());
    EngineOptions eo = tiny_engine_options();
    Result<std::unique_ptr<Engine>> engine = Engine::create(**model, eo);
    ASSERT_TRUE(engine.is_ok());
    server::ServerOptions o = tiny_server_options();
    o.max_body_bytes = 0;
    EXPECT_NE(server::HttpServer::start(**engine, o).status().message().find("--max-body-bytes"), std::string::npos);
    o = tiny_server_options();
    o.request_timeout_s = 0;
    EXPECT_NE(server::HttpServer::start(**engine, o).status().message().find("--request-timeout-s"), std::string::npos);
    o = tiny_server_options();
    o.health_stall_s = 0;
    EXPECT_NE(server::HttpServer::start(**engine, o).status().message().find("--health-stall-s"), std::string::npos);
    // A port already taken.
    o = tiny_server_options();
    Result<std::unique_ptr<server::HttpServer>> first = server::HttpServer::start(**engine, o);
    ASSERT_TRUE(first.is_ok());
    o.port = (*first)->port();
    const Result<std::unique_ptr<server::HttpServer>> second = server::HttpServer::start(**engine, o);
    ASSERT_FALSE(second.is_ok());
    EXPECT_EQ(second.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(second.status().message().find(std::to_string(o.port)), std::string::npos);
}

TEST(ServerOptions, HostPortTextBracketsAnIpv6Literal) {
    EXPECT_EQ(server::host_port_text("127.0.0.1", 8000), "127.0.0.1:8000");
    EXPECT_EQ(server::host_port_text("localhost", 0), "localhost:0");
    EXPECT_EQ(server::host_port_text("::1", 36685), "[::1]:36685");
    EXPECT_EQ(server::host_port_text("::", 8000), "[::]:8000");
    EXPECT_EQ(server::host_port_text("fe80::1%lo", 80), "[fe80::1%lo]:80");
}

TEST(OpenAiProtocol, ParsesDefaultsAndFields) {
    const server::CompletionLimits limits{"m", 320, 512};
    Result<server::CompletionRequest> r = server::parse_completion_request(R"({"prompt": [1, 2]})", limits, 77);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->params.prompt_ids, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(r->params.max_tokens, 16);
    EXPECT_EQ(r->params.sampling.temperature, 1.0);
    EXPECT_EQ(r->params.sampling.seed, 77u);
    EXPECT_FALSE(r->params.ignore_eos);
    EXPECT_FALSE(r->stream);
    // An omitted max_tokens fits the room the prompt leaves (511 tokens: 1 left); a given one must fit.
    const std::string near_full = json{{"prompt", std::vector<int32_t>(511, 1)}}.dump();
    r = server::parse_completion_request(near_full, limits, 77);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->params.max_tokens, 1);
    EXPECT_EQ(server::parse_completion_request(
                  json{{"prompt", std::vector<int32_t>(511, 1)}, {"max_tokens", 2}}.dump(), limits, 77)
                  .status()
                  .message(),
              "prompt (511 tokens) + max_tokens (2) exceeds the model's context of 512 tokens");
    r = server::parse_completion_request(
        R"({"prompt": [[3]], "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 7, "seed": 9,
            "stop_token_ids": [4, 5], "ignore_eos": true, "stream": true, "model": "m"})",
        limits, 77);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->params.prompt_ids, (std::vector<int32_t>{3}));
    EXPECT_EQ(r->params.max_tokens, 5);
    EXPECT_EQ(r->params.sampling.temperature, 0.5);
    EXPECT_EQ(r->params.sampling.top_p, 0.9);
    EXPECT_EQ(r->params.sampling.top_k, 7);
    EXPECT_EQ(r->params.sampling.seed, 9u);
    EXPECT_EQ(r->params.stop_token_ids, (std::vector<int32_t>{4, 5}));
    EXPECT_TRUE(r->params.ignore_eos);
    EXPECT_TRUE(r->stream);
    EXPECT_EQ(server::http_status_of(Status(StatusCode::kUnavailable, "x")), 503);
    EXPECT_EQ(server::http_status_of(internal_error("x")), 500);
}

}  // namespace
}  // namespace epinfer::testing
