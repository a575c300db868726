// The cost model: pure functions from (model, layout, hardware) to time breakdowns (STYLE.md R19).
//
// Formulas, each pinned by tests/unit/planner/ to a hand calculation (docs/planner.md derives them):
//   distinct experts touched by T tokens, uniform routing     E·(1 − (1 − K/E)^T)
//   EP ranks a token's K experts land on, contiguous blocks   Σ_r (1 − C(E − n_r, K)/C(E, K))
//                                                             = R·(1 − C(E − E/R, K)/C(E, K)) when R | E
//   collective (nccl-tests busbw convention)                  latency + size · f(n) / busbw,
//       f = 2(n−1)/n all_reduce, (n−1)/n all_gather and all_to_all, 1 send_recv; a measured table replaces
//       it at the group size it was measured at
//   roofline of one op: max(bytes / (BW · mem_eff), FLOPs / (rate · mm_eff)); the routed experts' bytes
//       at BW · expert_memory_efficiency(rows per touched expert) and their FLOPs at rate ·
//       expert_matmul_efficiency(rows per touched expert) (the profile's tables by rows, when it has them);
//       attention scores as two rooflines, decode rows (their context's KV) and prompt rows (their chunk's KV
//       once), FLOPs at attention_tflops
//   pipeline as the engine runs it (engine_facts.h): micro-batch j leaves stage s at
//       done(s, j) = max(arrival(s, j), free(s)) + t(s, j), then the send of c(s, j) starts when stage s + 1
//       is done with j − 1 (its stream reaches the receive) and holds both GPUs; step = the last stage's
//       end, then the output broadcast. One micro-batch: Σ t + Σ c, the stages one after another (pp2 at
//       C = 1 takes the whole model's time, not half); two stages of t with sends c ≤ t: (m + 1)·t + m·c
//       (pp2, m = 2: 3t + 2c); a middle stage receives, computes and sends each micro-batch in turn (t + 2c
//       per micro-batch)
//   activations: the bytes engine_facts.h counts per token (and per routed pair) at the memory roofline
//   kernels: the engine's kernels (engine_facts.h), each kernel_latency_us + graph_kernel_us when the
//       micro-batch replays a decode CUDA graph (one rank, decode only, ≤ 256 rows), else + eager_kernel_us
//       (launched one by one). H200 (profiles/measured/h200_epinfer_2026-11-29.json): 0.5 vs 2.0 µs, the
//       eager figure fitted to --no-decode-graphs runs (docs/benchmarks/planner.md)
//   host round trips: under DP attention each MoE layer plans its dispatch on the host, 9 synchronous
//       device↔host copies and MPI exchanges on a rank with tokens (engine_facts.h
//       kEngineDpMoeHostRoundTrips), each gpu.host_round_trip_us + gpu.host_round_trip_us_per_row × the
//       rank's rows with the GPU idle; its 2·moe_ep gathers and adds are kernels as above
//   collectives: every NCCL call returns once queued on the stream (engine_facts.h), so the GPU runs it
//       between the kernels around it with no host round trip: it costs its measured time (above; `bench
//       comm` times ops queued back to back, docs/benchmarks/planner.md "4× H200") and nothing more; it is
//       not counted as a kernel (its measured time includes its kernel)
// Routed experts run at the pace of the busiest EP rank: it reads E[max] touched local experts (binomial
// above) and computes μ + σ·E[max of moe_ep normals] token-expert pairs, μ = T·K·n/E, σ² = μ·(1 − n/E).
// One decode step of C requests in flight (never divided by pp: ARCHITECTURE.md §5) runs its sequences as
// m = min(pp, sequences) micro-batches split by count (--micro-batches overrides pp); each stage's time per
// micro-batch is the sum over its layers of attention, expert GEMMs, dense parts, activation traffic,
// collectives, kernels and host round trips, with no overlap between them. A closed-loop run
// (closed_loop_run) replays the engine's scheduler over such steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "planner/engine_facts.h"
#include "planner/hardware_profile.h"
#include "planner/model_costs.h"
#include "planner/weight_format.h"

