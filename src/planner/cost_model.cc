#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "planner/layouts.h"

namespace epinfer::planner {
namespace {

constexpr double kActivationBytes = 2.0;  // bf16 hidden states on the wire
constexpr double kTokenIdBytes = 4.0;     // int32 sampled ids sent back from the last stage
// Kernels per layer in a decode step (estimate; docs/planner.md): norms, projections, RoPE, attention,
// router, top-k, permute, grouped GEMMs, activation, combine, shared expert.
constexpr int kKernelsMlaAttention = 10;
constexpr int kKernelsGqaAttention = 8;
constexpr int kKernelsMoe = 10;
constexpr int kKernelsDenseMlp = 4;
constexpr int kKernelsHead = 4;  // final norm, LM head, sampling

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

double bytes_of(double elems, WeightFormat format) {
    return elems * weight_bytes_per_element(format);
}

enum class Phase { kDecode, kPrefill };

// Which ranks sit on which node: the layout's ranks in order, gpus_per_node to a node.
struct Topology {
    int gpus_per_node = 1;
    int node_of(int rank) const { return rank / gpus_per_node; }
    bool run_spans_nodes(int first, int count) const { return node_of(first) != node_of(first + count - 1); }
    // The fewest ranks of [first, first + count) that share a node with one another.
    int min_ranks_per_node(int first, int count) const {
        int fewest = count;
        for (int r = first; r < first + count; ++r) {
            int node = node_of(r);
            int lo = std::max(first, node * gpus_per_node),
                hi = std::min(first + count, (node + 1) * gpus_per_node);
            fewest = std::min(fewest, hi - lo);
        }
        return fewest;
    }
};

// Adds calls to the term with the same description, or a new term.
void add_term(std::vector<CollectiveTerm>& terms, const CollectiveTerm& term) {
    for (CollectiveTerm& t : terms) {
        if (t.what == term.what && t.kind == term.kind && t.ranks == term.ranks &&
            t.inter_node == term.inter_node && t.size_bytes == term.size_bytes) {
            t.calls += term.calls;
            return;
        }
    }
    terms.push_back(term);
}

class StageCost {
public:
    StageCost(const CostInputs& in, Phase phase) : in_(in), m_(*in.model), l_(in.layout), phase_(phase) {
        share_ = rank_share(m_, l_);
        topo_.gpus_per_node = l_.world_size() / std::max(1, in.nodes);
        const GpuSpec& gpu = in.hardware->gpu;
        bw_ = effective_bandwidth_gbps(gpu);
        bf16_ = effective_tflops(gpu, MathRate::kBf16);
        dense_rate_ = effective_tflops(gpu, weight_math_rate(in.weights.dense));
        expert_rate_ = effective_tflops(gpu, weight_math_rate(in.weights.routed_experts));
        max_normal_ = expected_max_standard_normal(l_.moe_ep);
    }

