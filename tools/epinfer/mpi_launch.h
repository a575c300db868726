// Starting this process's own ranks through mpirun on one host.
//
// `epinfer generate --tp 2`, `epinfer serve --ep 2`, `epinfer bench comm --ranks 4`, ... run as one
// process; when it is not already under an MPI launcher and needs more than one rank, it starts
//   mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --stdin none -np N <this executable>
//          <same arguments>
// whose ranks then see the launcher's environment and run the command themselves, and stays as mpirun's
// supervisor: mpirun runs in a process group of its own (a terminal's Ctrl-C reaches the supervisor only)
// and gets SIGTERM when the supervisor dies; a SIGTERM or SIGINT to the supervisor is passed on to mpirun
// as MpirunStop says; the supervisor exits with mpirun's exit status. mpirun's stderr passes through the
// supervisor, which drops Open MPI's boxed report of a rank's non-zero exit ("Primary job terminated
// normally, but 1 process returned a non-zero exit code...", "mpirun detected that one or more processes
// exited with non-zero status..."): the rank's own error line and the exit status say it; an
// "epinfer: error: " line that several ranks print alike is passed on once; every other line, Open MPI's
// other messages included, passes on. Under an external mpirun or srun
// (several hosts), the given world is used as it is.
#pragma once

#include <csignal>
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

// What the supervisor does with each SIGTERM or SIGINT it receives.
struct MpirunStop {
    // Sent to mpirun each time. SIGTERM: mpirun ends the ranks (SIGTERM, then SIGKILL a few seconds
    // later) and exits non-zero. SIGUSR1 (or SIGUSR2): Open MPI's mpirun forwards it to every rank and
    // lets them run on, for ranks that stop on their own when it comes (epinfer serve: drain).
    int signal = SIGTERM;
    // From the first SIGTERM/SIGINT, how long mpirun may take to exit; then its process group gets
    // SIGTERM, and if that does not end it within 10 s, SIGKILL.
    double exit_timeout_s = 30.0;
};

// When num_ranks > 1 and this process is not under an MPI launcher, runs this same command line (read
// from /proc/self/cmdline) on num_ranks ranks under mpirun, supervises it (see above, `stop`) and exits
// with its exit status (128 + the signal when a signal ended it); it returns only when mpirun could not be
// started. Otherwise returns OK at once and the caller goes on in this process.
// Errors: kNotFound when mpirun is missing; kInternal when fork or exec fails.
Status relaunch_under_mpirun_if_needed(int num_ranks, const MpirunStop& stop = {});

}  // namespace epinfer::cli