namespace epinfer::planner {

// The median of `values`: the middle one, the mean of the two middle ones for an even count; 0 for none.
double median(std::vector<double> values);

// Expected number of distinct experts T tokens select, each picking K of E uniformly without repetition.
double expected_distinct_experts(int64_t num_experts, int64_t top_k, double tokens);

// Expected number of distinct EP ranks that own at least one of a token's K experts, E experts placed in
// contiguous blocks over `ranks` ranks (sizes differ by at most one), uniform routing.
double expected_destination_ranks(int64_t num_experts, int64_t top_k, int ranks);

// E[max of `samples` independent Binomial(trials, p)] = Σ_{k≥1} (1 − F(k−1)^samples), F the binomial CDF.
// The busiest of R EP ranks: each of its n local experts is touched with p = 1 − (1 − K/E)^T, taken as
// independent across experts and ranks (an approximation: the K picks of a token are not independent).
double expected_max_binomial(int64_t trials, double p, int samples);

// E[max of `samples` independent standard normals] (0 for one sample), by numerical integration.
double expected_max_standard_normal(int samples);

// nccl-tests bus-bandwidth factor f(n) of a collective over n ranks (0 when n = 1).
double collective_bus_factor(Collective collective, int ranks);

// Time of one collective of nccl-tests size `size_bytes` over `ranks` ranks: 0 when ranks ≤ 1; the table,
// linearly interpolated, when it was measured at this group size (below its first size: the first time;
// above its last: the last time plus the extra bytes at bus bandwidth); else latency + size·f(n)/busbw.
double collective_time_us(const CollectiveSpec& spec, Collective collective, double size_bytes, int ranks);

struct Roofline {
    double bytes = 0.0;
    double flops = 0.0;
    double memory_us = 0.0;
    double compute_us = 0.0;
    double time_us() const { return memory_us > compute_us ? memory_us : compute_us; }
    bool memory_bound() const { return memory_us >= compute_us; }
};
// `bandwidth_gbps` in GB/s and `tflops` in TFLOP/s, both already effective (× efficiency).
Roofline roofline(double bytes, double flops, double bandwidth_gbps, double tflops);

// Achievable rates of `gpu`: bandwidth × memory_efficiency; the rate of `rate` × matmul_efficiency (or
// × expert_matmul_efficiency(rows_per_expert) for the routed experts' grouped GEMMs), falling back to bf16
// when the GPU lacks fp8/fp4 tensor cores.
double effective_bandwidth_gbps(const GpuSpec& gpu);
double effective_tflops(const GpuSpec& gpu, MathRate rate);
double effective_expert_tflops(const GpuSpec& gpu, MathRate rate, double rows_per_expert);
// The bf16 TFLOP/s of attention scores over the KV cache (score_flops_per_ctx): MLA's latent kernel, decode
// rows and prompt chunks alike, at gpu.latent_attention_matmul_efficiency; GQA prompt chunks at
// gpu.prefill_attention_matmul_efficiency; GQA decode rows (bound by their KV bytes) at matmul_efficiency.
// A figure of 0 (a GpuSpec built in code) falls back to matmul_efficiency.
double attention_tflops(const GpuSpec& gpu, bool mla, bool prompt_rows);

// The fraction of memory_bandwidth_gbps the routed experts' weights stream at when each touched expert
// computes `rows_per_expert` rows (token-expert pairs): gpu.expert_memory_efficiency_by_rows interpolated
// between its points linearly in log(rows), its first point's efficiency below them and its last's above;
// gpu.memory_efficiency when the table has no points. Example, points (1, 0.4), (4, 0.8): 2 rows → 0.6;
// 0.5 rows → 0.4; 64 rows → 0.8.
double expert_memory_efficiency(const GpuSpec& gpu, double rows_per_expert);
// The fraction of the tensor-core rate the routed experts' grouped GEMMs reach when each touched expert
// computes `rows_per_expert` rows: gpu.expert_matmul_efficiency_by_rows as above (interpolated in
// log(rows), clamped at its ends); gpu.expert_matmul_efficiency when the table has no points
// (matmul_efficiency when that is 0: a GpuSpec built in code). One H200 (h200_epinfer_2026-12-01.json):
// 0.203 at 64 rows, 0.384 at 256, 0.422 at 1024; 128 rows → 0.293.
double expert_matmul_efficiency(const GpuSpec& gpu, double rows_per_expert);

// Fixed time of one kernel of a step: kernel_latency_us + graph_kernel_us when it runs inside a decode
// CUDA graph, else + eager_kernel_us (engine_facts.h engine_uses_decode_graph says which).
double kernel_fixed_us(const GpuSpec& gpu, bool decode_graph);

struct PipelineTiming {
    int micro_batches = 1;
    double path_us = 0.0;        // micro-batch 0 through every stage, its sends included
    double bottleneck_us = 0.0;  // max over stages of Σ_j t(s, j): the busiest stage's compute
    double step_us = 0.0;        // the schedule's end (cost_model.h, top)
    double wait_us = 0.0;        // step − path: micro-batch 0's path is not the whole step
    double bubble_us = 0.0;      // step − bottleneck: idle (or sending) time of the busiest stage
};
// The engine's schedule of `stage_us[s][j]` (stage s, micro-batch j, compute) and `send_us[s][j]` (its
// send to stage s + 1; the last stage's entries are ignored).
PipelineTiming pipeline_timing(const std::vector<std::vector<double>>& stage_us,
                               const std::vector<std::vector<double>>& send_us);
// The same for `micro_batches` equal micro-batches, stage s taking stage_us[s] and each send send_us.
PipelineTiming pipeline_timing(const std::vector<double>& stage_us, int micro_batches, double send_us = 0.0);

// One kind of collective along a step's path, e.g. 122 all-reduces of 14 KiB over 8 ranks.
struct CollectiveTerm {
    // "attention all_reduce", "MoE all_reduce", "MLP all_reduce", "shared-expert all_reduce", "dispatch",
    // "combine", "stage send", "output broadcast".
    std::string what;
    Collective kind = Collective::kAllReduce;
    int ranks = 1;
    bool inter_node = false;
    double size_bytes = 0.0;  // nccl-tests size of one call (all_to_all: per-rank remote bytes · n/(n−1))
    int64_t calls = 0;        // along the path of one micro-batch
    double us_per_call = 0.0;  // the link's time (collective_time_us)
    double total_us() const { return static_cast<double>(calls) * us_per_call; }
};

// Time of one step along the path of one micro-batch through every stage, by part.
struct StepBreakdown {
    int64_t tokens = 0;                // tokens of micro-batch 0 (all attention-DP ranks of a stage)
    int64_t tokens_per_attn_rank = 0;  // ⌈tokens / attn_dp⌉
    int micro_batches = 1;
    bool decode_graph = false;  // micro-batch 0 replays a decode CUDA graph (engine_facts.h)
    double attention_us = 0.0;
    double experts_us = 0.0;      // routed-expert GEMMs
    double dense_us = 0.0;        // dense MLPs, shared experts, routers, LM head
    double activations_us = 0.0;  // activation reads and writes of the engine's kernels (engine_facts.h)
    int64_t kernels = 0;          // the engine's kernels along the path of micro-batch 0
    double launch_us = 0.0;       // kernels × kernel_fixed_us
    int64_t host_round_trips = 0;  // the engine's host round trips along the path (DP attention's MoE)
    double host_us = 0.0;          // host_round_trips × gpu.host_round_trip_us
    std::vector<CollectiveTerm> collectives;
    double path_us = 0.0;           // sum of the above: micro-batch 0 through every stage
    double pipeline_wait_us = 0.0;  // step − path: the other micro-batches
    double bubble_us = 0.0;         // idle (or sending) time of the busiest stage per step
    double step_us = 0.0;
    // Routed experts, per MoE layer on the busiest rank.
    int64_t moe_layers = 0;
    int64_t local_experts = 0;
    double experts_touched_per_rank = 0.0;  // on the busiest EP rank (expected maximum)
    double expert_bytes_per_layer = 0.0;
    double tokens_per_touched_expert = 0.0;
    double experts_memory_efficiency = 0.0;  // expert_memory_efficiency at tokens_per_touched_expert
    bool experts_memory_bound = false;

