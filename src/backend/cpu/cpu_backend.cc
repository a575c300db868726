#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>

#include "backend/cpu/cpu_argmax.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_moe_experts.h"
#include "backend/cpu/moe_router.h"
#include "backend/cpu/thread_pool.h"

namespace epinfer {

namespace {

constexpr size_t kAlignBytes = 64;
constexpr int kMaxDefaultThreads = 8;

// MemAvailable and MemTotal of /proc/meminfo ("MemTotal:       16318436 kB").
Result<DeviceMemory> host_memory_info() {
    const char* path = "/proc/meminfo";
    std::ifstream in(path);
    if (!in) return internal_error(std::string(path) + ": cannot open");
    DeviceMemory memory;
    bool have_free = false, have_total = false;
    std::string key;
    int64_t kib = 0;
    std::string unit;
    while (in >> key >> kib) {
        std::getline(in, unit);
        if (key == "MemAvailable:") {
            memory.free_bytes = kib * 1024;
            have_free = true;
        } else if (key == "MemTotal:") {
            memory.total_bytes = kib * 1024;
            have_total = true;
        }
        if (have_free && have_total) return memory;
    }
    return internal_error(std::string(path) + ": no MemAvailable/MemTotal line");
}

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int num_threads) : pool_(num_threads) {}

    const char* name() const override { return "cpu"; }
    bool host_accessible() const override { return true; }
    Result<DeviceMemory> memory_info() const override { return host_memory_info(); }

    Result<void*> alloc(size_t num_bytes) override {
        const size_t rounded = (std::max<size_t>(num_bytes, 1) + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
        void* ptr = std::aligned_alloc(kAlignBytes, rounded);
        if (ptr == nullptr) {
            return Status(StatusCode::kOutOfMemory,
                          "cpu: cannot allocate " + std::to_string(num_bytes) + " bytes");
        }
        return ptr;
    }
    void free(void* ptr) override { std::free(ptr); }

    Status copy_to_device(void* dst, const void* src, size_t num_bytes) override {
        copy(dst, src, num_bytes);
        return Status::ok();
    }
    Status copy_to_host(void* dst, const void* src, size_t num_bytes) override {
        copy(dst, src, num_bytes);
        return Status::ok();
    }
    Status copy_on_device(void* dst, const void* src, size_t num_bytes) override {
        copy(dst, src, num_bytes);
        return Status::ok();
    }
    Status copy_rows_on_device(void* dst, size_t dst_pitch_bytes, const void* src, size_t src_pitch_bytes,
                               size_t row_bytes, size_t num_rows) override {
        if (num_rows > 0 && (row_bytes > dst_pitch_bytes || row_bytes > src_pitch_bytes)) {
            return invalid_argument("copy_rows: row of " + std::to_string(row_bytes) +
                                    " bytes exceeds a pitch");
        }
        for (size_t r = 0; r < num_rows; ++r) {
            copy(static_cast<uint8_t*>(dst) + r * dst_pitch_bytes,
                 static_cast<const uint8_t*>(src) + r * src_pitch_bytes, row_bytes);
        }
        return Status::ok();
    }
    Status synchronize() override { return Status::ok(); }

    Status embedding(const EmbeddingArgs& args) override {
        EPI_RETURN_IF_ERROR(embedding_check(args));
        return cpu_embedding(args, pool_);
    }
    Status rms_norm(const RmsNormArgs& args) override {
        EPI_RETURN_IF_ERROR(rms_norm_check(args));
        cpu_rms_norm(args, pool_);
        return Status::ok();
    }
    Status matmul(const MatmulArgs& args) override {
        EPI_RETURN_IF_ERROR(matmul_check(args));
        cpu_matmul(args, pool_);
        return Status::ok();
    }
    Status batched_matmul(const BatchedMatmulArgs& args) override {
        EPI_RETURN_IF_ERROR(batched_matmul_check(args));
        cpu_batched_matmul(args, pool_);
        return Status::ok();
    }
    Status rope(const RopeArgs& args) override {
        EPI_RETURN_IF_ERROR(rope_check(args));
        cpu_rope(args, pool_);
        return Status::ok();
    }
    Status attention(const AttentionArgs& args) override {
        EPI_RETURN_IF_ERROR(attention_check(args));
        return cpu_attention(args, pool_);
    }
    Status argmax(const ArgmaxArgs& args) override {
        EPI_RETURN_IF_ERROR(argmax_check(args));
        cpu_argmax(args, pool_);
        return Status::ok();
    }
    Status kv_cache_store(const KvCacheStoreArgs& args) override {
        EPI_RETURN_IF_ERROR(kv_cache_store_check(args));
        return cpu_kv_cache_store(args);
    }
    Status silu_mul(const SiluMulArgs& args) override {
        EPI_RETURN_IF_ERROR(silu_mul_check(args));
        cpu_silu_mul(args);
        return Status::ok();
    }
    Status add(const AddArgs& args) override {
        EPI_RETURN_IF_ERROR(add_check(args));
        cpu_add(args);
        return Status::ok();
    }
    Status add_sigmoid_gated(const AddSigmoidGatedArgs& args) override {
        EPI_RETURN_IF_ERROR(add_sigmoid_gated_check(args));
        cpu_add_sigmoid_gated(args);
        return Status::ok();
    }
    Status cast(const CastArgs& args) override {
        EPI_RETURN_IF_ERROR(cast_check(args));
        cpu_cast(args);
        return Status::ok();
    }
    Status moe_router_topk(const MoeRouterTopkArgs& args) override { return cpu_moe_router_topk(args); }
    Status moe_experts(const MoeExpertsArgs& args) override {
        EPI_RETURN_IF_ERROR(moe_experts_check(args));
        cpu_moe_experts(args, pool_);
        return Status::ok();
    }

private:
    static void copy(void* dst, const void* src, size_t num_bytes) {
        if (num_bytes > 0 && dst != src) std::memmove(dst, src, num_bytes);
    }

    ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int num_threads) {
    if (num_threads <= 0) {
        num_threads =
            std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxDefaultThreads);
    }
    return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace epinfer
