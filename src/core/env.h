// EPINFER_* environment settings: the only place where they are declared, read and documented.
//
// Every variable the runtime reads is a row of env_vars() (name, type, default, doc); `epinfer --help`
// style listings and docs print that table. Readers return the default when the variable is unset or
// empty, and an error naming the variable and its value when it is set to something invalid.
#pragma once

#include <span>
#include <string>

#include "core/status.h"

namespace epinfer {

struct EnvVarInfo {
    const char* name;           // e.g. "EPINFER_COMM_TIMEOUT_S"
    const char* type;           // "seconds", "path", ...
    const char* default_value;  // as text, "" = none
    const char* doc;            // one line
};

// The table of every EPINFER_* variable.
std::span<const EnvVarInfo> env_vars();

// EPINFER_COMM_TIMEOUT_S: the bound, in seconds, on every wait of a communicator (default 300).
// Errors: kInvalidArgument when set to something that is not a number of seconds in (0, kMaxTimeoutSeconds].
Result<double> env_comm_timeout_s();

// EPINFER_MPIRUN: the mpirun executable used to start ranks on this host ("" = search PATH).
std::string env_mpirun();

// EPINFER_PROFILES_DIR: the folder of hardware profiles (*.json) `epinfer plan --hardware NAME` searches
// first ("" = only the folders next to the executable; planner/hardware_profile.h).
std::string env_profiles_dir();

}  // namespace epinfer
