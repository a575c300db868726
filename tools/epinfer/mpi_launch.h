// Starting this process's own ranks through mpirun on one host.
//
// `epinfer bench comm --ranks 4` (and later `epinfer generate --tp/--ep/--pp`) run as one process; when
// it is not already under an MPI launcher and needs more than one rank, it replaces itself with
//   mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np N <this executable> <same arguments>
// whose ranks then see the launcher's environment and run the command themselves. Under an external
// mpirun or srun (several hosts), the given world is used as it is.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace epinfer::cli {

// Arguments of this process after argv[0], from /proc/self/cmdline (NUL-separated).
// Errors: kInternal when it cannot be read or is empty.
Result<std::vector<std::string>> own_arguments();

// The mpirun executable: EPINFER_MPIRUN when set, else `mpirun` on PATH.
// Errors: kNotFound, one line, when there is none.
Result<std::string> find_mpirun();

// The full mpirun command line (argv) that runs `program` with `args` on num_ranks ranks of this host.
std::vector<std::string> mpirun_argv(const std::string& mpirun, int num_ranks, const std::string& program,
                                     const std::vector<std::string>& args);

// When num_ranks > 1 and this process is not under an MPI launcher, execs mpirun to run this same
// command line (read from /proc/self/cmdline) on num_ranks ranks; it returns only on failure. Otherwise
// returns OK at once and the caller goes on in this process.
// Errors: kNotFound when mpirun is missing; kInternal when exec fails.
Status relaunch_under_mpirun_if_needed(int num_ranks);

}  // namespace epinfer::cli
