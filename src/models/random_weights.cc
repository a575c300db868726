#include "models/random_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/weight_names.h"
#include "core/splitmix64.h"

namespace epinfer {

namespace {

// FNV-1a of a name.
uint64_t name_hash(const std::string& name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char ch : name) {
        h ^= static_cast<unsigned char>(ch);
        h *= 0x100000001b3ull;
    }
    return h;
}

// `value` in `dtype` (F32, F16, BF16), written to dst.
void store(DType dtype, float value, unsigned char* dst) {
    if (dtype == DType::kF32) {
        std::memcpy(dst, &value, sizeof(float));
    } else {
        const uint16_t bits = dtype == DType::kBF16 ? f32_to_bf16(value) : f32_to_f16(value);
        std::memcpy(dst, &bits, sizeof(bits));
    }
}

enum class FillKind { kOnes, kZeros, kUniform };

struct RandomTensor {
    TensorInfo info;
    FillKind kind = FillKind::kUniform;
    int64_t row_elems = 0;  // K: the last dimension (the whole tensor when 1-D)
    float scale = 0.0f;     // kUniform: values in ±scale
    uint64_t offset = 0;    // o: in [0, N − K]
};

// One run of rows of a slice: num_rows rows of row_elems elements, consecutive in the pool from
// pool_elem, written to the slice from dst_elem (both pitched: pool by K, slice by row_elems).
struct RowRun {
    int64_t dst_elem = 0, pool_elem = 0, num_rows = 0;
};

class RandomSource final : public TensorSource {
public:
    RandomSource(const ModelConfig& config, const RandomWeightsOptions& options, Backend& backend)
        : backend_(backend), dtype_(options.dtype), seed_(options.seed) {
        name_ = fmt::format("random weights (seed {})", options.seed);
        int64_t max_k = 1;
        for (ExpectedTensor& t : expected_tensors(config)) {
            RandomTensor r;
            r.info.name = std::move(t.name);
            r.info.dtype = dtype_;
            r.info.shape = std::move(t.shape);
            r.info.data_begin = 0;
            r.info.data_end = static_cast<uint64_t>(r.info.numel()) * dtype_size(dtype_);
            r.row_elems = r.info.shape.empty() ? 1 : r.info.shape.back();
            if (r.info.shape.size() <= 1) {
                r.kind = r.info.name.find("norm") != std::string::npos ? FillKind::kOnes : FillKind::kZeros;
            } else {
                r.scale = static_cast<float>(
                    1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(1, r.row_elems))));
                max_k = std::max(max_k, r.row_elems);
            }
            tensors_.emplace(r.info.name, std::move(r));
        }
        pool_elems_ = kRandomWeightsPoolElems;
        while (pool_elems_ < 2 * max_k) pool_elems_ *= 2;
        for (auto& [name, r] : tensors_) {
            if (r.kind != FillKind::kUniform) continue;
            uint64_t state = seed_ ^ name_hash(name);
            const uint64_t starts = static_cast<uint64_t>(pool_elems_ - r.row_elems + 1);
            r.offset = splitmix64(state) % starts;
        }
    }

    const std::string& name() const override { return name_; }

    const TensorInfo* find(const std::string& name) const override {
        const auto it = tensors_.find(name);
        return it == tensors_.end() ? nullptr : &it->second.info;
    }

    const void* host_data(const TensorInfo&) const override { return nullptr; }

    Status write_to_device(const TensorInfo& info, const TensorSlice& slice, void* dst) override {
        const RandomTensor& t = tensors_.at(info.name);
        const size_t elem = dtype_size(dtype_);
        if (t.kind != FillKind::kUniform) {
            std::vector<unsigned char> host(tensor_slice_bytes(info, slice));
            fill_constant(t, host.data(), host.size() / elem);
            return backend_.copy_to_device(dst, host.data(), host.size());
        }
        EPI_ASSIGN_OR_RETURN(const Pool* pool, scaled_pool(t.scale));
        const auto* src = static_cast<const unsigned char*>(pool->device.data());
        auto* out = static_cast<unsigned char*>(dst);
        const int64_t width = slice_row_elems(t, slice);
        for (const RowRun& run : row_runs(t, slice)) {
            const size_t row_bytes = static_cast<size_t>(width) * elem;
            const size_t src_pitch = static_cast<size_t>(t.row_elems) * elem;
            unsigned char* d = out + static_cast<size_t>(run.dst_elem) * elem;
            const unsigned char* s = src + static_cast<size_t>(run.pool_elem) * elem;
            if (width == t.row_elems) {
                EPI_RETURN_IF_ERROR(
                    backend_.copy_on_device(d, s, row_bytes * static_cast<size_t>(run.num_rows)));
            } else {
                EPI_RETURN_IF_ERROR(backend_.copy_rows_on_device(d, row_bytes, s, src_pitch, row_bytes,
                                                                 static_cast<size_t>(run.num_rows)));
            }
        }
        return Status::ok();
    }

    Status read_to_host(const TensorInfo& info, const TensorSlice& slice, void* dst) override {
        const RandomTensor& t = tensors_.at(info.name);
        const size_t elem = dtype_size(dtype_);
        auto* out = static_cast<unsigned char*>(dst);
        if (t.kind != FillKind::kUniform) {
            fill_constant(t, out, tensor_slice_bytes(info, slice) / elem);
            return Status::ok();
        }
        EPI_ASSIGN_OR_RETURN(const Pool* pool, scaled_pool(t.scale));
        const int64_t width = slice_row_elems(t, slice);
        for (const RowRun& run : row_runs(t, slice)) {
            for (int64_t r = 0; r < run.num_rows; ++r) {
                std::memcpy(out + static_cast<size_t>(run.dst_elem + r * width) * elem,
                            pool->host.data() + static_cast<size_t>(run.pool_elem + r * t.row_elems) * elem,
                            static_cast<size_t>(width) * elem);
            }
        }
        return Status::ok();
    }

