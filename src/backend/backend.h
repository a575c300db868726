// Backend: the one op interface every compute backend implements (ARCHITECTURE.md §2, STYLE.md R1-R3).
//
// A backend owns its memory (alloc/free/copies) and runs ops described by the POD argument structs of
// backend/op_args.h, backend/moe_router_args.h and backend/moe_experts_args.h. The CPU backend
// (backend/cpu/) is the naive reference every other backend is tested against. No CUDA, NCCL or MPI type
// appears here.
//
// Ops run in issue order; on an asynchronous backend a pointer handed to an op must stay valid until
// synchronize(). Every op validates its arguments (<op>_check) and returns kInvalidArgument or
// kNotSupported without touching memory when they are bad.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "backend/moe_experts_args.h"
#include "backend/moe_router_args.h"
#include "backend/op_args.h"
#include "core/status.h"

namespace epinfer {

// A recorded sequence of ops (a CUDA graph): the same kernels with the same pointers and sizes, run again
// by replay(). Buffers allocated while recording belong to the graph.
class OpGraph {
public:
    virtual ~OpGraph() = default;
    // Runs the recorded ops after the ops issued before (asynchronously, as an op).
    virtual Status replay() = 0;
};

// Memory of the device a backend allocates from, in bytes (Backend::memory_info).
struct DeviceMemory {
    int64_t free_bytes = 0;   // what may still be allocated now
    int64_t total_bytes = 0;  // the device's whole memory
};

class Backend {
public:
    virtual ~Backend() = default;

    // Short name, e.g. "cpu".
    virtual const char* name() const = 0;
    // True when device memory is host memory: checkpoint weights are then used in place from the mmap.
    virtual bool host_accessible() const = 0;

    // Memory. alloc returns 64-byte aligned memory (kOutOfMemory naming the size); free(nullptr) is a no-op.
    virtual Result<void*> alloc(size_t num_bytes) = 0;
    virtual void free(void* ptr) = 0;
    virtual Status copy_to_device(void* dst, const void* host_src, size_t num_bytes) = 0;
    virtual Status copy_to_host(void* host_dst, const void* src, size_t num_bytes) = 0;
    virtual Status copy_on_device(void* dst, const void* src, size_t num_bytes) = 0;
    // num_rows rows of row_bytes each, from src (row pitch src_pitch_bytes) to dst (dst_pitch_bytes),
    // both device memory (a 2-D copy, as cudaMemcpy2D).
    virtual Status copy_rows_on_device(void* dst, size_t dst_pitch_bytes, const void* src,
                                       size_t src_pitch_bytes, size_t row_bytes, size_t num_rows) = 0;
    // Waits for every op issued so far (a no-op on synchronous backends).
    virtual Status synchronize() = 0;
    // The device's free and total memory: CPU the host's MemAvailable and MemTotal (/proc/meminfo), CUDA
    // cudaMemGetInfo of the backend's GPU. Errors: kNotSupported for a backend that cannot tell (the
    // default), kInternal when the figures cannot be read.
    virtual Result<DeviceMemory> memory_info() const {
        return not_supported(std::string("backend ") + name() + " cannot report its memory");
    }

    // Op graphs: between begin_capture() and end_capture() ops are recorded, not run, and must not copy
    // to or from the host or synchronize; end_capture() ends the recording (also after a failed op) and
    // returns the graph. kNotSupported on backends without graphs (the default): run the ops directly.
    virtual bool supports_op_graphs() const { return false; }
    virtual Status begin_capture() { return not_supported(std::string(name()) + ": no op graphs"); }
    virtual Result<std::unique_ptr<OpGraph>> end_capture() {
        return not_supported(std::string(name()) + ": no op graphs");
    }

    // True when attention over MLA's latent cache (one KV head of kv_lora_rank + qk_rope_head_dim, V its
    // first kv_lora_rank) has a kernel of its own that beats attention over the expanded heads at every
    // chunk size, so layers/attention_mla.h absorbs every chunk (the CUDA backend over a bf16 cache:
    // docs/benchmarks/attention_h200.md). False (the default): the layer picks by multiply-adds.
    virtual bool has_latent_attention_kernel() const { return false; }

    // Ops (semantics and shapes: op_args.h, moe_router_args.h, moe_experts_args.h).
    virtual Status embedding(const EmbeddingArgs& args) = 0;
    virtual Status rms_norm(const RmsNormArgs& args) = 0;
    virtual Status matmul(const MatmulArgs& args) = 0;
    // Runs matmul on each entry in order (the reference); a backend may launch them as one.
    virtual Status matmul_group(const MatmulGroupArgs& args);
    virtual Status batched_matmul(const BatchedMatmulArgs& args) = 0;
    virtual Status rope(const RopeArgs& args) = 0;
    virtual Status attention(const AttentionArgs& args) = 0;
    virtual Status kv_cache_store(const KvCacheStoreArgs& args) = 0;
    // Runs the six ops of qk_norm_rope_kv_store_parts(args) in order (the reference); a backend may fuse
    // them.
    virtual Status qk_norm_rope_kv_store(const QkNormRopeKvStoreArgs& args);
    virtual Status argmax(const ArgmaxArgs& args) = 0;
    virtual Status silu_mul(const SiluMulArgs& args) = 0;
    virtual Status add(const AddArgs& args) = 0;
    virtual Status add_sigmoid_gated(const AddSigmoidGatedArgs& args) = 0;
    virtual Status cast(const CastArgs& args) = 0;
    virtual Status moe_router_topk(const MoeRouterTopkArgs& args) = 0;
    // Routed experts: permute, per-expert SwiGLU, weighted combine (moe_experts_args.h).
    virtual Status moe_experts(const MoeExpertsArgs& args) = 0;
};

// Device memory owned by one backend, freed on destruction. Move-only.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    // Errors: as Backend::alloc. A zero-byte buffer holds no memory.
    static Result<DeviceBuffer> alloc(Backend& backend, size_t num_bytes);
    // num_floats fp32 elements (uninitialised).
    static Result<DeviceBuffer> alloc_f32(Backend& backend, int64_t num_floats) {
        return alloc(backend, static_cast<size_t>(num_floats) * sizeof(float));
    }
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return data_; }
    float* f32() const { return static_cast<float*>(data_); }
    size_t num_bytes() const { return num_bytes_; }
    void reset();

private:
    Backend* backend_ = nullptr;
    void* data_ = nullptr;
    size_t num_bytes_ = 0;
};

}  // namespace epinfer