    // Adds one micro-batch of `tokens` (all DP ranks) through `stage` to `out`; returns the stage's time.
    // Decode: each token attends over `context` KV tokens; prefill: tokens_per_rank prompt tokens each attend
    // over half the prompt on average.
    double run(const PipelineStage& stage, int64_t tokens, int64_t tokens_per_rank, double context,
               StepBreakdown& out) {
        const int W = l_.stage_size(), a = l_.attn_tp, d = l_.attn_dp;
        const int base = stage.stage * W;
        const double H = static_cast<double>(m_.hidden);
        const double Tr = static_cast<double>(tokens_per_rank);
        const double T = static_cast<double>(tokens);
        bool attn_inter = false;
        for (int j = 0; j < d; ++j) attn_inter = attn_inter || topo_.run_spans_nodes(base + j * a, a);
        const bool stage_inter = topo_.run_spans_nodes(base, W);
        const double hidden_bytes = Tr * H * kActivationBytes;

        double attention = 0, experts = 0, dense = 0;
        int64_t kernels = 0;
        std::vector<CollectiveTerm> terms;
        auto collective = [&](const char* what, Collective kind, int ranks, bool inter, double size) {
            if (ranks <= 1) return;
            CollectiveTerm t{what, kind, ranks, inter, size, 1, 0.0};
            t.us_per_call = collective_time_us(link(inter)[kind], kind, size, ranks);
            add_term(terms, t);
            ++kernels;
        };

        // Per-layer costs that do not depend on the layer.
        const double attn_w = bytes_of(static_cast<double>(share_.attn_params), in_.weights.dense);
        Roofline attn_linear = roofline(attn_w, 2.0 * share_.attn_params * Tr, bw_, dense_rate_);
        const double kv_elem_bytes =
            static_cast<double>(share_.kv_elems_per_token) * in_.kv_bytes_per_element;
        Roofline attn_score =
            phase_ == Phase::kDecode
                ? roofline(Tr * context * kv_elem_bytes, Tr * context * m_.decode_score_flops_per_ctx / a,
                           bw_, bf16_)
                : roofline(Tr * kv_elem_bytes, Tr * context * m_.prefill_score_flops_per_ctx / a, bw_, bf16_);
        const double attn_us = attn_linear.time_us() + attn_score.time_us();
        const double dense_mlp_us =
            roofline(bytes_of(static_cast<double>(share_.dense_mlp_params), in_.weights.dense),
                     2.0 * share_.dense_mlp_params * Tr, bw_, dense_rate_)
                .time_us();
        const double shared_us =
            share_.shared_params > 0
                ? roofline(bytes_of(static_cast<double>(share_.shared_params), in_.weights.dense),
                           2.0 * share_.shared_params * Tr, bw_, dense_rate_)
                      .time_us()
                : 0.0;
        const double router_us =
            roofline(m_.router_params * 2.0, 2.0 * m_.router_params * Tr, bw_, bf16_).time_us();

        // Routed experts on the busiest rank: every touched local expert's slice is read once.
        double touched = 0, expert_bytes = 0;
        Roofline expert_roof;
        if (m_.n_experts > 0) {
            const double local = static_cast<double>(share_.local_experts);
            const double q = local / static_cast<double>(m_.n_experts);
            // Each expert is touched with p = E[distinct experts]/E; the busiest EP rank sets the pace.
            const double p_touch = expected_distinct_experts(m_.n_experts, m_.top_k, T) / m_.n_experts;
            touched = l_.moe_ep > 1 ? expected_max_binomial(share_.local_experts, p_touch, l_.moe_ep)
                                    : local * p_touch;
            const double mean_pairs = T * m_.top_k * q;
            const double pairs = mean_pairs + std::sqrt(mean_pairs * (1.0 - q)) * max_normal_;
            expert_bytes = touched * bytes_of(static_cast<double>(share_.expert_slice_params),
                                              in_.weights.routed_experts);
            expert_roof = roofline(expert_bytes, 2.0 * pairs * share_.expert_slice_params, bw_, expert_rate_);
            out.local_experts = share_.local_experts;
            out.experts_touched_per_rank = touched;
            out.expert_bytes_per_layer = expert_bytes;
            out.tokens_per_touched_expert = touched > 0 ? pairs / touched : 0.0;
            out.experts_memory_bound = expert_roof.memory_bound();
        }
        // Dispatch/combine volume per rank under DP attention: each of the a ranks of an attention group
        // sends its share of the group's tokens to every moe_tp rank of each EP rank hit, minus the row to
        // itself.
        const double dest =
            m_.n_experts > 0 ? expected_destination_ranks(m_.n_experts, m_.top_k, l_.moe_ep) : 1.0;
        const double remote_rows = l_.moe_tp * dest - dest / l_.moe_ep;
        const double a2a_remote_bytes = (Tr / a) * remote_rows * H * kActivationBytes;
        const int ranks_per_node = topo_.min_ranks_per_node(base, W);

        const int attn_kernels = m_.mla ? kKernelsMlaAttention : kKernelsGqaAttention;
        for (int64_t i = stage.layers.begin; i < stage.layers.end(); ++i) {
            attention += attn_us;
            kernels += attn_kernels;
            collective("attention all_reduce", Collective::kAllReduce, a, attn_inter, hidden_bytes);
            if (!m_.layer_is_moe[static_cast<size_t>(i)]) {
                dense += dense_mlp_us;
                kernels += kKernelsDenseMlp;
                collective("MLP all_reduce", Collective::kAllReduce, a, attn_inter, hidden_bytes);
                continue;
            }
            ++out.moe_layers;
            experts += expert_roof.time_us();
            dense += shared_us + router_us;
            kernels += kKernelsMoe;
            if (d == 1) {
                collective("MoE all_reduce", Collective::kAllReduce, W, stage_inter, hidden_bytes);
            } else {
                for (const char* what : {"dispatch", "combine"}) {
                    CollectiveTerm t{what,
                                     Collective::kAllToAll,
                                     W,
                                     ranks_per_node < W,
                                     a2a_remote_bytes * W / (W - 1),
                                     1,
                                     alltoallv_us(a2a_remote_bytes, W, ranks_per_node)};
                    add_term(terms, t);
                    ++kernels;
                }
                if (share_.shared_params > 0) {
                    collective("shared-expert all_reduce", Collective::kAllReduce, a, attn_inter,
                               hidden_bytes);
                }
            }
        }
        if (stage.has_lm_head) {
            const double lm_tokens = phase_ == Phase::kDecode ? Tr : 1.0;  // prefill: the last token's logits
            const double lm_params = static_cast<double>(share_.vocab_slice) * H;
            dense += roofline(lm_params * 2.0, 2.0 * lm_params * lm_tokens, bw_, bf16_).time_us();
            kernels += kKernelsHead;
        }
        if (l_.pp > 1) {
            // Hidden states to the next stage; the last stage returns the sampled token ids to the first.
            int peer = stage.has_lm_head ? base - (l_.pp - 1) * W : base + W;
            bool inter = topo_.node_of(base) != topo_.node_of(peer) || topo_.run_spans_nodes(base, W);
            double size = stage.has_lm_head ? Tr * kTokenIdBytes : hidden_bytes;
            collective("stage send", Collective::kSendRecv, 2, inter, size);
        }
        const double launch = static_cast<double>(kernels) * in_.hardware->gpu.graph_kernel_us.value;

        double comm = 0;
        for (const CollectiveTerm& t : terms) {
            comm += t.total_us();
            add_term(out.collectives, t);
        }
        out.attention_us += attention;
        out.experts_us += experts;
        out.dense_us += dense;
        out.launch_us += launch;
        return attention + experts + dense + launch + comm;
    }

private:
    const LinkSpec& link(bool inter) const {
        return inter && in_.hardware->inter_node ? *in_.hardware->inter_node : in_.hardware->intra_node;
    }

