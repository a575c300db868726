// The communicator of a world of one rank: every collective is a copy (a reduction over one rank is
// the identity), and a send to itself is queued until the matching receive.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace epinfer {

// A one-rank communicator named "world" with the given wait bound (unused: nothing ever waits).
std::unique_ptr<Communicator> create_single_rank_communicator(double timeout_s);

}  // namespace epinfer
