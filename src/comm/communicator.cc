#include "comm/communicator.h"

#include <fmt/format.h>

#include <cstdlib>

#include "comm/mpi_communicator.h"
#include "comm/single_rank_communicator.h"
#include "core/env.h"

namespace epinfer {
namespace {

bool dtype_reducible(DType dtype) {
    return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kI32 || dtype == DType::kI64;
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
    switch (op) {
        case ReduceOp::kSum:
            return "sum";
        case ReduceOp::kMax:
            return "max";
        case ReduceOp::kMin:
            return "min";
    }
    return "unknown";
}

std::string Communicator::rank_label() const {
    const CommIdentity& id = identity_;
    if (id.name == "world") return fmt::format("rank {}/{}", id.rank, id.size);
    return fmt::format("{} rank {}/{} (world rank {}/{})", id.name, id.rank, id.size, id.world_rank,
                       id.world_size);
}

Status Communicator::timeout_error(const char* op) const {
    return {StatusCode::kTimeout,
            fmt::format("{}: {} timed out after {:g} s waiting for peers", rank_label(), op, timeout_s_)};
}

Status Communicator::comm_failure(const char* op, const std::string& detail) const {
    return {StatusCode::kCommFailure, fmt::format("{}: {}: {}", rank_label(), op, detail)};
}

Status Communicator::check_args(const char* op, int64_t count, const void* send, const void* recv) const {
    if (count < 0) return invalid_argument(fmt::format("{}: {}: negative count {}", rank_label(), op, count));
    if (count > 0 && (send == nullptr || recv == nullptr)) {
        return invalid_argument(fmt::format("{}: {}: null buffer with count {}", rank_label(), op, count));
    }
    return Status::ok();
}

Status Communicator::check_peer(const char* op, const char* what, int peer) const {
    if (peer < 0 || peer >= size()) {
        return invalid_argument(fmt::format("{}: {}: {} {} is outside the group of {} ranks", rank_label(),
                                            op, what, peer, size()));
    }
    return Status::ok();
}

Status Communicator::all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
    EPI_RETURN_IF_ERROR(check_args("all_reduce", count, send, recv));
    if (!dtype_reducible(dtype)) {
        return not_supported(fmt::format("{}: all_reduce of {}: reductions take F32, F64, I32 or I64",
                                         rank_label(), dtype_name(dtype)));
    }
    return do_all_reduce(send, recv, count, dtype, op);
}

Status Communicator::all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype) {
    EPI_RETURN_IF_ERROR(check_args("all_gather", count_per_rank, send, recv));
    return do_all_gather(send, recv, count_per_rank, dtype);
}

Status Communicator::reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                    ReduceOp op) {
    EPI_RETURN_IF_ERROR(check_args("reduce_scatter", count_per_rank, send, recv));
    if (!dtype_reducible(dtype)) {
        return not_supported(fmt::format("{}: reduce_scatter of {}: reductions take F32, F64, I32 or I64",
                                         rank_label(), dtype_name(dtype)));
    }
    return do_reduce_scatter(send, recv, count_per_rank, dtype, op);
}

Status Communicator::all_to_all_v(const AllToAllVArgs& args) {
    const size_t n = static_cast<size_t>(size());
    const std::span<const int64_t> lists[] = {args.send_counts, args.send_displs, args.recv_counts,
                                              args.recv_displs};
    const char* names[] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    for (int i = 0; i < 4; ++i) {
        if (lists[i].size() != n) {
            return invalid_argument(fmt::format("{}: all_to_all_v: {} has {} entries, expected {}",
                                                rank_label(), names[i], lists[i].size(), n));
        }
        for (size_t r = 0; r < n; ++r) {
            if (lists[i][r] < 0) {
                return invalid_argument(fmt::format("{}: all_to_all_v: {}[{}] = {} is negative", rank_label(),
                                                    names[i], r, lists[i][r]));
            }
        }
    }
    for (size_t r = 0; r < n; ++r) {
        if ((args.send_counts[r] > 0 && args.send == nullptr) ||
            (args.recv_counts[r] > 0 && args.recv == nullptr)) {
            return invalid_argument(fmt::format(
                "{}: all_to_all_v: null buffer with a positive count for rank {}", rank_label(), r));
        }
    }
    return do_all_to_all_v(args);
}

Status Communicator::send(const void* buf, int64_t count, DType dtype, int peer, int tag) {
    SendRecvArgs args;
    args.send = buf;
    args.send_count = count;
    args.send_peer = peer;
    args.dtype = dtype;
    args.tag = tag;
    EPI_RETURN_IF_ERROR(check_peer("send", "peer", peer));
    return send_recv(args);
}

Status Communicator::recv(void* buf, int64_t count, DType dtype, int peer, int tag) {
    SendRecvArgs args;
    args.recv = buf;
    args.recv_count = count;
    args.recv_peer = peer;
    args.dtype = dtype;
    args.tag = tag;
    EPI_RETURN_IF_ERROR(check_peer("recv", "peer", peer));
    return send_recv(args);
}

Status Communicator::send_recv(const SendRecvArgs& args) {
    if (args.send_peer >= 0) {
        EPI_RETURN_IF_ERROR(check_peer("send_recv", "send_peer", args.send_peer));
        EPI_RETURN_IF_ERROR(check_args("send_recv", args.send_count, args.send, args.send));
    }
    if (args.recv_peer >= 0) {
        EPI_RETURN_IF_ERROR(check_peer("send_recv", "recv_peer", args.recv_peer));
        EPI_RETURN_IF_ERROR(check_args("send_recv", args.recv_count, args.recv, args.recv));
    }
    if (args.tag < 0 || args.tag >= 32768) {
        return invalid_argument(
            fmt::format("{}: send_recv: tag {} is outside [0, 32768)", rank_label(), args.tag));
    }
    if (args.send_peer < 0 && args.recv_peer < 0) return Status::ok();
    return do_send_recv(args);
}

Status Communicator::broadcast(void* buf, int64_t count, DType dtype, int root) {
    EPI_RETURN_IF_ERROR(check_args("broadcast", count, buf, buf));
    EPI_RETURN_IF_ERROR(check_peer("broadcast", "root", root));
    return do_broadcast(buf, count, dtype, root);
}

Status Communicator::barrier() {
    return do_barrier();
}

Status Communicator::synchronize() {
    return do_synchronize();
}

Result<std::unique_ptr<Communicator>> Communicator::split(int color, int key, const std::string& name) {
    if (color < 0) {
        return invalid_argument(
            fmt::format("{}: split into '{}': color {} is negative", rank_label(), name, color));
    }
    return do_split(color, key, name);
}

bool launched_by_mpi() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
           std::getenv("PMI_RANK") != nullptr;
}

Result<std::unique_ptr<Communicator>> create_world_communicator(const CommOptions& options) {
    double timeout_s = options.timeout_s;
    if (timeout_s <= 0.0) {
        EPI_ASSIGN_OR_RETURN(timeout_s, env_comm_timeout_s());
    }
    if (!launched_by_mpi()) return create_single_rank_communicator(timeout_s);
    if (!mpi_available()) {
        return not_supported(
            "this process was started by an MPI launcher, but epinfer was built without MPI "
            "(EPINFER_MPI=OFF)");
    }
    return create_mpi_world_communicator(timeout_s);
}

}  // namespace epinfer
