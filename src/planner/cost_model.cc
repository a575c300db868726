#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <unordered_map>

#include "planner/layouts.h"

namespace epinfer::planner {
namespace {

constexpr double kTokenIdBytes = 4.0;  // int32 sampled ids sent back from the last stage

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

double bytes_of(double elems, WeightFormat format) {
    return elems * weight_bytes_per_element(format);
}

// Rows of one micro-batch through a stage, per attention-DP rank: decode rows over `decode_context` KV
// tokens each, prompt rows over `prefill_context` on average; logits for `lm_rows`; `tokens` over the
// attention-DP ranks that have rows (what the MoE sees).
struct StageRows {
    int64_t tokens = 0;
    int64_t decode = 0;
    int64_t prefill = 0;
    double decode_context = 0.0;
    double prefill_context = 0.0;
    double prefill_keys = 0.0;  // Σ over the prompt chunks of the keys each attends to: offset + its rows
    int64_t lm_rows = 0;
    int64_t per_rank() const { return decode + prefill; }
};

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

// One stage's time for one micro-batch and its send to the next stage.
struct StageTime {
    double compute_us = 0.0;  // everything but the send, collectives inside the stage included
    double send_us = 0.0;     // the send/recv to the next stage (0 on the last)
};

// The tensor-core rate of `rate` on `gpu`, bf16's when the GPU has no fp8/fp4 tensor cores.
double peak_tflops(const GpuSpec& gpu, MathRate rate) {
    if (rate == MathRate::kFp8 && gpu.fp8_tflops.value > 0) return gpu.fp8_tflops.value;
    if (rate == MathRate::kFp4 && gpu.fp4_tflops.value > 0) return gpu.fp4_tflops.value;
    return gpu.bf16_tflops.value;
}

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
    explicit StageCost(const CostInputs& in) : in_(in), m_(*in.model), l_(in.layout) {
        share_ = rank_share(m_, l_);
        topo_.gpus_per_node = l_.world_size() / std::max(1, in.nodes);
        const GpuSpec& gpu = in.hardware->gpu;
        bw_ = effective_bandwidth_gbps(gpu);
        bf16_ = effective_tflops(gpu, MathRate::kBf16);
        decode_attn_rate_ = attention_tflops(gpu, m_.mla, false);
        prefill_attn_rate_ = attention_tflops(gpu, m_.mla, true);
        dense_rate_ = effective_tflops(gpu, weight_math_rate(in.weights.dense));
        expert_math_ = weight_math_rate(in.weights.routed_experts);
        graph_kernel_us_ = kernel_fixed_us(gpu, true);
        eager_kernel_us_ = kernel_fixed_us(gpu, false);
        act_bytes_ = in.activation_bytes_per_element;
        max_normal_ = expected_max_standard_normal(l_.moe_ep);
    }

