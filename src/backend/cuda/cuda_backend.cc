#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/cuda/attention_dispatch.h"
#include "backend/cuda/cuda_moe_experts.h"
#include "backend/cuda/cuda_moe_layer.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels/argmax.cuh"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/dense_ops.cuh"
#include "backend/cuda/kernels/matmul_small_t.cuh"
#include "backend/cuda/kernels/moe_router.cuh"
#include "backend/cuda/kernels/qk_norm_rope_kv_store.cuh"
#include "backend/cuda/kernels/sampling_floor.cuh"

namespace epinfer {

namespace {

// Indices of the data-dependent error flags in the backend's device flag array.
constexpr int kEmbeddingFlag = 0;
constexpr int kAttentionFlag = 1;
constexpr int kKvCacheStoreFlag = 2;
constexpr int kNumFlags = 3;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

Status cublas_status(cublasStatus_t status, const char* call) {
    return internal_error(std::string("cuBLAS error ") + cublasGetStatusName(status) + " in " + call);
}

#define EPI_CUBLAS_CHECK(expr)                                                   \
    do {                                                                         \
        const cublasStatus_t epi_cublas_status_ = (expr);                        \
        if (epi_cublas_status_ != CUBLAS_STATUS_SUCCESS)                         \
            return cublas_status(epi_cublas_status_, #expr);                     \
    } while (0)

// A CUDA graph instantiated from a stream capture, launched on the backend's stream.
class CudaOpGraph final : public OpGraph {
public:
    CudaOpGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
    ~CudaOpGraph() override { cudaGraphExecDestroy(exec_); }
    CudaOpGraph(const CudaOpGraph&) = delete;
    CudaOpGraph& operator=(const CudaOpGraph&) = delete;
    Status replay() override {
        EPI_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
        return Status::ok();
    }

private:
    cudaGraphExec_t exec_;
    cudaStream_t stream_;
};

class CudaBackend final : public Backend {
public:
    CudaBackend() = default;
    ~CudaBackend() override {
        if (stream_ != nullptr) cudaStreamSynchronize(stream_);
        moe_experts_.reset();
        // Buffers still allocated from the pool (a DeviceBuffer outliving its backend) keep it alive until
        // they are freed (cudaMemPoolDestroy's contract).
        if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
        if (flags_ != nullptr) cudaFree(flags_);
        if (cublas_ != nullptr) cublasDestroy(cublas_);
        if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
        if (stream_ != nullptr) cudaStreamDestroy(stream_);
    }
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    Status init(const CudaBackendOptions& options) {
        const int device = options.device;
        device_ = device;
        fp32_activations_ = options.fp32_activations;
        EPI_CUDA_CHECK(cudaSetDevice(device));
        EPI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        EPI_CUBLAS_CHECK(cublasCreate(&cublas_));
        EPI_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
        // A workspace of our own, so cuBLAS allocates nothing while ops are recorded into a graph.
        EPI_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
        EPI_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
        EPI_CUDA_CHECK(cudaMalloc(&flags_, kNumFlags * sizeof(int32_t)));
        EPI_CUDA_CHECK(cudaMemset(flags_, 0, kNumFlags * sizeof(int32_t)));
        // The stream-ordered pool of alloc/free: memory freed by one layer's temporaries is reused by the
        // next without a device synchronisation; nothing is released to the driver at synchronisation
        // points (threshold UINT64_MAX) until an allocation fails (alloc trims the pool and retries once).
        cudaMemPoolProps props = {};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        EPI_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
        uint64_t threshold = UINT64_MAX;
        EPI_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
        EPI_CUDA_CHECK(cuda::query_attention_device(device, &attention_device_));
        moe_experts_ = std::make_unique<cuda::CudaMoeExperts>(attention_device_.num_sms,
                                                              cuda::moe_default_narrow_max_rows(device));
        return Status::ok();
    }

    const char* name() const override { return "cuda"; }
    void* stream() const { return stream_; }
    bool host_accessible() const override { return false; }
    Result<DeviceMemory> memory_info() const override {
        EPI_CUDA_CHECK(cudaSetDevice(device_));
        size_t free_bytes = 0, total_bytes = 0;
        EPI_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        // Memory the allocation pool holds but no buffer uses is free to alloc too.
        uint64_t reserved = 0, used = 0;
        EPI_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
        EPI_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used));
        const size_t idle = reserved > used ? static_cast<size_t>(reserved - used) : 0;
        return DeviceMemory{static_cast<int64_t>(free_bytes + idle), static_cast<int64_t>(total_bytes)};
    }

