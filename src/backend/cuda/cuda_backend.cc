#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/dense_ops.cuh"
#include "backend/cuda/kernels/moe_router.cuh"

namespace epinfer {

namespace {

// Indices of the data-dependent error flags in the backend's device flag array.
constexpr int kEmbeddingFlag = 0;
constexpr int kAttentionFlag = 1;
constexpr int kNumFlags = 2;

Status cublas_status(cublasStatus_t status, const char* call) {
    return internal_error(std::string("cuBLAS error ") + cublasGetStatusName(status) + " in " + call);
}

#define EPI_CUBLAS_CHECK(expr)                                                   \
    do {                                                                         \
        const cublasStatus_t epi_cublas_status_ = (expr);                        \
        if (epi_cublas_status_ != CUBLAS_STATUS_SUCCESS)                         \
            return cublas_status(epi_cublas_status_, #expr);                     \
    } while (0)

class CudaBackend final : public Backend {
public:
    CudaBackend() = default;
    ~CudaBackend() override {
        if (stream_ != nullptr) cudaStreamSynchronize(stream_);
        if (w_f32_ != nullptr) cudaFree(w_f32_);
        if (flags_ != nullptr) cudaFree(flags_);
        if (cublas_ != nullptr) cublasDestroy(cublas_);
        if (stream_ != nullptr) cudaStreamDestroy(stream_);
    }
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    Status init(int device) {
        EPI_CUDA_CHECK(cudaSetDevice(device));
        EPI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        EPI_CUBLAS_CHECK(cublasCreate(&cublas_));
        EPI_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
        EPI_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));  // fp32 throughout, no TF32
        EPI_CUDA_CHECK(cudaMalloc(&flags_, kNumFlags * sizeof(int32_t)));
        EPI_CUDA_CHECK(cudaMemset(flags_, 0, kNumFlags * sizeof(int32_t)));
        return Status::ok();
    }

    const char* name() const override { return "cuda"; }
    bool host_accessible() const override { return false; }

    Result<void*> alloc(size_t num_bytes) override {
        void* ptr = nullptr;
        const cudaError_t err = cudaMalloc(&ptr, num_bytes == 0 ? 1 : num_bytes);  // 256-byte aligned
        if (err != cudaSuccess) {
            cudaGetLastError();  // a failed cudaMalloc is not sticky: clear it so later checks do not see it
            return Status(StatusCode::kOutOfMemory, "cuda: cannot allocate " + std::to_string(num_bytes) +
                                                        " bytes: " + cudaGetErrorString(err));
        }
        return ptr;
    }
    void free(void* ptr) override {
        if (ptr == nullptr) return;
        cudaStreamSynchronize(stream_);  // ops issued before may still read it
        cudaFree(ptr);
    }

    Status copy_to_device(void* dst, const void* host_src, size_t num_bytes) override {
        return copy_sync(dst, host_src, num_bytes, cudaMemcpyHostToDevice);
    }
    Status copy_to_host(void* host_dst, const void* src, size_t num_bytes) override {
        return copy_sync(host_dst, src, num_bytes, cudaMemcpyDeviceToHost);
    }
    Status copy_on_device(void* dst, const void* src, size_t num_bytes) override {
        if (num_bytes == 0 || dst == src) return Status::ok();
        EPI_CUDA_CHECK(cudaMemcpyAsync(dst, src, num_bytes, cudaMemcpyDeviceToDevice, stream_));
        return Status::ok();
    }
    Status copy_rows_on_device(void* dst, size_t dst_pitch_bytes, const void* src, size_t src_pitch_bytes,
                               size_t row_bytes, size_t num_rows) override {
        if (num_rows > 0 && (row_bytes > dst_pitch_bytes || row_bytes > src_pitch_bytes)) {
            return invalid_argument("copy_rows: row of " + std::to_string(row_bytes) + " bytes exceeds a pitch");
        }
        if (num_rows == 0 || row_bytes == 0) return Status::ok();
        EPI_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch_bytes, src, src_pitch_bytes, row_bytes, num_rows,
                                         cudaMemcpyDeviceToDevice, stream_));
        return Status::ok();
    }

    Status synchronize() override {
        EPI_CUDA_CHECK(cudaStreamSynchronize(stream_));
        int32_t flags[kNumFlags] = {0, 0};
        EPI_CUDA_CHECK(cudaMemcpy(flags, flags_, sizeof(flags), cudaMemcpyDeviceToHost));
        if (flags[kEmbeddingFlag] == 0 && flags[kAttentionFlag] == 0) return Status::ok();
        EPI_CUDA_CHECK(cudaMemset(flags_, 0, sizeof(flags)));
        return invalid_argument(flags[kEmbeddingFlag] != 0
                                    ? "embedding: a token id was outside [0, vocab_size) (rows written as zeros)"
                                    : "attention: a query position was outside the cached tokens "
                                      "(rows written as zeros)");
    }

    Status embedding(const EmbeddingArgs& args) override {
        EPI_RETURN_IF_ERROR(embedding_check(args));
        EPI_CUDA_CHECK(cuda::launch_embedding(args, flags_ + kEmbeddingFlag, stream_));
        return Status::ok();
    }
    Status rms_norm(const RmsNormArgs& args) override {
        EPI_RETURN_IF_ERROR(rms_norm_check(args));
        EPI_CUDA_CHECK(cuda::launch_rms_norm(args, stream_));
        return Status::ok();
    }
    Status matmul(const MatmulArgs& args) override;
    Status rope(const RopeArgs& args) override {
        EPI_RETURN_IF_ERROR(rope_check(args));
        EPI_CUDA_CHECK(cuda::launch_rope(args, stream_));
        return Status::ok();
    }
    Status attention(const AttentionArgs& args) override {
        EPI_RETURN_IF_ERROR(attention_check(args));
        if (args.head_dim_v > cuda::kAttentionMaxHeadDimV) {
            return not_supported("attention: head_dim_v " + std::to_string(args.head_dim_v) +
                                 " exceeds the CUDA kernel's limit " + std::to_string(cuda::kAttentionMaxHeadDimV));
        }
        EPI_CUDA_CHECK(cuda::launch_attention(args, flags_ + kAttentionFlag, stream_));
        return Status::ok();
    }
    Status silu_mul(const SiluMulArgs& args) override {
        EPI_RETURN_IF_ERROR(silu_mul_check(args));
        EPI_CUDA_CHECK(cuda::launch_silu_mul(args, stream_));
        return Status::ok();
    }
    Status add(const AddArgs& args) override {
        EPI_RETURN_IF_ERROR(add_check(args));
        EPI_CUDA_CHECK(cuda::launch_add(args, stream_));
        return Status::ok();
    }
    Status add_sigmoid_gated(const AddSigmoidGatedArgs& args) override {
        EPI_RETURN_IF_ERROR(add_sigmoid_gated_check(args));
        EPI_CUDA_CHECK(cuda::launch_add_sigmoid_gated(args, stream_));
        return Status::ok();
    }
    Status moe_router_topk(const MoeRouterTopkArgs& args) override {
        EPI_RETURN_IF_ERROR(moe_router_topk_check(args));
        if (args.num_experts > cuda::kRouterMaxExperts) {
            return not_supported("moe_router_topk: num_experts " + std::to_string(args.num_experts) +
                                 " exceeds the CUDA kernel's limit " + std::to_string(cuda::kRouterMaxExperts));
        }
        EPI_CUDA_CHECK(cuda::launch_moe_router_topk(args, stream_));
        return Status::ok();
    }

