#include "layers/dense_ffn.h"

namespace epinfer {

Status dense_ffn_forward(Backend& backend, const DenseFfnWeights& w, const float* x, int64_t num_rows,
                         float* y) {
    if (num_rows == 0) return Status::ok();
    const int64_t I = w.gate_proj.out_features;
    EPI_ASSIGN_OR_RETURN(DeviceBuffer gate, DeviceBuffer::alloc_f32(backend, num_rows * I));  // [T, I]
    EPI_ASSIGN_OR_RETURN(DeviceBuffer up, DeviceBuffer::alloc_f32(backend, num_rows * I));    // [T, I]
    EPI_RETURN_IF_ERROR_CTX(
        linear_group_forward(backend, {{&w.gate_proj, gate.f32()}, {&w.up_proj, up.f32()}}, x, num_rows),
        "gate_proj, up_proj");
    SiluMulArgs act;
    act.gate = gate.f32();
    act.up = up.f32();
    act.out = gate.f32();
    act.num_elements = num_rows * I;
    EPI_RETURN_IF_ERROR(backend.silu_mul(act));
    return linear_forward(backend, w.down_proj, gate.f32(), num_rows, y);
}

}  // namespace epinfer
