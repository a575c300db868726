// Weight views and the two simplest layers: nn.Linear and RMSNorm.
//
// A weight view points into memory the model owns (the checkpoint mmap on host backends, an uploaded
// copy otherwise); layers never copy or convert weights.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/status.h"

namespace epinfer {

// nn.Linear: y = x · Wᵀ + b.
struct Linear {
    const void* weight = nullptr;  // [N, K] dtype, device
    DType dtype = DType::kBF16;
    const void* bias = nullptr;  // [N] bias_dtype, device, or nullptr
    DType bias_dtype = DType::kBF16;
    int64_t out_features = 0;  // N
    int64_t in_features = 0;   // K
};

// transformers *RMSNorm: out = weight · (x · rsqrt(mean(x²) + eps)) in fp32.
struct RmsNormWeight {
    const void* weight = nullptr;  // [W] dtype, device; nullptr = no norm
    DType dtype = DType::kBF16;
    int64_t width = 0;  // W
    float eps = 1e-6f;
};

// y = x · Wᵀ + b for T rows. x: [T, K] fp32 device, row stride x_row_stride (0 = K);
// y: [T, N] fp32 device, contiguous.
Status linear_forward(Backend& backend, const Linear& linear, const float* x, int64_t num_rows, float* y,
                      int64_t x_row_stride = 0);

// Projections of the same x in one op (matmul_group: q, k and v; gate and up): y_i = x · W_iᵀ + b_i.
// x: [T, K] fp32 device, contiguous; each y_i: [T, N_i] fp32 device, row stride y_row_stride (0: N_i,
// contiguous). At most MatmulGroupArgs::kMaxMatmuls parts, all with in_features K. Parts whose weights are
// stacked (model_weights.cc) and whose y_i are adjacent column blocks of one output may run as one matmul.
struct LinearOutput {
    const Linear* linear = nullptr;
    float* y = nullptr;
    int64_t y_row_stride = 0;
};
Status linear_group_forward(Backend& backend, std::initializer_list<LinearOutput> parts, const float* x,
                            int64_t num_rows);

// RMSNorm of R rows of width W. x: [R, W] fp32 device, row stride row_stride (0 = W); out may equal x and
// uses the same row stride.
Status rms_norm_forward(Backend& backend, const RmsNormWeight& norm, const float* x, int64_t num_rows,
                        float* out, int64_t row_stride = 0);

// A decoder layer's residual add and the norm after it, in one op (RmsNormArgs::residual):
// hidden += residual, then out = norm(hidden). hidden, residual, out: [R, W] fp32 device, contiguous;
// out must not overlap the others.
Status add_rms_norm_forward(Backend& backend, const RmsNormWeight& norm, float* hidden, const float* residual,
                            int64_t num_rows, float* out);

}  // namespace epinfer
