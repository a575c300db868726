#include "layers/linear.h"

namespace epinfer {

namespace {

MatmulArgs linear_args(const Linear& linear, const float* x, int64_t num_rows, float* y,
                       int64_t x_row_stride) {
    MatmulArgs args;
    args.x = x;
    args.w = linear.weight;
    args.w_dtype = linear.dtype;
    args.bias = linear.bias;
    args.bias_dtype = linear.bias_dtype;
    args.y = y;
    args.num_rows = num_rows;
    args.out_features = linear.out_features;
    args.in_features = linear.in_features;
    args.x_row_stride = x_row_stride > 0 ? x_row_stride : linear.in_features;
    args.y_row_stride = linear.out_features;
    return args;
}

// RMSNorm of rows of `width` values (row_stride 0: packed rows) into out, at the same row stride.
RmsNormArgs rms_norm_args(const RmsNormWeight& norm, const float* x, int64_t num_rows, float* out,
                          int64_t row_stride) {
    RmsNormArgs args;
    args.x = x;
    args.weight = norm.weight;
    args.weight_dtype = norm.dtype;
    args.out = out;
    args.num_rows = num_rows;
    args.width = norm.width;
    args.x_row_stride = row_stride > 0 ? row_stride : norm.width;
    args.out_row_stride = args.x_row_stride;
    args.eps = norm.eps;
    return args;
}

}  // namespace

Status linear_forward(Backend& backend, const Linear& linear, const float* x, int64_t num_rows, float* y,
                      int64_t x_row_stride) {
    return backend.matmul(linear_args(linear, x, num_rows, y, x_row_stride));
}

Status linear_group_forward(Backend& backend, std::initializer_list<LinearOutput> parts, const float* x,
                            int64_t num_rows) {
    if (parts.size() > MatmulGroupArgs::kMaxMatmuls) {
        return invalid_argument("linear group: " + std::to_string(parts.size()) + " parts, at most " +
                                std::to_string(MatmulGroupArgs::kMaxMatmuls));
    }
    MatmulGroupArgs group;
    for (const LinearOutput& part : parts) {
        MatmulArgs& m = group.matmuls[group.num_matmuls++];
        m = linear_args(*part.linear, x, num_rows, part.y, 0);
        if (part.y_row_stride != 0) m.y_row_stride = part.y_row_stride;
    }
    return backend.matmul_group(group);
}

Status rms_norm_forward(Backend& backend, const RmsNormWeight& norm, const float* x, int64_t num_rows,
                        float* out, int64_t row_stride) {
    return backend.rms_norm(rms_norm_args(norm, x, num_rows, out, row_stride));
}

Status add_rms_norm_forward(Backend& backend, const RmsNormWeight& norm, float* hidden, const float* residual,
                            int64_t num_rows, float* out) {
    RmsNormArgs args = rms_norm_args(norm, hidden, num_rows, out, 0);
    args.residual = residual;
    args.sum_out = hidden;
    return backend.rms_norm(args);
}

}  // namespace epinfer
