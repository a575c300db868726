// epinfer bench comm: collective bandwidth on whatever Communicator backend runs, as nccl-tests reports it.
//
// For each message size (min-bytes, ×4, ..., max-bytes) and each op (all_reduce, all_gather,
// all_to_all_v), fp32 data: median time over --iters timed iterations (each iteration's time is the
// slowest rank's), algorithm bandwidth algbw = size / time, bus bandwidth busbw = algbw × factor with
// the nccl-tests factors (doc/PERFORMANCE.md of nccl-tests): all_reduce 2(n−1)/n, all_gather (n−1)/n,
// all_to_all (n−1)/n. `size` is as in nccl-tests: the all_reduce buffer, the gathered buffer, and what
// each rank sends in the all-to-all. The check column compares every received element with the
// expected rank-coded value after the timed iterations (wrong = elements that differ, summed over ranks).
// time_us is one op from a barrier until it has completed (a device backend: synchronize()); queued_us is
// the time per op of --iters ops issued back to back and waited for once, as nccl-tests times them and as
// an engine pays them when it does not wait per op (NCCL queues each op on the stream and returns); the
// profile of --profile-out is fitted to queued_us.
// Exits 1 when any check fails. --profile-out writes the measurements as a hardware profile: the base
// profile with intra_node.{all_reduce, all_gather, all_to_all} measured (profile_out.h, docs/planner.md).
//   epinfer bench comm --ranks 4
//   epinfer bench comm --ranks 2 --min-bytes 1K --max-bytes 64M --iters 20 --json comm.json
//   epinfer bench comm --ranks 8 --max-bytes 256M --profile-out mine.json --base-profile h200_sxm
// Without MPI around it and with --ranks > 1 it relaunches itself through mpirun (mpi_launch.h).
// --device cuda: the ops run through NCCL on GPU buffers, rank i of a host on its GPU i (the MPI world
// only bootstraps NCCL and carries the barriers and the timing exchange):
//   epinfer bench comm --ranks 2 --device cuda --max-bytes 256M
//   NCCL_P2P_DISABLE=1 epinfer bench comm --ranks 2 --device cuda   (traffic through host memory)
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "commands.h"
#include "core/env.h"
#include "flag_values.h"
#include "model_setup.h"
#include "mpi_launch.h"
#include "profile_out.h"

