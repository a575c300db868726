// Random weights at the real shapes of a config (Model::create_random): a TensorSource that holds every
// tensor of expected_tensors(config) (checkpoint/weight_names.h) without storing any of them.
//
// Values: 1-D tensors whose name holds "norm" are 1 (RMSNorm weights), other 1-D tensors 0 (biases,
// e_score_correction_bias); a tensor of rank ≥ 2 with last dimension K (a Linear [out, in], the
// embedding [V, H], a router [E, H]) is uniform in ±1/sqrt(K).
//
// The scheme, fast for a 60 GB model on a GPU: a pool of N uniform values in [−1, 1) is drawn once on the
// host from the seed (splitmix64; N = 4M, or 2 × the largest K when larger). For each distinct scale the
// pool is scaled, converted to the dtype and uploaded once. A tensor [R, K] (leading dimensions folded
// into R) is the rows pool[s_r, s_r + K) with s_r = (o + r·K) mod (N − K + 1) and o a hash of the seed
// and the tensor name: consecutive rows are consecutive in the pool until s wraps, so a tensor, a row
// slice or a column slice (as load slices under a layout) is a few device-to-device copies of up to N
// elements (copy_on_device / copy_rows_on_device), and a slice holds the same values as the same part of
// the whole tensor. No per-element work on the host beyond the pool.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "checkpoint/model_config.h"
#include "core/status.h"
#include "models/model.h"
#include "models/tensor_source.h"

namespace epinfer {

// Smallest pool (elements).
inline constexpr int64_t kRandomWeightsPoolElems = int64_t{1} << 22;

// The tensors of `config` with random values, written through `backend` (which must outlive the source;
// the source's device pools are freed with it). Errors: kInvalidArgument for a dtype other than F32,
// F16, BF16; the backend's memory errors.
Result<std::unique_ptr<TensorSource>> make_random_tensor_source(const ModelConfig& config,
                                                                const RandomWeightsOptions& options,
                                                                Backend& backend);

}  // namespace epinfer