private:
    struct Pool {
        std::vector<unsigned char> host;  // [N] dtype_
        DeviceBuffer device;              // the same, on the backend
    };

    void fill_constant(const RandomTensor& t, unsigned char* dst, size_t count) const {
        const size_t elem = dtype_size(dtype_);
        unsigned char value[4];
        store(dtype_, t.kind == FillKind::kOnes ? 1.0f : 0.0f, value);
        for (size_t i = 0; i < count; ++i) std::memcpy(dst + i * elem, value, elem);
    }

    // Elements per row of the slice: K, or the column range of a slice of the last dimension.
    static int64_t slice_row_elems(const RandomTensor& t, const TensorSlice& slice) {
        const bool cols = slice.dim >= 0 && static_cast<size_t>(slice.dim) + 1 == t.info.shape.size();
        return cols ? slice.range.size : t.row_elems;
    }

    // The runs of pool-consecutive rows that make up `slice` of `t`, in slice order.
    std::vector<RowRun> row_runs(const RandomTensor& t, const TensorSlice& slice) const {
        const std::vector<int64_t>& shape = t.info.shape;
        const int64_t K = t.row_elems;
        const int64_t num_rows = K == 0 ? 0 : t.info.numel() / K;
        int64_t row_begin = 0, row_end = num_rows, col_begin = 0;
        if (slice.dim >= 0 && static_cast<size_t>(slice.dim) + 1 == shape.size()) {
            col_begin = slice.range.begin;
        } else if (slice.dim >= 0) {
            int64_t rows_per_index = 1;  // rows of the folded [R, K] per index of dimension slice.dim
            for (size_t d = static_cast<size_t>(slice.dim) + 1; d + 1 < shape.size(); ++d)
                rows_per_index *= shape[d];
            row_begin = slice.range.begin * rows_per_index;
            row_end = slice.range.end() * rows_per_index;
        }
        const int64_t width = slice_row_elems(t, slice);
        const int64_t starts = pool_elems_ - K + 1;  // M
        std::vector<RowRun> runs;
        for (int64_t r = row_begin; r < row_end;) {
            const int64_t s =
                static_cast<int64_t>((t.offset + static_cast<uint64_t>(r) * static_cast<uint64_t>(K)) %
                                     static_cast<uint64_t>(starts));
            const int64_t n = std::min(row_end - r, (starts - 1 - s) / K + 1);
            runs.push_back({(r - row_begin) * width, s + col_begin, n});
            r += n;
        }
        return runs;
    }

    // The pool scaled by `scale` in dtype_, on the host and the backend (made on first use).
    Result<const Pool*> scaled_pool(float scale) {
        uint32_t key = 0;
        std::memcpy(&key, &scale, sizeof(key));
        const auto it = pools_.find(key);
        if (it != pools_.end()) return &it->second;
        if (unit_pool_.empty()) {
            unit_pool_.resize(static_cast<size_t>(pool_elems_));
            uint64_t state = seed_;
            // 24 random bits → [0, 1) → [−1, 1).
            for (float& v : unit_pool_) v = static_cast<float>(splitmix64(state) >> 40) * 0x1.0p-23f - 1.0f;
        }
        const size_t elem = dtype_size(dtype_);
        Pool pool;
        pool.host.resize(unit_pool_.size() * elem);
        for (size_t i = 0; i < unit_pool_.size(); ++i)
            store(dtype_, unit_pool_[i] * scale, pool.host.data() + i * elem);
        EPI_ASSIGN_OR_RETURN(pool.device, DeviceBuffer::alloc(backend_, pool.host.size()));
        EPI_RETURN_IF_ERROR(backend_.copy_to_device(pool.device.data(), pool.host.data(), pool.host.size()));
        return &pools_.emplace(key, std::move(pool)).first->second;
    }

    Backend& backend_;
    DType dtype_;
    uint64_t seed_;
    std::string name_;
    std::unordered_map<std::string, RandomTensor> tensors_;
    int64_t pool_elems_ = 0;          // N
    std::vector<float> unit_pool_;    // [N] in [−1, 1)
    std::map<uint32_t, Pool> pools_;  // by the scale's bits
};

}  // namespace

Result<std::unique_ptr<TensorSource>> make_random_tensor_source(const ModelConfig& config,
                                                                const RandomWeightsOptions& options,
                                                                Backend& backend) {
    if (options.dtype != DType::kF32 && options.dtype != DType::kF16 && options.dtype != DType::kBF16) {
        return invalid_argument(
            fmt::format("random weights: dtype {} is not F32, F16 or BF16", dtype_name(options.dtype)));
    }
    return std::unique_ptr<TensorSource>(new RandomSource(config, options, backend));
}

}  // namespace epinfer