namespace epinfer::cli {
namespace {

struct BenchCommOptions {
    int ranks = 0;  // 0: the world's size (1 outside MPI)
    uint64_t min_bytes = 1024;
    uint64_t max_bytes = 16u << 20;
    int step_factor = 4;
    int iters = 10;
    int warmup_iters = 2;
    std::string json_path;
    std::string profile_out;     // write a hardware profile here (rank 0)
    std::string base_profile;    // ... starting from this one (name or file), required with profile_out
    std::string device = "cpu";  // cpu: MPI on host buffers; cuda: NCCL on GPU buffers, one GPU per rank
};

enum class BenchOp { kAllReduce, kAllGather, kAllToAllV };

const char* bench_op_name(BenchOp op) {
    switch (op) {
        case BenchOp::kAllReduce:
            return "all_reduce";
        case BenchOp::kAllGather:
            return "all_gather";
        case BenchOp::kAllToAllV:
            return "all_to_all_v";
    }
    return "unknown";
}

// nccl-tests busbw factors.
double bus_factor(BenchOp op, int n) {
    if (n <= 1) return 0.0;
    const double ranks = n;
    return op == BenchOp::kAllReduce ? 2.0 * (ranks - 1) / ranks : (ranks - 1) / ranks;
}

struct BenchRow {
    BenchOp op;
    int64_t size_bytes;  // as nccl-tests counts it (see the file comment)
    int64_t count;   // fp32 elements per rank: all_reduce buffer, all_gather block, all-to-all block per peer
    double time_us;  // median over iterations of the slowest rank's time, one op from a barrier to its end
    double queued_us;  // per op, `iters` ops issued back to back then waited for once (nccl-tests' figure)
    double algbw_gbps;
    double busbw_gbps;
    int64_t wrong;  // elements that differ from the expected value, summed over ranks
};

// Rank-coded values, exact in fp32 (small integers).
float reduce_input(int rank, int64_t i) {
    return static_cast<float>((rank + 1) * (i % 13 + 1));
}
float gather_input(int rank, int64_t i) {
    return static_cast<float>(rank * 64 + i % 61);
}
float a2a_input(int src, int dst, int64_t i) {
    return static_cast<float>(src * 1024 + dst * 32 + i % 31);
}

// One op at one size: buffers, the op itself, and the expected result. With a device backend the op runs
// on copies of the buffers in its memory (NCCL), read back for the check.
class OpCase {
public:
    OpCase(Communicator& comm, BenchOp op, int64_t count, Backend* device)
        : comm_(comm), op_(op), count_(count), device_(device) {
        const int n = comm.size(), r = comm.rank();
        if (op == BenchOp::kAllReduce) {
            send_.resize(static_cast<size_t>(count));
            recv_.resize(static_cast<size_t>(count));
            for (int64_t i = 0; i < count; ++i) send_[static_cast<size_t>(i)] = reduce_input(r, i);
        } else if (op == BenchOp::kAllGather) {
            send_.resize(static_cast<size_t>(count));
            recv_.resize(static_cast<size_t>(count * n));
            for (int64_t i = 0; i < count; ++i) send_[static_cast<size_t>(i)] = gather_input(r, i);
        } else {
            send_.resize(static_cast<size_t>(count * n));
            recv_.resize(static_cast<size_t>(count * n));
            counts_.assign(static_cast<size_t>(n), count);
            for (int d = 0; d < n; ++d) {
                displs_.push_back(d * count);
                for (int64_t i = 0; i < count; ++i)
                    send_[static_cast<size_t>(d * count + i)] = a2a_input(r, d, i);
            }
        }
    }

    // Device copies of the buffers (a no-op on the host).
    Status upload() {
        if (device_ == nullptr) return Status::ok();
        EPI_ASSIGN_OR_RETURN(send_dev_, DeviceBuffer::alloc(*device_, send_.size() * sizeof(float)));
        EPI_ASSIGN_OR_RETURN(recv_dev_, DeviceBuffer::alloc(*device_, recv_.size() * sizeof(float)));
        EPI_RETURN_IF_ERROR(
            device_->copy_to_device(send_dev_.data(), send_.data(), send_.size() * sizeof(float)));
        return device_->synchronize();
    }

    Status run() {
        float* send = device_ != nullptr ? send_dev_.f32() : send_.data();
        float* recv = device_ != nullptr ? recv_dev_.f32() : recv_.data();
        switch (op_) {
            case BenchOp::kAllReduce:
                return comm_.all_reduce(send, recv, count_, DType::kF32, ReduceOp::kSum);
            case BenchOp::kAllGather:
                return comm_.all_gather(send, recv, count_, DType::kF32);
            case BenchOp::kAllToAllV:
                return comm_.all_to_all_v({send, counts_, displs_, recv, counts_, displs_, DType::kF32});
        }
        return internal_error("unknown bench op");
    }

    // Brings the device result back to recv_ (a no-op on the host).
    Status download() {
        if (device_ == nullptr) return Status::ok();
        return device_->copy_to_host(recv_.data(), recv_dev_.data(), recv_.size() * sizeof(float));
    }

