// epinfer bench ep: expert-parallel dispatch and combine across ranks as the engine runs them under DP
// attention on GPUs (layers/moe/ep_device.h: the bookkeeping on the host over MPI, the rows over NCCL on the
// backend's stream), against one NCCL all_to_all_v moving the same rows (the transport's floor).
// Per tokens-per-rank T: every rank routes T random tokens (K distinct of E experts, uniform, seeded by
// rank), x [T, H] fp32 random; a timed iteration is barrier → dispatch → synchronize (dispatch time) →
// combine of the received rows themselves (identity experts) → synchronize (combine time); each time is the
// slowest rank's; medians over --iters. The a2a column times all_to_all_v of the dispatch's own counts in
// the wire dtype (the same bytes). --wire-dtype: fp32 (default, the engine's activations) or bf16 (rows
// rounded to nearest even before each all_to_all_v, summed in fp32 at home: DeepEP's scheme). The check:
// the combined rows must equal x — bf16(x) with a bf16 wire (the dispatch rounds x; rounding those bf16
// values again in the combine is exact) — times the number of EP ranks that own the token's experts,
// summed in fp32 in EP-rank order (bit for bit).
//   epinfer bench ep --ranks 2 --device cuda                        # T = 128 and 4096, DeepSeek-V3 shape
//   epinfer bench ep --ranks 2 --device cuda --wire-dtype bf16      # the same, bf16 rows on the wire
//   epinfer bench ep --ranks 4 --tokens 64 --hidden 512 --experts 16 --top-k 2   # CPU ranks over MPI
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "comma_list.h"
#include "commands.h"
#include "core/env.h"
#include "layers/moe/ep_device.h"
#include "model_setup.h"
#include "mpi_launch.h"

namespace epinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchEpOptions {
    int ranks = 0;                    // 0: the world's size
    std::string tokens = "128,4096";  // --tokens as given, parsed by parse_token_counts
    int64_t hidden = 7168;            // DeepSeek-V3 / Kimi K2
    int64_t experts = 256;
    int64_t top_k = 8;
    int iters = 20;
    int warmup_iters = 3;
    std::string device = "cpu";
    std::string wire_dtype = "fp32";  // --wire-dtype as given: fp32 or bf16
};

// --wire-dtype: fp32 → F32, bf16 → BF16. Errors: one line naming the value.
Result<DType> parse_wire_dtype(const std::string& text) {
    if (text == "fp32") return DType::kF32;
    if (text == "bf16") return DType::kBF16;
    return invalid_argument(fmt::format("bench ep: --wire-dtype '{}' (want fp32 or bf16)", text));
}

