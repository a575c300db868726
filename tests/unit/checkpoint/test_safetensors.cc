// SafetensorsFile and parse_safetensors_header: values read back, every dtype's header, the fixture
// checkpoint, and one test per kind of corrupt input (code and message).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "test_safetensors_writer.h"

namespace epinfer {
namespace {

using safetensors_test::raw_safetensors_bytes;
using safetensors_test::safetensors_bytes;
using safetensors_test::TempDir;
using safetensors_test::TestTensor;
using safetensors_test::to_bytes;
using safetensors_test::write_file;
using ::testing::HasSubstr;

std::vector<uint8_t> tensor_bytes(const SafetensorsFile& file, const TensorInfo& info) {
    const auto* p = static_cast<const uint8_t*>(file.data(info));
    return std::vector<uint8_t>(p, p + info.num_bytes());
}

std::vector<float> tensor_f32(const SafetensorsFile& file, const TensorInfo& info) {
    std::vector<float> out(static_cast<size_t>(info.numel()));
    convert_to_f32(info.dtype, file.data(info), out.data(), out.size());
    return out;
}

// Writes `bytes` as DIR/name and returns the status of opening it.
Status open_status(const TempDir& dir, const std::vector<uint8_t>& bytes,
                   const std::string& name = "m.safetensors") {
    write_file(dir.path() / name, bytes);
    return SafetensorsFile::open(dir.file(name)).status();
}

TEST(SafetensorsFileTest, RoundTripsBf16F16F32) {
    TempDir dir;
    const std::vector<uint16_t> bf16_bits = {0x3F80, 0xC020, 0x3E20, 0x477F};  // 1, -2.5, 0.15625, 65280
    const std::vector<uint16_t> f16_bits = {0x3C00, 0xC100, 0x3100};           // 1, -2.5, 0.15625
    const std::vector<float> f32_values = {1.5f, -0.1f, 3.0e38f};
    write_file(dir.path() / "m.safetensors",
               safetensors_bytes({{"w.bf16", "BF16", {2, 2}, to_bytes(bf16_bits)},
                                  {"w.f16", "F16", {3}, to_bytes(f16_bits)},
                                  {"w.f32", "F32", {1, 3}, to_bytes(f32_values)}}));

    auto file = SafetensorsFile::open(dir.file("m.safetensors"));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    const auto& f = **file;
    ASSERT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(f.tensors()[0].name, "w.bf16");  // sorted by name
    EXPECT_EQ(f.path(), dir.file("m.safetensors"));
    EXPECT_EQ(f.find("w.missing"), nullptr);

    const TensorInfo* bf16 = f.find("w.bf16");
    ASSERT_NE(bf16, nullptr);
    EXPECT_EQ(bf16->dtype, DType::kBF16);
    EXPECT_EQ(bf16->shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(bf16->numel(), 4);
    EXPECT_EQ(bf16->data_begin, 0u);
    EXPECT_EQ(bf16->num_bytes(), 8u);
    EXPECT_EQ(tensor_bytes(f, *bf16), to_bytes(bf16_bits));
    EXPECT_EQ(tensor_f32(f, *bf16), (std::vector<float>{1.0f, -2.5f, 0.15625f, 65280.0f}));

    const TensorInfo* f16 = f.find("w.f16");
    ASSERT_NE(f16, nullptr);
    EXPECT_EQ(f16->dtype, DType::kF16);
    EXPECT_EQ(f16->data_begin, 8u);
    EXPECT_EQ(f16->data_end, 14u);
    EXPECT_EQ(tensor_f32(f, *f16), (std::vector<float>{1.0f, -2.5f, 0.15625f}));

    const TensorInfo* f32 = f.find("w.f32");
    ASSERT_NE(f32, nullptr);
    EXPECT_EQ(f32->dtype, DType::kF32);
    EXPECT_EQ(f32->shape, (std::vector<int64_t>{1, 3}));
    EXPECT_EQ(f32->data_begin, 14u);  // unaligned: readers must memcpy
    EXPECT_EQ(tensor_f32(f, *f32), f32_values);
}

TEST(SafetensorsFileTest, ReadsF8AndIntegerDtypes) {
    TempDir dir;
    const std::vector<uint8_t> f8 = {0x38, 0xC0, 0x00};  // e4m3 bits of 1, -2, 0
    const std::vector<int8_t> i8 = {-1, 127, -128};
    const std::vector<uint8_t> u8 = {0, 255};
    write_file(dir.path() / "m.safetensors",
               safetensors_bytes(
                   {{"f8", "F8_E4M3", {3}, f8}, {"i8", "I8", {1, 3}, to_bytes(i8)}, {"u8", "U8", {2}, u8}}));
    auto file = SafetensorsFile::open(dir.file("m.safetensors"));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    const auto& f = **file;
    ASSERT_NE(f.find("f8"), nullptr);
    EXPECT_EQ(f.find("f8")->dtype, DType::kF8E4M3);
    EXPECT_EQ(tensor_bytes(f, *f.find("f8")), f8);
    ASSERT_NE(f.find("i8"), nullptr);
    EXPECT_EQ(f.find("i8")->dtype, DType::kI8);
    EXPECT_EQ(tensor_bytes(f, *f.find("i8")), to_bytes(i8));
    ASSERT_NE(f.find("u8"), nullptr);
    EXPECT_EQ(f.find("u8")->dtype, DType::kU8);
    EXPECT_EQ(tensor_bytes(f, *f.find("u8")), u8);
}

TEST(SafetensorsHeaderTest, ParsesEveryDtype) {
    // name, bytes per element, expected enum; each tensor is [2, 3].
    const struct {
        const char* name;
        uint64_t size;
        DType dtype;
    } kCases[] = {{"F32", 4, DType::kF32}, {"F16", 2, DType::kF16},        {"BF16", 2, DType::kBF16},
                  {"F64", 8, DType::kF64}, {"F8_E4M3", 1, DType::kF8E4M3}, {"F8_E5M2", 1, DType::kF8E5M2},
                  {"I64", 8, DType::kI64}, {"I32", 4, DType::kI32},        {"I16", 2, DType::kI16},
                  {"I8", 1, DType::kI8},   {"U8", 1, DType::kU8},          {"BOOL", 1, DType::kBool}};
    nlohmann::json header = nlohmann::json::object();
    uint64_t offset = 0;
    for (const auto& c : kCases) {
        header[std::string("t_") + c.name] = {
            {"dtype", c.name}, {"shape", {2, 3}}, {"data_offsets", {offset, offset + 6 * c.size}}};
        offset += 6 * c.size;
    }
    auto tensors = parse_safetensors_header(header.dump(), offset, "h.safetensors");
    ASSERT_TRUE(tensors.is_ok()) << tensors.status().to_string();
    ASSERT_EQ(tensors->size(), std::size(kCases));
    for (const auto& c : kCases) {
        const auto it = std::find_if(tensors->begin(), tensors->end(), [&](const TensorInfo& t) {
            return t.name == std::string("t_") + c.name;
        });
        ASSERT_NE(it, tensors->end()) << c.name;
        EXPECT_EQ(it->dtype, c.dtype) << c.name;
        EXPECT_EQ(it->num_bytes(), 6 * c.size) << c.name;
    }
}

TEST(SafetensorsHeaderTest, AcceptsScalarsEmptyTensorsAndMetadata) {
    const std::string header = R"({"__metadata__": {"format": "pt", "note": "x"},
        "scalar": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "empty": {"dtype": "BF16", "shape": [0, 5], "data_offsets": [2, 2]},
        "after": {"dtype": "U8", "shape": [3], "data_offsets": [4, 7]}})";
    auto tensors = parse_safetensors_header(header, 8, "h.safetensors");
    ASSERT_TRUE(tensors.is_ok()) << tensors.status().to_string();
    ASSERT_EQ(tensors->size(), 3u);
    EXPECT_EQ((*tensors)[0].name, "after");
    EXPECT_EQ((*tensors)[1].name, "empty");
    EXPECT_EQ((*tensors)[1].numel(), 0);
    EXPECT_EQ((*tensors)[2].name, "scalar");
    EXPECT_EQ((*tensors)[2].numel(), 1);
    EXPECT_TRUE((*tensors)[2].shape.empty());
}

// tests/data/fixtures/deepseek_v3_tiny: 139 bf16 tensors, listed with their shapes in keys.txt.
TEST(SafetensorsFileTest, ReadsDeepseekV3TinyFixture) {
    const std::string fixture = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/deepseek_v3_tiny";
    auto file = SafetensorsFile::open(fixture + "/model.safetensors");
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    const auto& f = **file;
    EXPECT_EQ(f.tensors().size(), 139u);

    std::ifstream keys(fixture + "/keys.txt");
    ASSERT_TRUE(keys.good());
    std::string line;
    size_t num_lines = 0;
    while (std::getline(keys, line)) {  // "name\t[320, 64]\ttorch.bfloat16"
        std::istringstream fields(line);
        std::string name, shape, dtype;
        std::getline(fields, name, '\t');
        std::getline(fields, shape, '\t');
        std::getline(fields, dtype, '\t');
        const TensorInfo* info = f.find(name);
        ASSERT_NE(info, nullptr) << name;
        std::string shape_text = "[";
        for (size_t i = 0; i < info->shape.size(); ++i)
            shape_text += (i ? ", " : "") + std::to_string(info->shape[i]);
        EXPECT_EQ(shape_text + "]", shape) << name;
        EXPECT_EQ(dtype, "torch.bfloat16") << name;
        EXPECT_EQ(info->dtype, DType::kBF16) << name;
        ++num_lines;
    }
    EXPECT_EQ(num_lines, 139u);

    const TensorInfo* gate = f.find("model.layers.1.mlp.gate.weight");
    ASSERT_NE(gate, nullptr);
    EXPECT_EQ(gate->shape, (std::vector<int64_t>{16, 64}));
    EXPECT_EQ(gate->data_begin, 352832u);
    EXPECT_EQ(gate->data_end, 354880u);

    // First values of model.norm.weight, read with Python's struct from the same file.
    const TensorInfo* norm = f.find("model.norm.weight");
    ASSERT_NE(norm, nullptr);
    std::vector<uint16_t> first(4);
    std::memcpy(first.data(), f.data(*norm), 8);
    EXPECT_EQ(first, (std::vector<uint16_t>{0x3F84, 0x3F87, 0x3F65, 0x3F8A}));
}

// ---- corrupt files: the code and a message naming the file and the tensor ----

TEST(SafetensorsFileTest, MissingFileIsNotFound) {
    TempDir dir;
    const Status s = SafetensorsFile::open(dir.file("absent.safetensors")).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_THAT(s.message(), HasSubstr(dir.file("absent.safetensors")));
    const Status folder = SafetensorsFile::open(dir.path().string()).status();
    EXPECT_EQ(folder.code(), StatusCode::kNotFound);
    EXPECT_EQ(folder.message(), dir.path().string() + ": is a directory, not a file");
}

TEST(SafetensorsFileTest, FileShorterThanLengthFieldIsDataLoss) {
    TempDir dir;
    const Status s = open_status(dir, {1, 0, 0});
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr(dir.file("m.safetensors")));
}