    // Stream-ordered: the memory may be used by ops issued after alloc; free returns it to the pool once
    // the ops issued before it have run (no synchronisation).
    Result<void*> alloc(size_t num_bytes) override {
        use_device();
        const size_t bytes = num_bytes == 0 ? 1 : num_bytes;
        void* ptr = nullptr;
        cudaError_t err = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream_);  // ≥ 256-byte aligned
        if (err != cudaSuccess) {
            cudaGetLastError();  // a failed allocation is not sticky: clear it so later checks do not see it
            // Memory freed to the pool but not yet reusable, or held for other sizes: return it and retry.
            cudaStreamSynchronize(stream_);
            cudaMemPoolTrimTo(pool_, 0);
            err = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream_);
        }
        if (err != cudaSuccess) {
            cudaGetLastError();
            return Status(StatusCode::kOutOfMemory, "cuda: cannot allocate " + std::to_string(num_bytes) +
                                                        " bytes: " + cudaGetErrorString(err));
        }
        return ptr;
    }
    void free(void* ptr) override {
        use_device();
        if (ptr == nullptr) return;
        cudaFreeAsync(ptr, stream_);  // after the ops issued before, which may still read it
    }

    Status copy_to_device(void* dst, const void* host_src, size_t num_bytes) override {
        use_device();
        return copy_sync(dst, host_src, num_bytes, cudaMemcpyHostToDevice);
    }
    Status copy_to_host(void* host_dst, const void* src, size_t num_bytes) override {
        use_device();
        return copy_sync(host_dst, src, num_bytes, cudaMemcpyDeviceToHost);
    }
    Status copy_on_device(void* dst, const void* src, size_t num_bytes) override {
        use_device();
        if (num_bytes == 0 || dst == src) return Status::ok();
        EPI_CUDA_CHECK(cudaMemcpyAsync(dst, src, num_bytes, cudaMemcpyDeviceToDevice, stream_));
        return Status::ok();
    }
    Status copy_rows_on_device(void* dst, size_t dst_pitch_bytes, const void* src, size_t src_pitch_bytes,
                               size_t row_bytes, size_t num_rows) override {
        use_device();
        if (num_rows > 0 && (row_bytes > dst_pitch_bytes || row_bytes > src_pitch_bytes)) {
            return invalid_argument("copy_rows: row of " + std::to_string(row_bytes) + " bytes exceeds a pitch");
        }
        if (num_rows == 0 || row_bytes == 0) return Status::ok();
        EPI_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch_bytes, src, src_pitch_bytes, row_bytes, num_rows,
                                         cudaMemcpyDeviceToDevice, stream_));
        return Status::ok();
    }

    Status synchronize() override {
        use_device();
        EPI_CUDA_CHECK(cudaStreamSynchronize(stream_));
        int32_t flags[kNumFlags] = {};
        EPI_CUDA_CHECK(cudaMemcpy(flags, flags_, sizeof(flags), cudaMemcpyDeviceToHost));
        if (std::all_of(flags, flags + kNumFlags, [](int32_t f) { return f == 0; })) return Status::ok();
        EPI_CUDA_CHECK(cudaMemset(flags_, 0, sizeof(flags)));
        if (flags[kEmbeddingFlag] != 0)
            return invalid_argument("embedding: a token id was outside [0, vocab_size) (rows written as zeros)");
        if (flags[kAttentionFlag] != 0) {
            return invalid_argument(
                "attention: a query position was outside the cached tokens or its token_sequence outside the "
                "block tables (rows written as zeros), or a block table entry it reached was negative");
        }
        return invalid_argument("kv_cache_store: a slot_mapping entry was outside the pool (row skipped)");
    }

    bool supports_op_graphs() const override { return true; }
    Status begin_capture() override {
        use_device();
        EPI_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        return Status::ok();
    }
    Result<std::unique_ptr<OpGraph>> end_capture() override {
        use_device();
        cudaGraph_t graph = nullptr;
        const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
        if (err != cudaSuccess) {
            cudaGetLastError();  // a capture broken by an op: clear it, the stream is usable again
            if (graph != nullptr) cudaGraphDestroy(graph);
            return internal_error(std::string("cuda: stream capture failed: ") + cudaGetErrorString(err));
        }
        cudaGraphExec_t exec = nullptr;
        const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        if (inst != cudaSuccess) {
            cudaGetLastError();
            return internal_error(std::string("cuda: cannot instantiate the captured graph: ") +
                                  cudaGetErrorString(inst));
        }
        return std::unique_ptr<OpGraph>(std::make_unique<CudaOpGraph>(exec, stream_));
    }

    Status embedding(const EmbeddingArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(embedding_check(args));
        EPI_CUDA_CHECK(cuda::launch_embedding(args, flags_ + kEmbeddingFlag, stream_));
        return Status::ok();
    }
    Status rms_norm(const RmsNormArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(rms_norm_check(args));
        EPI_CUDA_CHECK(cuda::launch_rms_norm(args, stream_));
        return Status::ok();
    }
    bool has_latent_attention_kernel() const override { return attention_device_.latent_kernel; }
    Status matmul(const MatmulArgs& args) override;
    // Whether a cuBLAS matmul of these weights runs on tensor cores (bf16 weights, x rounded to bf16).
    bool tensor_core_matmul(DType w_dtype) const { return w_dtype == DType::kBF16 && !fp32_activations_; }
    Status matmul_group(const MatmulGroupArgs& args) override;
    Status batched_matmul(const BatchedMatmulArgs& args) override;
    Status rope(const RopeArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(rope_check(args));
        EPI_CUDA_CHECK(cuda::launch_rope(args, stream_));
        return Status::ok();
    }
    Status attention(const AttentionArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(attention_check(args));
        if (args.head_dim_v > cuda::kAttentionMaxHeadDimV) {
            return not_supported("attention: head_dim_v " + std::to_string(args.head_dim_v) +
                                 " exceeds the CUDA kernel's limit " + std::to_string(cuda::kAttentionMaxHeadDimV));
        }
        const cuda::AttentionDispatch dispatch = cuda::plan_attention_dispatch(args, attention_device_);
        EPI_ASSIGN_OR_RETURN(DeviceBuffer workspace, DeviceBuffer::alloc(*this, dispatch.split().workspace_bytes));
        EPI_CUDA_CHECK(
            cuda::launch_attention_dispatch(args, dispatch, workspace.data(), flags_ + kAttentionFlag, stream_));
        return Status::ok();
    }
    Status kv_cache_store(const KvCacheStoreArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(kv_cache_store_check(args));
        EPI_CUDA_CHECK(cuda::launch_kv_cache_store(args, flags_ + kKvCacheStoreFlag, stream_));
        return Status::ok();
    }
    Status qk_norm_rope_kv_store(const QkNormRopeKvStoreArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(qk_norm_rope_kv_store_check(args));
        if (!cuda::qk_norm_rope_kv_store_fusable(args)) return Backend::qk_norm_rope_kv_store(args);
        EPI_CUDA_CHECK(cuda::launch_qk_norm_rope_kv_store(args, flags_ + kKvCacheStoreFlag, stream_));
        return Status::ok();
    }
    Status argmax(const ArgmaxArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(argmax_check(args));
        if (args.draws != nullptr)
            EPI_CUDA_CHECK(cuda::launch_sampling_floor(args, attention_device_.num_sms, stream_));
        EPI_CUDA_CHECK(cuda::launch_argmax(args, attention_device_.num_sms, stream_));
        return Status::ok();
    }
    Status silu_mul(const SiluMulArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(silu_mul_check(args));
        EPI_CUDA_CHECK(cuda::launch_silu_mul(args, stream_));
        return Status::ok();
    }
    Status add(const AddArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(add_check(args));
        EPI_CUDA_CHECK(cuda::launch_add(args, stream_));
        return Status::ok();
    }
    Status add_sigmoid_gated(const AddSigmoidGatedArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(add_sigmoid_gated_check(args));
        EPI_CUDA_CHECK(cuda::launch_add_sigmoid_gated(args, stream_));
        return Status::ok();
    }
    Status cast(const CastArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(cast_check(args));
        if (args.dst_dtype == DType::kBF16) {
            const int64_t n = args.num_elements;  // one row of n
            EPI_CUDA_CHECK(
                cuda::launch_f32_rows_to_bf16(static_cast<const float*>(args.src), n, 1, n, args.dst, stream_));
        } else {
            EPI_CUDA_CHECK(cuda::launch_to_f32(args.src, args.src_dtype, static_cast<float*>(args.dst),
                                               args.num_elements, stream_));
        }
        return Status::ok();
    }
    Status moe_experts(const MoeExpertsArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(moe_experts_check(args));
        return moe_experts_->run(*this, args, stream_, fp32_activations_);
    }
    Status moe_router_topk(const MoeRouterTopkArgs& args) override {
        use_device();
        EPI_RETURN_IF_ERROR(moe_router_topk_check(args));
        if (args.num_experts > cuda::kRouterMaxExperts) {
            return not_supported("moe_router_topk: num_experts " + std::to_string(args.num_experts) +
                                 " exceeds the CUDA kernel's limit " + std::to_string(cuda::kRouterMaxExperts));
        }
        if (args.top_k > cuda::kRouterMaxTopK) {
            return not_supported("moe_router_topk: top_k " + std::to_string(args.top_k) +
                                 " exceeds the CUDA kernel's limit " + std::to_string(cuda::kRouterMaxTopK));
        }
        EPI_CUDA_CHECK(cuda::launch_moe_router_topk(args, stream_));
        return Status::ok();
    }