struct EpRow {
    int64_t tokens = 0;
    double rows_sent = 0.0;  // per rank, mean
    double dispatch_us = 0.0, combine_us = 0.0, a2a_us = 0.0;
    int64_t wrong = 0;  // elements that differ, over ranks
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// The slowest rank's seconds since `start`.
Result<double> slowest(Communicator& world, Clock::time_point start) {
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    EPI_RETURN_IF_ERROR(world.all_reduce(&s, &s, 1, DType::kF64, ReduceOp::kMax));
    return s;
}

Result<EpRow> bench_tokens(Communicator& world, Communicator& ep, Backend& backend,
                           const ExpertPlacement& placement, int64_t T, DType wire, const BenchEpOptions& o) {
    const int64_t H = o.hidden, K = o.top_k;
    std::mt19937 rng(static_cast<uint32_t>(1000 + world.rank()));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(T * H));
    for (float& v : x) v = u(rng);
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::vector<float> weights(static_cast<size_t>(T * K), 0.5f);
    std::vector<int32_t> order(static_cast<size_t>(o.experts));
    for (int64_t t = 0; t < T; ++t) {
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        std::copy(order.begin(), order.begin() + K, ids.begin() + t * K);
    }
    EPI_ASSIGN_OR_RETURN(DeviceBuffer x_dev, DeviceBuffer::alloc_f32(backend, T * H));
    EPI_RETURN_IF_ERROR(backend.copy_to_device(x_dev.data(), x.data(), x.size() * sizeof(float)));
    EPI_ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::alloc_f32(backend, T * H));
    EpDeviceDispatchArgs args;
    args.x = x_dev.f32();
    args.num_rows = T;
    args.hidden = H;
    args.num_tokens = T;
    args.topk_ids = ids.data();
    args.topk_weights = weights.data();
    args.top_k = K;
    args.wire_dtype = wire;

    EpRow row;
    row.tokens = T;
    std::vector<double> dispatch_s, combine_s, a2a_s;
    EpDeviceDispatch last;
    for (int it = 0; it < o.warmup_iters + o.iters; ++it) {
        EPI_RETURN_IF_ERROR(world.barrier());
        Clock::time_point start = Clock::now();
        EPI_ASSIGN_OR_RETURN(EpDeviceDispatch d, ep_dispatch_device(backend, world, ep, placement, args));
        EPI_RETURN_IF_ERROR(backend.synchronize());
        EPI_ASSIGN_OR_RETURN(const double t_dispatch, slowest(world, start));
        EPI_RETURN_IF_ERROR(world.barrier());
        start = Clock::now();
        EpDeviceCombineArgs combine;
        combine.dispatch = &d;
        combine.partial = d.rows.f32();
        combine.hidden = H;
        combine.out = out.f32();
        combine.wire_dtype = wire;
        EPI_RETURN_IF_ERROR(ep_combine_device(backend, ep, combine));
        EPI_RETURN_IF_ERROR(backend.synchronize());
        EPI_ASSIGN_OR_RETURN(const double t_combine, slowest(world, start));
        // The transport alone: the dispatch's rows in the wire dtype, one all_to_all_v (into d.rows, [R, H]
        // fp32, large enough for either dtype).
        const EpDispatchHandle& h = d.plan.handle;
        std::vector<int64_t> sc(h.send_counts), sd(h.send_displs), rc(h.recv_counts), rd(h.recv_displs);
        for (auto* v : {&sc, &sd, &rc, &rd})
            for (int64_t& e : *v) e *= H;
        const size_t send_elems = static_cast<size_t>(std::max<int64_t>(1, sd.back() + sc.back()));
        EPI_ASSIGN_OR_RETURN(DeviceBuffer send, DeviceBuffer::alloc(backend, send_elems * dtype_size(wire)));
        EPI_RETURN_IF_ERROR(backend.synchronize());
        EPI_RETURN_IF_ERROR(world.barrier());
        start = Clock::now();
        EPI_RETURN_IF_ERROR(ep.all_to_all_v({send.data(), sc, sd, d.rows.data(), rc, rd, wire}));
        EPI_RETURN_IF_ERROR(backend.synchronize());
        EPI_ASSIGN_OR_RETURN(const double t_a2a, slowest(world, start));
        if (it >= o.warmup_iters) {
            dispatch_s.push_back(t_dispatch);
            combine_s.push_back(t_combine);
            a2a_s.push_back(t_a2a);
        }
        if (it + 1 == o.warmup_iters + o.iters) last = std::move(d);
    }
    row.dispatch_us = 1e6 * median(dispatch_s);
    row.combine_us = 1e6 * median(combine_s);
    row.a2a_us = 1e6 * median(a2a_s);
    double sent = static_cast<double>(last.plan.handle.token_of_send.size());
    EPI_RETURN_IF_ERROR(world.all_reduce(&sent, &sent, 1, DType::kF64, ReduceOp::kSum));
    row.rows_sent = sent / world.size();

    // Check: the last combine of identity partials = x (bf16(x) with a bf16 wire) summed once per owning EP
    // rank, in rank order.
    if (wire == DType::kBF16)
        for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
    std::vector<float> got(x.size());
    EPI_RETURN_IF_ERROR(backend.copy_to_host(got.data(), out.data(), got.size() * sizeof(float)));
    for (int64_t t = 0; t < T; ++t) {
        std::vector<bool> owner(static_cast<size_t>(ep.size()), false);
        for (int64_t k = 0; k < K; ++k)
            owner[static_cast<size_t>(placement.primary(ids[static_cast<size_t>(t * K + k)]).ep_rank)] = true;
        for (int64_t h = 0; h < H; ++h) {
            float want = 0.0f;
            for (const bool o_d : owner)
                if (o_d) want += x[static_cast<size_t>(t * H + h)];
            if (got[static_cast<size_t>(t * H + h)] != want) ++row.wrong;
        }
    }
    EPI_RETURN_IF_ERROR(world.all_reduce(&row.wrong, &row.wrong, 1, DType::kI64, ReduceOp::kSum));
    return row;
}

