// The world communicator shared by the MPI tests (created once in mpi_test_main.cc).
//
// Every rank runs every test in the same order, so collectives inside tests match across ranks. An
// assertion that fails on one rank makes the others time out (EPINFER_COMM_TIMEOUT_S), never hang.
#pragma once

#include "comm/communicator.h"

namespace epinfer::mpi_test {

Communicator& world();

}  // namespace epinfer::mpi_test