    // Elements of the last result that differ from the expected value on this rank.
    int64_t count_wrong() const {
        const int n = comm_.size(), r = comm_.rank();
        int64_t wrong = 0;
        for (size_t k = 0; k < recv_.size(); ++k) {
            const int64_t i = static_cast<int64_t>(k) % count_;
            const int block = static_cast<int>(static_cast<int64_t>(k) / count_);
            float expected = 0.0f;
            if (op_ == BenchOp::kAllReduce) {
                expected = static_cast<float>(n * (n + 1) / 2 * (i % 13 + 1));
            } else if (op_ == BenchOp::kAllGather) {
                expected = gather_input(block, i);
            } else {
                expected = a2a_input(block, r, i);
            }
            if (recv_[k] != expected) ++wrong;
        }
        return wrong;
    }

    Status clear_result() {
        std::fill(recv_.begin(), recv_.end(), -1.0f);
        if (device_ == nullptr) return Status::ok();
        return device_->copy_to_device(recv_dev_.data(), recv_.data(), recv_.size() * sizeof(float));
    }

private:
    Communicator& comm_;
    BenchOp op_;
    int64_t count_;
    Backend* device_;
    std::vector<float> send_, recv_;
    std::vector<int64_t> counts_, displs_;
    DeviceBuffer send_dev_, recv_dev_;
};

// `comm` carries the op (MPI, or NCCL with `device`); `world` (MPI) the barriers and the result exchange.
Result<BenchRow> bench_one(Communicator& world, Communicator& comm, Backend* device, BenchOp op,
                           uint64_t bytes, const BenchCommOptions& opts) {
    const int n = comm.size();
    // Elements per rank (per peer for all-to-all), at least one; size is then what nccl-tests reports.
    const int64_t total_floats = static_cast<int64_t>(bytes / sizeof(float));
    const int64_t count = std::max<int64_t>(1, op == BenchOp::kAllReduce ? total_floats : total_floats / n);
    const int64_t size_bytes =
        static_cast<int64_t>(sizeof(float)) * (op == BenchOp::kAllReduce ? count : count * n);
    OpCase c(comm, op, count, device);
    EPI_RETURN_IF_ERROR(c.upload());
    for (int i = 0; i < opts.warmup_iters; ++i) EPI_RETURN_IF_ERROR(c.run());
    EPI_RETURN_IF_ERROR(comm.synchronize());
    // Back to back (the same buffers each time; the result is checked after the timed loop below).
    EPI_RETURN_IF_ERROR(world.barrier());
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < opts.iters; ++i) EPI_RETURN_IF_ERROR(c.run());
    EPI_RETURN_IF_ERROR(comm.synchronize());
    double queued_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
        opts.iters;
    EPI_RETURN_IF_ERROR(world.all_reduce(&queued_us, &queued_us, 1, DType::kF64, ReduceOp::kMax));
    EPI_RETURN_IF_ERROR(c.clear_result());
    if (device != nullptr) EPI_RETURN_IF_ERROR(device->synchronize());
    std::vector<double> times_us(static_cast<size_t>(opts.iters));
    for (int i = 0; i < opts.iters; ++i) {
        EPI_RETURN_IF_ERROR(world.barrier());
        start = std::chrono::steady_clock::now();
        EPI_RETURN_IF_ERROR(c.run());
        EPI_RETURN_IF_ERROR(comm.synchronize());
        times_us[static_cast<size_t>(i)] =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    }
    // The slowest rank's time per iteration, then the median.
    EPI_RETURN_IF_ERROR(
        world.all_reduce(times_us.data(), times_us.data(), opts.iters, DType::kF64, ReduceOp::kMax));
    std::sort(times_us.begin(), times_us.end());
    const size_t mid = times_us.size() / 2;
    const double median_us = times_us.size() % 2 ? times_us[mid] : 0.5 * (times_us[mid - 1] + times_us[mid]);
    EPI_RETURN_IF_ERROR(c.download());
    int64_t wrong = c.count_wrong();
    EPI_RETURN_IF_ERROR(world.all_reduce(&wrong, &wrong, 1, DType::kI64, ReduceOp::kSum));
    const double algbw_gbps = static_cast<double>(size_bytes) / (median_us * 1e-6) / 1e9;
    return BenchRow{op,   size_bytes, count, median_us, queued_us, algbw_gbps, algbw_gbps * bus_factor(op, n),
                    wrong};
}

void print_table(const Communicator& comm, const BenchCommOptions& opts, const std::vector<BenchRow>& rows) {
    std::printf("# epinfer bench comm: backend %s, %d ranks, fp32, median of %d iterations (%d warmup)\n",
                comm.backend_name(), comm.size(), opts.iters, opts.warmup_iters);
    std::printf(
        "# busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather, all_to_all_v), as nccl-tests\n");
    std::printf("%-13s %12s %10s %12s %11s %11s %6s %12s\n", "op", "size_bytes", "count", "time_us",
                "algbw_GB/s", "busbw_GB/s", "check", "queued_us");
    for (const BenchRow& row : rows) {
        std::printf("%-13s %12lld %10lld %12.1f %11.3f %11.3f %6s %12.1f\n", bench_op_name(row.op),
                    static_cast<long long>(row.size_bytes), static_cast<long long>(row.count), row.time_us,
                    row.algbw_gbps, row.busbw_gbps, row.wrong == 0 ? "ok" : "FAIL", row.queued_us);
    }
    std::fflush(stdout);
}

Status write_json(const std::string& path, const Communicator& comm, const BenchCommOptions& opts,
                  const std::vector<BenchRow>& rows) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    nlohmann::json doc = {{"bench", "comm"},      {"backend", comm.backend_name()},
                          {"ranks", comm.size()}, {"dtype", "F32"},
                          {"iters", opts.iters},  {"warmup_iters", opts.warmup_iters},
                          {"host", host},         {"results", nlohmann::json::array()}};
    for (const BenchRow& row : rows) {
        doc["results"].push_back({{"op", bench_op_name(row.op)},
                                  {"size_bytes", row.size_bytes},
                                  {"count", row.count},
                                  {"time_us", row.time_us},
                                  {"queued_us", row.queued_us},
                                  {"algbw_gbps", row.algbw_gbps},
                                  {"busbw_gbps", row.busbw_gbps},
                                  {"check", row.wrong == 0 ? "ok" : "FAIL"},
                                  {"wrong", row.wrong}});
    }
    std::ofstream out(path);
    out << doc.dump(2) << "\n";
    if (!out) return not_found(fmt::format("--json {}: cannot write the file", path));
    return Status::ok();
}