private:
    // Every entry's y = bf16(x) · Wᵀ (+ bias) for bf16 weights on cuBLAS's tensor cores: the shared x rounded
    // to bf16 once ([T, K] packed, from the pool), fp32 accumulation and output; stacked entries as one GEMM.
    // @pre matmul_group_check(entries), every w_dtype kBF16, T ≥ 1.
    Status bf16_gemms(const MatmulGroupArgs& entries);

    Status copy_sync(void* dst, const void* src, size_t num_bytes, cudaMemcpyKind kind) {
        if (num_bytes == 0) return Status::ok();
        EPI_CUDA_CHECK(cudaMemcpyAsync(dst, src, num_bytes, kind, stream_));
        EPI_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return Status::ok();
    }

    int device_ = 0;

    // Makes this backend's GPU the calling thread's current device: the engine loop's thread, or any
    // thread of a process that is one GPU rank of several, starts on device 0.
    void use_device() const {
        int current = -1;
        if (cudaGetDevice(&current) != cudaSuccess || current != device_) cudaSetDevice(device_);
    }
    bool fp32_activations_ = false;  // CudaBackendOptions::fp32_activations
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    int32_t* flags_ = nullptr;  // [kNumFlags] int32, device
    void* cublas_workspace_ = nullptr;  // [kCublasWorkspaceBytes]
    cuda::AttentionDevice attention_device_;  // SMs and which attention kernels fit (attention_dispatch.h)
    cudaMemPool_t pool_ = nullptr;
    std::unique_ptr<cuda::CudaMoeExperts> moe_experts_;
};