    // Adds one micro-batch of `rows` through `stage` to `out`; returns the stage's time and its send to the
    // next stage (0 on the last). `decode_graph`: the micro-batch replays a CUDA graph (engine_facts.h).
    StageTime run(const PipelineStage& stage, const StageRows& rows, bool decode_graph, StepBreakdown& out) {
        const int W = l_.stage_size(), a = l_.attn_tp, d = l_.attn_dp;
        const int base = stage.stage * W;
        const double H = static_cast<double>(m_.hidden);
        const double Tr = static_cast<double>(rows.per_rank());
        const double T = static_cast<double>(rows.tokens);
        bool attn_inter = false;
        for (int j = 0; j < d; ++j) attn_inter = attn_inter || topo_.run_spans_nodes(base + j * a, a);
        const bool stage_inter = topo_.run_spans_nodes(base, W);
        const double hidden_bytes = Tr * H * act_bytes_;

        double attention = 0, experts = 0, dense = 0, activations = 0;
        int64_t kernels = 0, host_round_trips = 0;
        std::vector<CollectiveTerm> terms;
        // Every NCCL call of the engine is queued on the stream: its measured time alone.
        auto collective = [&](const char* what, Collective kind, int ranks, bool inter, double size) {
            if (ranks <= 1) return;
            CollectiveTerm t{what, kind, ranks, inter, size, 1, 0.0};
            t.us_per_call = collective_time_us(link(inter)[kind], kind, size, ranks);
            add_term(terms, t);
        };

        // Per-layer costs that do not depend on the layer.
        const double attn_w = bytes_of(static_cast<double>(share_.attn_params), in_.weights.dense);
        Roofline attn_linear = roofline(attn_w, 2.0 * share_.attn_params * Tr, bw_, dense_rate_);
        const double kv_elem_bytes =
            static_cast<double>(share_.kv_elems_per_token) * in_.kv_bytes_per_element;
        // Decode rows read their context's KV; a prompt chunk reads the KV of every key it attends to once
        // (the chunks before it and its own rows). Each kind of rows is its own roofline, its FLOPs at the
        // rate of the kernel that runs it (attention_tflops).
        const double Td = static_cast<double>(rows.decode), Tp = static_cast<double>(rows.prefill);
        const double score_flops = m_.score_flops_per_ctx / a;
        Roofline decode_score = roofline(Td * rows.decode_context * kv_elem_bytes,
                                         Td * rows.decode_context * score_flops, bw_, decode_attn_rate_);
        Roofline prefill_score = roofline(rows.prefill_keys * kv_elem_bytes,
                                          Tp * rows.prefill_context * score_flops, bw_, prefill_attn_rate_);
        const double attn_us = attn_linear.time_us() + decode_score.time_us() + prefill_score.time_us();
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
        double touched = 0, expert_bytes = 0, pairs = 0;
        Roofline expert_roof;
        if (m_.n_experts > 0) {
            const double local = static_cast<double>(share_.local_experts);
            const double q = local / static_cast<double>(m_.n_experts);
            touched = touched_experts(rows.tokens);
            const double mean_pairs = T * m_.top_k * q;
            pairs = mean_pairs + std::sqrt(mean_pairs * (1.0 - q)) * max_normal_;
            expert_bytes = touched * bytes_of(static_cast<double>(share_.expert_slice_params),
                                              in_.weights.routed_experts);
            // The weights stream at the rate of the rows each touched expert computes (gemv-like when few).
            const double rows_per_expert = touched > 0 ? pairs / touched : 0.0;
            const GpuSpec& gpu = in_.hardware->gpu;
            const double expert_efficiency = expert_memory_efficiency(gpu, rows_per_expert);
            expert_roof = roofline(expert_bytes, 2.0 * pairs * share_.expert_slice_params,
                                   gpu.memory_bandwidth_gbps.value * expert_efficiency,
                                   effective_expert_tflops(gpu, expert_math_, rows_per_expert));
            out.local_experts = share_.local_experts;
            out.experts_touched_per_rank = touched;
            out.expert_bytes_per_layer = expert_bytes;
            out.tokens_per_touched_expert = rows_per_expert;
            out.experts_memory_efficiency = expert_efficiency;
            out.experts_memory_bound = expert_roof.memory_bound();
        }
        // Dispatch/combine volume per rank under DP attention: each of the a ranks of an attention group
        // sends its share of the group's tokens to every moe_tp rank of each EP rank hit, minus the row to
        // itself.
        const double dest =
            m_.n_experts > 0 ? expected_destination_ranks(m_.n_experts, m_.top_k, l_.moe_ep) : 1.0;
        const double remote_rows = l_.moe_tp * dest - dest / l_.moe_ep;
        const double a2a_remote_bytes = (Tr / a) * remote_rows * H * act_bytes_;
        const int ranks_per_node = topo_.min_ranks_per_node(base, W);

        // The engine's kernels and activation traffic (engine_facts.h), at the memory roofline.
        const int64_t rows_per_rank = rows.per_rank();
        const EngineKernels engine = engine_kernels(m_, rows_per_rank, rows.tokens, a);
        const EngineActivationBytes act =
            engine_activation_bytes(m_, a, l_.moe_tp, share_.kv_heads_per_rank, act_bytes_, rows_per_rank);
        const double attn_act_us = Tr * act.attention_per_token / (bw_ * 1e3);
        const double moe_act_us = (Tr * act.moe_per_token + pairs * act.moe_per_pair) / (bw_ * 1e3);
        const double mlp_act_us = Tr * act.dense_mlp_per_token / (bw_ * 1e3);

        for (int64_t i = stage.layers.begin; i < stage.layers.end(); ++i) {
            attention += attn_us;
            activations += attn_act_us;
            kernels += engine.attention;
            collective("attention all_reduce", Collective::kAllReduce, a, attn_inter, hidden_bytes);
            if (!m_.layer_is_moe[static_cast<size_t>(i)]) {
                dense += dense_mlp_us;
                activations += mlp_act_us;
                kernels += engine.dense_mlp;
                collective("MLP all_reduce", Collective::kAllReduce, a, attn_inter, hidden_bytes);
                continue;
            }
            ++out.moe_layers;
            experts += expert_roof.time_us();
            dense += shared_us + router_us;
            activations += moe_act_us;
            kernels += engine.moe;
            if (d == 1) {
                collective("MoE all_reduce", Collective::kAllReduce, W, stage_inter, hidden_bytes);
            } else {
                // The dispatch planned on the host (engine_facts.h): round trips and the gathers and adds.
                if (rows_per_rank > 0) {
                    host_round_trips += kEngineDpMoeHostRoundTrips;
                    kernels += engine_dp_moe_kernels(l_.moe_ep);
                }
                for (const char* what : {"dispatch", "combine"}) {
                    CollectiveTerm t{what,
                                     Collective::kAllToAll,
                                     W,
                                     ranks_per_node < W,
                                     a2a_remote_bytes * W / (W - 1),
                                     1,
                                     alltoallv_us(a2a_remote_bytes, W, ranks_per_node)};
                    add_term(terms, t);
                }
                if (share_.shared_params > 0) {
                    collective("shared-expert all_reduce", Collective::kAllReduce, a, attn_inter,
                               hidden_bytes);
                }
            }
        }
        if (stage.has_lm_head) {
            const double lm_rows = static_cast<double>(rows.lm_rows);
            const double lm_params = static_cast<double>(share_.vocab_slice) * H;
            dense += roofline(lm_params * 2.0, 2.0 * lm_params * lm_rows, bw_, bf16_).time_us();
            const EngineActivationBytes head =
                engine_activation_bytes(m_, a, l_.moe_tp, share_.kv_heads_per_rank, act_bytes_, rows.lm_rows);
            activations += lm_rows * head.head_per_row / (bw_ * 1e3);
            kernels += engine_kernels(m_, rows.lm_rows, rows.tokens, a).head;
        } else if (rows_per_rank > 0) {  // the last layer's residual add, run alone before the send
            kernels += engine.stage_send;
            activations += Tr * act.stage_send_per_token / (bw_ * 1e3);
        }
        const double launch =
            static_cast<double>(kernels) * (decode_graph ? graph_kernel_us_ : eager_kernel_us_);
        const GpuSpec& gpu = in_.hardware->gpu;
        const double host = static_cast<double>(host_round_trips) *
                            (gpu.host_round_trip_us.value +
                             gpu.host_round_trip_us_per_row.value * static_cast<double>(rows_per_rank));
        double comm = 0;
        for (const CollectiveTerm& t : terms) comm += t.total_us();
        StageTime time;
        time.compute_us = attention + experts + dense + activations + launch + host + comm;
        if (!stage.has_lm_head) {
            // [T, H] fp32 hidden states to the next stage: one NCCL send/recv, which runs when both GPUs
            // reach it.
            const int peer = base + W;
            const bool inter = topo_.node_of(base) != topo_.node_of(peer) || topo_.run_spans_nodes(base, W);
            CollectiveTerm send{"stage send", Collective::kSendRecv, 2, inter, hidden_bytes, 1, 0.0};
            send.us_per_call = collective_time_us(link(inter)[Collective::kSendRecv], Collective::kSendRecv,
                                                  hidden_bytes, 2);
            time.send_us = send.total_us();
            terms.push_back(send);
        }
        for (const CollectiveTerm& t : terms) add_term(out.collectives, t);
        out.attention_us += attention;
        out.experts_us += experts;
        out.dense_us += dense;
        out.activations_us += activations;
        out.kernels += kernels;
        out.launch_us += launch;
        out.host_round_trips += host_round_trips;
        out.host_us += host;
        return time;
    }

