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
