// Communicator: collectives and point-to-point messages among the ranks of one group.
//
// One interface for every backend (single rank, MPI for CPU ranks, NCCL for GPU ranks later); this
// header carries no MPI or NCCL type. Signatures follow NCCL (send buffer, receive buffer, element
// count, dtype, op), so the NCCL backend maps one call to one NCCL call (all_to_all_v to grouped
// send/recv).
//
// Contracts, every backend:
//  - Every rank of the group makes the same collective calls in the same order with matching counts.
//  - Every wait is bounded by timeout_s() (EPINFER_COMM_TIMEOUT_S, core/env.h). On expiry the call
//    returns kTimeout, e.g. "rank 3/8: all_to_all_v timed out after 300 s waiting for peers", and the
//    communicator is broken: later calls return kCommFailure at once. The buffers of the timed-out call
//    may still be written by the backend until the process exits: keep them alive, report, exit.
//  - Completion: CPU backends return when the operation is done. A device backend (NCCL) may return once
//    the operation is queued on its stream, where later work on that stream is ordered after it; read a
//    result on the host or time an operation after synchronize(). A queued operation is still bounded: one
//    that has not completed timeout_s() after it was queued breaks the communicator (NCCL: a watchdog
//    aborts it, so nothing waiting on the stream hangs), and the next call or synchronize() reports it.
//  - A failed peer or transport is kCommFailure naming the rank and the operation.
//  - Counts are elements of `dtype`; buffers are host memory for CPU backends, device memory for NCCL.
//  - Reductions support F32, F64, I32 and I64 (reduce bf16 activations in fp32). Data movement (gather,
//    all-to-all, send/recv, broadcast) supports every dtype.
//  - Send and receive buffers must not overlap, except in-place all_reduce (send == recv) and in-place
//    all_gather (send == recv + rank·count_per_rank), as in NCCL.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "core/status.h"

namespace epinfer {

enum class ReduceOp { kSum, kMax, kMin };

// "sum", "max", "min".
const char* reduce_op_name(ReduceOp op);

struct AllToAllVArgs {
    const void* send = nullptr;            // [Σ send_counts] elements of dtype (null when all counts are 0)
    std::span<const int64_t> send_counts;  // [size()] elements this rank sends to each rank
    std::span<const int64_t> send_displs;  // [size()] element offset in `send` of each rank's block
    void* recv = nullptr;                  // [Σ recv_counts] elements of dtype
    std::span<const int64_t> recv_counts;  // [size()] elements this rank receives from each rank
    std::span<const int64_t> recv_displs;  // [size()] element offset in `recv` of each rank's block
    DType dtype = DType::kU8;
};

// One send and one receive posted together, so that rings and pipeline exchanges cannot deadlock.
// A negative peer leaves that half out (first and last pipeline stages).
struct SendRecvArgs {
    const void* send = nullptr;  // [send_count] elements of dtype
    int64_t send_count = 0;
    int send_peer = -1;
    void* recv = nullptr;  // [recv_count] elements of dtype
    int64_t recv_count = 0;
    int recv_peer = -1;
    DType dtype = DType::kU8;
    int tag = 0;  // 0 ≤ tag < 32768
};

// Who a communicator is: its group name and this rank's place in the group and in the world.
struct CommIdentity {
    std::string name = "world";  // "world", or the name given to split(): "tp", "ep", ...
    int rank = 0;
    int size = 1;
    int world_rank = 0;
    int world_size = 1;
};

class Communicator {
public:
    virtual ~Communicator() = default;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return identity_.rank; }
    int size() const { return identity_.size; }
    const CommIdentity& identity() const { return identity_; }
    // "single" or "mpi".
    virtual const char* backend_name() const = 0;

    // The bound on every wait, in seconds. Sub-groups made by split() inherit it.
    double timeout_s() const { return timeout_s_; }
    void set_timeout_s(double timeout_s) { timeout_s_ = timeout_s; }

