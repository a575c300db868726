#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "engine/kv_block_pool.h"
#include "engine/scheduler.h"

namespace epinfer {

namespace {

using Clock = std::chrono::steady_clock;

// An idle driver sends the followers an empty step at most this often (and the caller steps it at least
// every second: engine.h).
constexpr double kHeartbeatSeconds = 0.1;
// The token a rank reports for a sequence whose logits are not finite (the all-reduce takes the max).
constexpr int32_t kNonFiniteToken = std::numeric_limits<int32_t>::max();

// One sequence's part of a step, as every rank of the layout sees it.
struct PlanChunk {
    RequestId id = 0;
    int group = 0;                     // attention-DP group whose ranks run it
    int64_t num_cached = 0;            // KV rows already filled
    bool sample = false;               // sample a token after this chunk
    int64_t produced = 0;              // tokens the request produced before this step (for messages)
    SamplingParams sampling;           // for the Sampler made when the sequence is first seen
    std::vector<int32_t> tokens;       // [num_new] the tokens to feed
    std::vector<int32_t> block_table;  // block ids of the group's pools, covering num_cached + num_new
};

struct StepPlan {
    bool shutdown = false;
    std::vector<RequestId> released;  // finished or aborted since the last plan: drop their samplers
    std::vector<PlanChunk> chunks;
};

// The plan as int64 words: kind, #released, released…, #chunks, then per chunk id, group, num_cached,
// sample, produced, temperature bits, top_k, top_p bits, seed, #tokens, #blocks, tokens…, blocks….
std::vector<int64_t> encode_plan(const StepPlan& plan) {
    std::vector<int64_t> w;
    w.push_back(plan.shutdown ? 1 : 0);
    w.push_back(static_cast<int64_t>(plan.released.size()));
    for (const RequestId id : plan.released) w.push_back(static_cast<int64_t>(id));
    w.push_back(static_cast<int64_t>(plan.chunks.size()));
    for (const PlanChunk& c : plan.chunks) {
        w.insert(w.end(),
                 {static_cast<int64_t>(c.id), c.group, c.num_cached, c.sample ? 1 : 0, c.produced,
                  std::bit_cast<int64_t>(c.sampling.temperature), c.sampling.top_k,
                  std::bit_cast<int64_t>(c.sampling.top_p), static_cast<int64_t>(c.sampling.seed),
                  static_cast<int64_t>(c.tokens.size()), static_cast<int64_t>(c.block_table.size())});
        w.insert(w.end(), c.tokens.begin(), c.tokens.end());
        w.insert(w.end(), c.block_table.begin(), c.block_table.end());
    }
    return w;
}

Result<StepPlan> decode_plan(std::span<const int64_t> w) {
    size_t pos = 0;
    bool ok = true;
    const auto next = [&]() -> int64_t {
        if (pos >= w.size()) {
            ok = false;
            return 0;
        }
        return w[pos++];
    };
    const auto count = [&]() -> size_t {
        const int64_t n = next();
        if (n < 0 || static_cast<uint64_t>(n) > w.size() - std::min(pos, w.size())) ok = false;
        return ok ? static_cast<size_t>(n) : 0;
    };
    StepPlan plan;
    plan.shutdown = next() != 0;
    const size_t num_released = count();
    for (size_t i = 0; i < num_released && ok; ++i) plan.released.push_back(static_cast<RequestId>(next()));
    const size_t num_chunks = count();
    for (size_t i = 0; i < num_chunks && ok; ++i) {
        PlanChunk c;
        c.id = static_cast<RequestId>(next());
        c.group = static_cast<int>(next());
        c.num_cached = next();
        c.sample = next() != 0;
        c.produced = next();
        c.sampling.temperature = std::bit_cast<double>(next());
        c.sampling.top_k = next();
        c.sampling.top_p = std::bit_cast<double>(next());
        c.sampling.seed = static_cast<uint64_t>(next());
        const size_t num_tokens = count();
        const size_t num_blocks = count();
        for (size_t t = 0; t < num_tokens && ok; ++t) c.tokens.push_back(static_cast<int32_t>(next()));
        for (size_t b = 0; b < num_blocks && ok; ++b) c.block_table.push_back(static_cast<int32_t>(next()));
        plan.chunks.push_back(std::move(c));
    }
    if (!ok || pos != w.size())
        return internal_error("engine: malformed step message of " + std::to_string(w.size()) + " words");
    return plan;
}

Status check_request_params(const ModelConfig& config, const RequestParams& r) {
    if (r.prompt_ids.empty()) return invalid_argument("prompt_ids is empty");
    for (const int32_t id : r.prompt_ids) {
        if (id < 0 || id >= config.vocab_size) {
            return invalid_argument("prompt id " + std::to_string(id) + " is outside [0, vocab_size " +
                                    std::to_string(config.vocab_size) + ")");
        }
    }
    if (r.max_tokens < 1)
        return invalid_argument("max_tokens must be ≥ 1, got " + std::to_string(r.max_tokens));
    const auto prompt_len = static_cast<int64_t>(r.prompt_ids.size());
    if (r.max_tokens > config.max_position_embeddings - prompt_len) {
        return invalid_argument("prompt of " + std::to_string(prompt_len) + " tokens + max_tokens " +
                                std::to_string(r.max_tokens) + " exceeds max_position_embeddings " +
                                std::to_string(config.max_position_embeddings));
    }
    for (const int32_t id : r.stop_token_ids) {
        if (id < 0 || id >= config.vocab_size) {
            return invalid_argument("stop token id " + std::to_string(id) + " is outside [0, vocab_size " +
                                    std::to_string(config.vocab_size) + ")");
        }
    }
    return sampling_params_check(r.sampling);
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

}  // namespace

struct Engine::Impl {
    Impl(Model& m, const EngineOptions& o, KvBlockPool p, Scheduler s)
        : model(m), options(o), pool(std::move(p)), scheduler(std::move(s)) {}

