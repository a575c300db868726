// libFuzzer target: parse_safetensors_header on arbitrary bytes must return (OK or an error), never
// crash, throw, leak or hit undefined behaviour. Input: 8 bytes little-endian data-section size (fewer
// when the input is shorter), then the header text. Run with scripts/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t num_bytes) {
    const size_t num_size_bytes = num_bytes < 8 ? num_bytes : 8;
    uint64_t data_bytes = 0;
    for (size_t i = 0; i < num_size_bytes; ++i) data_bytes |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    const std::string header(reinterpret_cast<const char*>(bytes) + num_size_bytes,
                             num_bytes - num_size_bytes);

    auto result = epinfer::parse_safetensors_header(header, data_bytes, "fuzz.safetensors");
    if (result.is_ok()) {
        // Every accepted tensor must satisfy the documented invariants.
        for (const epinfer::TensorInfo& t : *result) {
            if (t.data_begin > t.data_end || t.data_end > data_bytes ||
                t.num_bytes() != static_cast<uint64_t>(t.numel()) * epinfer::dtype_size(t.dtype))
                __builtin_trap();
        }
    } else if (result.status().message().find('\n') != std::string::npos) {
        __builtin_trap();  // messages are one line
    }
    return 0;
}
