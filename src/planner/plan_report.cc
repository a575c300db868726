#include "planner/plan_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace epinfer::planner {
namespace {

using Json = nlohmann::ordered_json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double gib(int64_t bytes) {
    return static_cast<double>(bytes) / kGiB;
}

// A memory cell of the table: GiB with one decimal and a G, in T or P (1024-fold) once the GiB figure needs
// five digits, so that the cell stays within its column even for a pool of --kv-cache-tokens that cannot
// fit by petabytes.
std::string table_gib(int64_t bytes) {
    double value = gib(bytes);
    for (const char* unit : {"G", "T"}) {
        if (std::fabs(value) < 9999.95) return fmt::format("{:.1f}{}", value, unit);
        value /= 1024.0;
    }
    return fmt::format("{:.1f}P", value);
}

std::string model_summary(const Plan& plan) {
    const ModelCosts& m = plan.model;
    return fmt::format("{} ({}: {} layers, {} MoE, {} experts top-{}, {}, {:.1f} B params)",
                       plan.request.model_label, plan.model_type, m.num_layers, m.num_moe_layers, m.n_experts,
                       m.top_k, m.mla ? "MLA" : "GQA", static_cast<double>(m.total_params()) / 1e9);
}

const char* kv_dtype_name(int bytes_per_element) {
    return bytes_per_element == 1 ? "fp8" : bytes_per_element == 2 ? "bf16" : "fp32";
}

// How a pipeline stage's GPUs split attention and the experts, factors of 1 left out: "tp4·dp2 / tp2·ep4",
// "tp8 / ep8", "tp1 / tp1" on one GPU.
std::string rank_split(const ParallelLayout& l) {
    const auto split = [](const char* a, int x, const char* b, int y) {
        if (x > 1 && y > 1) return fmt::format("{}{}·{}{}", a, x, b, y);
        return y > 1 ? fmt::format("{}{}", b, y) : fmt::format("{}{}", a, x);
    };
    return split("tp", l.attn_tp, "dp", l.attn_dp) + " / " + split("tp", l.moe_tp, "ep", l.moe_ep);
}

std::string decode_cell(const LayoutPlan& lp, const DecodeResult& d) {
    if (!lp.memory.fits) return "-";
    if (!d.kv_fits) return "KV full";
    return fmt::format("{} @{:.1f}", format_tokens_per_s(d.tokens_per_s), d.tpot_ms);
}

Json figure_json(const Figure& f) {
    return Json{{"value", f.value}, {"provenance", provenance_name(f.provenance)}, {"source", f.source}};
}

Json step_json(const StepBreakdown& s) {
    Json collectives = Json::array();
    for (const CollectiveTerm& t : s.collectives) {
        collectives.push_back(Json{{"what", t.what},
                                   {"kind", collective_name(t.kind)},
                                   {"ranks", t.ranks},
                                   {"inter_node", t.inter_node},
                                   {"size_bytes", t.size_bytes},
                                   {"calls", t.calls},
                                   {"us_per_call", t.us_per_call},
                                   {"total_us", t.total_us()}});
    }
    return Json{{"tokens_per_micro_batch", s.tokens},
                {"tokens_per_attention_rank", s.tokens_per_attn_rank},
                {"micro_batches", s.micro_batches},
                {"decode_graph", s.decode_graph},
                {"attention_us", s.attention_us},
                {"experts_us", s.experts_us},
                {"dense_us", s.dense_us},
                {"activations_us", s.activations_us},
                {"collectives_us", s.collectives_us()},
                {"kernels", s.kernels},
                {"launch_us", s.launch_us},
                {"host_round_trips", s.host_round_trips},
                {"host_us", s.host_us},
                {"path_us", s.path_us},
                {"pipeline_wait_us", s.pipeline_wait_us},
                {"bubble_us", s.bubble_us},
                {"step_us", s.step_us},
                {"experts", Json{{"moe_layers", s.moe_layers},
                                 {"local_experts", s.local_experts},
                                 {"touched_per_rank_per_layer", s.experts_touched_per_rank},
                                 {"bytes_per_layer", s.expert_bytes_per_layer},
                                 {"tokens_per_touched_expert", s.tokens_per_touched_expert},
                                 {"memory_efficiency", s.experts_memory_efficiency},
                                 {"memory_bound", s.experts_memory_bound}}},
                {"collectives", collectives}};
}

Json memory_json(const MemoryPlan& m) {
    Json stages = Json::array();
    for (const StageMemory& s : m.stages) {
        const WeightBytes& w = s.weights;
        stages.push_back(Json{{"stage", s.stage},
                              {"first_layer", s.first_layer},
                              {"num_layers", s.num_layers},
                              {"weights_bytes", Json{{"embedding", w.embedding},
                                                     {"lm_head", w.lm_head},
                                                     {"attention", w.attention},
                                                     {"dense_mlp", w.dense_mlp},
                                                     {"shared_experts", w.shared_experts},
                                                     {"routed_experts", w.routed_experts},
                                                     {"router_and_norms", w.router_and_norms},
                                                     {"total", w.total()}}},
                              {"ep_buffer_bytes", s.ep_buffer_bytes},
                              {"activation_bytes", s.activation_bytes},
                              {"cuda_graph_bytes", s.cuda_graph_bytes},
                              {"kv_bytes_per_token", s.kv_bytes_per_token},
                              {"kv_cache_bytes", s.kv_cache_bytes},
                              {"kv_tokens", s.kv_tokens}});
    }
    return Json{{"device_bytes", m.device_bytes},
                {"usable_bytes", m.usable_bytes},
                {"fits", m.fits},
                {"margin_bytes", m.margin_bytes},
                {"largest_term", m.largest_term},
                {"largest_term_bytes", m.largest_term_bytes},
                {"worst_stage", m.worst_stage},
                {"kv_tokens_per_rank", m.kv_tokens_per_rank},
                {"kv_tokens_total", m.kv_tokens_total},
                {"max_requests", m.max_requests},
                {"stages", stages}};
}

}  // namespace