private:
    Status copy_sync(void* dst, const void* src, size_t num_bytes, cudaMemcpyKind kind) {
        if (num_bytes == 0) return Status::ok();
        EPI_CUDA_CHECK(cudaMemcpyAsync(dst, src, num_bytes, kind, stream_));
        EPI_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return Status::ok();
    }

    // An fp32 scratch of at least num_floats elements (grown after the stream drains).
    Result<float*> weight_scratch(int64_t num_floats) {
        const size_t need = static_cast<size_t>(num_floats) * sizeof(float);
        if (need > w_f32_bytes_) {
            EPI_CUDA_CHECK(cudaStreamSynchronize(stream_));
            if (w_f32_ != nullptr) EPI_CUDA_CHECK(cudaFree(w_f32_));
            w_f32_ = nullptr;
            w_f32_bytes_ = 0;
            const cudaError_t err = cudaMalloc(&w_f32_, need);
            if (err != cudaSuccess) {
                cudaGetLastError();
                return Status(StatusCode::kOutOfMemory, "cuda matmul: cannot allocate the " +
                                                            std::to_string(need) + "-byte fp32 weight scratch");
            }
            w_f32_bytes_ = need;
        }
        return w_f32_;
    }

    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    int32_t* flags_ = nullptr;  // [kNumFlags] int32, device
    float* w_f32_ = nullptr;    // [w_f32_bytes_ / 4] fp32, device: upcast F16/BF16 weights
    size_t w_f32_bytes_ = 0;
};

Status CudaBackend::matmul(const MatmulArgs& args) {
    EPI_RETURN_IF_ERROR(matmul_check(args));
    const int64_t T = args.num_rows, N = args.out_features, K = args.in_features;
    if (T == 0 || N == 0) return Status::ok();
    for (const int64_t v : {T, N, K, args.x_row_stride, args.y_row_stride}) {
        if (v > INT_MAX) return not_supported("matmul: size " + std::to_string(v) + " exceeds cuBLAS's int range");
    }
    const float* w = static_cast<const float*>(args.w);  // [N, K] fp32, device
    if (args.w_dtype != DType::kF32) {
        auto scratch = weight_scratch(N * K);
        EPI_RETURN_IF_ERROR(scratch.status());
        EPI_CUDA_CHECK(cuda::launch_to_f32(args.w, args.w_dtype, *scratch, N * K, stream_));
        w = *scratch;
    }
    // Row-major y[T, N] = x[T, K] · W[N, K]ᵀ is column-major yᵀ[N, T] = op_T(W as [K, N]) · xᵀ[K, T].
    const float alpha = 1.0f, beta = 0.0f;
    EPI_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(T),
                                 static_cast<int>(K), &alpha, w, static_cast<int>(K), args.x,
                                 static_cast<int>(args.x_row_stride), &beta, args.y,
                                 static_cast<int>(args.y_row_stride)));
    if (args.bias != nullptr) {
        EPI_CUDA_CHECK(cuda::launch_add_bias(args.y, args.y_row_stride, args.bias, args.bias_dtype, T, N, stream_));
    }
    return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(int device) {
    EPI_RETURN_IF_ERROR(cuda::cuda_require_device());
    int count = 0;
    EPI_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device < 0 || device >= count) {
        return not_supported("cuda: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                             " visible)");
    }
    auto backend = std::make_unique<CudaBackend>();
    EPI_RETURN_IF_ERROR(backend->init(device));
    return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace epinfer