TEST(SafetensorsFileTest, HeaderLengthLargerThanFileIsDataLoss) {
    TempDir dir;
    auto bytes = safetensors_bytes({{"x", "F32", {1}, to_bytes(std::vector<float>{1.0f})}});
    const uint64_t file_bytes = bytes.size();
    bytes[0] = static_cast<uint8_t>(file_bytes - 7);  // header would end one byte past the file
    const Status s = open_status(dir, bytes);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr(dir.file("m.safetensors")));
    EXPECT_THAT(s.message(), HasSubstr("header length " + std::to_string(file_bytes - 7)));
}

TEST(SafetensorsFileTest, HeaderLongerThan100MiBIsDataLoss) {
    TempDir dir;
    const uint64_t header_bytes = kMaxSafetensorsHeaderBytes + 1;
    std::vector<uint8_t> length(8);
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(header_bytes >> (8 * i));
    write_file(dir.path() / "m.safetensors", length);
    std::filesystem::resize_file(dir.path() / "m.safetensors", 8 + header_bytes);  // sparse: no disk used
    const Status s = SafetensorsFile::open(dir.file("m.safetensors")).status();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr("exceeds the limit of 104857600"));
}

TEST(SafetensorsFileTest, TruncatedDataIsDataLoss) {
    TempDir dir;
    auto bytes = safetensors_bytes({{"first", "F32", {2}, to_bytes(std::vector<float>{1.0f, 2.0f})},
                                    {"last", "BF16", {2}, to_bytes(std::vector<uint16_t>{1, 2})}});
    bytes.erase(bytes.end() - 2, bytes.end());  // cut the last bf16 element
    const Status s = open_status(dir, bytes);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr(dir.file("m.safetensors")));
    EXPECT_THAT(s.message(), HasSubstr("tensor 'last'"));
    EXPECT_THAT(s.message(), HasSubstr("data_offsets [8, 12] exceed the data section of 10 bytes"));
}

