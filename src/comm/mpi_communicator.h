// The MPI backend of Communicator (CPU ranks, Open MPI). No MPI type crosses this header.
//
// Every operation is non-blocking MPI (MPI_Iallreduce, MPI_Ialltoallv, MPI_Isend/MPI_Irecv, MPI_Ibarrier,
// ...) polled with MPI_Testall against the communicator's deadline, so no wait outlives timeout_s().
// Errors are returned (MPI_ERRORS_RETURN), never raised by MPI's default abort handler.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace epinfer {

// True when this build has the MPI backend (CMake EPINFER_MPI=ON).
bool mpi_available();

// Initialises MPI (MPI_Init_thread, MPI_THREAD_SERIALIZED) unless already initialised, and returns a
// duplicate of MPI_COMM_WORLD named "world". MPI is finalised when the last MPI communicator is
// destroyed, after a barrier bounded by timeout_s proves every rank is shutting down; without it (a peer
// is stuck or gone) MPI is left unfinalised and mpirun ends the job when this process exits, as it does
// for a process whose fatal error path exits without destroying its communicators.
// Errors: kNotSupported without the MPI backend or after MPI was finalised; kCommFailure when MPI
// fails; kTimeout when the world does not assemble within timeout_s.
Result<std::unique_ptr<Communicator>> create_mpi_world_communicator(double timeout_s);

}  // namespace epinfer