    // recv[i] = op over ranks of send[i]. send: [count], recv: [count]; send == recv is in place.
    Status all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op);
    // recv = concat over ranks r of send(r). send: [count_per_rank], recv: [size()·count_per_rank].
    Status all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype);
    // recv = block rank() of (op over ranks of send). send: [size()·count_per_rank], recv: [count_per_rank].
    Status reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype, ReduceOp op);
    // Variable all-to-all (MPI_Alltoallv semantics); see AllToAllVArgs. recv_counts[r] must equal what
    // rank r sends here. Zero counts are allowed everywhere.
    Status all_to_all_v(const AllToAllVArgs& args);
    // Sends [count] elements to `peer`; returns when the buffer may be reused. A peer that sends to
    // this rank at the same time must use send_recv() (a large send waits for its matching receive).
    Status send(const void* buf, int64_t count, DType dtype, int peer, int tag = 0);
    // Receives exactly [count] elements from `peer`; a message of another length is kInvalidArgument.
    Status recv(void* buf, int64_t count, DType dtype, int peer, int tag = 0);
    Status send_recv(const SendRecvArgs& args);
    // Copies [count] elements of `root`'s buf to every rank's buf.
    Status broadcast(void* buf, int64_t count, DType dtype, int root);
    // Blocks the host until the rank's part of every operation issued so far is done. Also the barrier
    // for device backends: returns kTimeout/kCommFailure when one of them failed or timed out.
    Status barrier();
    // Waits until every operation this rank issued on this communicator has completed (a no-op for CPU
    // backends); reports a failure or timeout of any of them, bounded by timeout_s().
    Status synchronize();
    // Collective: ranks with the same color form one new group, ordered by (key, rank). color ≥ 0.
    // `name` labels the group in error messages ("tp", "ep", ...).
    Result<std::unique_ptr<Communicator>> split(int color, int key, const std::string& name);

protected:
    Communicator(CommIdentity identity, double timeout_s)
        : identity_(std::move(identity)), timeout_s_(timeout_s) {}

    // "rank 3/8" for the world, "ep rank 1/2 (world rank 3/8)" for a sub-group.
    std::string rank_label() const;
    // kTimeout: "<rank_label>: <op> timed out after <timeout> s waiting for peers".
    Status timeout_error(const char* op) const;
    // kCommFailure: "<rank_label>: <op>: <detail>".
    Status comm_failure(const char* op, const std::string& detail) const;

    // Backend operations; arguments are already validated (counts ≥ 0, peers and roots in range,
    // non-null buffers where counts are positive, reduction dtypes supported).
    virtual Status do_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) = 0;
    virtual Status do_all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype) = 0;
    virtual Status do_reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                     ReduceOp op) = 0;
    virtual Status do_all_to_all_v(const AllToAllVArgs& args) = 0;
    virtual Status do_send_recv(const SendRecvArgs& args) = 0;
    virtual Status do_broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
    virtual Status do_barrier() = 0;
    virtual Status do_synchronize() = 0;
    virtual Result<std::unique_ptr<Communicator>> do_split(int color, int key, const std::string& name) = 0;

private:
    Status check_args(const char* op, int64_t count, const void* send, const void* recv) const;
    Status check_peer(const char* op, const char* what, int peer) const;

    CommIdentity identity_;
    double timeout_s_;
};

struct CommOptions {
    double timeout_s = 0.0;  // 0: EPINFER_COMM_TIMEOUT_S (default 300 s)
};

// True when this process was started by an MPI launcher (mpirun/mpiexec of Open MPI, a PMIx or PMI
// launcher such as srun): OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK is set.
bool launched_by_mpi();

// The communicator of all ranks: MPI when launched_by_mpi() (MPI is initialised here with
// MPI_Init_thread, serialized, and finalised when the last communicator is destroyed), else one rank.
// Errors: kNotSupported when launched by MPI but this build has no MPI (EPINFER_MPI=OFF);
// kInvalidArgument for a bad EPINFER_COMM_TIMEOUT_S; kCommFailure when MPI fails to initialise.
Result<std::unique_ptr<Communicator>> create_world_communicator(const CommOptions& options = {});

}  // namespace epinfer