TEST(SafetensorsFileTest, NonJsonHeaderIsDataLoss) {
    TempDir dir;
    const Status s = open_status(dir, raw_safetensors_bytes("{\"x\": {\"dtype\": ", {}));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), ::testing::StartsWith(dir.file("m.safetensors") +
                                                   ": header is not valid JSON (error at byte "));
}

TEST(SafetensorsFileTest, OffsetsOutOfBoundsIsDataLoss) {
    TempDir dir;
    const Status s = open_status(
        dir, raw_safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                   {0, 0, 0, 0, 0, 0, 0, 0}));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_EQ(s.message(),
              dir.file("m.safetensors") +
                  ": tensor 'w': data_offsets [4, 12] exceed the data section of 8 bytes (truncated file?)");
}

TEST(SafetensorsFileTest, OverlappingTensorsAreDataLoss) {
    TempDir dir;
    const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "b": {"dtype": "F16", "shape": [2], "data_offsets": [6, 10]}})";
    const Status s = open_status(dir, raw_safetensors_bytes(header, std::vector<uint8_t>(10)));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_EQ(s.message(), dir.file("m.safetensors") + ": tensors 'a' [0, 8] and 'b' [6, 10] overlap");
}

TEST(SafetensorsFileTest, ByteLengthNotDtypeTimesShapeIsDataLoss) {
    TempDir dir;
    const std::string header = R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}})";
    const Status s = open_status(dir, raw_safetensors_bytes(header, std::vector<uint8_t>(12)));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_EQ(s.message(), dir.file("m.safetensors") +
                               ": tensor 'w': data_offsets [0, 10] hold 10 bytes, but BF16 [2, 3] needs 12");
}

