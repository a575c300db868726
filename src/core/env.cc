#include "core/env.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "core/timeout.h"

namespace epinfer {
namespace {

constexpr double kDefaultCommTimeoutS = 300.0;

constexpr std::array kEnvVars = {
    EnvVarInfo{"EPINFER_COMM_TIMEOUT_S", "seconds", "300",
               "bound on every communicator wait; on expiry the operation fails with a rank-tagged timeout"},
    EnvVarInfo{
        "EPINFER_MPIRUN", "path", "",
        "mpirun used to start ranks on this host when not already under MPI (default: mpirun on PATH)"},
    EnvVarInfo{"EPINFER_PROFILES_DIR", "path", "",
               "folder of hardware profiles searched first by `epinfer plan --hardware NAME`"},
};

// The value of `name` (a row of kEnvVars), or "" when unset.
std::string_view env_text(const char* name) {
    const char* value = std::getenv(name);
    return value ? std::string_view(value) : std::string_view();
}

}  // namespace

std::span<const EnvVarInfo> env_vars() {
    return kEnvVars;
}

Result<double> env_comm_timeout_s() {
    std::string_view text = env_text("EPINFER_COMM_TIMEOUT_S");
    if (text.empty()) return kDefaultCommTimeoutS;
    std::string copy(text);
    char* end = nullptr;
    double value = std::strtod(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size() || !std::isfinite(value) || value <= 0.0 ||
        value > kMaxTimeoutSeconds) {
        return invalid_argument(
            fmt::format("EPINFER_COMM_TIMEOUT_S='{}': expected a positive number of seconds up to {:g}", copy,
                        kMaxTimeoutSeconds));
    }
    return value;
}

std::string env_mpirun() {
    return std::string(env_text("EPINFER_MPIRUN"));
}

std::string env_profiles_dir() {
    return std::string(env_text("EPINFER_PROFILES_DIR"));
}

}  // namespace epinfer
