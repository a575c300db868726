// The CPU reference backend: plain loops, fp32 accumulation, fp32 activations, weights read in place as
// F32/F16/BF16. Ops are multi-threaded over output rows or columns with a small fixed pool; each output
// element is computed by one thread in a fixed summation order, so results do not depend on the thread
// count (tests/unit/backend_cpu checks this).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace epinfer {

// num_threads ≤ 0: std::thread::hardware_concurrency(), at most 8.
std::unique_ptr<Backend> make_cpu_backend(int num_threads = 0);

}  // namespace epinfer
