#include "comm/mpi_communicator.h"

#if EPINFER_WITH_MPI

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace epinfer {
namespace {

// Polls `req` until done or `timeout_s` has passed; true when done.
bool test_until(MPI_Request* req, double timeout_s) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    for (;;) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
        if (done) return true;
        if (Clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
}

// MPI is initialised once per process; the last communicator to go finalises it.
class MpiSession {
public:
    static Result<std::shared_ptr<MpiSession>> acquire(double timeout_s) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (auto session = current_.lock()) return session;
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized)
            return not_supported("MPI was already finalised in this process (it initialises once)");
        int initialized = 0;
        MPI_Initialized(&initialized);
        bool owns = false;
        if (!initialized) {
            int provided = 0;
            int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
            if (rc != MPI_SUCCESS) return Status(StatusCode::kCommFailure, "MPI_Init_thread failed");
            if (provided < MPI_THREAD_SERIALIZED) {
                MPI_Finalize();
                return not_supported(fmt::format(
                    "MPI provides thread level {}, epinfer needs MPI_THREAD_SERIALIZED", provided));
            }
            owns = true;
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        auto session = std::shared_ptr<MpiSession>(new MpiSession(owns, timeout_s));
        current_ = session;
        return session;
    }

    // MPI_Finalize waits for every rank without bound. A bounded barrier first proves that every rank
    // is shutting down; when it expires (a peer is stuck or gone), MPI is left unfinalised and mpirun
    // ends the job when this process exits.
    ~MpiSession() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!owns_ || finalized) return;
        MPI_Request req;
        if (MPI_Ibarrier(MPI_COMM_WORLD, &req) == MPI_SUCCESS && test_until(&req, shutdown_timeout_s_)) {
            MPI_Finalize();
        }
    }

private:
    MpiSession(bool owns, double shutdown_timeout_s) : owns_(owns), shutdown_timeout_s_(shutdown_timeout_s) {}

    static inline std::mutex mutex_;
    static inline std::weak_ptr<MpiSession> current_;
    bool owns_;
    double shutdown_timeout_s_;
};

std::string mpi_error_string(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
    return std::string(text, static_cast<size_t>(len));
}

MPI_Datatype mpi_type(DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return MPI_FLOAT;
        case DType::kF64:
            return MPI_DOUBLE;
        case DType::kI64:
            return MPI_INT64_T;
        case DType::kI32:
            return MPI_INT32_T;
        case DType::kI16:
            return MPI_INT16_T;
        case DType::kF16:
        case DType::kBF16:
            return MPI_UINT16_T;  // moved, never reduced
        case DType::kI8:
            return MPI_INT8_T;
        case DType::kF8E4M3:
        case DType::kF8E5M2:
        case DType::kU8:
        case DType::kBool:
            return MPI_UINT8_T;
    }
    return MPI_UINT8_T;
}

MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::kSum:
            return MPI_SUM;
        case ReduceOp::kMax:
            return MPI_MAX;
        case ReduceOp::kMin:
            return MPI_MIN;
    }
    return MPI_SUM;
}

class MpiCommunicator final : public Communicator {
public:
    MpiCommunicator(CommIdentity identity, double timeout_s, MPI_Comm comm,
                    std::shared_ptr<MpiSession> session)
        : Communicator(std::move(identity), timeout_s), comm_(comm), session_(std::move(session)) {}

    ~MpiCommunicator() override {
        // A broken communicator keeps its pending requests (MPI forbids freeing collective requests).
        if (broken_op_.empty()) MPI_Comm_free(&comm_);
    }

