#include "planner/calibration.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "core/json_error.h"
#include "planner/cost_model.h"

namespace epinfer::planner {
namespace {

using OrderedJson = nlohmann::ordered_json;

OrderedJson measured_figure(double value, const std::string& source) {
    return OrderedJson{{"value", value}, {"provenance", "measured"}, {"source", source}};
}

Result<OrderedJson> collective_json(const MeasuredCollective& m, const std::string& source) {
    const char* name = collective_name(m.collective);
    if (m.ranks < 2 || m.points.empty()) {
        return invalid_argument(
            fmt::format("calibration: {}: needs ranks >= 2 and at least one point (got {} "
                        "ranks, {} points)",
                        name, m.ranks, m.points.size()));
    }
    const double factor = collective_bus_factor(m.collective, m.ranks);
    Result<LatencyBandwidthFit> fit = fit_latency_bandwidth(m.points);
    double latency_us = 0.0, busbw_gbps = 0.0;
    std::string fit_source;
    if (fit.is_ok()) {
        latency_us = fit.value().latency_us;
        busbw_gbps = fit.value().bandwidth_gbps * factor;
        fit_source = fmt::format(
            "least-squares fit of time = latency + size/algbw over {} sizes at {} ranks, "
            "busbw = algbw x {:.4g}; {}",
            m.points.size(), m.ranks, factor, source);
    } else {
        // Times that do not grow with size (too small a range, or noise): the smallest size's time as the
        // latency and the largest size's busbw, which over-estimates large messages a little.
        const auto& [last_bytes, last_us] = m.points.back();
        latency_us = m.points.front().second;
        busbw_gbps = last_bytes / (last_us * 1e3) * factor;
        fit_source = fmt::format("no fit ({}): time at the smallest size, busbw at the largest, {} ranks; {}",
                                 fit.status().message(), m.ranks, source);
    }
    OrderedJson points = OrderedJson::array();
    for (const auto& [bytes, time_us] : m.points) points.push_back({bytes, time_us});
    OrderedJson table = {{"ranks", m.ranks}, {"points", points}, {"provenance", "measured"}, {"source", source}};
    return OrderedJson{{"latency_us", measured_figure(latency_us, fit_source)},
                       {"bus_bandwidth_gbps", measured_figure(busbw_gbps, fit_source)},
                       {"tables", OrderedJson::array({table})}};
}

// measured / peak as a fraction in (0, 1]; an error names both when the measurement is above the peak.
Result<double> efficiency(double measured, const Figure& peak, const char* what, const char* key) {
    if (!(measured > 0) || !std::isfinite(measured)) {
        return invalid_argument(fmt::format("calibration: {}: must be > 0 (got {})", what, measured));
    }
    if (measured > peak.value) {
        return invalid_argument(
            fmt::format("calibration: {} {:.1f} is above the base profile's gpu.{} {:.1f}: "
                        "is the base profile for this GPU?",
                        what, measured, key, peak.value));
    }
    return measured / peak.value;
}

// A gpu.expert_*_efficiency_by_rows table of `points`, measured as `source` says.
OrderedJson measured_rows_table(const std::vector<RowsEfficiencyPoint>& points, const std::string& source) {
    OrderedJson json_points = OrderedJson::array();
    for (const RowsEfficiencyPoint& p : points) {
        json_points.push_back({{"rows_per_expert", p.rows_per_expert}, {"efficiency", p.efficiency}});
    }
    return OrderedJson{{"points", json_points}, {"provenance", "measured"}, {"source", source}};
}

// `points` sorted by rows, the efficiencies of equal rows averaged into one point.
std::vector<RowsEfficiencyPoint> sorted_by_rows(std::vector<RowsEfficiencyPoint> points) {
    std::stable_sort(points.begin(), points.end(),
                     [](const auto& a, const auto& b) { return a.rows_per_expert < b.rows_per_expert; });
    std::vector<RowsEfficiencyPoint> merged;
    int same = 0;  // points averaged into merged.back()
    for (const RowsEfficiencyPoint& p : points) {
        if (!merged.empty() && p.rows_per_expert == merged.back().rows_per_expert) {
            ++same;
            merged.back().efficiency += (p.efficiency - merged.back().efficiency) / same;
            continue;
        }
        merged.push_back(p);
        same = 1;
    }
    return merged;
}

}  // namespace

Result<LatencyBandwidthFit> fit_latency_bandwidth(const std::vector<std::pair<double, double>>& points) {
    double n = 0.0, sum_x = 0.0, sum_y = 0.0;
    for (const auto& [x, y] : points) {
        if (!std::isfinite(x) || !std::isfinite(y) || !(x > 0) || !(y > 0)) {
            return invalid_argument(
                fmt::format("latency/bandwidth fit: point ({}, {}): bytes and time_us must "
                            "be finite and > 0",
                            x, y));
        }
        n += 1.0;
        sum_x += x;
        sum_y += y;
    }
    double sxx = 0.0, sxy = 0.0, xx = 0.0, xy = 0.0;
    for (const auto& [x, y] : points) {
        sxx += (x - sum_x / n) * (x - sum_x / n);
        sxy += (x - sum_x / n) * (y - sum_y / n);
        xx += x * x;
        xy += x * y;
    }
    if (points.size() < 2 || !(sxx > 0)) {
        return invalid_argument(fmt::format(
            "latency/bandwidth fit: needs at least two distinct sizes (got {} points)", points.size()));
    }
    double slope_us_per_byte = sxy / sxx;
    double latency_us = sum_y / n - slope_us_per_byte * sum_x / n;
    if (latency_us < 0) {  // constrained to latency ≥ 0: the fit through the origin
        latency_us = 0.0;
        slope_us_per_byte = xy / xx;
    }
    if (!(slope_us_per_byte > 0)) {
        return invalid_argument("latency/bandwidth fit: times do not grow with size, bandwidth not resolved");
    }
    // bytes/µs = 1e6 B/s = 1e-3 GB/s.
    return LatencyBandwidthFit{latency_us, 1e-3 / slope_us_per_byte};
}

Result<MoeLayerFit> fit_moe_layers(const std::vector<MeasuredMoeLayer>& layers,
                                   int64_t max_memory_bound_tokens, int64_t compute_bound_tokens) {
    std::vector<std::pair<double, double>> points;
    for (const MeasuredMoeLayer& l : layers) {
        if (l.tokens <= max_memory_bound_tokens) points.emplace_back(l.weight_bytes, l.time_us);
    }
    EPI_ASSIGN_OR_RETURN(LatencyBandwidthFit fit, fit_latency_bandwidth(points));
    MoeLayerFit result{fit.latency_us, fit.bandwidth_gbps, 0.0};
    for (const MeasuredMoeLayer& l : layers) {
        if (l.tokens != compute_bound_tokens) continue;
        if (!(l.time_us > fit.latency_us) || !(l.flops > 0)) {
            return invalid_argument(
                fmt::format("MoE layer fit: T {}: {} FLOP in {} us, not above the fitted latency {:.2f} us",
                            l.tokens, l.flops, l.time_us, fit.latency_us));
        }
        result.expert_tflops = l.flops / ((l.time_us - fit.latency_us) * 1e6);  // TFLOP/s = 1e6 FLOP/µs
        return result;
    }
    return invalid_argument(fmt::format("MoE layer fit: no layer of T {} tokens", compute_bound_tokens));
}

Result<MoeEngineFit> fit_moe_engine(const std::vector<MeasuredMoeLayer>& layers, double graph_kernel_us) {
    EPI_ASSIGN_OR_RETURN(MoeLayerFit fit,
                         fit_moe_layers(layers, kMoeFitMaxMemoryBoundTokens, kMoeFitComputeBoundTokens));
    const MeasuredMoeLayer* first = nullptr;  // fit_moe_layers found ≥ 2 layers of T ≤ 256
    for (const MeasuredMoeLayer& l : layers) {
        if (l.tokens > kMoeFitMaxMemoryBoundTokens) continue;
        if (first == nullptr || l.tokens < first->tokens) first = &l;
    }
    if (first->kernels < 1) {
        return invalid_argument(fmt::format("MoE engine fit: the layer of T {} has no kernel count (got {})",
                                            first->tokens, first->kernels));
    }
    const double per_node_us = fit.latency_us / static_cast<double>(first->kernels);
    if (per_node_us < graph_kernel_us) {
        return invalid_argument(
            fmt::format("MoE engine fit: latency {:.2f} us over {} graph nodes = {:.2f} us per node, below "
                        "gpu.graph_kernel_us {}",
                        fit.latency_us, first->kernels, per_node_us, graph_kernel_us));
    }
    return MoeEngineFit{fit, first->tokens, first->kernels, per_node_us - graph_kernel_us};
}

Result<std::vector<RowsEfficiencyPoint>> expert_memory_efficiency_by_rows(
    const std::vector<MeasuredMoeLayer>& layers, double kernel_fixed_us, double memory_bandwidth_gbps) {
    if (!(memory_bandwidth_gbps > 0) || !std::isfinite(memory_bandwidth_gbps) || !(kernel_fixed_us >= 0) ||
        !std::isfinite(kernel_fixed_us)) {
        return invalid_argument(fmt::format(
            "expert efficiency by rows: needs a bandwidth > 0 and a kernel time >= 0 (got {} GB/s, {} us)",
            memory_bandwidth_gbps, kernel_fixed_us));
    }
    std::vector<RowsEfficiencyPoint> points;
    for (const MeasuredMoeLayer& l : layers) {
        if (l.tokens > kMoeFitMaxMemoryBoundTokens) continue;
        if (!(l.rows_per_expert > 0) || l.kernels < 1) {
            return invalid_argument(fmt::format(
                "expert efficiency by rows: the layer of T {} has no rows per expert or kernel count (got "
                "{}, {})",
                l.tokens, l.rows_per_expert, l.kernels));
        }
        const double stream_us = l.time_us - static_cast<double>(l.kernels) * kernel_fixed_us;
        const double efficiency =
            stream_us > 0 ? std::min(1.0, l.weight_bytes / (stream_us * memory_bandwidth_gbps * 1e3)) : 1.0;
        points.push_back({l.rows_per_expert, efficiency});
    }
    if (points.empty()) {
        return invalid_argument(
            fmt::format("expert efficiency by rows: no layer of T <= {}", kMoeFitMaxMemoryBoundTokens));
    }
    return sorted_by_rows(std::move(points));
}

Result<std::vector<RowsEfficiencyPoint>> expert_matmul_efficiency_by_rows(
    const std::vector<MeasuredMoeLayer>& layers, double kernel_fixed_us, double bf16_tflops) {
    if (!(bf16_tflops > 0) || !std::isfinite(bf16_tflops) || !(kernel_fixed_us >= 0) ||
        !std::isfinite(kernel_fixed_us)) {
        return invalid_argument(
            fmt::format("expert matmul efficiency by rows: needs a rate > 0 and a kernel time >= 0 (got {} "
                        "TFLOP/s, {} us)",
                        bf16_tflops, kernel_fixed_us));
    }
    std::vector<RowsEfficiencyPoint> points;
    for (const MeasuredMoeLayer& l : layers) {
        if (l.tokens < kMoeFitComputeBoundTokens) continue;
        if (!(l.rows_per_expert > 0) || l.kernels < 1 || !(l.flops > 0)) {
            return invalid_argument(fmt::format(
                "expert matmul efficiency by rows: the layer of T {} has no rows per expert, kernel count or "
                "FLOPs (got {}, {}, {})",
                l.tokens, l.rows_per_expert, l.kernels, l.flops));
        }
        const double gemm_us = l.time_us - static_cast<double>(l.kernels) * kernel_fixed_us;
        const double efficiency = gemm_us > 0 ? std::min(1.0, l.flops / (gemm_us * bf16_tflops * 1e6)) : 1.0;
        points.push_back({l.rows_per_expert, efficiency});
    }
    if (points.empty()) {
        return invalid_argument(
            fmt::format("expert matmul efficiency by rows: no layer of T >= {}", kMoeFitComputeBoundTokens));
    }
    return sorted_by_rows(std::move(points));
}

Result<double> attention_matmul_efficiency(const std::vector<MeasuredAttentionCase>& cases,
                                           double bf16_tflops) {
    if (cases.empty() || !(bf16_tflops > 0)) {
        return invalid_argument(
            fmt::format("attention efficiency: needs cases ({} given) and a bf16 rate > 0 "
                        "(got {} TFLOP/s)",
                        cases.size(), bf16_tflops));
    }
    std::vector<double> tflops;
    for (const MeasuredAttentionCase& c : cases) {
        if (!(c.flops > 0) || !(c.time_us > 0) || !std::isfinite(c.flops) || !std::isfinite(c.time_us)) {
            return invalid_argument(
                fmt::format("attention efficiency: case '{}' needs FLOPs > 0 and a time > 0 "
                            "(got {} FLOP, {} us)",
                            c.name, c.flops, c.time_us));
        }
        tflops.push_back(c.flops / c.time_us / 1e6);
    }
    return median(std::move(tflops)) / bf16_tflops;
}

Result<double> engine_kernel_latency_us(const std::vector<double>& durations_us, double bytes,
                                        double bandwidth_gbps) {
    if (durations_us.empty() || !(bandwidth_gbps > 0)) {
        return invalid_argument(
            fmt::format("kernel latency: needs durations ({} given) and a bandwidth > 0 (got {})",
                        durations_us.size(), bandwidth_gbps));
    }
    double total_us = 0.0;
    for (double d : durations_us) total_us += d;
    const double latency =
        (total_us - bytes / (bandwidth_gbps * 1e3)) / static_cast<double>(durations_us.size());
    if (!(latency >= 0)) {
        return invalid_argument(
            fmt::format("kernel latency: {:.1f} us of kernels read {} B, faster than {} GB/s", total_us,
                        bytes, bandwidth_gbps));
    }
    return latency;
}

Result<std::string> calibrated_profile_json(const std::string& base_json, const std::string& base_source,
                                            const Calibration& calibration) {
    EPI_ASSIGN_OR_RETURN(HardwareProfile base, parse_hardware_profile(base_json, base_source));
    OrderedJson doc;
    try {
        doc = OrderedJson::parse(base_json);
    } catch (const nlohmann::json::exception& e) {  // parse_hardware_profile accepted it, so unreachable
        return invalid_argument(fmt::format("{}: malformed JSON: {}", base_source, json_error_text(e)));
    }
    for (const MeasuredCollective& m : calibration.collectives) {
        EPI_ASSIGN_OR_RETURN(doc["intra_node"][collective_name(m.collective)],
                             collective_json(m, calibration.source));
    }
    if (calibration.gpu_ceilings.size() > 1) {
        return invalid_argument("calibration: at most one set of GPU ceilings");
    }
    for (const MeasuredGpuCeilings& c : calibration.gpu_ceilings) {
        EPI_ASSIGN_OR_RETURN(double memory, efficiency(c.stream_read_gbps, base.gpu.memory_bandwidth_gbps,
                                                       "stream read GB/s", "memory_bandwidth_gbps"));
        EPI_ASSIGN_OR_RETURN(double matmul, efficiency(c.gemm_tflops, base.gpu.bf16_tflops,
                                                       "bf16 GEMM TFLOP/s", "bf16_tflops"));
        doc["gpu"]["memory_efficiency"] = measured_figure(
            memory,
            fmt::format("read-only stream {:.1f} GB/s over gpu.memory_bandwidth_gbps {:.1f}; {}",
                        c.stream_read_gbps, base.gpu.memory_bandwidth_gbps.value, calibration.source));
        doc["gpu"]["matmul_efficiency"] = measured_figure(
            matmul, fmt::format("cuBLAS bf16 GEMM {:.1f} TFLOP/s over gpu.bf16_tflops {:.1f}; {}",
                                c.gemm_tflops, base.gpu.bf16_tflops.value, calibration.source));
    }
    if (calibration.moe_engine.size() > 1) {
        return invalid_argument("calibration: at most one set of MoE layers");
    }
    for (const MeasuredMoeEngine& m : calibration.moe_engine) {
        const GpuSpec& gpu = base.gpu;
        EPI_ASSIGN_OR_RETURN(MoeEngineFit fit, fit_moe_engine(m.layers, gpu.graph_kernel_us.value));
        EPI_ASSIGN_OR_RETURN(double memory, efficiency(fit.layers.bandwidth_gbps, gpu.memory_bandwidth_gbps,
                                                       "MoE layer GB/s", "memory_bandwidth_gbps"));
        EPI_ASSIGN_OR_RETURN(double experts, efficiency(fit.layers.expert_tflops, gpu.bf16_tflops,
                                                        "MoE grouped GEMM TFLOP/s", "bf16_tflops"));
        std::vector<int64_t> tokens, nodes_tokens, nodes, fitted_nodes;
        std::vector<double> times_us, gbytes, rows;
        const MeasuredMoeLayer* compute = nullptr;
        for (const MeasuredMoeLayer& l : m.layers) {
            nodes_tokens.push_back(l.tokens);
            nodes.push_back(l.kernels);
            if (l.tokens == kMoeFitComputeBoundTokens) compute = &l;
            if (l.tokens > kMoeFitMaxMemoryBoundTokens) continue;
            tokens.push_back(l.tokens);
            times_us.push_back(l.time_us);
            gbytes.push_back(l.weight_bytes / 1e9);
            rows.push_back(l.rows_per_expert);
            fitted_nodes.push_back(l.kernels);
        }
        std::string node_counts;
        for (size_t i = 0; i < nodes.size(); ++i) {
            node_counts += fmt::format("{}T {}: {}", i ? ", " : "", nodes_tokens[i], nodes[i]);
        }
        std::string stream;
        for (const MeasuredGpuCeilings& c : calibration.gpu_ceilings) {
            stream = fmt::format("; the read-only stream of the same run reached {:.1f} GB/s ({:.3f})",
                                 c.stream_read_gbps, c.stream_read_gbps / gpu.memory_bandwidth_gbps.value);
        }
        const std::string layer = fmt::format("the {} MoE layer, uniform routing", m.shape);
        doc["gpu"]["memory_efficiency"] = measured_figure(
            memory,
            fmt::format("least-squares fit of time = latency + bytes / bandwidth (planner/calibration.h "
                        "fit_moe_engine) over {}, T = {}: {:.1f} us for {:.4f} GB of touched experts: {:.1f} "
                        "GB/s (latency {:.2f} us) over gpu.memory_bandwidth_gbps {:.1f}{}; {}",
                        layer, fmt::join(tokens, ", "), fmt::join(times_us, ", "), fmt::join(gbytes, ", "),
                        fit.layers.bandwidth_gbps, fit.layers.latency_us, gpu.memory_bandwidth_gbps.value,
                        stream, calibration.source));
        doc["gpu"]["expert_matmul_efficiency"] = measured_figure(
            experts,
            fmt::format("{} at T = {}: {:.1f} us for {:.0f} FLOP; minus the fitted latency {:.2f} us "
                        "(gpu.memory_efficiency) = {:.1f} us: {:.1f} TFLOP/s over gpu.bf16_tflops {:.1f}; {}",
                        layer, kMoeFitComputeBoundTokens, compute->time_us, compute->flops,
                        fit.layers.latency_us, compute->time_us - fit.layers.latency_us,
                        fit.layers.expert_tflops, gpu.bf16_tflops.value, calibration.source));
        const double kernel_fixed_us = gpu.graph_kernel_us.value + fit.kernel_latency_us;
        EPI_ASSIGN_OR_RETURN(
            std::vector<RowsEfficiencyPoint> by_rows,
            expert_memory_efficiency_by_rows(m.layers, kernel_fixed_us, gpu.memory_bandwidth_gbps.value));
        doc["gpu"]["expert_memory_efficiency_by_rows"] = measured_rows_table(
            by_rows,
            fmt::format(
                "{}, T = {} (rows per touched expert {:.4g}): {:.1f} us less the fixed time of their {} "
                "graph nodes at gpu.graph_kernel_us {:.2f} + gpu.kernel_latency_us {:.2f} (the planner's "
                "price of a kernel in a decode graph) for {:.4f} GB of touched experts, over "
                "gpu.memory_bandwidth_gbps {:.1f}, capped at 1 (planner/calibration.h "
                "expert_memory_efficiency_by_rows); {}",
                layer, fmt::join(tokens, ", "), fmt::join(rows, ", "), fmt::join(times_us, ", "),
                fmt::join(fitted_nodes, ", "), gpu.graph_kernel_us.value, fit.kernel_latency_us,
                fmt::join(gbytes, ", "), gpu.memory_bandwidth_gbps.value, calibration.source));
        EPI_ASSIGN_OR_RETURN(
            std::vector<RowsEfficiencyPoint> matmul_by_rows,
            expert_matmul_efficiency_by_rows(m.layers, kernel_fixed_us, gpu.bf16_tflops.value));
        std::vector<int64_t> big_tokens, big_nodes;
        std::vector<double> big_us, big_gflop, big_rows;
        for (const MeasuredMoeLayer& l : m.layers) {
            if (l.tokens < kMoeFitComputeBoundTokens) continue;
            big_tokens.push_back(l.tokens);
            big_nodes.push_back(l.kernels);
            big_us.push_back(l.time_us);
            big_gflop.push_back(l.flops / 1e9);
            big_rows.push_back(l.rows_per_expert);
        }
        doc["gpu"]["expert_matmul_efficiency_by_rows"] = measured_rows_table(
            matmul_by_rows,
            fmt::format("{}, T = {} (rows per touched expert {:.4g}): {:.3f} GFLOP in {:.1f} us less the "
                        "fixed time of their {} graph nodes at gpu.graph_kernel_us {:.2f} + "
                        "gpu.kernel_latency_us {:.2f}, over gpu.bf16_tflops {:.1f}, capped at 1 "
                        "(planner/calibration.h expert_matmul_efficiency_by_rows); {}",
                        layer, fmt::join(big_tokens, ", "), fmt::join(big_rows, ", "),
                        fmt::join(big_gflop, ", "), fmt::join(big_us, ", "), fmt::join(big_nodes, ", "),
                        gpu.graph_kernel_us.value, fit.kernel_latency_us, gpu.bf16_tflops.value,
                        calibration.source));
        doc["gpu"]["kernel_latency_us"] = measured_figure(
            fit.kernel_latency_us,
            fmt::format(
                "the fitted latency {:.2f} us of {} (gpu.memory_efficiency) over the {} nodes "
                "(kernels, memsets) of its CUDA graph at T = {}, the fitted layer with the fewest "
                "tokens: {:.2f} us per node, minus the base's gpu.graph_kernel_us {:.2f}; graph nodes "
                "by size: {}; {}",
                fit.layers.latency_us, layer, fit.kernels, fit.tokens,
                fit.layers.latency_us / static_cast<double>(fit.kernels), gpu.graph_kernel_us.value,
                node_counts, calibration.source));
    }
    std::vector<MeasuredAttentionCase> prompts, latent;
    for (const MeasuredAttentionCase& c : calibration.attention) {
        if (c.latent) latent.push_back(c);
        if (!c.latent && c.prompt) prompts.push_back(c);
    }
    if (!calibration.attention.empty() && prompts.empty() && latent.empty()) {
        return invalid_argument(
            "calibration: attention cases of GQA decode only: no prompt or latent case to measure an "
            "attention efficiency with");
    }
    for (auto [key, what, cases] :
         {std::tuple{"prefill_attention_matmul_efficiency", "GQA prompt", &prompts},
          std::tuple{"latent_attention_matmul_efficiency", "MLA latent", &latent}}) {
        if (cases->empty()) continue;
        EPI_ASSIGN_OR_RETURN(const double value,
                             attention_matmul_efficiency(*cases, base.gpu.bf16_tflops.value));
        if (value > 1.0) {
            return invalid_argument(fmt::format(
                "calibration: {} attention at {:.1f} TFLOP/s is above the base profile's gpu.bf16_tflops "
                "{:.1f}: is the base profile for this GPU?",
                what, value * base.gpu.bf16_tflops.value, base.gpu.bf16_tflops.value));
        }
        std::vector<std::string> quoted;
        for (const MeasuredAttentionCase& c : *cases) {
            quoted.push_back(fmt::format("{} {:.3f} GFLOP in {:.1f} us ({:.1f} TFLOP/s)", c.name,
                                         c.flops / 1e9, c.time_us, c.flops / c.time_us / 1e6));
        }
        doc["gpu"][key] = measured_figure(
            value,
            fmt::format("the median TFLOP/s of epinfer bench attention's {} cases over gpu.bf16_tflops "
                        "{:.1f} (planner/calibration.h attention_matmul_efficiency): {}; {}",
                        what, base.gpu.bf16_tflops.value, fmt::join(quoted, "; "), calibration.source));
    }
    // A base that is itself calibrated keeps its name and its note (chained benches, or a measured base).
    const std::string suffix = "_measured";
    const bool measured_base =
        base.name.size() >= suffix.size() &&
        base.name.compare(base.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    doc["name"] = measured_base ? base.name : base.name + suffix;
    if (doc.contains("note_calibration")) {
        std::string key = "note_calibration_base";
        for (int i = 2; doc.contains(key); ++i) key = fmt::format("note_calibration_base{}", i);
        doc[key] = doc["note_calibration"];
    }
    std::string replaced;
    for (const MeasuredCollective& m : calibration.collectives) {
        replaced +=
            fmt::format("{}intra_node.{}", replaced.empty() ? "" : ", ", collective_name(m.collective));
    }
    if (!calibration.gpu_ceilings.empty() || !calibration.moe_engine.empty()) {
        replaced += fmt::format("{}gpu.memory_efficiency", replaced.empty() ? "" : ", ");
    }
    if (!calibration.gpu_ceilings.empty()) replaced += ", gpu.matmul_efficiency";
    if (!calibration.moe_engine.empty()) {
        replaced +=
            ", gpu.expert_matmul_efficiency, gpu.kernel_latency_us, gpu.expert_memory_efficiency_by_rows, "
            "gpu.expert_matmul_efficiency_by_rows (the engine's MoE layer)";
    }
    if (!prompts.empty()) {
        replaced += fmt::format("{}gpu.prefill_attention_matmul_efficiency", replaced.empty() ? "" : ", ");
    }
    if (!latent.empty()) {
        replaced += fmt::format("{}gpu.latent_attention_matmul_efficiency", replaced.empty() ? "" : ", ");
    }
    doc["note_calibration"] =
        fmt::format("{} with {} measured by: {}", base_source, replaced, calibration.source);
    std::string text = doc.dump(2) + "\n";
    EPI_RETURN_IF_ERROR_CTX(parse_hardware_profile(text, "calibrated profile").status(),
                            "calibration produced an invalid profile");
    return text;
}

}  // namespace epinfer::planner