TEST(SafetensorsFileTest, UnsupportedDtypeIsNotSupported) {
    TempDir dir;
    const std::string header = R"({"x": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}})";
    const Status s = open_status(dir, raw_safetensors_bytes(header, std::vector<uint8_t>(1)));
    EXPECT_EQ(s.code(), StatusCode::kNotSupported);
    EXPECT_EQ(s.message(), "unsupported dtype 'Q4' of tensor 'x' in " + dir.file("m.safetensors"));
}

TEST(SafetensorsFileTest, NegativeShapeIsDataLoss) {
    TempDir dir;
    const std::string header = R"({"w": {"dtype": "U8", "shape": [2, -3], "data_offsets": [0, 0]}})";
    const Status s = open_status(dir, raw_safetensors_bytes(header, {}));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_EQ(s.message(),
              dir.file("m.safetensors") + ": tensor 'w': shape[1] is not a non-negative integer");
}

// Malformed headers, checked on parse_safetensors_header: each gives kDataLoss naming the file and, for
// an entry, the tensor.
TEST(SafetensorsHeaderTest, RejectsMalformedEntries) {
    const struct {
        const char* header;
        const char* message;  // expected after "bad.safetensors: "
    } kCases[] = {
        {R"([1, 2])", "header is not a JSON object"},
        {R"("text")", "header is not a JSON object"},
        {R"({"__metadata__": {"format": 1}})", "'__metadata__' is not a map of strings to strings"},
        {R"({"__metadata__": ["pt"]})", "'__metadata__' is not a map of strings to strings"},
        {R"({"w": 3})", "tensor 'w': entry is not a JSON object"},
        {R"({"w": {"shape": [1], "data_offsets": [0, 1]}})",
         "tensor 'w': 'dtype' is missing or not a string"},
        {R"({"w": {"dtype": 8, "shape": [1], "data_offsets": [0, 1]}})",
         "tensor 'w': 'dtype' is missing or not a string"},
        {R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})",
         "tensor 'w': 'shape' is missing or not an array"},
        {R"({"w": {"dtype": "U8", "shape": 1, "data_offsets": [0, 1]}})",
         "tensor 'w': 'shape' is missing or not an array"},
        {R"({"w": {"dtype": "U8", "shape": [2.5], "data_offsets": [0, 1]}})",
         "tensor 'w': shape[0] is not a non-negative integer"},
        {R"({"w": {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}})",
         "tensor 'w': shape[0] is not a non-negative integer"},
        {R"({"w": {"dtype": "U8", "shape": ["1"], "data_offsets": [0, 1]}})",
         "tensor 'w': shape[0] is not a non-negative integer"},
        {R"({"w": {"dtype": "U8", "shape": [9223372036854775808], "data_offsets": [0, 1]}})",
         "tensor 'w': shape[0] is not a non-negative integer"},
        {R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 1]}})",
         "tensor 'w': the product of shape overflows int64"},
        {R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 1]}})",
         "tensor 'w': the byte size of F64 [4611686018427387904] overflows uint64"},
        {R"({"w": {"dtype": "U8", "shape": [1]}})",
         "tensor 'w': 'data_offsets' is missing or not 2 non-negative integers"},
        {R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})",
         "tensor 'w': 'data_offsets' is missing or not 2 non-negative integers"},
        {R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})",
         "tensor 'w': 'data_offsets' is missing or not 2 non-negative integers"},
        {R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1e0]}})",
         "tensor 'w': 'data_offsets' is missing or not 2 non-negative integers"},
        {R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [3, 2]}})",
         "tensor 'w': data_offsets [3, 2] begin after they end"},
        {R"({"w": {"dtype": "U8", "shape": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], "data_offsets": [0, 2]}})",
         "tensor 'w': data_offsets [0, 2] hold 2 bytes, but U8 [1, 1, 1, 1, 1, 1, 1, 1, ...] needs 1"},
        {R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
         R"( "b": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
         "tensors 'a' [0, 4] and 'b' [0, 4] overlap"},
    };
    for (const auto& c : kCases) {
        auto result = parse_safetensors_header(c.header, 16, "bad.safetensors");
        ASSERT_FALSE(result.is_ok()) << c.header;
        EXPECT_EQ(result.status().code(), StatusCode::kDataLoss) << c.header;
        EXPECT_EQ(result.status().message(), std::string("bad.safetensors: ") + c.message) << c.header;
    }
}