    const char* backend_name() const override { return "mpi"; }

protected:
    Status do_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
        EPI_RETURN_IF_ERROR(usable("all_reduce"));
        int n = 0;
        EPI_RETURN_IF_ERROR(to_int("all_reduce", "count", count, &n));
        const void* src = distinct_send(send, recv, count, count, dtype);
        MPI_Request req;
        int rc = MPI_Iallreduce(src, recv_ptr(recv), n, mpi_type(dtype), mpi_op(op), comm_, &req);
        return finish("all_reduce", rc, std::span(&req, 1));
    }

    Status do_all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
        EPI_RETURN_IF_ERROR(usable("all_gather"));
        int n = 0;
        EPI_RETURN_IF_ERROR(to_int("all_gather", "count", count_per_rank * size(), &n));
        n /= size();
        const void* src = distinct_send(send, recv, count_per_rank, count_per_rank * size(), dtype);
        MPI_Request req;
        int rc = MPI_Iallgather(src, n, mpi_type(dtype), recv_ptr(recv), n, mpi_type(dtype), comm_, &req);
        return finish("all_gather", rc, std::span(&req, 1));
    }

    Status do_reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                             ReduceOp op) override {
        EPI_RETURN_IF_ERROR(usable("reduce_scatter"));
        int n = 0;
        EPI_RETURN_IF_ERROR(to_int("reduce_scatter", "count", count_per_rank * size(), &n));
        n /= size();
        MPI_Request req;
        int rc = MPI_Ireduce_scatter_block(send_ptr(send), recv_ptr(recv), n, mpi_type(dtype), mpi_op(op),
                                           comm_, &req);
        return finish("reduce_scatter", rc, std::span(&req, 1));
    }

    Status do_all_to_all_v(const AllToAllVArgs& args) override {
        EPI_RETURN_IF_ERROR(usable("all_to_all_v"));
        const size_t n = static_cast<size_t>(size());
        std::vector<int> counts(4 * n);
        const std::span<const int64_t> lists[] = {args.send_counts, args.send_displs, args.recv_counts,
                                                  args.recv_displs};
        for (size_t i = 0; i < 4; ++i) {
            for (size_t r = 0; r < n; ++r) {
                EPI_RETURN_IF_ERROR(
                    to_int("all_to_all_v", "count or displacement", lists[i][r], &counts[i * n + r]));
            }
        }
        MPI_Request req;
        const MPI_Datatype type = mpi_type(args.dtype);
        int rc = MPI_Ialltoallv(send_ptr(args.send), &counts[0], &counts[n], type, recv_ptr(args.recv),
                                &counts[2 * n], &counts[3 * n], type, comm_, &req);
        return finish("all_to_all_v", rc, std::span(&req, 1));
    }

    Status do_send_recv(const SendRecvArgs& args) override {
        const char* op = args.send_peer >= 0 && args.recv_peer >= 0 ? "send_recv"
                         : args.send_peer >= 0                      ? "send"
                                                                    : "recv";
        EPI_RETURN_IF_ERROR(usable(op));
        const MPI_Datatype type = mpi_type(args.dtype);
        int recv_n = 0, send_n = 0;
        if (args.recv_peer >= 0) EPI_RETURN_IF_ERROR(to_int(op, "recv count", args.recv_count, &recv_n));
        if (args.send_peer >= 0) EPI_RETURN_IF_ERROR(to_int(op, "send count", args.send_count, &send_n));
        MPI_Request reqs[2];
        int num_reqs = 0;
        int recv_idx = -1;
        int rc = MPI_SUCCESS;
        if (args.recv_peer >= 0) {
            recv_idx = num_reqs;
            rc = MPI_Irecv(recv_ptr(args.recv), recv_n, type, args.recv_peer, args.tag, comm_,
                           &reqs[num_reqs++]);
        }
        if (rc == MPI_SUCCESS && args.send_peer >= 0) {
            rc = MPI_Isend(send_ptr(args.send), send_n, type, args.send_peer, args.tag, comm_,
                           &reqs[num_reqs++]);
        }
        MPI_Status statuses[2];
        EPI_RETURN_IF_ERROR(finish(op, rc, std::span(reqs, static_cast<size_t>(num_reqs)), statuses));
        if (recv_idx >= 0) {
            int got = 0;
            MPI_Get_count(&statuses[recv_idx], type, &got);
            if (got != args.recv_count) {
                return invalid_argument(
                    fmt::format("{}: recv from rank {} (tag {}): got {} elements, expected {}", rank_label(),
                                args.recv_peer, args.tag, got, args.recv_count));
            }
        }
        return Status::ok();
    }

    Status do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
        EPI_RETURN_IF_ERROR(usable("broadcast"));
        int n = 0;
        EPI_RETURN_IF_ERROR(to_int("broadcast", "count", count, &n));
        MPI_Request req;
        int rc = MPI_Ibcast(recv_ptr(buf), n, mpi_type(dtype), root, comm_, &req);
        return finish("broadcast", rc, std::span(&req, 1));
    }

    Status do_synchronize() override { return Status::ok(); }  // every call completes before it returns

    Status do_barrier() override {
        EPI_RETURN_IF_ERROR(usable("barrier"));
        MPI_Request req;
        int rc = MPI_Ibarrier(comm_, &req);
        return finish("barrier", rc, std::span(&req, 1));
    }

    Result<std::unique_ptr<Communicator>> do_split(int color, int key, const std::string& name) override {
        // MPI_Comm_split blocks without bound; gathering (color, key) first proves that every rank has
        // arrived, so the split itself then completes promptly.
        int32_t mine[2] = {color, key};
        std::vector<int32_t> all(2 * static_cast<size_t>(size()));
        EPI_RETURN_IF_ERROR_CTX(do_all_gather(mine, all.data(), 2, DType::kI32), "split into '" + name + "'");
        MPI_Comm sub = MPI_COMM_NULL;
        int rc = MPI_Comm_split(comm_, color, key, &sub);
        if (rc != MPI_SUCCESS) return comm_failure("split", mpi_error_string(rc));
        MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
        CommIdentity id = identity();
        id.name = name;
        MPI_Comm_rank(sub, &id.rank);
        MPI_Comm_size(sub, &id.size);
        return std::unique_ptr<Communicator>(new MpiCommunicator(std::move(id), timeout_s(), sub, session_));
    }

