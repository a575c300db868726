// Where the weight binder (models/model_weights.cc) takes tensors from: a checkpoint (its mmap) or random
// values (models/random_weights.h). Internal to models/.
#pragma once

#include <string>

#include "checkpoint/safetensors.h"
#include "core/status.h"
#include "parallel/sharding.h"

namespace epinfer {

class TensorSource {
public:
    virtual ~TensorSource() = default;
    // Names the source in error messages: the checkpoint folder, or "random weights (seed N)".
    virtual const std::string& name() const = 0;
    // The tensor called `name` (dtype, shape), or null when absent; valid while the source lives.
    virtual const TensorInfo* find(const std::string& name) const = 0;
    // The whole tensor in host memory that stays valid while the source lives (the mmap), or null when
    // the source has none (its tensors must be written out).
    virtual const void* host_data(const TensorInfo& info) const = 0;
    // Writes `slice` of the tensor (the whole one when slice.dim < 0), row-major in the slice's own
    // shape, to `dst`: device memory of the source's backend (write_to_device) or host memory
    // (read_to_host). The slice lies inside the tensor (the caller checks).
    virtual Status write_to_device(const TensorInfo& info, const TensorSlice& slice, void* dst) = 0;
    virtual Status read_to_host(const TensorInfo& info, const TensorSlice& slice, void* dst) = 0;
};

// Bytes of `slice` of a tensor (the whole one when slice.dim < 0).
inline size_t tensor_slice_bytes(const TensorInfo& info, const TensorSlice& slice) {
    if (slice.dim < 0) return static_cast<size_t>(info.num_bytes());
    const int64_t full = info.shape[static_cast<size_t>(slice.dim)];
    return full == 0 ? 0
                     : static_cast<size_t>(info.numel() / full * slice.range.size) * dtype_size(info.dtype);
}

}  // namespace epinfer