std::string plan_to_text(const Plan& plan) {
    const PlanRequest& r = plan.request;
    const HardwareProfile& hw = plan.hardware;
    std::string out;
    out += fmt::format("model     {}\n", model_summary(plan));
    out += fmt::format("hardware  {}: {}× {} ({:.1f} GiB, usable {:.0f}%), intra-node {}{}\n", hw.name,
                       r.gpus, hw.gpu.name, gib(static_cast<int64_t>(hw.gpu.memory_bytes.value)),
                       hw.gpu.usable_memory_fraction.value * 100, link_kind_name(hw.intra_node.kind),
                       r.nodes > 1
                           ? fmt::format(", {} nodes over {}", r.nodes, link_kind_name(hw.inter_node->kind))
                           : std::string());
    out += fmt::format(
        "weights   {} · KV {} · context {} tokens/request · prefill {} tokens · micro-batches {}{}\n\n",
        weight_formats_to_string(r.memory.weights), kv_dtype_name(r.memory.kv_bytes_per_element),
        r.memory.context_tokens, r.input_len,
        r.micro_batches > 0 ? std::to_string(r.micro_batches) : std::string("= pp"),
        r.output_len > 0
            ? fmt::format("\ncells     closed loop: C requests of {} + {} tokens started together, "
                          "steps of {} tokens; TPOT of the median request",
                          r.input_len, r.output_len, r.max_step_tokens)
            : std::string());

    size_t width = 8, split_width = 14;
    for (const LayoutPlan& lp : plan.layouts) {
        width = std::max(width, lp.spec.size() + 2);
        split_width = std::max(split_width, rank_split(lp.layout).size() + 2);
    }
    out += fmt::format("{:<{}}{:<{}}{:>12}{:>11}{:>12}{:>9}  ", "layout", width, "attn / MoE", split_width,
                       "weights/GPU", "free/GPU", "KV tokens", "max req");
    for (int64_t c : r.concurrency) out += fmt::format("{:>14}", fmt::format("C={}", c));
    out += fmt::format("{:>22}\n", fmt::format("prefill tok/s @TTFT"));
    for (const LayoutPlan& lp : plan.layouts) {
        const MemoryPlan& m = lp.memory;
        out += fmt::format("{:<{}}{:<{}}{:>12}{:>11}{:>12}{:>9}  ", lp.spec, width, rank_split(lp.layout),
                           split_width, table_gib(m.worst().weights.total()), table_gib(m.margin_bytes),
                           m.kv_tokens_total, m.max_requests);
        for (const DecodeResult& d : lp.decode) out += fmt::format("{:>14}", decode_cell(lp, d));
        out += fmt::format("{:>22}\n",
                           m.fits ? fmt::format("{} @{:.0f}ms", format_tokens_per_s(lp.prefill.tokens_per_s),
                                                lp.prefill.ttft_ms)
                                  : std::string("-"));
    }
    out +=
        "\ncells: output tok/s of the whole layout @ TPOT ms per request; 'KV full': C requests of the "
        "context do "
        "not fit; free/GPU: usable memory left after one request's KV (negative: over by); attn / MoE: how "
        "each pipeline stage's GPUs split attention (tp heads × dp requests) and the experts (tp slices × ep "
        "experts)\n";
    if (r.kv_cache_tokens) {
        out += *r.kv_cache_tokens > 0
                   ? fmt::format("fit as the engine checks it: a KV pool of --kv-cache-tokens {} per rank (free/GPU: "
                                 "left after it)\n",
                                 *r.kv_cache_tokens)
                   : std::string("fit as the engine checks it (--kv-cache-tokens 0): one request of "
                                 "max_position_embeddings (free/GPU: left after it); KV tokens: what is left\n");
    }

    for (const std::string& note : plan.notes) out += "note: " + note + "\n";
    if (!plan.any_fits) {
        out += "\n" + plan.memory_verdict + "\n";
        return out;
    }
    out += "\nrecommended\n";
    for (const Recommendation& rec : plan.recommendations) {
        out += fmt::format("  C={:<6} {}\n", rec.concurrency, rec.reason);
    }
    std::string misfits;
    for (const LayoutPlan& lp : plan.layouts) {
        if (lp.memory.fits) continue;
        if (!lp.refusal.empty()) {
            misfits += fmt::format("  {}\n", lp.refusal);
            continue;
        }
        misfits += fmt::format("  {:<{}} over by {} (largest term {} {} per GPU)\n", lp.spec, width,
                               format_gib(-lp.memory.margin_bytes), lp.memory.largest_term,
                               format_gib(lp.memory.largest_term_bytes));
    }
    if (!misfits.empty()) out += "\ndo not fit\n" + misfits;
    return out;
}