// --min-bytes / --max-bytes as given: decimal digits, then an optional unit (K, KB, KiB, M, G, ...: binary
// multiples, CLI::AsSizeValue's). Runs before AsSizeValue, whose strtoull would take "-1" as 2^64 − 1, "010"
// as octal and "0x10" as hex, and clamp 20 digits to 2^64 − 1; leading zeros are dropped. Sizes are then
// rounded down to whole fp32 elements (the byte column shows the sizes run).
CLI::Validator decimal_byte_count() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
            const size_t digits = std::min(value.find_first_not_of("0123456789"), value.size());
            const bool unit_ok = std::all_of(value.begin() + static_cast<ptrdiff_t>(digits), value.end(),
                                             [](unsigned char c) { return std::isalpha(c) != 0; });
            if (digits == 0 || !unit_ok)
                return "'" + value + "' is not a byte count (digits, then an optional unit: K, KB, KiB, M, G, ...)";
            size_t zeros = 0;
            while (zeros + 1 < digits && value[zeros] == '0') ++zeros;
            if (digits - zeros > 10) return "'" + value + "' is too large (at most 1G)";  // before strtoull clamps it
            value.erase(0, zeros);
            return "";
        },
        "");
}

constexpr int kMaxRanks = 4096;
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 30;  // per rank; all-gather holds ranks × this

