// The bound on every timeout epinfer takes from its user (flags, EPINFER_COMM_TIMEOUT_S, benchmark levels).
#pragma once

namespace epinfer {

// Seconds (about 31.7 years). Deadlines are std::chrono::steady_clock time points, int64 nanoseconds that
// hold ±292 years: a timeout of 1e10 s would overflow its deadline into the past and every wait would end
// at once, so larger values are refused where they are read.
inline constexpr double kMaxTimeoutSeconds = 1e9;

}  // namespace epinfer
