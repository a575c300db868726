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

void DeviceBuffer::reset() {
    if (data_ != nullptr) backend_->free(data_);
    data_ = nullptr;
    num_bytes_ = 0;
}

}  // namespace epinfer
