#include "layers/kv_cache.h"

#include <algorithm>
#include <string>
#include <vector>

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

Result<KvBatchHostMetadata> kv_batch_host_metadata(std::span<const AttentionSequence> sequences,
                                                   int64_t num_rows, int64_t block_table_stride) {
    KvBatchHostMetadata meta;
    meta.num_sequences = static_cast<int64_t>(sequences.size());
    int64_t longest = 1, next_row = 0;
    for (const AttentionSequence& seq : sequences) {
        EPI_RETURN_IF_ERROR(check_kv_capacity(seq));
        if (seq.row_begin != next_row || seq.num_rows < 0) {
            return invalid_argument("attention batch: sequence rows start at " + std::to_string(seq.row_begin) +
                                    " where row " + std::to_string(next_row) + " was expected");
        }
        next_row += seq.num_rows;
        longest = std::max(longest, static_cast<int64_t>(seq.kv->block_table.size()));
    }
    if (next_row != num_rows) {
        return invalid_argument("attention batch: the sequences cover " + std::to_string(next_row) + " of " +
                                std::to_string(num_rows) + " rows");
    }
    if (block_table_stride != 0 && block_table_stride < longest) {
        return invalid_argument("attention batch: block table width " + std::to_string(block_table_stride) +
                                " is below the longest table's " + std::to_string(longest));
    }
    meta.block_table_stride = block_table_stride != 0 ? block_table_stride : longest;
    meta.slot_mapping.resize(static_cast<size_t>(num_rows));
    meta.token_sequence.resize(static_cast<size_t>(num_rows));
    meta.block_tables.assign(static_cast<size_t>(meta.num_sequences * meta.block_table_stride), -1);
    for (size_t s = 0; s < sequences.size(); ++s) {
        const AttentionSequence& seq = sequences[s];
        const LayerKvCache& kv = *seq.kv;
        std::copy(kv.block_table.begin(), kv.block_table.end(),
                  meta.block_tables.begin() + static_cast<int64_t>(s) * meta.block_table_stride);
        for (int64_t i = 0; i < seq.num_rows; ++i) {
            const int64_t p = kv.num_tokens + i;
            const int32_t block = kv.block_table[static_cast<size_t>(p / kv.block_size)];
            if (block < 0) {
                return invalid_argument("attention batch: block table entry " +
                                        std::to_string(p / kv.block_size) + " of sequence " + std::to_string(s) +
                                        " is " + std::to_string(block));
            }
            const size_t row = static_cast<size_t>(seq.row_begin + i);
            meta.slot_mapping[row] = int64_t{block} * kv.block_size + p % kv.block_size;
            meta.token_sequence[row] = static_cast<int32_t>(s);
        }
    }
    return meta;
}

Result<KvBatchMetadata> build_kv_batch_metadata(Backend& backend, std::span<const AttentionSequence> sequences,
                                                int64_t num_rows) {
    EPI_ASSIGN_OR_RETURN(const KvBatchHostMetadata host, kv_batch_host_metadata(sequences, num_rows));
    KvBatchMetadata meta;
    meta.num_rows = num_rows;
    meta.num_sequences = host.num_sequences;
    meta.block_table_stride = host.block_table_stride;
    const auto upload = [&](DeviceBuffer* dst, const void* src, size_t bytes) -> Status {
        EPI_ASSIGN_OR_RETURN(*dst, DeviceBuffer::alloc(backend, bytes));
        return bytes == 0 ? Status::ok() : backend.copy_to_device(dst->data(), src, bytes);
    };
    EPI_RETURN_IF_ERROR(upload(&meta.slot_mapping, host.slot_mapping.data(), host.slot_mapping.size() * 8));
    EPI_RETURN_IF_ERROR(upload(&meta.token_sequence, host.token_sequence.data(), host.token_sequence.size() * 4));
    EPI_RETURN_IF_ERROR(upload(&meta.block_tables, host.block_tables.data(), host.block_tables.size() * 4));
    return meta;
}

Result<const LayerKvCache*> batch_layer_cache(const AttentionBatch& batch) {
    if (batch.sequences.empty() || batch.kv_metadata == nullptr)
        return invalid_argument("attention: a batch without sequences or KV metadata");
    const LayerKvCache* first = batch.sequences.front().kv;
    for (const AttentionSequence& seq : batch.sequences) {
        EPI_RETURN_IF_ERROR(check_kv_capacity(seq));
        if (seq.kv->k_pool != first->k_pool || seq.kv->v_pool != first->v_pool ||
            seq.kv->block_size != first->block_size || seq.kv->num_blocks != first->num_blocks ||
            seq.kv->dtype != first->dtype) {
            return invalid_argument("attention: the sequences of a batch do not share one layer's KV pools");
        }
    }
    return first;
}

Status kv_cache_store_rows(Backend& backend, const AttentionBatch& batch, const LayerKvCache& layer,
                           void* pool, int64_t width, const float* rows) {
    KvCacheStoreArgs args;
    args.src = rows;
    args.pool = pool;
    args.pool_dtype = layer.dtype;
    args.slot_mapping = static_cast<const int64_t*>(batch.kv_metadata->slot_mapping.data());
    args.num_tokens = batch.kv_metadata->num_rows;
    args.width = width;
    args.src_row_stride = width;
    args.num_pool_rows = layer.num_blocks * layer.block_size;
    return backend.kv_cache_store(args);
}

void set_paged_attention(const AttentionBatch& batch, const LayerKvCache& layer, AttentionArgs* args) {
    const KvBatchMetadata& meta = *batch.kv_metadata;
    args->kv_block_tables = static_cast<const int32_t*>(meta.block_tables.data());
    args->token_sequence = static_cast<const int32_t*>(meta.token_sequence.data());
    args->num_sequences = meta.num_sequences;
    args->block_table_stride = meta.block_table_stride;
    args->kv_block_size = layer.block_size;
    args->kv_dtype = layer.dtype;
    args->num_kv_tokens = meta.block_table_stride * layer.block_size;
}

Status kv_cache_gather_rows(Backend& backend, const LayerKvCache& kv, const void* pool, int64_t width,
                            int64_t num_rows, float* out) {
    const char* what = "kv cache gather";
    if (kv.dtype != DType::kF32 && kv.dtype != DType::kBF16) {
        return not_supported(std::string(what) + ": pool dtype " + dtype_name(kv.dtype) +
                             " is not supported (F32 or BF16)");
    }
    EPI_RETURN_IF_ERROR(check_range(what, kv, width, 0, num_rows));
    if (num_rows == 0) return Status::ok();
    if (pool == nullptr || out == nullptr) return invalid_argument(std::string(what) + ": null pool or out");
    const auto* pool_bytes = static_cast<const uint8_t*>(pool);
    const size_t row_bytes = static_cast<size_t>(width) * dtype_size(kv.dtype);
    return for_each_pool_run(kv, 0, num_rows, [&](int64_t pool_row, int64_t offset, int64_t length) {
        const void* src = pool_bytes + static_cast<size_t>(pool_row) * row_bytes;
        if (kv.dtype == DType::kF32) {
            return backend.copy_on_device(out + offset * width, src, static_cast<size_t>(length) * row_bytes);
        }
        CastArgs cast;
        cast.src = src;
        cast.src_dtype = DType::kBF16;
        cast.dst = out + offset * width;
        cast.dst_dtype = DType::kF32;
        cast.num_elements = length * width;
        return backend.cast(cast);
    });
}

}  // namespace epinfer