namespace {

// The group as one entry of the concatenated weights where its entries are stacked (MatmulGroupArgs: weights,
// outputs and biases each right after the previous entry's), else the group itself. Weights of one dtype.
MatmulGroupArgs stacked_as_one(const MatmulGroupArgs& group) {
    const auto bytes_after = [](const void* p, int64_t elements, DType dtype) {
        return static_cast<const unsigned char*>(p) + elements * static_cast<int64_t>(dtype_size(dtype));
    };
    MatmulArgs one = group.matmuls[0];
    for (int i = 1; i < group.num_matmuls; ++i) {
        const MatmulArgs& prev = group.matmuls[i - 1];
        const MatmulArgs& m = group.matmuls[i];
        const bool stacked =
            m.w == bytes_after(prev.w, prev.out_features * prev.in_features, prev.w_dtype) &&
            m.y == prev.y + prev.out_features && m.y_row_stride == one.y_row_stride &&
            (m.bias == nullptr) == (one.bias == nullptr) &&
            (m.bias == nullptr || (m.bias_dtype == one.bias_dtype &&
                                   m.bias == bytes_after(prev.bias, prev.out_features, prev.bias_dtype)));
        if (!stacked) return group;
        one.out_features += m.out_features;
    }
    if (one.out_features > one.y_row_stride) return group;  // the entries' rows would overlap
    MatmulGroupArgs merged;
    merged.matmuls[0] = one;
    merged.num_matmuls = 1;
    return merged;
}

// cuBLAS takes int sizes and strides.
Status cublas_sizes_check(const MatmulArgs& a) {
    for (const int64_t v : {a.num_rows, a.out_features, a.in_features, a.x_row_stride, a.y_row_stride}) {
        if (v > INT_MAX)
            return not_supported("matmul: size " + std::to_string(v) + " exceeds cuBLAS's int range");
    }
    return Status::ok();
}

}  // namespace

