// Test helpers for the safetensors tests: build safetensors bytes from a list of tensors, write them into
// a temporary folder that is removed afterwards.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace epinfer::safetensors_test {

struct TestTensor {
    std::string name;
    std::string dtype;           // safetensors name, e.g. "BF16"
    std::vector<int64_t> shape;  // outermost first
    std::vector<uint8_t> bytes;  // raw little-endian data
};

// Little-endian bytes of `values` (uint16_t bf16/f16 bits, float, int8_t, ...).
template <typename T>
std::vector<uint8_t> to_bytes(const std::vector<T>& values) {
    std::vector<uint8_t> out(values.size() * sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
    return out;
}

// A file with the given header text (not padded) followed by `data`.
inline std::vector<uint8_t> raw_safetensors_bytes(const std::string& header,
                                                  const std::vector<uint8_t>& data) {
    // Sized once and filled (inserting after an 8-byte vector trips GCC 12's -Warray-bounds false positive).
    std::vector<uint8_t> out(8 + header.size() + data.size());
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
    std::copy(header.begin(), header.end(), out.begin() + 8);
    std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
    return out;
}

// The header text of `tensors` stored back to back in list order, padded with spaces to a multiple of 8
// bytes as the Python writer does.
inline std::string safetensors_header(const std::vector<TestTensor>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    header["__metadata__"] = {{"format", "pt"}};
    uint64_t offset = 0;
    for (const auto& t : tensors) {
        header[t.name] = {
            {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
        offset += t.bytes.size();
    }
    std::string text = header.dump();
    text.append((8 - (8 + text.size()) % 8) % 8, ' ');
    return text;
}

inline std::vector<uint8_t> safetensors_bytes(const std::vector<TestTensor>& tensors) {
    std::vector<uint8_t> data;
    for (const auto& t : tensors) data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    return raw_safetensors_bytes(safetensors_header(tensors), data);
}

inline void write_file(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
    write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
}

// A fresh folder per test (ctest runs tests as parallel processes), removed by the destructor.
class TempDir {
public:
    TempDir() {
        const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
        path_ =
            std::filesystem::temp_directory_path() / ("epinfer_" + std::string(test->test_suite_name()) +
                                                      "_" + test->name() + "_" + std::to_string(::getpid()));
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    const std::filesystem::path& path() const { return path_; }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    std::filesystem::path path_;
};

}  // namespace epinfer::safetensors_test
