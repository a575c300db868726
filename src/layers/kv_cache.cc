#include "layers/kv_cache.h"

#include <algorithm>

namespace epinfer {

namespace {

// kInvalidArgument unless positions [begin, begin + count) fit kv's block table and their blocks have
// ids ≥ 0; width must be ≥ 1.
Status check_range(const char* what, const LayerKvCache& kv, int64_t width, int64_t begin, int64_t count) {
    if (width < 1)
        return invalid_argument(std::string(what) + ": row width " + std::to_string(width) + " < 1");
    if (count < 0)
        return invalid_argument(std::string(what) + ": negative row count " + std::to_string(count));
    if (count == 0) return Status::ok();
    if (kv.block_size < 1) {
        return invalid_argument(std::string(what) + ": block size " + std::to_string(kv.block_size) + " < 1");
    }
    if (begin + count > kv.capacity()) {
        return invalid_argument(std::string(what) + ": positions up to " + std::to_string(begin + count - 1) +
                                " exceed the block table's " + std::to_string(kv.capacity()) + " tokens");
    }
    for (int64_t b = begin / kv.block_size; b <= (begin + count - 1) / kv.block_size; ++b) {
        if (kv.block_table[static_cast<size_t>(b)] < 0) {
            return invalid_argument(std::string(what) + ": block table entry " + std::to_string(b) + " is " +
                                    std::to_string(kv.block_table[static_cast<size_t>(b)]));
        }
    }
    return Status::ok();
}

// Calls copy(pool_row, offset, length) for each run of positions [begin, begin + count) that is contiguous
// in the pool: positions begin + offset .. begin + offset + length − 1 are pool rows pool_row .. pool_row +
// length − 1. @pre check_range passed.
template <typename Copy>
Status for_each_pool_run(const LayerKvCache& kv, int64_t begin, int64_t count, Copy&& copy) {
    const int64_t bs = kv.block_size;
    int64_t run_row = 0, run_offset = 0, run_length = 0;
    for (int64_t offset = 0; offset < count;) {
        const int64_t p = begin + offset;
        const int64_t row = int64_t{kv.block_table[static_cast<size_t>(p / bs)]} * bs + p % bs;
        const int64_t length = std::min(bs - p % bs, count - offset);  // the rest of this block, at most
        if (run_length > 0 && run_row + run_length == row) {
            run_length += length;
        } else {
            if (run_length > 0) EPI_RETURN_IF_ERROR(copy(run_row, run_offset, run_length));
            run_row = row;
            run_offset = offset;
            run_length = length;
        }
        offset += length;
    }
    return run_length > 0 ? copy(run_row, run_offset, run_length) : Status::ok();
}

}  // namespace

Status kv_cache_write_rows(Backend& backend, const LayerKvCache& kv, float* pool, int64_t width,
                           const float* rows, int64_t num_rows) {
    const char* what = "kv cache write";
    EPI_RETURN_IF_ERROR(check_range(what, kv, width, kv.num_tokens, num_rows));
    if (num_rows == 0) return Status::ok();
    if (pool == nullptr || rows == nullptr)
        return invalid_argument(std::string(what) + ": null pool or rows");
    return for_each_pool_run(
        kv, kv.num_tokens, num_rows, [&](int64_t pool_row, int64_t offset, int64_t length) {
            return backend.copy_on_device(pool + pool_row * width, rows + offset * width,
                                          static_cast<size_t>(length * width) * sizeof(float));
        });
}

Status kv_cache_gather_rows(Backend& backend, const LayerKvCache& kv, const float* pool, int64_t width,
                            int64_t num_rows, float* out) {
    const char* what = "kv cache gather";
    EPI_RETURN_IF_ERROR(check_range(what, kv, width, 0, num_rows));
    if (num_rows == 0) return Status::ok();
    if (pool == nullptr || out == nullptr) return invalid_argument(std::string(what) + ": null pool or out");
    return for_each_pool_run(kv, 0, num_rows, [&](int64_t pool_row, int64_t offset, int64_t length) {
        return backend.copy_on_device(out + offset * width, pool + pool_row * width,
                                      static_cast<size_t>(length * width) * sizeof(float));
    });
}

}  // namespace epinfer