constexpr int64_t kMaxHidden = 65536, kMaxExperts = 65536, kMaxTokens = int64_t{1} << 20;
constexpr int64_t kMaxRowElements = int64_t{1} << 31;  // tokens × hidden per rank (8 GiB of fp32)

Status outside(const char* flag, int64_t v, int64_t lo, int64_t hi) {
    return invalid_argument(fmt::format("bench ep: {} {} is outside [{}, {}]", flag, v, lo, hi));
}

// --tokens: comma-separated integers in [1, kMaxTokens] (0 tokens time only the bookkeeping, against an
// empty all_to_all_v: a ratio of nothing). Errors: one line naming the value and the item.
Result<std::vector<int64_t>> parse_token_counts(const std::string& text) {
    EPI_ASSIGN_OR_RETURN(std::vector<int64_t> counts, parse_comma_ints({text}, "bench ep", "--tokens"));
    for (int64_t value : counts) {
        if (value < 1 || value > kMaxTokens) return outside("--tokens", value, 1, kMaxTokens);
    }
    return counts;
}

// Every flag, before any rank starts: one line naming the flag and its bound.
Status check_options(const BenchEpOptions& o, const std::vector<int64_t>& token_counts) {
    if (o.hidden < 1 || o.hidden > kMaxHidden) return outside("--hidden", o.hidden, 1, kMaxHidden);
    if (o.experts < 1 || o.experts > kMaxExperts) return outside("--experts", o.experts, 1, kMaxExperts);
    if (o.top_k < 1 || o.top_k > o.experts) return outside("--top-k", o.top_k, 1, o.experts);
    if (o.iters < 1) return outside("--iters", o.iters, 1, 1 << 20);
    if (o.warmup_iters < 0) return outside("--warmup-iters", o.warmup_iters, 0, 1 << 20);
    if (o.ranks > o.experts)
        return invalid_argument(fmt::format(
            "bench ep: --ranks {} exceeds --experts {} (every rank holds one)", o.ranks, o.experts));
    // CPU ranks share this host's memory: x and out [T, H], and about min(K, ranks) rows per token each
    // sent, received and returned, fp32, on every rank.
    const int64_t ranks = std::max(o.ranks, 1);
    const double host_bytes =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    for (const int64_t t : token_counts) {
        if (t * o.hidden > kMaxRowElements)
            return invalid_argument(
                fmt::format("bench ep: --tokens {} × --hidden {} exceeds {} elements per rank", t, o.hidden,
                            kMaxRowElements));
        const double need = 4.0 * static_cast<double>(t) * static_cast<double>(o.hidden) *
                            (2.0 + 3.0 * static_cast<double>(std::min<int64_t>(o.top_k, ranks))) *
                            static_cast<double>(ranks);
        if (o.device == "cpu" && host_bytes > 0 && need > 0.8 * host_bytes) {
            return invalid_argument(
                fmt::format("bench ep: --tokens {} × --hidden {} on {} CPU rank(s) needs about {:.1f} GiB of "
                            "host memory, more "
                            "than 80 % of this machine's {:.1f} GiB",
                            t, o.hidden, ranks, need / (1 << 30), host_bytes / (1 << 30)));
        }
    }
    return require_device_built(o.device);
}

