// Comma-separated flag values (`--tokens 1,8,64`, `--cases decode,mla`), split here rather than by CLI11's
// delimiter, which drops empty items: `--tokens 8,` must be refused, not read as `--tokens 8`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace epinfer::cli {

// The items of every value given for a flag (each split at its commas), in order.
// Errors: kInvalidArgument "<command>: <flag> '<value>' has an empty item (expected <expected>)" for an
// empty value, a leading, trailing or doubled comma.
Result<std::vector<std::string>> split_comma_lists(const std::vector<std::string>& values, const std::string& command,
                                                   const std::string& flag, const std::string& expected);

// The same, each item a decimal int64. Errors: split_comma_lists's, and kInvalidArgument
// "<command>: <flag> '<value>': '<item>' is not an integer".
Result<std::vector<int64_t>> parse_comma_ints(const std::vector<std::string>& values, const std::string& command,
                                              const std::string& flag);

}  // namespace epinfer::cli