Status check_options(const BenchCommOptions& opts) {
    if (opts.ranks < 0) return invalid_argument(fmt::format("--ranks {}: must be at least 1", opts.ranks));
    if (opts.min_bytes < 4 || opts.min_bytes > opts.max_bytes) {
        return invalid_argument(fmt::format("--min-bytes {} and --max-bytes {}: need 4 ≤ min ≤ max",
                                            opts.min_bytes, opts.max_bytes));
    }
    if (opts.max_bytes > kMaxMessageBytes) {
        return invalid_argument(fmt::format("--max-bytes {}: above the limit of {} bytes (1 GiB)",
                                            opts.max_bytes, kMaxMessageBytes));
    }
    if (opts.step_factor < 2)
        return invalid_argument(fmt::format("--step-factor {}: must be at least 2", opts.step_factor));
    if (opts.iters < 1 || opts.warmup_iters < 0) {
        return invalid_argument(fmt::format("--iters {} / --warmup-iters {}: need iters ≥ 1 and warmup ≥ 0",
                                            opts.iters, opts.warmup_iters));
    }
    if (!opts.json_path.empty()) return check_output_file("--json", opts.json_path);
    return Status::ok();
}

planner::Collective profile_collective(BenchOp op) {
    switch (op) {
        case BenchOp::kAllReduce:
            return planner::Collective::kAllReduce;
        case BenchOp::kAllGather:
            return planner::Collective::kAllGather;
        case BenchOp::kAllToAllV:
            return planner::Collective::kAllToAll;
    }
    return planner::Collective::kAllReduce;
}

// The rows as measured collectives of the profile's intra-node link (size as nccl-tests counts it).
planner::Calibration comm_calibration(const Communicator& comm, const std::vector<BenchRow>& rows) {
    planner::Calibration cal;
    cal.source = fmt::format("{}, backend {}", calibration_source(), comm.backend_name());
    for (BenchOp op : {BenchOp::kAllReduce, BenchOp::kAllGather, BenchOp::kAllToAllV}) {
        planner::MeasuredCollective m{profile_collective(op), comm.size(), {}};
        for (const BenchRow& row : rows) {
            // Tiny messages can round to the same size (one element per peer): keep the first.
            if (row.op != op || (!m.points.empty() && row.size_bytes <= m.points.back().first)) continue;
            m.points.emplace_back(static_cast<double>(row.size_bytes), row.queued_us);
        }
        cal.collectives.push_back(std::move(m));
    }
    return cal;
}