private:
    // Send and receive pointers handed to MPI are never equal: with send == recv on one rank (two null
    // buffers of an empty all_to_all_v), Open MPI 4.1's non-blocking collectives (libnbc) leave every
    // rank stalled in the next collective (tests/mpi/comm_test.cc, EmptyRankBesideASelfOnlyRank...).
    // Null buffers (zero counts) become two distinct placeholders.
    static const void* send_ptr(const void* send) { return send ? send : &send_placeholder_; }
    static void* recv_ptr(void* recv) { return recv ? recv : &recv_placeholder_; }

    // `send` ([count] elements), or a scratch copy of it when it overlaps `recv` ([recv_count] elements):
    // in-place use. (MPI_IN_PLACE would have to be used by every rank at once; this API lets each rank
    // choose, as NCCL does.)
    const void* distinct_send(const void* send, const void* recv, int64_t count, int64_t recv_count,
                              DType dtype) {
        const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
        const auto* s = static_cast<const char*>(send);
        const auto* r = static_cast<const char*>(recv);
        const bool overlap = send && recv && bytes > 0 &&
                             s < r + static_cast<size_t>(recv_count) * dtype_size(dtype) && r < s + bytes;
        if (!overlap) return send_ptr(send);
        scratch_.resize(bytes);
        std::memcpy(scratch_.data(), send, bytes);
        return scratch_.data();
    }

    Status usable(const char* op) const {
        if (broken_op_.empty()) return Status::ok();
        return comm_failure(op, "the communicator is unusable after an earlier failure in " + broken_op_);
    }

    Status to_int(const char* op, const char* what, int64_t value, int* out) const {
        if (value > INT_MAX) {
            return not_supported(fmt::format("{}: {}: {} {} exceeds MPI's int limit {}", rank_label(), op,
                                             what, value, INT_MAX));
        }
        *out = static_cast<int>(value);
        return Status::ok();
    }

    // Checks the return code of the call that started `reqs`, then polls them until done or until
    // timeout_s() has passed since this call. Polls spin briefly, then yield for 20 ms, then sleep 1/32 of
    // the time waited so far (0.6 to 2 ms), so oversubscribed ranks leave the cores to their peers during
    // long waits, an idle follower waiting for rank 0's next step (Engine::run_follower) polls about 500
    // times a second (it polled 10000 times, 100 us apart), and a long wait overshoots by at most ~3 %.
    Status finish(const char* op, int start_rc, std::span<MPI_Request> reqs, MPI_Status* statuses = nullptr) {
        if (start_rc != MPI_SUCCESS) return fail(op, start_rc);
        using Clock = std::chrono::steady_clock;
        const Clock::time_point start = Clock::now();
        const Clock::time_point deadline =
            start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s()));
        MPI_Status* status_out = statuses ? statuses : MPI_STATUSES_IGNORE;
        for (int polls = 0;; ++polls) {
            int done = 0;
            int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, status_out);
            if (rc != MPI_SUCCESS) {
                if (rc == MPI_ERR_IN_STATUS && statuses) {
                    for (size_t i = 0; i < reqs.size(); ++i) {
                        if (statuses[i].MPI_ERROR != MPI_SUCCESS) return fail(op, statuses[i].MPI_ERROR);
                    }
                }
                return fail(op, rc);
            }
            if (done) return Status::ok();
            const Clock::time_point now = Clock::now();
            if (now >= deadline) {
                broken_op_ = op;
                return timeout_error(op);
            }
            if (polls < 64) continue;
            const Clock::duration waited = now - start;
            if (waited < std::chrono::milliseconds(20)) {
                std::this_thread::yield();
            } else {
                std::this_thread::sleep_for(
                    std::min<Clock::duration>(waited / 32, std::chrono::milliseconds(2)));
            }
        }
    }

    Status fail(const char* op, int rc) {
        broken_op_ = op;
        return comm_failure(op, mpi_error_string(rc));
    }

    static inline char send_placeholder_ = 0;
    static inline char recv_placeholder_ = 0;
    MPI_Comm comm_;
    std::vector<char> scratch_;            // the send copy of an in-place all_reduce / all_gather
    std::shared_ptr<MpiSession> session_;  // keeps MPI initialised while this communicator lives
    std::string broken_op_;                // the operation that timed out or failed; "" while usable
};

}  // namespace

