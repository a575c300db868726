// Weight storage formats the planner sizes, with the bytes per element including their scales.
//
//   bf16   2-byte elements                                             2
//   fp8    e4m3 + one fp32 scale per 128×128 block (weight_scale_inv)  1 + 4/16384 = 1.000244
//   int4   4 bit + one bf16 scale per 32 along K (compressed-tensors)  0.5 + 2/32  = 0.5625
//   nvfp4  e2m1 + one e4m3 scale per 16 (per-tensor fp32 ignored)      0.5 + 1/16  = 0.5625
//   mxfp4  e2m1 + one e8m0 scale per 32 (OCP MX; gpt-oss experts)      0.5 + 1/32  = 0.53125
//   fp32   4-byte elements (F32 checkpoints the CPU engine runs; not a --weight-dtype choice)  4
// Sources: DeepSeek-V3 README_WEIGHTS.md (FACTS.md A.4 [S10]); gpt-oss README (FACTS.md A.4 [S21]);
// K2.5/K2.6 group size 32 (FACTS.md A.4 [S7][S8]); the OCP Microscaling spec and NVIDIA's NVFP4
// description for the fp4 block sizes (docs/planner.md).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "checkpoint/model_config.h"
#include "core/status.h"

namespace epinfer::planner {

enum class WeightFormat { kBf16, kFp8Block128, kInt4Group32, kNvfp4, kMxfp4, kFp32 };

// "bf16", "fp8", "int4", "nvfp4", "mxfp4", "fp32".
const char* weight_format_name(WeightFormat format);
// The --weight-dtype names: every format but fp32.
std::optional<WeightFormat> weight_format_from_name(std::string_view name);
// Bytes per weight element, scales included (table above).
double weight_bytes_per_element(WeightFormat format);

// The tensor-core rate a GEMM on weights of this format runs at.
enum class MathRate { kBf16, kFp8, kFp4 };
// bf16 → bf16; fp8 → fp8 (w8a8, dynamic activation scales); int4 → bf16 (w4a16: dequantised in the GEMM);
// nvfp4, mxfp4 → fp4; fp32 → bf16 (read at twice the bytes). A GPU without the rate falls back to bf16
// (cost_model.h).
MathRate weight_math_rate(WeightFormat format);

// Formats per part of the model.
struct WeightFormats {
    WeightFormat routed_experts = WeightFormat::kBf16;
    WeightFormat dense = WeightFormat::kBf16;  // attention, dense MLP layers, shared experts
    // Embedding, LM head, router gates and norms: bf16 in every published checkpoint and in every plan;
    // fp32 only for the F32 checkpoints the engine's memory check sizes (check_fits).
    WeightFormat other = WeightFormat::kBf16;
    bool operator==(const WeightFormats&) const = default;
};

// The checkpoint's own formats: quant_method "fp8" → every linear layer fp8 (DeepSeek-V3, Kimi K2);
// "mxfp4" → routed experts mxfp4, the rest bf16 (gpt-oss); anything else → bf16.
WeightFormats checkpoint_weight_formats(const ModelConfig& config);

// Parses --weight-dtype: "D" sets every part; "experts=D", "dense=D" or both, comma separated, set one
// part and keep the other from `base`. D is a weight_format_name.
// Errors: kInvalidArgument naming the text and listing the formats.
Result<WeightFormats> parse_weight_dtype(const std::string& text, const WeightFormats& base);

// e.g. "experts int4, dense bf16" or "fp8" when both parts agree.
std::string weight_formats_to_string(const WeightFormats& formats);

}  // namespace epinfer::planner
