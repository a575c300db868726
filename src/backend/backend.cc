#include "backend/backend.h"

namespace epinfer {

Result<DeviceBuffer> DeviceBuffer::alloc(Backend& backend, size_t num_bytes) {
    DeviceBuffer buffer;
    buffer.backend_ = &backend;
    if (num_bytes == 0) return buffer;
    EPI_ASSIGN_OR_RETURN(buffer.data_, backend.alloc(num_bytes));
    buffer.num_bytes_ = num_bytes;
    return buffer;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
        reset();
        backend_ = std::exchange(other.backend_, nullptr);
        data_ = std::exchange(other.data_, nullptr);
        num_bytes_ = std::exchange(other.num_bytes_, 0);
    }
    return *this;
}

Status Backend::matmul_group(const MatmulGroupArgs& args) {
    EPI_RETURN_IF_ERROR(matmul_group_check(args));
    for (int i = 0; i < args.num_matmuls; ++i) EPI_RETURN_IF_ERROR(matmul(args.matmuls[i]));
    return Status::ok();
}

Status Backend::qk_norm_rope_kv_store(const QkNormRopeKvStoreArgs& args) {
    EPI_RETURN_IF_ERROR(qk_norm_rope_kv_store_check(args));
    const int64_t T = args.num_tokens, q_row = args.num_heads * args.head_dim;
    const int64_t kv_row = args.num_kv_heads * args.head_dim;
    const QkvTokenStrides strides = qkv_token_strides(args);
    if (T > 0 && (strides.q != q_row || strides.k != kv_row)) {
        // The parts' norms take packed rows: q and k go through packed copies, and back.
        constexpr size_t kF = sizeof(float);
        EPI_ASSIGN_OR_RETURN(DeviceBuffer q, DeviceBuffer::alloc_f32(*this, T * q_row));
        EPI_ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::alloc_f32(*this, T * kv_row));
        const auto copy = [&](float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                              int64_t row) {
            return copy_rows_on_device(dst, static_cast<size_t>(dst_stride) * kF, src,
                                       static_cast<size_t>(src_stride) * kF, static_cast<size_t>(row) * kF,
                                       static_cast<size_t>(T));
        };
        EPI_RETURN_IF_ERROR(copy(q.f32(), q_row, args.q, strides.q, q_row));
        EPI_RETURN_IF_ERROR(copy(k.f32(), kv_row, args.k, strides.k, kv_row));
        QkNormRopeKvStoreArgs packed = args;
        packed.q = q.f32();
        packed.k = k.f32();
        packed.q_token_stride = packed.k_token_stride = 0;
        EPI_RETURN_IF_ERROR(Backend::qk_norm_rope_kv_store(packed));
        EPI_RETURN_IF_ERROR(copy(args.q, strides.q, q.f32(), q_row, q_row));
        return copy(args.k, strides.k, k.f32(), kv_row, kv_row);
    }
    const QkNormRopeKvStoreParts p = qk_norm_rope_kv_store_parts(args);
    if (p.q_norm.num_rows > 0) EPI_RETURN_IF_ERROR(rms_norm(p.q_norm));
    if (p.k_norm.num_rows > 0) EPI_RETURN_IF_ERROR(rms_norm(p.k_norm));
    EPI_RETURN_IF_ERROR(rope(p.q_rope));
    EPI_RETURN_IF_ERROR(rope(p.k_rope));
    EPI_RETURN_IF_ERROR(kv_cache_store(p.k_store));
    return kv_cache_store(p.v_store);
}

void DeviceBuffer::reset() {
    if (data_ != nullptr) backend_->free(data_);
    data_ = nullptr;
    num_bytes_ = 0;
}

}  // namespace epinfer