    // Runs one plan on this rank: its group's sequences through Model::forward (every rank joins, also
    // with none under DP attention), then samples its group's tokens. sampled: [chunks] the token of each
    // sampling chunk (−1 for the others), the same on every rank after the all-reduce.
    Status execute(const StepPlan& plan, std::vector<int32_t>* sampled);
    // Driver: sends `plan` to the followers. Followers: receives the next plan.
    Status send_plan(const StepPlan& plan);
    Result<StepPlan> receive_plan();
    // Driver: one step (engine.h).
    Status step(std::vector<RequestOutput>* outputs);
    // Driver: moves the queued requests and aborts into the scheduler.
    void absorb(std::vector<RequestOutput>* outputs);
    FinishReason finish_reason(const RequestParams& params, int64_t produced, int32_t token) const;

    Model& model;
    EngineOptions options;
    const ParallelContext* par = nullptr;
    bool driver = true;
    bool multi_rank = false;  // a layout of more than one rank: plans are broadcast
    int group = 0;            // this rank's attention-DP group
    KvBlockPool pool;  // storage only: block ids come from the driver's scheduler (one allocator per group)
    Scheduler scheduler;                              // driver
    std::unordered_map<RequestId, Sampler> samplers;  // every rank: the sequences it samples
    Status failure;                                   // the first failed step: the engine is unusable

    // Driver, stepping thread.
    struct RequestState {
        RequestParams params;
        int64_t produced = 0;
    };
    std::unordered_map<RequestId, RequestState> requests;
    std::vector<RequestId> released;  // finished or aborted since the last plan
    Clock::time_point last_plan_time = Clock::now();
    int64_t tokens_generated = 0;
    int64_t steps = 0;

