// Whole-string parses of a flag's text, one per kind of value, and the checks flags share, so that every
// command reads a flag the same way and fails with the same one-line message naming the flag and the value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace epinfer::cli {

// A decimal integer in [lo, hi]. Errors (kInvalidArgument): "<flag> '<text>' is not an integer", "<flag> must
// be in [<lo>, <hi>], got <text>" (also for integers beyond int64).
Result<int64_t> parse_flag_int(const std::string& text, std::string_view flag, int64_t lo, int64_t hi);

// A decimal integer in [0, 2^64 − 1] (seeds). Error: "<flag> '<text>' is not an integer in [0,
// 18446744073709551615]".
Result<uint64_t> parse_flag_uint64(const std::string& text, std::string_view flag);

// A finite decimal number; one below double's smallest magnitude reads as 0 (as strtod and JSON parsers read
// it). Error: "<flag> '<text>' is not a finite number".
Result<double> parse_flag_double(const std::string& text, std::string_view flag);

// The sampling flags of generate and bench, together (the server checks its requests' fields as OpenAI
// names them). Errors (kInvalidArgument): "--temperature must be ≥ 0 (0: greedy), got <t>", "--top-p must be
// in (0, 1], got <p>", "--top-k <k> applies to sampled tokens: give --temperature > 0" (likewise --top-p
// below 1), top_k 0 and top_p 1 being no filter.
Status check_sampling_flags(double temperature, double top_p, int64_t top_k);

// An output file of `flag` (--json, --profile-out) that is written after the run: refused before it when it
// cannot be. Errors (kInvalidArgument): "<flag> <path>: is a folder, not a file", "<flag> <path>: the file
// exists and is not writable", "<flag> <path>: cannot write into the folder <folder> (missing or not
// writable)".
Status check_output_file(std::string_view flag, const std::string& path);

}  // namespace epinfer::cli