Status run_bench_comm(const BenchCommOptions& opts) {
    EPI_RETURN_IF_ERROR(check_options(opts));
    BaseProfile base;
    if (!opts.profile_out.empty()) {
        if (opts.ranks == 1) return invalid_argument("--profile-out: needs --ranks 2 or more");
        EPI_ASSIGN_OR_RETURN(base, load_base_profile(opts.profile_out, opts.base_profile));
    } else if (!opts.base_profile.empty()) {
        return invalid_argument("--base-profile is used only with --profile-out FILE.json");
    }
    EPI_RETURN_IF_ERROR(env_comm_timeout_s().status());  // a bad setting fails here, before mpirun starts
    EPI_RETURN_IF_ERROR(require_device_built(opts.device));
    EPI_RETURN_IF_ERROR(relaunch_under_mpirun_if_needed(opts.ranks));
    EPI_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, create_world_communicator());
    if (opts.ranks > 0 && comm->size() != opts.ranks) {
        return invalid_argument(
            fmt::format("--ranks {}, but the MPI world has {} ranks", opts.ranks, comm->size()));
    }
    if (!opts.profile_out.empty() && comm->size() < 2) {
        return invalid_argument(
            fmt::format("--profile-out: needs 2 or more ranks (the MPI world has {})", comm->size()));
    }
    // --device cuda: one GPU per rank of a host, NCCL over the same ranks (bootstrapped over the world).
    std::unique_ptr<Backend> device;
    std::unique_ptr<Communicator> nccl;
    if (opts.device == "cuda") {
        EPI_ASSIGN_OR_RETURN(GpuRank gpu, make_gpu_rank(*comm));
        device = std::move(gpu.backend);
        nccl = std::move(gpu.nccl);
    }
    Communicator& op_comm = nccl != nullptr ? *nccl : *comm;
    std::vector<BenchRow> rows;
    for (BenchOp op : {BenchOp::kAllReduce, BenchOp::kAllGather, BenchOp::kAllToAllV}) {
        for (uint64_t bytes = opts.min_bytes; bytes <= opts.max_bytes;
             bytes *= static_cast<uint64_t>(opts.step_factor)) {
            EPI_ASSIGN_OR_RETURN(BenchRow row, bench_one(*comm, op_comm, device.get(), op, bytes, opts));
            rows.push_back(row);
        }
    }
    int64_t wrong = 0;
    for (const BenchRow& row : rows) wrong += row.wrong;
    if (comm->rank() == 0) {
        print_table(op_comm, opts, rows);
        if (!opts.json_path.empty()) EPI_RETURN_IF_ERROR(write_json(opts.json_path, op_comm, opts, rows));
        if (!opts.profile_out.empty() && wrong == 0) {
            EPI_RETURN_IF_ERROR(
                write_calibrated_profile(opts.profile_out, base, comm_calibration(op_comm, rows)));
        }
    }
    if (wrong > 0) {
        return internal_error(fmt::format("rank {}: bench comm: {} elements differ from the expected values",
                                          comm->rank(), wrong));
    }
    return Status::ok();
}

}  // namespace

void add_bench_command(CLI::App& app) {
    CLI::App* bench = app.add_subcommand(
        "bench",
        "Serving benchmark: throughput and latency per concurrency level (subcommands: comm, the "
        "collectives; moe, one MoE layer on the GPU; attention, the attention op on the GPU; ep, EP dispatch "
        "and combine)");
    bench->require_subcommand(0, 1);
    auto opts = std::make_shared<BenchCommOptions>();
    CLI::App* comm =
        bench->add_subcommand("comm", "all_reduce, all_gather, all_to_all_v bandwidth (nccl-tests style)");
    comm->add_option("--ranks", opts->ranks,
                     "ranks; without MPI around, starts them through mpirun (default: the world)")
        ->check(CLI::Range(1, kMaxRanks));
    comm->add_option("--min-bytes", opts->min_bytes, "smallest message (suffixes K, M, G: powers of 1024)")
        ->transform(CLI::AsSizeValue(false))
        ->transform(decimal_byte_count())  // runs first: CLI11 puts each transform before the earlier ones
        ->capture_default_str();
    comm->add_option("--max-bytes", opts->max_bytes, "largest message")
        ->transform(CLI::AsSizeValue(false))
        ->transform(decimal_byte_count())  // runs first: CLI11 puts each transform before the earlier ones
        ->capture_default_str();
    comm->add_option("--step-factor", opts->step_factor, "size multiplier between rows")
        ->capture_default_str();
    comm->add_option("--iters", opts->iters, "timed iterations per size (median reported)")
        ->capture_default_str();
    comm->add_option("--warmup-iters", opts->warmup_iters, "untimed iterations first")->capture_default_str();
    comm->add_option("--device", opts->device,
                     "cpu: MPI on host buffers; cuda: NCCL on GPU buffers, one GPU per rank (default cpu)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    comm->add_option("--json", opts->json_path, "also write the results to this JSON file (rank 0)");
    add_profile_out_options(*comm, opts->profile_out, opts->base_profile,
                            "with the measured intra-node collectives (rank 0)");
    comm->callback([opts] { exit_on_error(run_bench_comm(*opts)); });
    add_bench_moe_command(*bench);
    add_bench_attention_command(*bench);
    add_bench_ep_command(*bench);
    add_bench_serving(*bench);
}

}  // namespace epinfer::cli
