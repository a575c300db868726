#include "planner/weight_format.h"

#include <fmt/format.h>

#include <array>

namespace epinfer::planner {
namespace {

constexpr std::array kAllFormats = {WeightFormat::kBf16, WeightFormat::kFp8Block128,
                                    WeightFormat::kInt4Group32, WeightFormat::kNvfp4, WeightFormat::kMxfp4};

Status bad_weight_dtype(const std::string& text) {
    return invalid_argument(fmt::format(
        "--weight-dtype '{}': expected D, experts=D, dense=D or experts=D,dense=D with D one of bf16, fp8, "
        "int4, nvfp4, mxfp4",
        text));
}

}  // namespace

const char* weight_format_name(WeightFormat format) {
    switch (format) {
        case WeightFormat::kBf16:
            return "bf16";
        case WeightFormat::kFp8Block128:
            return "fp8";
        case WeightFormat::kInt4Group32:
            return "int4";
        case WeightFormat::kNvfp4:
            return "nvfp4";
        case WeightFormat::kMxfp4:
            return "mxfp4";
        case WeightFormat::kFp32:
            return "fp32";
    }
    return "?";
}

std::optional<WeightFormat> weight_format_from_name(std::string_view name) {
    for (WeightFormat f : kAllFormats) {
        if (name == weight_format_name(f)) return f;
    }
    return std::nullopt;
}

double weight_bytes_per_element(WeightFormat format) {
    switch (format) {
        case WeightFormat::kBf16:
            return 2.0;
        case WeightFormat::kFp8Block128:
            return 1.0 + 4.0 / (128.0 * 128.0);
        case WeightFormat::kInt4Group32:
            return 0.5 + 2.0 / 32.0;
        case WeightFormat::kNvfp4:
            return 0.5 + 1.0 / 16.0;
        case WeightFormat::kMxfp4:
            return 0.5 + 1.0 / 32.0;
        case WeightFormat::kFp32:
            return 4.0;
    }
    return 2.0;
}

MathRate weight_math_rate(WeightFormat format) {
    switch (format) {
        case WeightFormat::kFp8Block128:
            return MathRate::kFp8;
        case WeightFormat::kNvfp4:
        case WeightFormat::kMxfp4:
            return MathRate::kFp4;
        case WeightFormat::kBf16:
        case WeightFormat::kInt4Group32:
        case WeightFormat::kFp32:
            return MathRate::kBf16;
    }
    return MathRate::kBf16;
}

WeightFormats checkpoint_weight_formats(const ModelConfig& config) {
    WeightFormats formats;
    if (config.quant_method == "fp8") {
        formats.routed_experts = formats.dense = WeightFormat::kFp8Block128;
    } else if (config.quant_method == "mxfp4") {
        formats.routed_experts = WeightFormat::kMxfp4;
    }
    return formats;
}

Result<WeightFormats> parse_weight_dtype(const std::string& text, const WeightFormats& base) {
    if (auto all = weight_format_from_name(text)) return WeightFormats{*all, *all};
    WeightFormats formats = base;
    size_t begin = 0;
    bool any = false, experts = false, dense = false;
    while (begin <= text.size()) {
        size_t end = text.find(',', begin);
        if (end == std::string::npos) end = text.size();
        std::string part = text.substr(begin, end - begin);
        begin = end + 1;
        size_t eq = part.find('=');
        if (eq == std::string::npos) return bad_weight_dtype(text);
        std::string key = part.substr(0, eq);
        auto format = weight_format_from_name(part.substr(eq + 1));
        if (!format) return bad_weight_dtype(text);
        if (key != "experts" && key != "dense") return bad_weight_dtype(text);
        bool& given = key == "experts" ? experts : dense;
        if (given) return invalid_argument(fmt::format("--weight-dtype '{}': {} is given twice", text, key));
        given = true;
        (key == "experts" ? formats.routed_experts : formats.dense) = *format;
        any = true;
    }
    if (!any) return bad_weight_dtype(text);
    return formats;
}

std::string weight_formats_to_string(const WeightFormats& formats) {
    if (formats.routed_experts == formats.dense) return weight_format_name(formats.dense);
    return fmt::format("experts {}, dense {}", weight_format_name(formats.routed_experts),
                       weight_format_name(formats.dense));
}

}  // namespace epinfer::planner