    // Driver, any thread (guarded by mu).
    mutable std::mutex mu;
    std::vector<std::pair<RequestId, RequestParams>> incoming;
    std::vector<RequestId> aborts;
    RequestId next_id = 1;
    int64_t num_waiting = 0;  // the scheduler's queue after the last step
    bool shut_down = false;
};

Result<std::unique_ptr<Engine>> Engine::create(Model& model, const EngineOptions& options) {
    const ParallelContext* par = model.parallel();
    if (options.max_waiting < 1)
        return invalid_argument("max_waiting must be ≥ 1, got " + std::to_string(options.max_waiting));
    SchedulerOptions so;
    so.block_size = options.block_size;
    so.num_blocks = options.num_kv_blocks;
    so.max_running = options.max_running;
    so.max_step_tokens = options.max_step_tokens;
    so.num_groups = par != nullptr ? par->layout.attn_dp : 1;
    EPI_ASSIGN_OR_RETURN(Scheduler scheduler, Scheduler::create(so));
    EPI_ASSIGN_OR_RETURN(KvBlockPool pool,
                         KvBlockPool::create(model, options.num_kv_blocks, options.block_size,
                                             options.kv_cache_dtype));
    std::unique_ptr<Engine> engine(new Engine());
    engine->impl_ = std::make_unique<Impl>(model, options, std::move(pool), std::move(scheduler));
    Impl& m = *engine->impl_;
    m.par = par;
    m.multi_rank = par != nullptr && par->world->size() > 1;
    m.driver = par == nullptr || par->world->rank() == 0;
    m.group = par != nullptr ? par->coords.attn_dp_rank : 0;
    return engine;
}

Engine::~Engine() = default;

const Model& Engine::model() const {
    return impl_->model;
}

Result<RequestId> Engine::add_request(const RequestParams& params) {
    Impl& m = *impl_;
    if (!m.driver) {
        return internal_error("Engine::add_request on world rank " + std::to_string(m.par->world->rank()) +
                              ": only the driver (rank 0) takes requests");
    }
    EPI_RETURN_IF_ERROR(check_request_params(m.model.config(), params));
    EPI_RETURN_IF_ERROR(
        m.scheduler.check_request(static_cast<int64_t>(params.prompt_ids.size()), params.max_tokens));
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.shut_down) return Status(StatusCode::kUnavailable, "the engine is shut down");
    const int64_t queued = static_cast<int64_t>(m.incoming.size()) + m.num_waiting;
    if (queued >= m.options.max_waiting) {
        return Status(StatusCode::kUnavailable, std::to_string(queued) +
                                                    " requests are queued (max_waiting " +
                                                    std::to_string(m.options.max_waiting) + ")");
    }
    const RequestId id = m.next_id++;
    m.incoming.emplace_back(id, params);
    // A top_k of the whole vocabulary filters nothing: as 0, so the draw takes the same path (and tokens).
    SamplingParams& sampling = m.incoming.back().second.sampling;
    if (sampling.top_k >= m.model.config().vocab_size) sampling.top_k = 0;
    return id;
}

void Engine::abort(RequestId id) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->aborts.push_back(id);
}

bool Engine::has_unfinished() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return !impl_->incoming.empty() || !impl_->requests.empty();
}

EngineStats Engine::stats() const {
    const Impl& m = *impl_;
    EngineStats s;
    s.running = m.scheduler.num_running();
    s.waiting = m.scheduler.num_waiting();
    {
        std::lock_guard<std::mutex> lock(m.mu);
        s.waiting += static_cast<int64_t>(m.incoming.size());
    }
    s.kv_blocks_used = m.scheduler.num_blocks_used();
    s.kv_blocks_total = m.scheduler.num_blocks_total();
    s.tokens_generated = m.tokens_generated;
    s.preemptions = m.scheduler.num_preemptions();
    s.steps = m.steps;
    return s;
}

Result<std::vector<RequestOutput>> Engine::step() {
    Impl& m = *impl_;
    if (!m.driver) {
        return internal_error("Engine::step on world rank " + std::to_string(m.par->world->rank()) +
                              ": followers call run_follower()");
    }
    if (!m.failure.is_ok()) return m.failure;
    std::vector<RequestOutput> outputs;
    const Status st = m.step(&outputs);
    if (!st.is_ok()) {
        m.failure = st;
        return st;
    }
    return outputs;
}

Status Engine::shutdown() {
    Impl& m = *impl_;
    {
        std::lock_guard<std::mutex> lock(m.mu);
        if (m.shut_down) return Status::ok();
        m.shut_down = true;
    }
    if (!m.driver || !m.multi_rank || !m.failure.is_ok()) return Status::ok();
    StepPlan plan;
    plan.shutdown = true;
    return m.send_plan(plan);
}

Status Engine::run_follower() {
    Impl& m = *impl_;
    if (m.driver) return internal_error("Engine::run_follower on the driver (world rank 0)");
    std::vector<int32_t> sampled;
    for (;;) {
        EPI_ASSIGN_OR_RETURN(const StepPlan plan, m.receive_plan());
        if (plan.shutdown) return Status::ok();
        EPI_RETURN_IF_ERROR(m.execute(plan, &sampled));
    }
}

Status Engine::Impl::send_plan(const StepPlan& plan) {
    std::vector<int64_t> words = encode_plan(plan);
    int64_t n = static_cast<int64_t>(words.size());
    EPI_RETURN_IF_ERROR_CTX(par->world->broadcast(&n, 1, DType::kI64, 0), "engine step message");
    EPI_RETURN_IF_ERROR_CTX(par->world->broadcast(words.data(), n, DType::kI64, 0), "engine step message");
    last_plan_time = Clock::now();
    return Status::ok();
}