std::string plan_to_json(const Plan& plan) {
    const PlanRequest& r = plan.request;
    const HardwareProfile& hw = plan.hardware;
    const ModelCosts& m = plan.model;
    Json doc;
    doc["schema"] = "epinfer.plan/1";
    doc["model"] =
        Json{{"label", r.model_label},
             {"model_type", plan.model_type},
             {"layers", m.num_layers},
             {"moe_layers", m.num_moe_layers},
             {"experts", m.n_experts},
             {"top_k", m.top_k},
             {"attention", m.mla ? "mla" : "gqa"},
             {"total_params", m.total_params()},
             {"kv_elems_per_token_per_layer", m.kv_elems_per_token_per_layer},
             {"weights", Json{{"routed_experts", weight_format_name(r.memory.weights.routed_experts)},
                              {"dense", weight_format_name(r.memory.weights.dense)}}}};
    doc["hardware"] = Json{{"name", hw.name},
                           {"path", hw.path},
                           {"gpu", hw.gpu.name},
                           {"memory_bytes", figure_json(hw.gpu.memory_bytes)},
                           {"usable_memory_fraction", figure_json(hw.gpu.usable_memory_fraction)},
                           {"intra_node", link_kind_name(hw.intra_node.kind)},
                           {"inter_node", hw.inter_node ? link_kind_name(hw.inter_node->kind) : "none"}};
    doc["options"] = Json{{"gpus", r.gpus},
                          {"nodes", r.nodes},
                          {"context_tokens", r.memory.context_tokens},
                          {"input_len", r.input_len},
                          {"output_len", r.output_len},
                          {"max_step_tokens", r.max_step_tokens},
                          {"kv_bytes_per_element", r.memory.kv_bytes_per_element},
                          {"activation_bytes_per_element", r.memory.activation_bytes_per_element},
                          {"micro_batches", r.micro_batches},
                          {"memory_fraction", r.memory_fraction ? Json(*r.memory_fraction) : Json()},
                          {"kv_cache_tokens", r.kv_cache_tokens ? Json(*r.kv_cache_tokens) : Json()},
                          {"concurrency", r.concurrency}};
    Json layouts = Json::array();
    for (const LayoutPlan& lp : plan.layouts) {
        Json decode = Json::array();
        for (const DecodeResult& d : lp.decode) {
            Json entry{{"concurrency", d.concurrency},
                       {"fits", lp.memory.fits && d.kv_fits},
                       {"kv_fits", d.kv_fits},
                       {"kv_tokens_needed_per_rank", d.kv_tokens_needed_per_rank},
                       {"tokens_per_s", d.tokens_per_s},
                       {"tpot_ms", d.tpot_ms},
                       {"decode_step_ms", d.decode_step_ms},
                       {"breakdown", step_json(d.step)}};
            if (d.has_closed_loop) {
                const ClosedLoopResult& c = d.closed_loop;
                entry["closed_loop"] = Json{{"requests_per_group", c.requests_per_group},
                                            {"steps", c.steps},
                                            {"mixed_steps", c.mixed_steps},
                                            {"duration_ms", c.duration_ms},
                                            {"tpot_ms", c.tpot_ms},
                                            {"ttft_ms", c.ttft_ms},
                                            {"tokens_per_s", c.tokens_per_s}};
            }
            decode.push_back(std::move(entry));
        }
        const ParallelLayout& l = lp.layout;
        layouts.push_back(Json{{"spec", lp.spec},
                               {"pp", l.pp},
                               {"attn_tp", l.attn_tp},
                               {"attn_dp", l.attn_dp},
                               {"moe_tp", l.moe_tp},
                               {"moe_ep", l.moe_ep},
                               {"fits", lp.memory.fits},
                               {"refusal", lp.refusal},
                               {"memory", memory_json(lp.memory)},
                               {"decode", decode},
                               {"prefill", Json{{"input_len", lp.prefill.input_len},
                                                {"chunks", lp.prefill.chunks},
                                                {"ttft_ms", lp.prefill.ttft_ms},
                                                {"tokens_per_s", lp.prefill.tokens_per_s},
                                                {"breakdown", step_json(lp.prefill.step)}}}});
    }
    doc["layouts"] = layouts;
    Json recs = Json::array();
    for (const Recommendation& rec : plan.recommendations) {
        recs.push_back(Json{
            {"concurrency", rec.concurrency},
            {"layout", rec.layout >= 0 ? Json(plan.layouts[static_cast<size_t>(rec.layout)].spec) : Json()},
            {"runner_up",
             rec.runner_up >= 0 ? Json(plan.layouts[static_cast<size_t>(rec.runner_up)].spec) : Json()},
            {"reason", rec.reason}});
    }
    doc["recommendations"] = recs;
    doc["any_fits"] = plan.any_fits;
    doc["memory_verdict"] = plan.memory_verdict;
    doc["notes"] = plan.notes;
    return doc.dump(2) + "\n";
}

}  // namespace epinfer::planner
