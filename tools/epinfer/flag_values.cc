#include "flag_values.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

namespace epinfer::cli {

Result<int64_t> parse_flag_int(const std::string& text, std::string_view flag, int64_t lo, int64_t hi) {
    int64_t value = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    const bool whole = !text.empty() && ptr == end;
    if (whole && ec == std::errc::result_out_of_range)
        return invalid_argument(fmt::format("{} must be in [{}, {}], got {}", flag, lo, hi, text));
    if (!whole || ec != std::errc()) return invalid_argument(fmt::format("{} '{}' is not an integer", flag, text));
    if (value < lo || value > hi)
        return invalid_argument(fmt::format("{} must be in [{}, {}], got {}", flag, lo, hi, text));
    return value;
}

Result<uint64_t> parse_flag_uint64(const std::string& text, std::string_view flag) {
    uint64_t value = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ec != std::errc() || ptr != end) {
        return invalid_argument(fmt::format("{} '{}' is not an integer in [0, {}]", flag, text,
                                            std::numeric_limits<uint64_t>::max()));
    }
    return value;
}

Result<double> parse_flag_double(const std::string& text, std::string_view flag) {
    double value = 0.0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    const bool whole = !text.empty() && ptr == end;
    // from_chars leaves value unset on overflow and underflow alike; strtod tells them apart (±HUGE_VAL
    // for an overflow, 0 or a denormal for an underflow).
    if (whole && ec == std::errc::result_out_of_range) value = std::strtod(text.c_str(), nullptr);
    if (!whole || (ec != std::errc() && ec != std::errc::result_out_of_range) || !std::isfinite(value))
        return invalid_argument(fmt::format("{} '{}' is not a finite number", flag, text));
    return value;
}

Status check_sampling_flags(double temperature, double top_p, int64_t top_k) {
    if (!(temperature >= 0.0))
        return invalid_argument(fmt::format("--temperature must be ≥ 0 (0: greedy), got {}", temperature));
    if (!(top_p > 0.0 && top_p <= 1.0))
        return invalid_argument(fmt::format("--top-p must be in (0, 1], got {}", top_p));
    if (temperature == 0.0 && top_k > 0)
        return invalid_argument(
            fmt::format("--top-k {} applies to sampled tokens: give --temperature > 0", top_k));
    if (temperature == 0.0 && top_p < 1.0)
        return invalid_argument(
            fmt::format("--top-p {} applies to sampled tokens: give --temperature > 0", top_p));
    return Status::ok();
}

Status check_output_file(std::string_view flag, const std::string& path) {
    std::error_code ec;
    const std::filesystem::path out(path);
    const std::filesystem::path folder = out.has_parent_path() ? out.parent_path() : ".";
    if (std::filesystem::is_directory(out, ec))
        return invalid_argument(fmt::format("{} {}: is a folder, not a file", flag, path));
    if (std::filesystem::exists(out, ec) && access(out.c_str(), W_OK) != 0)
        return invalid_argument(fmt::format("{} {}: the file exists and is not writable", flag, path));
    if (!std::filesystem::is_directory(folder, ec) || access(folder.c_str(), W_OK) != 0) {
        return invalid_argument(fmt::format(
            "{} {}: cannot write into the folder {} (missing or not writable)", flag, path, folder.string()));
    }
    return Status::ok();
}

}  // namespace epinfer::cli