Status CudaBackend::matmul(const MatmulArgs& args) {
    use_device();
    EPI_RETURN_IF_ERROR(matmul_check(args));
    const int64_t T = args.num_rows, N = args.out_features, K = args.in_features;
    if (T == 0 || N == 0) return Status::ok();
    MatmulGroupArgs one;
    one.matmuls[0] = args;
    one.num_matmuls = 1;
    // Decode sizes on the few-row kernel: W read once, fp32 activations.
    if (cuda::matmul_small_t_takes(T, K, tensor_core_matmul(args.w_dtype))) {
        EPI_CUDA_CHECK(cuda::launch_matmul_small_t(one, stream_));
        return Status::ok();
    }
    if (tensor_core_matmul(args.w_dtype)) return bf16_gemms(one);
    EPI_RETURN_IF_ERROR(cublas_sizes_check(args));
    // fp32 SGEMM without TF32; F16 weights are first upcast to an fp32 scratch from the pool. Row-major
    // y[T, N] = x[T, K] · W[N, K]ᵀ is column-major yᵀ[N, T] = op_T(W as [K, N]) · xᵀ[K, T].
    const int n = static_cast<int>(N), t = static_cast<int>(T), k = static_cast<int>(K);
    const float alpha = 1.0f, beta = 0.0f;
    const float* w = static_cast<const float*>(args.w);  // [N, K] fp32, device
    DeviceBuffer w_f32;
    if (args.w_dtype != DType::kF32) {
        EPI_ASSIGN_OR_RETURN(w_f32, DeviceBuffer::alloc_f32(*this, N * K));
        EPI_CUDA_CHECK(cuda::launch_to_f32(args.w, args.w_dtype, w_f32.f32(), N * K, stream_));
        w = w_f32.f32();
    }
    EPI_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));
    EPI_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, t, k, &alpha, w, k, args.x,
                                 static_cast<int>(args.x_row_stride), &beta, args.y,
                                 static_cast<int>(args.y_row_stride)));
    if (args.bias != nullptr) {
        EPI_CUDA_CHECK(cuda::launch_add_bias(args.y, args.y_row_stride, args.bias, args.bias_dtype, T, N, stream_));
    }
    return Status::ok();
}