Result<StepPlan> Engine::Impl::receive_plan() {
    int64_t n = 0;
    EPI_RETURN_IF_ERROR_CTX(par->world->broadcast(&n, 1, DType::kI64, 0), "engine step message");
    if (n < 0) return internal_error("engine: step message of " + std::to_string(n) + " words");
    std::vector<int64_t> words(static_cast<size_t>(n));
    EPI_RETURN_IF_ERROR_CTX(par->world->broadcast(words.data(), n, DType::kI64, 0), "engine step message");
    return decode_plan(words);
}

Status Engine::Impl::execute(const StepPlan& plan, std::vector<int32_t>* sampled) {
    for (const RequestId id : plan.released) samplers.erase(id);
    sampled->assign(plan.chunks.size(), -1);
    if (plan.chunks.empty()) return Status::ok();

    std::vector<size_t> mine;  // chunks of this rank's group, in plan order
    for (size_t i = 0; i < plan.chunks.size(); ++i)
        if (plan.chunks[i].group == group) mine.push_back(i);
    std::vector<std::vector<LayerKvCache>> kv(mine.size());
    std::vector<SequenceInput> inputs(mine.size());
    for (size_t k = 0; k < mine.size(); ++k) {
        const PlanChunk& c = plan.chunks[mine[k]];
        kv[k] = pool.views(c.block_table, c.num_cached);
        inputs[k] = {c.tokens, kv[k]};
    }
    // The device chooses every row's token (Backend::argmax: the argmax, or the row's draw) and only ids
    // come back; drawn rows send their TokenDraw (Sampler::next_draw, once per produced token).
    std::vector<TokenDraw> draws;  // [mine] when some row draws
    for (size_t k = 0; k < mine.size(); ++k) {
        const PlanChunk& c = plan.chunks[mine[k]];
        if (!c.sample || c.sampling.temperature == 0.0) continue;
        draws.resize(mine.size());
        draws[k] = samplers.try_emplace(c.id, c.sampling).first->second.next_draw();
    }
    std::vector<int32_t> ids(mine.size()), non_finite_rows(mine.size());  // [mine]
    if (!mine.empty() || (par != nullptr && par->dp_attention())) {
        ForwardArgs args;
        args.sequences = inputs;
        args.logits_mode = LogitsMode::kLastRowPerSequence;
        args.greedy_ids = ids.data();
        args.greedy_non_finite = non_finite_rows.data();
        if (!draws.empty()) args.sample_draws = draws.data();
        EPI_RETURN_IF_ERROR(model.forward(args));
    }
    Status non_finite;
    for (size_t k = 0; k < mine.size(); ++k) {
        const PlanChunk& c = plan.chunks[mine[k]];
        if (!c.sample) continue;
        if (non_finite_rows[k] != 0) {
            (*sampled)[mine[k]] = kNonFiniteToken;
            if (non_finite.is_ok()) {
                non_finite = data_loss(
                    "request id " + std::to_string(c.id) + ", new token " + std::to_string(c.produced) +
                    ": its logits hold a NaN or inf (non-finite: do the checkpoint's weights "
                    "hold NaN or inf?)");
            }
            continue;
        }
        (*sampled)[mine[k]] = ids[k];
    }
    if (multi_rank) {
        EPI_RETURN_IF_ERROR_CTX(
            par->world->all_reduce(sampled->data(), sampled->data(), static_cast<int64_t>(sampled->size()),
                                   DType::kI32, ReduceOp::kMax),
            "engine sampled tokens");
    }
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
        if ((*sampled)[i] != kNonFiniteToken) continue;
        if (!non_finite.is_ok()) return non_finite;
        const PlanChunk& c = plan.chunks[i];
        return data_loss("request id " + std::to_string(c.id) + ", new token " + std::to_string(c.produced) +
                         ": non-finite logits on the ranks of attention-DP group " + std::to_string(c.group) +
                         " (do the checkpoint's weights hold NaN or inf?)");
    }
    return Status::ok();
}

