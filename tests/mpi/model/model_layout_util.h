// Shared by the model tests under mpirun: the layout a test run is given, and prefill logits through a
// paged KV pool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/status.h"
#include "models/model.h"
#include "parallel/layout.h"

namespace epinfer {

// The layout flags in EPINFER_TEST_LAYOUT ("--tp 2 --ep 2 ..."; unset or empty: none).
LayoutFlags layout_flags_from_env();

// This rank's backend for EPINFER_TEST_DEVICE: unset or "cpu", the CPU backend (1 thread); "cuda", GPU
// (local rank mod visible GPUs) with fp32 activations, so that greedy tokens match the fp32 goldens exactly,
// and for several ranks the NCCL world over `world` on the backend's stream (create_parallel_context's
// device_world). Errors: kNotSupported for cuda in a build without CUDA or without a GPU; kInvalidArgument
// for another value.
struct TestRankBackend {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Communicator> device_world;  // null for CPU or one rank
};
Result<TestRankBackend> test_rank_backend(Communicator& world);

// Prefill logits [Σ P, V] fp32 of `prompts`, in one forward over a pool of 4-token blocks (only this rank's
// pipeline stage holds storage; on the CPU backend the host block tables serve as the device ones). Every
// rank calls it, also with no prompt.
Result<std::vector<float>> prefill_logits(Model& model, const std::vector<std::vector<int32_t>>& prompts);

}  // namespace epinfer