Status CudaBackend::bf16_gemms(const MatmulGroupArgs& entries) {
    // Stacked entries (MatmulGroupArgs) as one GEMM: at 17–256 rows a cuBLAS GEMM of Qwen3-30B-A3B's k or v
    // projection takes ~5 µs, about what the stacked q/k/v GEMM adds to q's (H200,
    // docs/benchmarks/serving.md).
    const MatmulGroupArgs group = stacked_as_one(entries);
    for (int i = 0; i < group.num_matmuls; ++i) EPI_RETURN_IF_ERROR(cublas_sizes_check(group.matmuls[i]));
    const MatmulArgs& first = group.matmuls[0];
    const int64_t T = first.num_rows, K = first.in_features;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer x_bf16, DeviceBuffer::alloc(*this, static_cast<size_t>(T * K) * 2));
    EPI_CUDA_CHECK(cuda::launch_f32_rows_to_bf16(first.x, first.x_row_stride, T, K, x_bf16.data(), stream_));
    EPI_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    const float alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < group.num_matmuls; ++i) {
        const MatmulArgs& m = group.matmuls[i];
        // Row-major y[T, N] = x[T, K] · W[N, K]ᵀ is column-major yᵀ[N, T] = op_T(W as [K, N]) · xᵀ[K, T].
        const int n = static_cast<int>(m.out_features), t = static_cast<int>(T), k = static_cast<int>(K);
        EPI_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, t, k, &alpha, m.w, CUDA_R_16BF, k,
                                      x_bf16.data(), CUDA_R_16BF, k, &beta, m.y, CUDA_R_32F,
                                      static_cast<int>(m.y_row_stride), CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        if (m.bias != nullptr) {
            EPI_CUDA_CHECK(
                cuda::launch_add_bias(m.y, m.y_row_stride, m.bias, m.bias_dtype, T, m.out_features, stream_));
        }
    }
    return Status::ok();
}

Status CudaBackend::matmul_group(const MatmulGroupArgs& group) {
    use_device();
    EPI_RETURN_IF_ERROR(matmul_group_check(group));
    const MatmulArgs& first = group.matmuls[0];
    const bool one_dtype = std::all_of(group.matmuls, group.matmuls + group.num_matmuls,
                                       [&](const MatmulArgs& m) { return m.w_dtype == first.w_dtype; });
    const int64_t T = first.num_rows, K = first.in_features;
    if (T == 0) return Status::ok();
    if (one_dtype && cuda::matmul_small_t_takes(T, K, tensor_core_matmul(first.w_dtype))) {
        EPI_CUDA_CHECK(cuda::launch_matmul_small_t(group, stream_));
        return Status::ok();
    }
    if (!one_dtype || !tensor_core_matmul(first.w_dtype)) return Backend::matmul_group(group);
    // The entries share x: rounded to bf16 once for all of them (measured on the H200, Qwen3-30B-A3B decode
    // at 256 rows: q, k and v each converted x again, 3.2 µs a launch; docs/benchmarks/serving.md).
    return bf16_gemms(group);
}