bool mpi_available() {
    return true;
}

Result<std::unique_ptr<Communicator>> create_mpi_world_communicator(double timeout_s) {
    EPI_ASSIGN_OR_RETURN(std::shared_ptr<MpiSession> session, MpiSession::acquire(timeout_s));
    CommIdentity id;
    MPI_Comm_rank(MPI_COMM_WORLD, &id.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &id.size);
    id.world_rank = id.rank;
    id.world_size = id.size;
    // MPI_Comm_idup rather than MPI_Comm_dup, so that a rank that never arrives is a timeout.
    MPI_Comm world = MPI_COMM_NULL;
    MPI_Request req;
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &world, &req);
    if (rc != MPI_SUCCESS) {
        return Status(StatusCode::kCommFailure,
                      fmt::format("rank {}/{}: MPI_Comm_idup: {}", id.rank, id.size, mpi_error_string(rc)));
    }
    if (!test_until(&req, timeout_s)) {
        return Status(StatusCode::kTimeout,
                      fmt::format("rank {}/{}: creating the world communicator timed out after "
                                  "{:g} s waiting for peers",
                                  id.rank, id.size, timeout_s));
    }
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    return std::unique_ptr<Communicator>(
        new MpiCommunicator(std::move(id), timeout_s, world, std::move(session)));
}

}  // namespace epinfer

#else  // !EPINFER_WITH_MPI

namespace epinfer {

bool mpi_available() {
    return false;
}

Result<std::unique_ptr<Communicator>> create_mpi_world_communicator(double) {
    return not_supported("epinfer was built without MPI (EPINFER_MPI=OFF)");
}

}  // namespace epinfer

#endif
