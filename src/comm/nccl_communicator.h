// The NCCL backend of Communicator (GPU ranks): buffers are device memory. No NCCL or CUDA type crosses
// this header.
//
// Bootstrap: rank 0 of `bootstrap` makes the ncclUniqueId and broadcasts it over `bootstrap` (the MPI world
// under mpirun; at world size 1 the single-rank communicator, so no MPI is needed). libnccl.so.2 is loaded
// at run time (dlopen) by the first create_nccl_communicator, so binaries built with CUDA start on machines
// without NCCL; only this factory then fails.
// Bounded waits: every NCCL communicator is non-blocking (ncclConfig_t.blocking = 0). Init, split and every
// operation are polled — ncclCommGetAsyncError until the call is enqueued, then cudaStreamQuery until the
// GPU work is done — against a deadline of timeout_s() from the call's start; on expiry the communicator is
// aborted (ncclCommAbort), the call returns kTimeout and later calls kCommFailure (Communicator contract).
// Streams: operations run on the communicator's stream (NcclOptions::stream, else one it creates) and
// return when they have completed on the GPU. Device buffers written on another stream must be ready
// before the call (synchronize that backend first).
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
