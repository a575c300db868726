// Shared by the model tests under mpirun: the layout a test run is given, and prefill logits through a
// paged KV pool.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "models/model.h"
#include "parallel/layout.h"

namespace epinfer {

// The layout flags in EPINFER_TEST_LAYOUT ("--tp 2 --ep 2 ..."; unset or empty: none).
LayoutFlags layout_flags_from_env();

// Prefill logits [Σ P, V] fp32 of `prompts`, in one forward over a pool of 4-token blocks (only this rank's
// pipeline stage holds storage; on the CPU backend the host block tables serve as the device ones). Every
// rank calls it, also with no prompt.
Result<std::vector<float>> prefill_logits(Model& model, const std::vector<std::vector<int32_t>>& prompts);

}  // namespace epinfer
