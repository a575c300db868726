#include "planner/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "planner/fit_check.h"
#include "planner/layouts.h"

namespace epinfer::planner {
namespace {

std::string ms(double us) {
    return fmt::format("{:.2f} ms", us / 1e3);
}

// One comparable term of a decode step: a key shared across layouts, its time and a description.
struct Term {
    std::string key;
    double us = 0.0;
    std::string text;
};

std::vector<Term> terms_of(const LayoutPlan& lp, const DecodeResult& r) {
    const StepBreakdown& s = r.step;
    std::vector<Term> terms;
    terms.push_back({"attention", s.attention_us, fmt::format("attention {}", ms(s.attention_us))});
    terms.push_back(
        {"experts", s.experts_us,
         fmt::format("expert GEMMs {} (busiest rank reads {:.1f} of its {} experts, {:.0f} MB, per MoE "
                     "layer × {})",
                     ms(s.experts_us), s.experts_touched_per_rank, s.local_experts,
                     s.expert_bytes_per_layer / 1e6, s.moe_layers)});
    terms.push_back({"dense", s.dense_us,
                     fmt::format("dense parts (shared experts, routers, LM head) {}", ms(s.dense_us))});
    terms.push_back({"activations", s.activations_us,
                     fmt::format("activation reads and writes {}", ms(s.activations_us))});
    terms.push_back({"launch", s.launch_us, fmt::format("{} kernels {}", s.kernels, ms(s.launch_us))});
    if (s.host_round_trips > 0) {
        terms.push_back({"host", s.host_us,
                         fmt::format("{} host round trips (the MoE dispatch planned on the host: routing to "
                                     "the host, MPI exchanges, uploads) × {:.1f} µs = {} per step",
                                     s.host_round_trips, s.host_us / static_cast<double>(s.host_round_trips),
                                     ms(s.host_us))});
    }
    terms.push_back({"pipeline", s.pipeline_wait_us,
                     fmt::format("pipeline wait {} ({} micro-batches over {} stages)", ms(s.pipeline_wait_us),
                                 s.micro_batches, lp.layout.pp)});
    // Collectives, aggregated by kind.
    std::map<Collective, std::pair<int64_t, double>> by_kind;  // calls, µs
    for (const CollectiveTerm& t : s.collectives) {
        by_kind[t.kind].first += t.calls;
        by_kind[t.kind].second += t.total_us();
    }
    for (const auto& [kind, calls_us] : by_kind) {
        const auto& [calls, us] = calls_us;
        const char* suffix = kind == Collective::kAllToAll   ? " (dispatch + combine)"
                             : kind == Collective::kSendRecv ? " (stage sends, output broadcast)"
                                                             : "";
        terms.push_back({collective_name(kind), us,
                         fmt::format("{} {}{} × {:.1f} µs = {} per step", calls, collective_name(kind),
                                     suffix, calls > 0 ? us / calls : 0.0, ms(us))});
    }
    return terms;
}

const Term* find_term(const std::vector<Term>& terms, const std::string& key) {
    for (const Term& t : terms) {
        if (t.key == key) return &t;
    }
    return nullptr;
}

Status validate_request(const HardwareProfile& hw, const PlanRequest& r) {
    if (r.gpus < 1) return invalid_argument(fmt::format("--gpus {}: must be >= 1", r.gpus));
    if (r.nodes < 1) return invalid_argument(fmt::format("--nodes {}: must be >= 1", r.nodes));
    if (r.gpus % r.nodes != 0) {
        return invalid_argument(
            fmt::format("--gpus {} --nodes {}: the GPUs must split evenly over the nodes", r.gpus, r.nodes));
    }
    if (r.gpus / r.nodes > hw.gpus_per_node) {
        return invalid_argument(fmt::format(
            "--gpus {} on {} node(s): profile {} has at most {} GPUs per node; pass --nodes {}", r.gpus,
            r.nodes, hw.name, hw.gpus_per_node, (r.gpus + hw.gpus_per_node - 1) / hw.gpus_per_node));
    }
    if (r.nodes > 1 && !hw.inter_node) {
        return invalid_argument(
            fmt::format("--nodes {}: profile {} has no inter_node link", r.nodes, hw.name));
    }
    if (r.concurrency.empty()) return invalid_argument("--concurrency: empty list");
    for (int64_t c : r.concurrency) {
        if (c < 1) return invalid_argument(fmt::format("--concurrency {}: must be >= 1", c));
    }
    if (r.memory.context_tokens < 1) {
        return invalid_argument(fmt::format("--context {}: must be >= 1", r.memory.context_tokens));
    }
    if (r.input_len < 1) return invalid_argument(fmt::format("--input-len {}: must be >= 1", r.input_len));
    if (r.output_len < 0 || r.output_len == 1) {
        return invalid_argument(
            fmt::format("--output-len {}: must be 0 (no closed loop) or >= 2", r.output_len));
    }
    if (r.max_step_tokens < 1 || r.max_step_tokens > kMaxPlanStepTokens) {
        return invalid_argument(
            fmt::format("--max-step-tokens {}: must be in [1, {}]", r.max_step_tokens, kMaxPlanStepTokens));
    }
    if (r.memory.context_tokens < r.input_len + r.output_len) {  // a request holds its prompt (and output)
        return invalid_argument(
            r.output_len > 0
                ? fmt::format("--context {}: shorter than --input-len + --output-len = {} (the closed loop's "
                              "requests hold them all)",
                              r.memory.context_tokens, r.input_len + r.output_len)
                : fmt::format("--context {}: shorter than --input-len {} (a prompt's KV is held whole)",
                              r.memory.context_tokens, r.input_len));
    }
    if (r.micro_batches < 0) {
        return invalid_argument(fmt::format("--micro-batches {}: must be >= 0", r.micro_batches));
    }
    if (r.memory_fraction && !(*r.memory_fraction > 0.0 && *r.memory_fraction <= 1.0)) {
        return invalid_argument(fmt::format("--memory-fraction must be in (0, 1], got {}", *r.memory_fraction));
    }
    if (r.kv_cache_tokens && *r.kv_cache_tokens < 0) {
        return invalid_argument(fmt::format("--kv-cache-tokens {}: must be >= 0", *r.kv_cache_tokens));
    }
    if (r.kv_cache_tokens && *r.kv_cache_tokens > 0 && *r.kv_cache_tokens < kEngineKvBlockTokens) {
        return invalid_argument(
            fmt::format("--kv-cache-tokens {}: holds no KV block of the engine's {} tokens",
                        *r.kv_cache_tokens, kEngineKvBlockTokens));
    }
    return Status::ok();
}

// Plan::notes: each (link, collective, ranks) the decode steps use with no measured table at that rank
// count while the profile has tables at others (e.g. a 2-GPU profile planned for 8 GPUs).
std::vector<std::string> extrapolation_notes(const Plan& plan) {
    std::set<std::tuple<bool, Collective, int>> seen;
    std::vector<std::string> notes;
    for (const LayoutPlan& lp : plan.layouts) {
        for (const DecodeResult& d : lp.decode) {
            for (const CollectiveTerm& t : d.step.collectives) {
                const LinkSpec& link = t.inter_node ? *plan.hardware.inter_node : plan.hardware.intra_node;
                const CollectiveSpec& spec = link[t.kind];
                if (spec.tables.empty() || spec.table_for(t.ranks) != nullptr) continue;
                if (!seen.insert({t.inter_node, t.kind, t.ranks}).second) continue;
                std::string measured;
                for (const SizeTable& table : spec.tables) {
                    measured += fmt::format("{}{}", measured.empty() ? "" : ", ", table.ranks);
                }
                notes.push_back(fmt::format(
                    "{}.{} at {} ranks: the profile measured {} ranks only; priced from its fit ({:.1f} µs + "
                    "bytes at {:.0f} GB/s bus bandwidth)",
                    t.inter_node ? "inter_node" : "intra_node", collective_name(t.kind), t.ranks, measured,
                    spec.latency_us.value, spec.bus_bandwidth_gbps.value));
            }
        }
    }
    return notes;
}

std::string recommend_reason(const Plan& plan, const Recommendation& rec, size_t ci) {
    const LayoutPlan& win = plan.layouts[static_cast<size_t>(rec.layout)];
    const DecodeResult& w = win.decode[ci];
    std::string text =
        fmt::format("{}: {} tok/s, TPOT {:.1f} ms", win.spec, format_tokens_per_s(w.tokens_per_s), w.tpot_ms);
    if (rec.runner_up >= 0) {
        const LayoutPlan& run = plan.layouts[static_cast<size_t>(rec.runner_up)];
        text += fmt::format(". {} ({} tok/s) {}", run.spec, format_tokens_per_s(run.decode[ci].tokens_per_s),
                            explain_difference(win, w, run, run.decode[ci]));
    } else {
        text += ". The only layout that fits";
    }
    // A faster layout that fits the weights but not this many requests' KV.
    for (const LayoutPlan& lp : plan.layouts) {
        const DecodeResult& d = lp.decode[ci];
        if (lp.memory.fits && !d.kv_fits && d.tokens_per_s > w.tokens_per_s) {
            text += fmt::format(". {} would be faster ({} tok/s) but holds only {} requests of {} tokens",
                                lp.spec, format_tokens_per_s(d.tokens_per_s), lp.memory.max_requests,
                                plan.request.memory.context_tokens);
            break;
        }
    }
    return text;
}

std::string memory_verdict(const Plan& plan) {
    const LayoutPlan* closest = nullptr;
    for (const LayoutPlan& lp : plan.layouts) {
        if (!closest || lp.memory.margin_bytes > closest->memory.margin_bytes) closest = &lp;
    }
    if (!closest) return "";
    if (!closest->refusal.empty()) return "nothing fits: " + closest->refusal;
    const MemoryPlan& mem = closest->memory;
    const StageMemory& s = mem.worst();
    return fmt::format(
        "nothing fits: {} on {}× {} with weights {}: the closest layout, {}, needs {} of weights per GPU "
        "(largest: "
        "{} {}) + {} of buffers, activations and CUDA graphs + {} of KV for one {}-token request, over the "
        "usable {} "
        "by {}",
        plan.request.model_label, plan.request.gpus, plan.hardware.gpu.name,
        weight_formats_to_string(plan.request.memory.weights), closest->spec, format_gib(s.weights.total()),
        mem.largest_term, format_gib(mem.largest_term_bytes),
        format_gib(s.ep_buffer_bytes + s.activation_bytes + s.cuda_graph_bytes),
        format_gib(plan.request.memory.context_tokens * s.kv_bytes_per_token),
        plan.request.memory.context_tokens, format_gib(mem.usable_bytes), format_gib(-mem.margin_bytes));
}

// The runtime's memory check (check_fits, as start_model runs it) of `layout` on one GPU of `hw`, under
// request.kv_cache_tokens: `memory` gets the plan with the engine's KV pool (kv_cache_tokens — then also each
// stage's kv_tokens and kv_cache_bytes, fitting or not — or what is left when 0) and max_requests of
// memory.context_tokens; returns "" when it fits, else the check's one-line refusal.
Result<std::string> engine_fit(const ModelConfig& config, const HardwareProfile& hw, const ParallelLayout& layout,
                               const PlanRequest& request, MemoryPlan& memory) {
    const int64_t pool = *request.kv_cache_tokens;
    FitOptions fit;
    fit.device_bytes = static_cast<int64_t>(hw.gpu.memory_bytes.value);
    fit.usable_fraction = hw.gpu.usable_memory_fraction.value;
    fit.device = fmt::format("{}: gpu.memory_bytes", hw.name);
    fit.memory = request.memory;
    fit.memory.context_tokens = pool > 0 ? pool : config.max_position_embeddings;
    fit.kv_tokens_source = pool > 0 ? "--kv-cache-tokens" : "one request of max_position_embeddings";
    // start_model reserves memory for decode graphs only where they run: one rank (engine_facts.h).
    if (layout.world_size() > 1) fit.memory.cuda_graph_bytes = 0;
    memory = plan_memory(config, layout, hw.gpu, fit.memory);
    if (pool > 0) {
        // A fixed pool is a term like the weights: each stage reports the pool the engine would allocate (not
        // the room left), and the pool is the largest term when it outweighs the rest (as check_fits says).
        for (StageMemory& s : memory.stages) {
            s.kv_tokens = pool;
            s.kv_cache_bytes = pool * s.kv_bytes_per_token;
        }
        const int64_t pool_bytes = memory.worst().kv_cache_bytes;
        if (pool_bytes > memory.largest_term_bytes) {
            memory.largest_term = "KV cache";
            memory.largest_term_bytes = pool_bytes;
        }
    }
    Result<MemoryPlan> checked = check_fits(config, layout, fit);
    if (!checked.is_ok()) {
        if (checked.status().code() != StatusCode::kOutOfMemory) return checked.status();
        // Refused: no KV pool, no requests (the engine would not start).
        memory.fits = false;
        memory.kv_tokens_per_rank = 0;
        memory.kv_tokens_total = 0;
        memory.max_requests = 0;
        return checked.status().message();
    }
    if (pool > 0) memory.kv_tokens_per_rank = pool;
    memory.kv_tokens_total = memory.kv_tokens_per_rank * layout.attn_dp;
    memory.max_requests = memory.kv_tokens_per_rank / request.memory.context_tokens * layout.attn_dp;
    return std::string();
}

}  // namespace

std::string format_tokens_per_s(double tokens_per_s) {
    return tokens_per_s >= 10.0 ? fmt::format("{:.0f}", tokens_per_s) : fmt::format("{:.2g}", tokens_per_s);
}

std::string explain_difference(const LayoutPlan& winner, const DecodeResult& win, const LayoutPlan& loser,
                               const DecodeResult& lose) {
    std::vector<Term> wt = terms_of(winner, win), lt = terms_of(loser, lose);
    std::vector<std::pair<double, const Term*>> diffs;
    for (const Term& t : lt) {
        const Term* other = find_term(wt, t.key);
        diffs.emplace_back(t.us - (other ? other->us : 0.0), &t);
    }
    std::sort(diffs.begin(), diffs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (diffs.empty() || diffs[0].first <= 1e-3) {
        return fmt::format("ties with {} at C={} (equal predicted step times)", winner.spec,
                           lose.concurrency);
    }
    // The loser's term in full; the winner's counterpart as its time (collectives: in full, or its own kind).
    auto describe = [&](const Term& t) {
        const Term* other = find_term(wt, t.key);
        bool collective = t.key == "all_reduce" || t.key == "all_to_all" || t.key == "send_recv";
        std::string counterpart;
        if (other && collective) {
            counterpart = other->text;
        } else if (other) {
            counterpart = ms(other->us);
        } else if (collective) {
            counterpart = fmt::format("none; its collectives take {}", ms(win.step.collectives_us()));
        } else {
            counterpart = "none";
        }
        return fmt::format("{} ({}: {})", t.text, winner.spec, counterpart);
    };
    // Within 1 % of the winner's throughput: a tie at the planner's accuracy (measured runs of one layout
    // differ by more, docs/benchmarks/planner.md), said so before the term that tips it.
    const bool near_tie = lose.tokens_per_s > 0.0 && win.tokens_per_s < 1.01 * lose.tokens_per_s;
    std::string text =
        near_tie ? fmt::format("ties with {} at C={} (within 1 %); the term that tips it: {}", winner.spec,
                               lose.concurrency, describe(*diffs[0].second))
                 : fmt::format("loses at C={}: {}", lose.concurrency, describe(*diffs[0].second));
    if (diffs.size() > 1 && diffs[1].first > 0.25 * diffs[0].first) {
        text += "; and " + describe(*diffs[1].second);
    }
    return text;
}

Result<Plan> make_plan(const ModelConfig& config, const HardwareProfile& hardware,
                       const PlanRequest& request) {
    EPI_RETURN_IF_ERROR(validate_request(hardware, request));
    Plan plan;
    plan.request = request;
    plan.model = model_costs(config);
    plan.model_type = config.model_type;
    plan.hardware = hardware;
    if (request.memory_fraction) {
        plan.hardware.gpu.usable_memory_fraction =
            Figure{*request.memory_fraction, Provenance::kUnspecified, "--memory-fraction"};
    }

    std::vector<ParallelLayout> layouts = request.layouts;
    const LayoutModelDims dims = layout_model_dims(plan.model);
    for (size_t i = 0; i < layouts.size(); ++i) {
        const std::string name =
            i < request.layout_names.size() ? request.layout_names[i] : layout_spec(layouts[i]);
        EPI_RETURN_IF_ERROR_CTX(validate_layout(layouts[i], dims, request.gpus), "layout " + name);
    }
    if (layouts.empty()) layouts = enumerate_layouts(request.gpus, plan.model);
    if (layouts.empty()) {
        return invalid_argument(fmt::format(
            "--gpus {}: no layout of {} GPUs suits the model's shapes ({} heads, {} "
            "experts, {} layers)",
            request.gpus, request.gpus, plan.model.num_heads, plan.model.n_experts, plan.model.num_layers));
    }

    for (const ParallelLayout& l : layouts) {
        LayoutPlan lp;
        lp.layout = l;
        lp.spec = layout_spec(l);
        if (request.kv_cache_tokens) {
            EPI_ASSIGN_OR_RETURN(lp.refusal, engine_fit(config, plan.hardware, l, request, lp.memory));
        } else {
            lp.memory = plan_memory(plan.model, l, plan.hardware.gpu, request.memory);
        }
        CostInputs in;
        in.model = &plan.model;
        in.hardware = &plan.hardware;
        in.layout = l;
        in.nodes = request.nodes;
        in.weights = request.memory.weights;
        in.kv_bytes_per_element = request.memory.kv_bytes_per_element;
        in.activation_bytes_per_element = request.memory.activation_bytes_per_element;
        in.context_tokens = request.memory.context_tokens;
        in.micro_batches = request.micro_batches;
        in.input_len = request.input_len;
        in.output_len = request.output_len;
        in.max_step_tokens = request.max_step_tokens;
        for (int64_t c : request.concurrency)
            lp.decode.push_back(decode_step(in, c, lp.memory.kv_tokens_per_rank));
        lp.prefill = prefill_step(in, request.input_len);
        plan.any_fits = plan.any_fits || lp.memory.fits;
        plan.layouts.push_back(std::move(lp));
    }

    if (!plan.any_fits) plan.memory_verdict = memory_verdict(plan);
    plan.notes = extrapolation_notes(plan);
    for (size_t ci = 0; ci < request.concurrency.size(); ++ci) {
        Recommendation rec;
        rec.concurrency = request.concurrency[ci];
        for (size_t li = 0; li < plan.layouts.size(); ++li) {
            const LayoutPlan& lp = plan.layouts[li];
            if (!lp.memory.fits || !lp.decode[ci].kv_fits) continue;
            double tps = lp.decode[ci].tokens_per_s;
            if (rec.layout < 0 ||
                tps > plan.layouts[static_cast<size_t>(rec.layout)].decode[ci].tokens_per_s) {
                rec.runner_up = rec.layout;
                rec.layout = static_cast<int>(li);
            } else if (rec.runner_up < 0 ||
                       tps > plan.layouts[static_cast<size_t>(rec.runner_up)].decode[ci].tokens_per_s) {
                rec.runner_up = static_cast<int>(li);
            }
        }
        if (rec.layout >= 0) {
            rec.reason = recommend_reason(plan, rec, ci);
        } else if (plan.any_fits) {
            const LayoutPlan* most = nullptr;
            for (const LayoutPlan& lp : plan.layouts) {
                if (lp.memory.fits && (!most || lp.memory.max_requests > most->memory.max_requests))
                    most = &lp;
            }
            rec.reason = fmt::format(
                "no layout holds {} requests × {} tokens of KV; the most is {} requests ({})",
                rec.concurrency, request.memory.context_tokens, most->memory.max_requests, most->spec);
        } else {
            rec.reason = plan.memory_verdict.empty() ? "no layout fits the weights" : plan.memory_verdict;
        }
        plan.recommendations.push_back(std::move(rec));
    }
    return plan;
}

}  // namespace epinfer::planner