void Engine::Impl::absorb(std::vector<RequestOutput>* outputs) {
    std::vector<std::pair<RequestId, RequestParams>> new_requests;
    std::vector<RequestId> new_aborts;
    {
        std::lock_guard<std::mutex> lock(mu);
        new_requests.swap(incoming);
        new_aborts.swap(aborts);
        // They leave `incoming` now but reach the scheduler's count only after this step: count them
        // as waiting meanwhile, so add_request keeps max_waiting during the step.
        num_waiting += static_cast<int64_t>(new_requests.size());
    }
    for (auto& [id, params] : new_requests) {
        scheduler.add(id, params.prompt_ids);
        requests.emplace(id, RequestState{std::move(params), 0});
    }
    for (const RequestId id : new_aborts) {
        const auto it = requests.find(id);
        if (it == requests.end()) continue;  // unknown or already finished
        scheduler.remove(id);
        RequestOutput out;
        out.id = id;
        out.finish = FinishReason::kAborted;
        out.prompt_tokens = static_cast<int64_t>(it->second.params.prompt_ids.size());
        out.completion_tokens = it->second.produced;
        outputs->push_back(std::move(out));
        released.push_back(id);
        requests.erase(it);
    }
}

FinishReason Engine::Impl::finish_reason(const RequestParams& params, int64_t produced, int32_t token) const {
    const auto& stop = params.stop_token_ids;
    if (std::find(stop.begin(), stop.end(), token) != stop.end()) return FinishReason::kStop;
    const auto& eos = model.config().eos_token_ids;
    if (!params.ignore_eos && std::find(eos.begin(), eos.end(), static_cast<int64_t>(token)) != eos.end())
        return FinishReason::kStop;
    return produced >= params.max_tokens ? FinishReason::kLength : FinishReason::kNone;
}

Status Engine::Impl::step(std::vector<RequestOutput>* outputs) {
    absorb(outputs);
    const SchedulerStep sched = scheduler.schedule();
    const auto set_waiting = [&] {
        std::lock_guard<std::mutex> lock(mu);
        num_waiting = scheduler.num_waiting();
    };
    StepPlan plan;
    plan.released = std::move(released);
    released.clear();
    if (sched.chunks.empty()) {
        set_waiting();
        for (const RequestId id : plan.released) samplers.erase(id);
        if (multi_rank &&
            (!plan.released.empty() || seconds_between(last_plan_time, Clock::now()) >= kHeartbeatSeconds))
            return send_plan(plan);
        return Status::ok();
    }
    for (const ScheduledChunk& c : sched.chunks) {
        const RequestState& state = requests.at(c.id);
        const std::vector<int32_t>& tokens = scheduler.tokens(c.id);
        PlanChunk pc;
        pc.id = c.id;
        pc.group = c.group;
        pc.num_cached = c.num_cached;
        pc.sample = c.sample;
        pc.produced = state.produced;
        pc.sampling = state.params.sampling;
        pc.tokens.assign(tokens.begin() + c.num_cached, tokens.begin() + c.num_cached + c.num_new);
        pc.block_table = scheduler.block_table(c.id);
        plan.chunks.push_back(std::move(pc));
    }
    if (multi_rank) EPI_RETURN_IF_ERROR(send_plan(plan));
    std::vector<int32_t> sampled;
    EPI_RETURN_IF_ERROR(execute(plan, &sampled));
    ++steps;
    const int64_t V = model.config().vocab_size;
    for (size_t i = 0; i < sched.chunks.size(); ++i) {
        const ScheduledChunk& c = sched.chunks[i];
        scheduler.commit(c);
        if (!c.sample) continue;
        const int32_t token = sampled[i];
        if (token < 0 || token >= V) {
            return internal_error("engine: request " + std::to_string(c.id) + " sampled token " +
                                  std::to_string(token) + " outside [0, " + std::to_string(V) + ")");
        }
        RequestState& state = requests.at(c.id);
        ++state.produced;
        ++tokens_generated;
        scheduler.append_token(c.id, token);
        RequestOutput out;
        out.id = c.id;
        out.new_token_ids = {token};
        out.finish = finish_reason(state.params, state.produced, token);
        out.prompt_tokens = static_cast<int64_t>(state.params.prompt_ids.size());
        out.completion_tokens = state.produced;
        if (out.finish != FinishReason::kNone) {
            scheduler.remove(c.id);
            released.push_back(c.id);
            requests.erase(c.id);
        }
        outputs->push_back(std::move(out));
    }
    set_waiting();
    return Status::ok();
}

}  // namespace epinfer