Status run_bench_ep(const BenchEpOptions& o) {
    EPI_ASSIGN_OR_RETURN(const std::vector<int64_t> token_counts, parse_token_counts(o.tokens));
    EPI_ASSIGN_OR_RETURN(const DType wire, parse_wire_dtype(o.wire_dtype));
    EPI_RETURN_IF_ERROR(check_options(o, token_counts));
    EPI_RETURN_IF_ERROR(env_comm_timeout_s().status());
    EPI_RETURN_IF_ERROR(relaunch_under_mpirun_if_needed(o.ranks));
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, create_world_communicator());
    if (o.ranks > 0 && world->size() != o.ranks)
        return invalid_argument(
            fmt::format("--ranks {}, but the MPI world has {} ranks", o.ranks, world->size()));
    if (world->size() > o.experts)
        return invalid_argument(
            fmt::format("bench ep: {} ranks but only --experts {}", world->size(), o.experts));
    EPI_ASSIGN_OR_RETURN(const ExpertPlacement placement,
                         ExpertPlacement::contiguous(o.experts, world->size()));
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Communicator> nccl;
    if (o.device == "cuda") {
        EPI_ASSIGN_OR_RETURN(GpuRank gpu, make_gpu_rank(*world));
        backend = std::move(gpu.backend);
        nccl = std::move(gpu.nccl);
    } else {
        backend = make_cpu_backend(1);
    }
    Communicator& ep = nccl != nullptr ? *nccl : *world;
    std::vector<EpRow> rows;
    for (const int64_t T : token_counts) {
        EPI_ASSIGN_OR_RETURN(EpRow row, bench_tokens(*world, ep, *backend, placement, T, wire, o));
        rows.push_back(row);
    }
    int64_t wrong = 0;
    if (world->rank() == 0) {
        std::printf(
            "# epinfer bench ep: %d rank(s), rows over %s, bookkeeping over MPI; H %lld, wire %s (%zu bytes "
            "per element, %lld bytes per row), E %lld, top-%lld uniform; median of %d iterations (the "
            "slowest rank's)\n",
            world->size(), ep.backend_name(), static_cast<long long>(o.hidden), o.wire_dtype.c_str(),
            dtype_size(wire), static_cast<long long>(o.hidden * static_cast<int64_t>(dtype_size(wire))),
            static_cast<long long>(o.experts), static_cast<long long>(o.top_k), o.iters);
        std::printf("%10s %12s %10s %12s %12s %12s %14s %6s\n", "tokens", "rows_sent", "MB_sent",
                    "dispatch_us", "combine_us", "a2a_us", "dispatch/a2a", "check");
        for (const EpRow& r : rows) {
            const double mb =
                r.rows_sent * static_cast<double>(o.hidden) * static_cast<double>(dtype_size(wire)) / 1e6;
            std::printf("%10lld %12.1f %10.2f %12.1f %12.1f %12.1f %14.2f %6s\n",
                        static_cast<long long>(r.tokens), r.rows_sent, mb, r.dispatch_us, r.combine_us,
                        r.a2a_us, r.a2a_us > 0 ? r.dispatch_us / r.a2a_us : 0.0,
                        r.wrong == 0 ? "ok" : "FAIL");
        }
        std::fflush(stdout);
    }
    for (const EpRow& r : rows) wrong += r.wrong;
    if (wrong > 0)
        return internal_error(
            fmt::format("bench ep: {} combined elements differ from the expected sums", wrong));
    return Status::ok();
}

}  // namespace

void add_bench_ep_command(CLI::App& bench) {
    auto opts = std::make_shared<BenchEpOptions>();
    CLI::App* ep =
        bench.add_subcommand("ep", "EP dispatch and combine across ranks (DP attention's MoE transport)");
    ep->add_option("--ranks", opts->ranks,
                   "ranks; without MPI around, starts them through mpirun (default: the world)")
        ->check(CLI::Range(1, 4096));
    ep->add_option("--tokens", opts->tokens, "tokens per rank, each ≥ 1, comma separated (default 128,4096)");
    ep->add_option("--hidden", opts->hidden, "row width H (default 7168)");
    ep->add_option("--experts", opts->experts, "routed experts E (default 256)");
    ep->add_option("--top-k", opts->top_k, "experts per token K (default 8)");
    ep->add_option("--iters", opts->iters, "timed iterations (default 20)");
    ep->add_option("--warmup-iters", opts->warmup_iters, "untimed iterations first (default 3)");
    ep->add_option("--device", opts->device,
                   "cpu: MPI on host rows; cuda: NCCL on GPU rows, one GPU per rank")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    ep->add_option("--wire-dtype", opts->wire_dtype,
                   "rows on the wire: fp32, or bf16 (rounded to nearest even, summed in fp32; default fp32)");
    ep->callback([opts] { exit_on_error(run_bench_ep(*opts)); });
}

}  // namespace epinfer::cli