// Inputs once feared for a JSON parser: none may crash, throw or hang (tests/fuzz does the same at random).
TEST(SafetensorsHeaderTest, SurvivesHostileText) {
    const std::string kCases[] = {
        "",
        "{",
        std::string(200000, '['),
        "{\"a\":" + std::string(100000, '{'),
        std::string("{\"\xff\xfe\": 1}"),
        std::string("{\"a\0b\": 1}", 10),
        "{\"w\": {\"dtype\": \"U8\", \"shape\": [1e999], \"data_offsets\": [0, 1]}}",
        std::string(1000, ' '),
    };
    for (const std::string& header : kCases) {
        auto result = parse_safetensors_header(header, 1 << 20, "bad.safetensors");
        EXPECT_EQ(result.status().code(), StatusCode::kDataLoss) << header.substr(0, 40);
        EXPECT_THAT(result.status().message(), HasSubstr("bad.safetensors")) << header.substr(0, 40);
    }
}

TEST(SafetensorsHeaderTest, EscapesControlBytesInNames) {
    auto result = parse_safetensors_header("{\"a\\nb\": {\"dtype\": \"Q4\"}}", 0, "bad.safetensors");
    EXPECT_EQ(result.status().code(), StatusCode::kNotSupported);
    EXPECT_EQ(result.status().message(), "unsupported dtype 'Q4' of tensor 'a\\x0ab' in bad.safetensors");
}

TEST(SafetensorsHeaderTest, AcceptsEmptyTensorInsideAnother) {
    const std::string header = R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                   "e": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]}})";
    auto result = parse_safetensors_header(header, 4, "h.safetensors");
    ASSERT_TRUE(result.is_ok()) << result.status().to_string();
    EXPECT_EQ(result->size(), 2u);
}

}  // namespace
}  // namespace epinfer
