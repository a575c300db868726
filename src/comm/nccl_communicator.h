// The NCCL backend of Communicator (GPU ranks): buffers are device memory. No NCCL or CUDA type crosses
// this header.
//
// Bootstrap: rank 0 of `bootstrap` makes the ncclUniqueId and broadcasts it over `bootstrap` (the MPI world
// under mpirun; at world size 1 the single-rank communicator, so no MPI is needed). libnccl.so.2 is loaded
// at run time (dlopen) by the first create_nccl_communicator, so binaries built with CUDA start on machines
// without NCCL; only this factory then fails.
// Completion: an operation returns once NCCL has queued it on the communicator's stream (NcclOptions::
// stream, else one it creates); work queued on that stream later runs after it, and the host waits only
// in synchronize() or barrier(). So a decode step queues its kernels and collectives without draining the
// GPU at each collective. Device buffers written on another stream must be ready before the call.
// Bounded waits: the communicators are blocking (ncclConfig_t.blocking = 1: a non-blocking one launched each
// collective from an NCCL thread and cost the host ~80 µs per call, docs/benchmarks/multi_gpu.md). The calls
// that wait for peers — init, split, and finalize when a communicator is destroyed — run on a thread of their
// own, waited for until a deadline of timeout_s() from the call's start (past it: kTimeout, the thread left
// behind); init makes every connection (NCCL_RUNTIME_CONNECT=0 unless the user set it), so no later
// enqueue waits for a peer. A watchdog thread per communicator follows the queued operations (a CUDA event
// after each): one still running timeout_s() after its call, or an asynchronous NCCL error, aborts the
// communicator (ncclCommAbort: its kernels exit, so a host wait on the stream returns). The first such
// failure breaks the world and every communicator split from it: their next call, synchronize() or
// barrier() returns kCommFailure quoting it ("... unusable after an earlier failure: rank 1/4:
// all_reduce timed out after 300 s waiting for peers"); a deadline passed while polling returns kTimeout.
// NCCL has no tags: sends and receives between two ranks match in issue order and `tag` is only
// validated; a receive whose count differs from the matching send is not detected (undefined, as in
// NCCL). A send to oneself must be paired with its receive in one send_recv call (a device copy then).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace epinfer {

struct NcclOptions {
    int device = 0;          // CUDA device of this rank
    void* stream = nullptr;  // cudaStream_t the operations run on; nullptr: each communicator creates one
    double timeout_s = 0.0;  // bound of every wait; 0: bootstrap.timeout_s()
};

// True when this build has the NCCL backend (CMake EPINFER_CUDA=ON).
bool nccl_available();

// A communicator over the ranks of `bootstrap` (same ranks, same order), named as it is. Collective over
// `bootstrap`. Errors: kNotSupported without the NCCL backend, when libnccl.so.2 cannot be loaded or the
// device does not exist; kTimeout when the ranks do not assemble within the timeout; kCommFailure naming
// the NCCL error; errors of bootstrap.broadcast.
Result<std::unique_ptr<Communicator>> create_nccl_communicator(Communicator& bootstrap,
                                                               const NcclOptions& options = {});

}  // namespace epinfer