    double collectives_us() const;
};

// A closed-loop run as `epinfer bench` drives it: C requests of input_len prompt tokens queued at t = 0,
// all admitted (max_running = C); each step the engine's scheduler (engine/scheduler.cc) gives every
// decoding request one token and fills the rest of max_step_tokens per attention-DP group with prompt
// chunks in arrival order; a prompt's last chunk yields its first token, output_len − 1 decode steps
// follow. Each step is priced by mixed_step; decode rows attend over their true context (prompt + tokens
// so far), a chunk's rows over its offset + half its length.
struct ClosedLoopResult {
    int64_t requests_per_group = 0;  // ⌈C / attn_dp⌉, the busiest attention-DP group, simulated
    int64_t steps = 0;
    int64_t mixed_steps = 0;  // steps that carried prompt tokens
    double duration_ms = 0.0;
    double tpot_ms = 0.0;       // median request: (finish − first token) / (output_len − 1)
    double ttft_ms = 0.0;       // median request: first token − 0
    double tokens_per_s = 0.0;  // C · output_len / duration, the whole layout
};

struct DecodeResult {
    int64_t concurrency = 0;
    bool kv_fits = false;  // ⌈C / attn_dp⌉ · context ≤ KV tokens per rank
    int64_t kv_tokens_needed_per_rank = 0;
    // One decode step: min(⌈C / attn_dp⌉, max_step_tokens) requests per attention-DP rank over context_tokens
    // each; with more requests than that, TPOT is ⌈⌈C / attn_dp⌉ / max_step_tokens⌉ such steps.
    StepBreakdown step;
    double decode_step_ms = 0.0;   // step.step_us / 1e3
    bool has_closed_loop = false;  // CostInputs::output_len > 0
    ClosedLoopResult closed_loop;
    // Headline figures: the closed loop's when run, else the decode step's (TPOT = the steps a request
    // waits per token, C / TPOT).
    double tokens_per_s = 0.0;  // output tokens/s of the whole layout
    double tpot_ms = 0.0;
};

struct PrefillResult {
    int64_t input_len = 0;
    int64_t chunks = 0;  // steps of at most max_step_tokens prompt tokens
    // One prompt per attention-DP rank: its chunks' times, counts and collectives summed (step_us = TTFT
    // on an idle system); tokens, micro-batches and the expert figures are the first chunk's.
    StepBreakdown step;
    double ttft_ms = 0.0;
    double tokens_per_s = 0.0;  // prompt tokens/s of the whole layout, one prompt per step
};

struct CostInputs {
    const ModelCosts* model = nullptr;
    const HardwareProfile* hardware = nullptr;
    ParallelLayout layout;
    int nodes = 1;  // the layout's ranks split evenly over this many nodes, rank-major
    WeightFormats weights;
    int kv_bytes_per_element = kEngineKvBytesPerElement;
    int activation_bytes_per_element = kEngineActivationBytesPerElement;  // in memory and on the wire
    int64_t context_tokens = 4096;  // KV tokens each decoding request attends over
    int micro_batches = 0;          // 0 = pp (what the engine runs); at most the step's sequences
    // Closed loop (decode_step): 0 = off; else C requests of input_len prompt tokens produce output_len
    // tokens each, in steps of at most max_step_tokens tokens per attention-DP group.
    int64_t input_len = 0;
    int64_t output_len = 0;
    int64_t max_step_tokens = kEngineMaxStepTokens;
};

// One forward of `decode_rows` decode rows (per attention-DP rank, context_tokens of KV each, or
// `decode_context` when > 0) and `prefill_rows` prompt rows per rank attending over `prefill_context`
// tokens on average, in lm_rows − decode_rows prompt chunks (at least 1 when prefill_rows > 0) of equal
// size after the decode rows, split into micro-batches as the engine does. Requires a validated layout and
// decode_rows + prefill_rows ≥ 1.
StepBreakdown mixed_step(const CostInputs& inputs, int64_t decode_rows, int64_t prefill_rows,
                         double decode_context, double prefill_context, int64_t lm_rows);

// One decode step with `concurrency` requests in flight; `kv_tokens_per_rank` from plan_memory; and the
// closed-loop run when inputs.output_len > 0 (needs input_len ≥ 1, output_len ≥ 2, max_step_tokens ≥ 1).
// Requires a validated layout, concurrency ≥ 1 and hardware->inter_node when nodes > 1.
DecodeResult decode_step(const CostInputs& inputs, int64_t concurrency, int64_t kv_tokens_per_rank);

// The closed loop described at ClosedLoopResult, `concurrency` requests over the whole layout.
ClosedLoopResult closed_loop_run(const CostInputs& inputs, int64_t concurrency);

// Prefill of one prompt of `input_len` tokens per attention-DP rank as the engine runs it on an idle
// system: chunks of at most inputs.max_step_tokens tokens, one step each, each one sequence, so one
// micro-batch through the stages one after another (the engine splits a step by sequences); chunk c of n
// rows after `done` tokens attends over done + n/2 on average.
PrefillResult prefill_step(const CostInputs& inputs, int64_t input_len);

}  // namespace epinfer::planner