    // All-to-all-v where each rank sends `remote_bytes` to the others, `local` of the W ranks per node: the
    // intra- and inter-node shares move at once, each at its link's all_to_all cost.
    double alltoallv_us(double remote_bytes, int W, int local) const {
        if (W <= 1 || remote_bytes <= 0) return 0.0;
        const CollectiveSpec& intra = in_.hardware->intra_node[Collective::kAllToAll];
        if (local >= W)
            return collective_time_us(intra, Collective::kAllToAll, remote_bytes * W / (W - 1), W);
        double intra_bytes = remote_bytes * (local - 1) / (W - 1);
        double inter_bytes = remote_bytes * (W - local) / (W - 1);
        double t_intra = local > 1 ? collective_time_us(intra, Collective::kAllToAll,
                                                        intra_bytes * local / (local - 1), local)
                                   : 0.0;
        double t_inter = collective_time_us(link(true)[Collective::kAllToAll], Collective::kAllToAll,
                                            inter_bytes * W / (W - 1), W);
        return std::max(t_intra, t_inter);
    }

    const CostInputs& in_;
    const ModelCosts& m_;
    const ParallelLayout& l_;
    Phase phase_;
    RankShare share_;
    Topology topo_;
    double bw_ = 0, bf16_ = 0, dense_rate_ = 0, expert_rate_ = 0;
    double max_normal_ = 0;  // E[max of moe_ep standard normals]
};

}  // namespace

double expected_distinct_experts(int64_t num_experts, int64_t top_k, double tokens) {
    if (num_experts <= 0 || tokens <= 0) return 0.0;
    double p_miss = 1.0 - static_cast<double>(top_k) / static_cast<double>(num_experts);
    return static_cast<double>(num_experts) * (1.0 - std::pow(p_miss, tokens));
}

double expected_destination_ranks(int64_t num_experts, int64_t top_k, int ranks) {
    if (num_experts <= 0 || ranks <= 0) return 0.0;
    double total = 0.0;
    for (int r = 0; r < ranks; ++r) {
        int64_t n_r = num_experts / ranks + (r < num_experts % ranks ? 1 : 0);
        // C(E − n_r, K) / C(E, K) = Π_{i<K} (E − n_r − i) / (E − i): none of the K picks lands on rank r.
        double p_miss = 1.0;
        for (int64_t i = 0; i < top_k; ++i) {
            double num = static_cast<double>(num_experts - n_r - i);
            if (num <= 0) {
                p_miss = 0.0;
                break;
            }
            p_miss *= num / static_cast<double>(num_experts - i);
        }
        total += 1.0 - p_miss;
    }
    return total;
}

double expected_max_binomial(int64_t trials, double p, int samples) {
    if (trials <= 0 || p <= 0.0) return 0.0;
    if (p >= 1.0) return static_cast<double>(trials);
    if (samples <= 1) return static_cast<double>(trials) * p;
    const double n = static_cast<double>(trials);
    const double log_p = std::log(p), log_q = std::log1p(-p);
    double cdf = 0.0, expected = 0.0;
    for (int64_t k = 0; k < trials; ++k) {
        const double kd = static_cast<double>(k);
        double log_pmf = std::lgamma(n + 1) - std::lgamma(kd + 1) - std::lgamma(n - kd + 1) + kd * log_p +
                         (n - kd) * log_q;
        cdf = std::min(1.0, cdf + std::exp(log_pmf));
        double tail = 1.0 - std::pow(cdf, samples);  // P(max > k)
        expected += tail;
        if (tail < 1e-12 && kd > n * p) break;
    }
    return expected;
}

double expected_max_standard_normal(int samples) {
    if (samples <= 1) return 0.0;
    // ∫ x · R·φ(x)·Φ(x)^(R−1) dx over [−10, 10], midpoint rule.
    constexpr int kSteps = 4000;
    constexpr double kLo = -10.0, kHi = 10.0, kDx = (kHi - kLo) / kSteps;
    const double inv_sqrt_2pi = 1.0 / std::sqrt(2.0 * std::numbers::pi);
    double sum = 0.0;
    for (int i = 0; i < kSteps; ++i) {
        double x = kLo + (i + 0.5) * kDx;
        double pdf = inv_sqrt_2pi * std::exp(-0.5 * x * x);
        double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
        sum += x * samples * pdf * std::pow(cdf, samples - 1) * kDx;
    }
    return sum;
}

double collective_bus_factor(Collective collective, int ranks) {
    if (ranks <= 1) return 0.0;
    double n = ranks;
    switch (collective) {
        case Collective::kAllReduce:
            return 2.0 * (n - 1) / n;
        case Collective::kAllGather:
        case Collective::kAllToAll:
            return (n - 1) / n;
        case Collective::kSendRecv:
            return 1.0;
    }
    return 1.0;
}

double collective_time_us(const CollectiveSpec& spec, Collective collective, double size_bytes, int ranks) {
    if (ranks <= 1) return 0.0;
    const double factor = collective_bus_factor(collective, ranks);
    const double us_per_byte = factor / (spec.bus_bandwidth_gbps.value * 1e3);  // GB/s = 1e3 bytes/µs
    const auto& points = spec.table.points;
    if (spec.table.ranks == ranks && !points.empty()) {
        if (size_bytes <= points.front().first) return points.front().second;
        if (size_bytes >= points.back().first) {
            return points.back().second + (size_bytes - points.back().first) * us_per_byte;
        }
        auto hi = std::lower_bound(points.begin(), points.end(), size_bytes,
                                   [](const std::pair<double, double>& p, double s) { return p.first < s; });
        auto lo = hi - 1;
        double f = (size_bytes - lo->first) / (hi->first - lo->first);
        return lo->second + f * (hi->second - lo->second);
    }
    return spec.latency_us.value + size_bytes * us_per_byte;
}

Roofline roofline(double bytes, double flops, double bandwidth_gbps, double tflops) {
    Roofline r;
    r.bytes = bytes;
    r.flops = flops;
    r.memory_us = bandwidth_gbps > 0 ? bytes / (bandwidth_gbps * 1e3) : 0.0;  // GB/s = 1e3 bytes/µs
    r.compute_us = tflops > 0 ? flops / (tflops * 1e6) : 0.0;                 // TFLOP/s = 1e6 FLOP/µs
    return r;
}

double effective_bandwidth_gbps(const GpuSpec& gpu) {
    return gpu.memory_bandwidth_gbps.value * gpu.memory_efficiency.value;
}

double effective_tflops(const GpuSpec& gpu, MathRate rate) {
    double tflops = gpu.bf16_tflops.value;
    if (rate == MathRate::kFp8 && gpu.fp8_tflops.value > 0) tflops = gpu.fp8_tflops.value;
    if (rate == MathRate::kFp4 && gpu.fp4_tflops.value > 0) tflops = gpu.fp4_tflops.value;
    return tflops * gpu.matmul_efficiency.value;
}

PipelineTiming pipeline_timing(const std::vector<double>& stage_us, int micro_batches) {
    PipelineTiming t;
    t.micro_batches = std::max(1, micro_batches);
    for (double s : stage_us) {
        t.path_us += s;
        t.bottleneck_us = std::max(t.bottleneck_us, s);
    }
    t.step_us = std::max(t.path_us, t.micro_batches * t.bottleneck_us);
    t.wait_us = t.step_us - t.path_us;
    t.bubble_us = t.step_us - t.micro_batches * t.bottleneck_us;
    return t;
}

double StepBreakdown::collectives_us() const {
    double total = 0.0;
    for (const CollectiveTerm& t : collectives) total += t.total_us();
    return total;
}

DecodeResult decode_step(const CostInputs& in, int64_t concurrency, int64_t kv_tokens_per_rank) {
    DecodeResult result;
    result.concurrency = concurrency;
    const ParallelLayout& l = in.layout;
    result.kv_tokens_needed_per_rank = ceil_div(concurrency, l.attn_dp) * in.context_tokens;
    result.kv_fits = result.kv_tokens_needed_per_rank <= kv_tokens_per_rank;

    int m = in.micro_batches > 0 ? in.micro_batches : l.pp;
    m = static_cast<int>(std::clamp<int64_t>(m, 1, concurrency));
    StepBreakdown& step = result.step;
    step.micro_batches = m;
    step.tokens = ceil_div(concurrency, m);
    step.tokens_per_attn_rank = ceil_div(step.tokens, l.attn_dp);

    StageCost cost(in, Phase::kDecode);
    std::vector<double> stage_us;
    for (const PipelineStage& stage : layout_stages(*in.model, in.layout.pp)) {
        stage_us.push_back(cost.run(stage, step.tokens, step.tokens_per_attn_rank,
                                    static_cast<double>(in.context_tokens), step));
    }
    PipelineTiming timing = pipeline_timing(stage_us, m);
    step.path_us = timing.path_us;
    step.pipeline_wait_us = timing.wait_us;
    step.bubble_us = timing.bubble_us;
    step.step_us = timing.step_us;
    result.tpot_ms = step.step_us / 1e3;
    result.tokens_per_s = step.step_us > 0 ? static_cast<double>(concurrency) / step.step_us * 1e6 : 0.0;
    return result;
}

PrefillResult prefill_step(const CostInputs& in, int64_t input_len) {
    PrefillResult result;
    result.input_len = input_len;
    const ParallelLayout& l = in.layout;
    int m = in.micro_batches > 0 ? in.micro_batches : l.pp;
    m = static_cast<int>(std::clamp<int64_t>(m, 1, input_len));
    StepBreakdown& step = result.step;
    step.micro_batches = m;
    step.tokens_per_attn_rank = ceil_div(input_len, m);
    step.tokens = step.tokens_per_attn_rank * l.attn_dp;

    StageCost cost(in, Phase::kPrefill);
    std::vector<double> stage_us;
    for (const PipelineStage& stage : layout_stages(*in.model, in.layout.pp)) {
        stage_us.push_back(cost.run(stage, step.tokens, step.tokens_per_attn_rank,
                                    static_cast<double>(input_len) / 2.0, step));
    }
    // Chunks follow one another through the stages: TTFT = path + (m − 1) · bottleneck.
    PipelineTiming timing = pipeline_timing(stage_us, 1);
    step.path_us = timing.path_us;
    step.pipeline_wait_us = (m - 1) * timing.bottleneck_us;
    step.bubble_us = timing.path_us - timing.bottleneck_us;
    step.step_us = step.path_us + step.pipeline_wait_us;
    result.ttft_ms = step.step_us / 1e3;
    double busy_us = m * timing.bottleneck_us;
    result.tokens_per_s = busy_us > 0 ? static_cast<double>(input_len) * l.attn_dp / busy_us * 1e6 : 0.0;
    return result;
}

}  // namespace epinfer::planner