    // pp > 1: after the last micro-batch the last stage broadcasts the step's sampled ids and non-finite
    // flags (`sequences` int32 each) to every stage over MPI on the host; priced as the link's send_recv
    // (not measured). None when pp = 1.
    CollectiveTerm output_broadcast(int64_t sequences) const {
        CollectiveTerm t{"output broadcast", Collective::kSendRecv, l_.pp, false, 0.0, 0, 0.0};
        if (l_.pp <= 1 || sequences <= 0) return t;
        const int W = l_.stage_size();
        t.inter_node = topo_.node_of(0) != topo_.node_of((l_.pp - 1) * W);
        t.size_bytes = static_cast<double>(sequences) * kTokenIdBytes;
        t.calls = kEngineOutputBroadcasts;
        t.us_per_call = collective_time_us(link(t.inter_node)[Collective::kSendRecv], Collective::kSendRecv,
                                           t.size_bytes, 2);
        return t;
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

    // Local experts a micro-batch of `tokens` tokens touches on the busiest EP rank: each expert is touched
    // with p = E[distinct experts]/E, and the busiest rank sets the pace. Kept by tokens (a step prices every
    // stage of every micro-batch, and the binomial's sum takes microseconds: a 32-stage pipeline of EP
    // ranks spent most of its plan here).
    double touched_experts(int64_t tokens) {
        const auto found = touched_by_tokens_.find(tokens);
        if (found != touched_by_tokens_.end()) return found->second;
        const double p_touch =
            expected_distinct_experts(m_.n_experts, m_.top_k, static_cast<double>(tokens)) / m_.n_experts;
        const double touched = l_.moe_ep > 1 ? expected_max_binomial(share_.local_experts, p_touch, l_.moe_ep)
                                             : static_cast<double>(share_.local_experts) * p_touch;
        touched_by_tokens_.emplace(tokens, touched);
        return touched;
    }

    const CostInputs& in_;
    const ModelCosts& m_;
    const ParallelLayout& l_;
    std::unordered_map<int64_t, double> touched_by_tokens_;
    RankShare share_;
    Topology topo_;
    double bw_ = 0, bf16_ = 0, dense_rate_ = 0, decode_attn_rate_ = 0, prefill_attn_rate_ = 0;
    double graph_kernel_us_ = 0, eager_kernel_us_ = 0;
    MathRate expert_math_ = MathRate::kBf16;  // the routed experts' weight format's tensor-core rate
    int act_bytes_ = kEngineActivationBytesPerElement;
    double max_normal_ = 0;  // E[max of moe_ep standard normals]
};

}  // namespace

double median(std::vector<double> values) {
    if (values.empty()) return 0.0;
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

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
    if (const SizeTable* table = spec.table_for(ranks)) {
        const auto& points = table->points;
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
    return peak_tflops(gpu, rate) * gpu.matmul_efficiency.value;
}

double attention_tflops(const GpuSpec& gpu, bool mla, bool prompt_rows) {
    const Figure& figure = mla           ? gpu.latent_attention_matmul_efficiency
                           : prompt_rows ? gpu.prefill_attention_matmul_efficiency
                                         : gpu.matmul_efficiency;
    const double efficiency = figure.value > 0 ? figure.value : gpu.matmul_efficiency.value;
    return gpu.bf16_tflops.value * efficiency;
}

PipelineTiming pipeline_timing(const std::vector<std::vector<double>>& stage_us,
                               const std::vector<std::vector<double>>& send_us) {
    PipelineTiming t;
    const size_t S = stage_us.size();
    if (S == 0) return t;
    const size_t m = stage_us[0].size();
    t.micro_batches = static_cast<int>(std::max<size_t>(1, m));
    auto send = [&](size_t s, size_t j) {
        return s < send_us.size() && j < send_us[s].size() ? send_us[s][j] : 0.0;
    };
    for (size_t s = 0; s < S; ++s) {
        if (m > 0) t.path_us += stage_us[s][0] + (s + 1 < S ? send(s, 0) : 0.0);
        double busy = 0.0;
        for (size_t j = 0; j < m; ++j) busy += stage_us[s][j];
        t.bottleneck_us = std::max(t.bottleneck_us, busy);
    }
    // free[s]: when rank s has finished everything of the micro-batches so far (its send included).
    std::vector<double> free(S, 0.0);
    for (size_t j = 0; j < m; ++j) {
        double arrival = free[0];  // stage 0 starts micro-batch j when it is done with j − 1
        for (size_t s = 0; s < S; ++s) {
            const double done = std::max(arrival, free[s]) + stage_us[s][j];
            if (s + 1 == S) {
                free[s] = done;
                break;
            }
            // The send starts once the next stage has posted its receive (it is done with j − 1) and
            // occupies both ranks.
            const double end = std::max(done, free[s + 1]) + send(s, j);
            free[s] = end;
            arrival = end;
        }
    }
    t.step_us = free[S - 1];
    t.wait_us = t.step_us - t.path_us;
    t.bubble_us = t.step_us - t.bottleneck_us;
    return t;
}

PipelineTiming pipeline_timing(const std::vector<double>& stage_us, int micro_batches, double send_us) {
    const size_t m = static_cast<size_t>(std::max(1, micro_batches));
    std::vector<std::vector<double>> stages, sends;
    for (double s : stage_us) {
        stages.emplace_back(m, s);
        sends.emplace_back(m, send_us);
    }
    return pipeline_timing(stages, sends);
}

double StepBreakdown::collectives_us() const {
    double total = 0.0;
    for (const CollectiveTerm& t : collectives) total += t.total_us();
    return total;
}

namespace {

// One sequence of a step on one attention-DP rank: a decode row or a prompt chunk.
struct StepSequence {
    int64_t rows = 1;
    double context = 0.0;  // decode: KV tokens it attends over; chunk: its rows' mean context
    bool decode = true;
};

// The micro-batches of a step as the engine forms them (engine_facts.h): `seqs` in step order (decode
// first), split by count into min(m, sequences) parts, the first ones one larger. `seqs` are the busiest
// attention-DP group's; `dp_groups_with_rows` of the attn_dp groups have as many (fewer than attn_dp when
// there are fewer requests than groups: the others join the MoE's all-to-all with no token).
std::vector<StageRows> split_micro_batches(const CostInputs& in, const std::vector<StepSequence>& seqs,
                                           int64_t dp_groups_with_rows) {
    const int64_t n = static_cast<int64_t>(seqs.size());
    const int64_t m_req = in.micro_batches > 0 ? in.micro_batches : in.layout.pp;
    const int m = static_cast<int>(std::clamp<int64_t>(m_req, 1, std::max<int64_t>(1, n)));
    std::vector<StageRows> out;
    int64_t begin = 0;
    for (int j = 0; j < m; ++j) {
        const int64_t size = n / m + (j < n % m ? 1 : 0);
        StageRows r;
        double decode_ctx = 0.0, prefill_ctx = 0.0;
        for (int64_t i = begin; i < begin + size; ++i) {
            const StepSequence& q = seqs[static_cast<size_t>(i)];
            if (q.decode) {
                ++r.decode;
                decode_ctx += q.context;
            } else {
                r.prefill += q.rows;
                prefill_ctx += static_cast<double>(q.rows) * q.context;
                r.prefill_keys += q.context + static_cast<double>(q.rows) / 2.0;  // context: offset + rows/2
            }
        }
        begin += size;
        r.decode_context = r.decode > 0 ? decode_ctx / static_cast<double>(r.decode) : 0.0;
        r.prefill_context = r.prefill > 0 ? prefill_ctx / static_cast<double>(r.prefill) : 0.0;
        r.lm_rows = size;
        r.tokens = r.per_rank() * dp_groups_with_rows;
        out.push_back(r);
    }
    return out;
}

// The engine's step: every micro-batch through every stage (breakdown: micro-batch 0's path), the
// pipeline schedule, then the output broadcast.
StepBreakdown price_step(StageCost& cost, const CostInputs& in, const std::vector<PipelineStage>& stages,
                         const std::vector<StageRows>& micro_batches) {
    StepBreakdown step;
    step.micro_batches = static_cast<int>(micro_batches.size());
    if (micro_batches.empty()) return step;
    step.tokens = micro_batches[0].tokens;
    step.tokens_per_attn_rank = micro_batches[0].per_rank();
    const int world = in.layout.world_size();
    std::vector<std::vector<double>> stage_us(stages.size()), send_us(stages.size());
    int64_t sequences = 0;
    for (size_t j = 0; j < micro_batches.size(); ++j) {
        const StageRows& rows = micro_batches[j];
        sequences += rows.lm_rows;
        const bool graph = engine_uses_decode_graph(*in.model, world, rows.decode, rows.prefill);
        if (j == 0) step.decode_graph = graph;
        StepBreakdown scratch;
        for (size_t s = 0; s < stages.size(); ++s) {
            const StageTime t = cost.run(stages[s], rows, graph, j == 0 ? step : scratch);
            stage_us[s].push_back(t.compute_us);
            send_us[s].push_back(t.send_us);
        }
    }
    const PipelineTiming timing = pipeline_timing(stage_us, send_us);
    const CollectiveTerm broadcast = cost.output_broadcast(sequences);
    if (broadcast.calls > 0) step.collectives.push_back(broadcast);
    step.path_us = timing.path_us + broadcast.total_us();
    step.step_us = timing.step_us + broadcast.total_us();
    step.pipeline_wait_us = step.step_us - step.path_us;
    step.bubble_us = timing.bubble_us;
    return step;
}

// Adds `count` times the times, kernel and round-trip counts and collectives of `b`, a later step, to `sum`
// (a prompt's chunks, one step each); the token, micro-batch and expert fields stay `sum`'s.
void add_steps(StepBreakdown& sum, const StepBreakdown& b, int64_t count) {
    const double k = static_cast<double>(count);
    sum.attention_us += k * b.attention_us;
    sum.experts_us += k * b.experts_us;
    sum.dense_us += k * b.dense_us;
    sum.activations_us += k * b.activations_us;
    sum.kernels += count * b.kernels;
    sum.launch_us += k * b.launch_us;
    sum.host_round_trips += count * b.host_round_trips;
    sum.host_us += k * b.host_us;
    for (CollectiveTerm t : b.collectives) {
        t.calls *= count;
        add_term(sum.collectives, t);
    }
    sum.path_us += k * b.path_us;
    sum.pipeline_wait_us += k * b.pipeline_wait_us;
    sum.bubble_us += k * b.bubble_us;
    sum.step_us += k * b.step_us;
}

// Calls add(step, count) for stretches that together cover the steps k0 … k1 of a run whose contexts grow
// linearly with the step k, priced by price(k) (k may be fractional: the middle of a stretch). A step's cost
// is convex and piecewise affine in k (each context-dependent part of it is the larger of a bytes and a
// FLOPs term, both affine in the contexts), so where the step time and the busiest stage's idle time at a
// stretch's middle are the means of those at its ends, the stretch is affine and adds as its length times
// its middle step; else it is halved. That prices O(log n) steps per kink instead of n (a 131072-token prompt
// in 1-token chunks took 25 s to plan).
template <typename Price, typename Add>
void add_affine_stretches(const Price& price, int64_t k0, int64_t k1, const StepBreakdown& lo,
                          const StepBreakdown& hi, const Add& add) {
    if (k1 - k0 < 3) {  // as cheap to price one by one as to test
        add(lo, 1);
        for (int64_t k = k0 + 1; k < k1; ++k) add(price(static_cast<double>(k)), 1);
        if (k1 > k0) add(hi, 1);
        return;
    }
    const StepBreakdown mid = price((k0 + k1) / 2.0);
    const auto on_chord = [](double m, double a, double b) {
        return std::abs(m - (a + b) / 2.0) <= 1e-12 * std::max(1.0, std::abs(m));
    };
    if (on_chord(mid.step_us, lo.step_us, hi.step_us) &&
        on_chord(mid.bubble_us, lo.bubble_us, hi.bubble_us)) {
        add(mid, k1 - k0 + 1);
        return;
    }
    const int64_t m = k0 + (k1 - k0) / 2;
    add_affine_stretches(price, k0, m, lo, price(static_cast<double>(m)), add);
    add_affine_stretches(price, m + 1, k1, price(static_cast<double>(m + 1)), hi, add);
}
template <typename Price, typename Add>
void add_affine_stretches(const Price& price, int64_t k0, int64_t k1, const Add& add) {
    const StepBreakdown lo = price(static_cast<double>(k0));
    add_affine_stretches(price, k0, k1, lo, k1 > k0 ? price(static_cast<double>(k1)) : lo, add);
}

// The table's efficiency at `rows_per_expert` (linear in log rows between its points, its end points
// outside them); `none` when it has no points.
double rows_efficiency(const std::vector<RowsEfficiencyPoint>& points, double rows_per_expert, double none) {
    if (points.empty()) return none;
    if (rows_per_expert <= points.front().rows_per_expert) return points.front().efficiency;
    if (rows_per_expert >= points.back().rows_per_expert) return points.back().efficiency;
    auto hi = std::lower_bound(points.begin(), points.end(), rows_per_expert,
                               [](const RowsEfficiencyPoint& p, double r) { return p.rows_per_expert < r; });
    auto lo = hi - 1;
    // Linear in log(rows): the bench's sizes, and so its points, are spaced geometrically.
    const double f =
        std::log(rows_per_expert / lo->rows_per_expert) / std::log(hi->rows_per_expert / lo->rows_per_expert);
    return lo->efficiency + f * (hi->efficiency - lo->efficiency);
}

}  // namespace

double effective_expert_tflops(const GpuSpec& gpu, MathRate rate, double rows_per_expert) {
    return peak_tflops(gpu, rate) * expert_matmul_efficiency(gpu, rows_per_expert);
}

double expert_memory_efficiency(const GpuSpec& gpu, double rows_per_expert) {
    return rows_efficiency(gpu.expert_memory_efficiency_by_rows.points, rows_per_expert,
                           gpu.memory_efficiency.value);
}

double expert_matmul_efficiency(const GpuSpec& gpu, double rows_per_expert) {
    // A GpuSpec built in code may leave the optional figure at 0: matmul_efficiency.
    const double flat = gpu.expert_matmul_efficiency.value > 0 ? gpu.expert_matmul_efficiency.value
                                                               : gpu.matmul_efficiency.value;
    return rows_efficiency(gpu.expert_matmul_efficiency_by_rows.points, rows_per_expert, flat);
}

double kernel_fixed_us(const GpuSpec& gpu, bool decode_graph) {
    return (decode_graph ? gpu.graph_kernel_us.value : gpu.eager_kernel_us.value) +
           gpu.kernel_latency_us.value;
}

StepBreakdown mixed_step(const CostInputs& in, int64_t decode_rows, int64_t prefill_rows,
                         double decode_context, double prefill_context, int64_t lm_rows) {
    std::vector<StepSequence> seqs;
    const double ctx = decode_context > 0 ? decode_context : static_cast<double>(in.context_tokens);
    for (int64_t i = 0; i < decode_rows; ++i) seqs.push_back({1, ctx, true});
    if (prefill_rows > 0) {
        const int64_t chunks = std::clamp<int64_t>(lm_rows - decode_rows, 1, prefill_rows);
        for (int64_t c = 0; c < chunks; ++c)
            seqs.push_back(
                {prefill_rows / chunks + (c < prefill_rows % chunks ? 1 : 0), prefill_context, false});
    }
    StageCost cost(in);
    return price_step(cost, in, layout_stages(*in.model, in.layout.pp),
                      split_micro_batches(in, seqs, in.layout.attn_dp));
}

ClosedLoopResult closed_loop_run(const CostInputs& in, int64_t concurrency) {
    ClosedLoopResult r;
    const int64_t G = ceil_div(concurrency, in.layout.attn_dp);
    const int64_t dp_groups = std::min<int64_t>(concurrency, in.layout.attn_dp);  // groups with requests
    const int64_t P = in.input_len, O = in.output_len, S = in.max_step_tokens;
    r.requests_per_group = G;
    if (G < 1 || P < 1 || O < 2 || S < 1) return r;
    StageCost cost(in);
    const std::vector<PipelineStage> stages = layout_stages(*in.model, in.layout.pp);
    std::vector<int64_t> prompt_done(static_cast<size_t>(G), 0), generated(static_cast<size_t>(G), 0);
    std::vector<double> first_us(static_cast<size_t>(G), -1.0), finish_us(static_cast<size_t>(G), -1.0);
    std::vector<StepSequence> seqs;
    // Requests are served in arrival order and an earlier one decodes whenever a later one does, so they
    // finish in order and prompts complete in order: [0, f) finished, [f, a) decoding (prompts done, the
    // first S of them decode in a step), [a, G) prompts still to prefill. A step costs O(its rows), not O(G).
    int64_t f = 0, a = 0;
    double now_us = 0.0;
    const auto at = [](int64_t i) { return static_cast<size_t>(i); };
    // The last run of prompt chunks alone (no request decoding): the next request's prompt often repeats it
    // (the same chunks at the same offsets), e.g. every prompt when decoders take the whole budget.
    struct PromptRun {
        int64_t done = -1, budget = 0, steps = 0;
        double us = 0.0;
        bool matches(int64_t d, int64_t b, int64_t n) const { return d == done && b == budget && n == steps; }
    } prompt_run;
    while (f < G) {
        // Every decoding request takes one token of the budget, in arrival order; prompt chunks the rest.
        const int64_t decode_end = std::min(a, f + S);
        const int64_t budget = S - (decode_end - f);
        // A run of steps alike until the next event: request f finishes (after O − generated steps), or
        // prompt a, taking the whole budget each step, has less than the budget left. Only the contexts
        // change along it (one more token per step for each decoder, the budget for the chunk); its events
        // happen at its last step. Without a chunk the run costs its length times its middle step: a decode
        // row's attention bytes and FLOPs are both proportional to its context, so the step is affine in
        // the contexts (plans agreed to 1e-14 with the steps priced one by one, which took seconds for a run
        // of 1000 steps of 1024 requests). A chunk's FLOPs and bytes are not proportional (its own rows
        // attend to each other), so the step may bend where one overtakes the other: add_affine_stretches.
        const int64_t to_finish = f < decode_end ? O - generated[at(f)] : std::numeric_limits<int64_t>::max();
        const bool chunk = a < G && budget > 0;
        const int64_t full_chunks =
            chunk ? (P - prompt_done[at(a)]) / budget : std::numeric_limits<int64_t>::max();
        const int64_t run = std::min(to_finish, full_chunks);
        if (run >= 1) {
            const auto step = [&](double k) {
                seqs.clear();
                for (int64_t i = f; i < decode_end; ++i)
                    seqs.push_back({1, static_cast<double>(P + generated[at(i)]) + k, true});
                if (chunk) {
                    seqs.push_back(
                        {budget, static_cast<double>(prompt_done[at(a)]) + k * budget + budget / 2.0, false});
                }
                return price_step(cost, in, stages, split_micro_batches(in, seqs, dp_groups));
            };
            const auto add = [&](const StepBreakdown& b, int64_t n) {
                now_us += static_cast<double>(n) * b.step_us;
            };
            if (chunk && decode_end == f && prompt_run.matches(prompt_done[at(a)], budget, run)) {
                now_us += prompt_run.us;
            } else if (chunk) {
                const double before_us = now_us;
                add_affine_stretches(step, 0, run - 1, add);
                if (decode_end == f) prompt_run = {prompt_done[at(a)], budget, run, now_us - before_us};
            } else {
                add(step((run - 1) / 2.0), run);
            }
            r.steps += run;
            if (chunk) r.mixed_steps += run;
            for (int64_t i = f; i < decode_end; ++i) generated[at(i)] += run;
            for (; f < decode_end && generated[at(f)] == O; ++f) finish_us[at(f)] = now_us;
            if (chunk) {
                prompt_done[at(a)] += run * budget;
                if (prompt_done[at(a)] == P) {  // its last chunk: the first token
                    first_us[at(a)] = now_us;
                    generated[at(a)] = 1;
                    ++a;
                }
            }
            continue;
        }
        // One step: prompt a's last chunk and chunks of the prompts after it.
        seqs.clear();
        for (int64_t i = f; i < decode_end; ++i)
            seqs.push_back({1, static_cast<double>(P + generated[at(i)]), true});
        int64_t left = budget;
        int64_t prompt_end = a;  // prompts [a, prompt_end) get a chunk this step
        for (; prompt_end < G && left > 0; ++prompt_end) {
            const int64_t n = std::min(P - prompt_done[at(prompt_end)], left);
            seqs.push_back({n, static_cast<double>(prompt_done[at(prompt_end)]) + n / 2.0, false});
            prompt_done[at(prompt_end)] += n;
            left -= n;
        }
        now_us += price_step(cost, in, stages, split_micro_batches(in, seqs, dp_groups)).step_us;
        ++r.steps;
        ++r.mixed_steps;
        for (int64_t i = f; i < decode_end; ++i) {
            if (++generated[at(i)] == O) finish_us[at(i)] = now_us;
        }
        while (f < decode_end && finish_us[at(f)] >= 0) ++f;
        for (; a < prompt_end && prompt_done[at(a)] == P; ++a) {  // completed prompts: their first token
            first_us[at(a)] = now_us;
            generated[at(a)] = 1;
        }
    }
    std::vector<double> tpot_us, ttft_us;
    for (size_t u = 0; u < static_cast<size_t>(G); ++u) {
        tpot_us.push_back((finish_us[u] - first_us[u]) / static_cast<double>(O - 1));
        ttft_us.push_back(first_us[u]);
    }
    r.duration_ms = now_us / 1e3;
    r.tpot_ms = median(tpot_us) / 1e3;
    r.ttft_ms = median(ttft_us) / 1e3;
    r.tokens_per_s = now_us > 0 ? static_cast<double>(concurrency * O) / now_us * 1e6 : 0.0;
    return r;
}

DecodeResult decode_step(const CostInputs& in, int64_t concurrency, int64_t kv_tokens_per_rank) {
    DecodeResult result;
    result.concurrency = concurrency;
    const ParallelLayout& l = in.layout;
    const int64_t G = ceil_div(concurrency, l.attn_dp);
    result.kv_tokens_needed_per_rank = G * in.context_tokens;
    result.kv_fits = result.kv_tokens_needed_per_rank <= kv_tokens_per_rank;
    // A step decodes at most max_step_tokens requests per attention-DP group (one token of the budget each,
    // engine/scheduler.cc); with more, each request waits ⌈G / rows⌉ steps for its next token.
    const int64_t rows = in.max_step_tokens > 0 ? std::min(G, in.max_step_tokens) : G;
    const int64_t rounds = ceil_div(G, rows);
    const std::vector<StepSequence> seqs(static_cast<size_t>(rows),
                                         StepSequence{1, static_cast<double>(in.context_tokens), true});
    StageCost cost(in);
    result.step = price_step(cost, in, layout_stages(*in.model, l.pp),
                             split_micro_batches(in, seqs, std::min<int64_t>(concurrency, l.attn_dp)));
    result.decode_step_ms = result.step.step_us / 1e3;
    result.tpot_ms = result.decode_step_ms * static_cast<double>(rounds);
    result.tokens_per_s =
        result.step.step_us > 0
            ? static_cast<double>(concurrency) / (result.step.step_us * static_cast<double>(rounds)) * 1e6
            : 0.0;
    if (in.output_len > 0) {
        result.has_closed_loop = true;
        result.closed_loop = closed_loop_run(in, concurrency);
        result.tpot_ms = result.closed_loop.tpot_ms;
        result.tokens_per_s = result.closed_loop.tokens_per_s;
    }
    return result;
}

PrefillResult prefill_step(const CostInputs& in, int64_t input_len) {
    PrefillResult result;
    result.input_len = input_len;
    // One prompt is one sequence, so each step is one micro-batch through the stages one after another; the
    // engine runs it in chunks of at most max_step_tokens (engine/scheduler.cc), one step each, every chunk
    // attending over itself and the chunks before it.
    const int64_t S = std::max<int64_t>(1, in.max_step_tokens);
    StageCost cost(in);
    const std::vector<PipelineStage> stages = layout_stages(*in.model, in.layout.pp);
    // Chunk k of `tokens` tokens at offset k·S.
    const auto chunk = [&](int64_t tokens) {
        return [&, tokens](double k) {
            const std::vector<StepSequence> seqs{{tokens, k * static_cast<double>(S) + tokens / 2.0, false}};
            return price_step(cost, in, stages, split_micro_batches(in, seqs, in.layout.attn_dp));
        };
    };
    const int64_t full = input_len / S, rest = input_len % S;  // chunks of S tokens, then one of `rest`
    result.chunks = full + (rest > 0 ? 1 : 0);
    const auto add = [&](const StepBreakdown& b, int64_t count) { add_steps(result.step, b, count); };
    if (full > 0) {
        result.step = chunk(S)(0.0);  // the first chunk's token and expert fields
        if (full > 1) add_affine_stretches(chunk(S), 1, full - 1, add);
    }
    if (rest > 0) {
        const StepBreakdown last = chunk(rest)(static_cast<double>(full));
        if (full == 0) {
            result.step = last;
        } else {
            add_steps(result.step, last, 1);
        }
    }
    result.ttft_ms = result.step.step_us / 1e3;
    result.tokens_per_s = result.step.step_us > 0
                              ? static_cast<double>(input_len) * in.layout.attn_dp / result.step.step_us * 1e6
                              : 0.0;
    return result;
}

}  // namespace epinfer::planner