Status CudaBackend::batched_matmul(const BatchedMatmulArgs& a) {
    use_device();
    EPI_RETURN_IF_ERROR(batched_matmul_check(a));
    const int64_t T = a.num_rows, B = a.num_batches, N = a.out_features, K = a.in_features;
    if (T == 0) return Status::ok();
    // cuBLAS wants leading dimensions ≥ the rows of a column; with one token the token stride is unused.
    const int64_t ld_y = T == 1 ? std::max(a.y_token_stride, N) : a.y_token_stride;
    const int64_t ld_x = T == 1 ? std::max(a.x_token_stride, K) : a.x_token_stride;
    if (ld_y < N) {
        return not_supported("batched_matmul: y_token_stride " + std::to_string(a.y_token_stride) +
                             " is below out_features " + std::to_string(N) + " (cuBLAS needs token-major rows)");
    }
    for (const int64_t v : {T, B, N, K, ld_x, ld_y, B * K}) {
        if (v > INT_MAX) {
            return not_supported("batched_matmul: size " + std::to_string(v) + " exceeds cuBLAS's int range");
        }
    }
    // Row-major y_b[T, N] = x_b[T, K] · op(W_b) is column-major y_bᵀ[N, T] = op'(W_b) · x_bᵀ[K, T], where W_b
    // read column-major is [K, N] with ld K (kNK: transpose it) or [N, K] with ld N (kKN: as is).
    const bool kn = a.w_layout == BatchedWeightLayout::kKN;
    const cublasOperation_t op_w = kn ? CUBLAS_OP_N : CUBLAS_OP_T;
    const int n = static_cast<int>(N), t = static_cast<int>(T), k = static_cast<int>(K), b = static_cast<int>(B);
    const int ld_w = kn ? n : k;
    const float alpha = 1.0f, beta = 0.0f;
    if (tensor_core_matmul(a.w_dtype)) {
        // x rounded to bf16 once into [T, B, K] (packed, from the pool); x_b = rows b, b + B, ...: ld B·K.
        EPI_ASSIGN_OR_RETURN(DeviceBuffer x_bf16, DeviceBuffer::alloc(*this, static_cast<size_t>(T * B * K) * 2));
        EPI_CUDA_CHECK(cuda::launch_f32_batched_rows_to_bf16(a.x, a.x_token_stride, a.x_batch_stride, T, B, K,
                                                             x_bf16.data(), stream_));
        EPI_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
        EPI_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            cublas_, op_w, CUBLAS_OP_N, n, t, k, &alpha, a.w, CUDA_R_16BF, ld_w, a.w_batch_stride, x_bf16.data(),
            CUDA_R_16BF, static_cast<int>(B * K), K, &beta, a.y, CUDA_R_32F, static_cast<int>(ld_y),
            a.y_batch_stride, b, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return Status::ok();
    }
    if (ld_x < K) {
        return not_supported("batched_matmul: x_token_stride " + std::to_string(a.x_token_stride) +
                             " is below in_features " + std::to_string(K) + " (cuBLAS needs token-major rows)");
    }
    // fp32 SGEMM without TF32; F16/BF16 weights are first upcast to an fp32 scratch from the pool.
    const float* w = static_cast<const float*>(a.w);
    DeviceBuffer w_f32;
    if (a.w_dtype != DType::kF32) {
        const int64_t count = (B - 1) * a.w_batch_stride + N * K;
        EPI_ASSIGN_OR_RETURN(w_f32, DeviceBuffer::alloc_f32(*this, count));
        EPI_CUDA_CHECK(cuda::launch_to_f32(a.w, a.w_dtype, w_f32.f32(), count, stream_));
        w = w_f32.f32();
    }
    EPI_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));
    EPI_CUBLAS_CHECK(cublasSgemmStridedBatched(cublas_, op_w, CUBLAS_OP_N, n, t, k, &alpha, w, ld_w,
                                               a.w_batch_stride, a.x, static_cast<int>(ld_x), a.x_batch_stride,
                                               &beta, a.y, static_cast<int>(ld_y), a.y_batch_stride, b));
    return Status::ok();
}

}  // namespace

void* cuda_stream_of(Backend& backend) {
    auto* cuda = dynamic_cast<CudaBackend*>(&backend);
    return cuda != nullptr ? cuda->stream() : nullptr;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(int device) {
    CudaBackendOptions options;
    options.device = device;
    return make_cuda_backend(options);
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
    const int device = options.device;
    EPI_RETURN_IF_ERROR(cuda::cuda_require_device());
    int count = 0;
    EPI_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device < 0 || device >= count) {
        return not_supported("cuda: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                             " visible)");
    }
    auto backend = std::make_unique<CudaBackend>();
    EPI_RETURN_IF_ERROR(backend->init(options));
    return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace epinfer
