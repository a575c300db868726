// Checkpoint::open on folders: single file, sharded index, model*.safetensors shards without their index,
// and the folder errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "test_safetensors_writer.h"

namespace epinfer {
namespace {

using safetensors_test::safetensors_bytes;
using safetensors_test::TempDir;
using safetensors_test::TestTensor;
using safetensors_test::to_bytes;
using safetensors_test::write_file;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TestTensor f32_tensor(const std::string& name, std::vector<float> values) {
    return {name, "F32", {static_cast<int64_t>(values.size())}, to_bytes(values)};
}

std::vector<float> read_f32(const Checkpoint::Entry& entry) {
    std::vector<float> out(static_cast<size_t>(entry.info->numel()));
    std::memcpy(out.data(), entry.data(), out.size() * sizeof(float));
    return out;
}

// Two shards: a, b in model-00001-of-00002; c in model-00002-of-00002.
void write_two_shards(const TempDir& dir) {
    write_file(dir.path() / "model-00001-of-00002.safetensors",
               safetensors_bytes({f32_tensor("a", {1, 2}), f32_tensor("b", {3})}));
    write_file(dir.path() / "model-00002-of-00002.safetensors",
               safetensors_bytes({f32_tensor("c", {4, 5, 6})}));
}

const char kTwoShardIndex[] = R"({"metadata": {"total_size": 24}, "weight_map": {
    "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
    "c": "model-00002-of-00002.safetensors"}})";

Status open_status(const TempDir& dir) {
    return Checkpoint::open(dir.path().string()).status();
}

TEST(CheckpointTest, OpensFixtureFolderWithModelSafetensors) {
    const std::string fixture = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/deepseek_v3_tiny";
    auto ckpt = Checkpoint::open(fixture);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    const auto names = (*ckpt)->names();
    EXPECT_EQ(names.size(), 139u);  // golden.safetensors beside it is not part of the model
    EXPECT_EQ(names.front(), "lm_head.weight");
    EXPECT_EQ(names.back(), "model.norm.weight");
    const auto entry = (*ckpt)->find("model.layers.2.mlp.gate.e_score_correction_bias");
    ASSERT_NE(entry.info, nullptr);
    EXPECT_EQ(entry.info->shape, (std::vector<int64_t>{16}));
    EXPECT_EQ(entry.info->dtype, DType::kBF16);
    EXPECT_EQ(entry.file->path(), fixture + "/model.safetensors");
    EXPECT_EQ((*ckpt)->dir(), fixture);
}

TEST(CheckpointTest, OpensTwoShardsThroughIndex) {
    TempDir dir;
    write_two_shards(dir);
    write_file(dir.path() / "model.safetensors.index.json", std::string(kTwoShardIndex));
    auto ckpt = Checkpoint::open(dir.path().string());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    EXPECT_THAT((*ckpt)->names(), ElementsAre("a", "b", "c"));
    const auto a = (*ckpt)->find("a");
    const auto c = (*ckpt)->find("c");
    ASSERT_NE(a.info, nullptr);
    ASSERT_NE(c.info, nullptr);
    EXPECT_EQ(a.file->path(), dir.file("model-00001-of-00002.safetensors"));
    EXPECT_EQ(c.file->path(), dir.file("model-00002-of-00002.safetensors"));
    EXPECT_EQ(read_f32(a), (std::vector<float>{1, 2}));
    EXPECT_EQ(read_f32((*ckpt)->find("b")), (std::vector<float>{3}));
    EXPECT_EQ(read_f32(c), (std::vector<float>{4, 5, 6}));
    const auto absent = (*ckpt)->find("d");
    EXPECT_EQ(absent.info, nullptr);
    EXPECT_EQ(absent.file, nullptr);
}

TEST(CheckpointTest, ShardTensorMissingFromWeightMapIsStillVisible) {
    TempDir dir;
    write_two_shards(dir);
    write_file(dir.path() / "model.safetensors.index.json",
               std::string(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                              "c": "model-00002-of-00002.safetensors"}})"));
    auto ckpt = Checkpoint::open(dir.path().string());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    EXPECT_THAT((*ckpt)->names(), ElementsAre("a", "b", "c"));
}

TEST(CheckpointTest, PrefersModelSafetensorsOverOtherFiles) {
    TempDir dir;
    write_file(dir.path() / "model.safetensors", safetensors_bytes({f32_tensor("w", {1})}));
    write_file(dir.path() / "golden.safetensors", safetensors_bytes({f32_tensor("logits", {2})}));
    auto ckpt = Checkpoint::open(dir.path().string());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    EXPECT_THAT((*ckpt)->names(), ElementsAre("w"));
}

TEST(CheckpointTest, OpensModelShardsWithoutIndexButNoOtherFile) {
    TempDir dir;
    write_two_shards(dir);
    write_file(dir.path() / "golden.safetensors", safetensors_bytes({f32_tensor("logits", {7})}));
    write_file(dir.path() / "config.json", std::string("{}"));
    auto ckpt = Checkpoint::open(dir.path().string());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    EXPECT_THAT((*ckpt)->names(), ElementsAre("a", "b", "c"));
    EXPECT_EQ(read_f32((*ckpt)->find("c")), (std::vector<float>{4, 5, 6}));
}

TEST(CheckpointTest, IndexReadsOnlyItsShards) {
    TempDir dir;
    write_two_shards(dir);
    write_file(dir.path() / "model.safetensors.index.json", std::string(kTwoShardIndex));
    write_file(dir.path() / "model-extra.safetensors", safetensors_bytes({f32_tensor("x", {1})}));
    auto ckpt = Checkpoint::open(dir.path().string());
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    EXPECT_THAT((*ckpt)->names(), ElementsAre("a", "b", "c"));
}

// ---- errors ----

TEST(CheckpointTest, MissingFolderIsNotFound) {
    TempDir dir;
    const Status s = Checkpoint::open(dir.file("absent")).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_EQ(s.message(), dir.file("absent") + ": no such directory");

    write_file(dir.path() / "plain.txt", std::string("x"));
    const Status file = Checkpoint::open(dir.file("plain.txt")).status();
    EXPECT_EQ(file.code(), StatusCode::kNotFound);
    EXPECT_EQ(file.message(), dir.file("plain.txt") + ": not a directory");
}

TEST(CheckpointTest, FolderWithoutWeightFileIsNotFound) {
    TempDir dir;
    write_file(dir.path() / "config.json", std::string("{}"));
    const std::string message = dir.path().string() +
                                ": no model weights: neither model.safetensors.index.json nor " +
                                "model*.safetensors";
    Status s = open_status(dir);
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_EQ(s.message(), message);
    // A fixture folder whose model.safetensors was deleted: its golden.safetensors is not read as weights
    // (found by a tester: "model.embed_tokens.weight: missing ... (and 150 more tensor issues)").
    write_file(dir.path() / "golden.safetensors", safetensors_bytes({f32_tensor("logits", {1})}));
    s = open_status(dir);
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_EQ(s.message(), message);
}

// A folder or a FIFO where a weight file is expected is named as such (a tester's model.safetensors
// folder gave "neither model.safetensors.index.json nor model*.safetensors"); a FIFO is never opened.
TEST(CheckpointTest, WeightFileThatIsNoFileSaysWhatItIs) {
    const auto expect_message = [](const TempDir& dir, const std::string& message) {
        const Status s = open_status(dir);
        EXPECT_EQ(s.code(), StatusCode::kNotFound);
        EXPECT_EQ(s.message(), message);
    };
    {
        TempDir dir;
        std::filesystem::create_directory(dir.path() / "model.safetensors");
        expect_message(dir, dir.file("model.safetensors") + ": is a directory, not a file");
    }
    {
        TempDir dir;
        ASSERT_EQ(::mkfifo(dir.file("model.safetensors").c_str(), 0600), 0);
        expect_message(dir, dir.file("model.safetensors") + ": is a FIFO, not a regular file");
    }
    {
        TempDir dir;
        write_two_shards(dir);
        std::filesystem::create_directory(dir.path() / "model.safetensors.index.json");
        expect_message(dir, dir.file("model.safetensors.index.json") + ": is a directory, not a file");
    }
    {  // a shard of the index
        TempDir dir;
        write_file(dir.path() / "model-00001-of-00002.safetensors",
                   safetensors_bytes({f32_tensor("a", {1, 2}), f32_tensor("b", {3})}));
        ASSERT_EQ(::mkfifo(dir.file("model-00002-of-00002.safetensors").c_str(), 0600), 0);
        write_file(dir.path() / "model.safetensors.index.json", std::string(kTwoShardIndex));
        expect_message(dir, dir.file("model.safetensors.index.json") +
                                ": shard of tensor 'c': " + dir.file("model-00002-of-00002.safetensors") +
                                ": is a FIFO, not a regular file");
    }
    {  // model*.safetensors without an index
        TempDir dir;
        write_two_shards(dir);
        std::filesystem::remove(dir.path() / "model-00002-of-00002.safetensors");
        std::filesystem::create_directory(dir.path() / "model-00002-of-00002.safetensors");
        expect_message(dir, dir.file("model-00002-of-00002.safetensors") + ": is a directory, not a file");
    }
}

TEST(CheckpointTest, MissingShardIsNotFound) {
    TempDir dir;
    write_file(dir.path() / "model-00001-of-00002.safetensors",
               safetensors_bytes({f32_tensor("a", {1, 2}), f32_tensor("b", {3})}));
    write_file(dir.path() / "model.safetensors.index.json", std::string(kTwoShardIndex));
    const Status s = open_status(dir);
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_THAT(s.message(), HasSubstr(dir.file("model.safetensors.index.json") + ": shard of tensor 'c': "));
    EXPECT_THAT(s.message(), HasSubstr(dir.file("model-00002-of-00002.safetensors") + ": cannot open"));
}

TEST(CheckpointTest, IndexNamingTensorAbsentFromShardIsDataLoss) {
    TempDir dir;
    write_two_shards(dir);
    write_file(dir.path() / "model.safetensors.index.json",
               std::string(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                              "c": "model-00001-of-00002.safetensors"}})"));
    const Status s = open_status(dir);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_EQ(s.message(), dir.file("model.safetensors.index.json") + ": tensor 'c' is not in its shard " +
                               dir.file("model-00001-of-00002.safetensors"));
}

TEST(CheckpointTest, TensorInTwoShardsIsDataLoss) {
    TempDir dir;
    write_file(dir.path() / "s1.safetensors",
               safetensors_bytes({f32_tensor("a", {1}), f32_tensor("dup", {2})}));
    write_file(dir.path() / "s2.safetensors", safetensors_bytes({f32_tensor("dup", {3})}));
    write_file(dir.path() / "model.safetensors.index.json",
               std::string(R"({"weight_map": {"a": "s1.safetensors", "dup": "s2.safetensors"}})"));
    const Status s = open_status(dir);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr("tensor 'dup' is in both " + dir.file("s1.safetensors") + " and " +
                                       dir.file("s2.safetensors")));
}

TEST(CheckpointTest, TensorInTwoFilesOfFolderIsDataLoss) {
    TempDir dir;
    write_file(dir.path() / "model-00001-of-00002.safetensors", safetensors_bytes({f32_tensor("w", {1})}));
    write_file(dir.path() / "model-00002-of-00002.safetensors", safetensors_bytes({f32_tensor("w", {2})}));
    const Status s = open_status(dir);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_EQ(s.message(), dir.path().string() + ": tensor 'w' is in both " +
                               dir.file("model-00001-of-00002.safetensors") + " and " +
                               dir.file("model-00002-of-00002.safetensors"));
}

TEST(CheckpointTest, MalformedIndexIsDataLoss) {
    const struct {
        const char* index;
        const char* message;  // expected after "<index path>: "
    } kCases[] = {
        {"{\"weight_map\": ", "not valid JSON"},
        {R"({"metadata": {}})", "'weight_map' is missing, empty or not an object"},
        {R"({"weight_map": {}})", "'weight_map' is missing, empty or not an object"},
        {R"([1])", "'weight_map' is missing, empty or not an object"},
        {R"({"weight_map": {"a": 3}})", "weight_map['a'] is not a string"},
    };
    for (const auto& c : kCases) {
        TempDir dir;
        write_file(dir.path() / "model.safetensors.index.json", std::string(c.index));
        const Status s = open_status(dir);
        EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.index;
        EXPECT_EQ(s.message(), dir.file("model.safetensors.index.json") + ": " + c.message) << c.index;
    }
}

TEST(CheckpointTest, ShardOutsideFolderIsDataLoss) {
    TempDir dir;
    write_file(dir.path() / "model.safetensors.index.json",
               std::string(R"({"weight_map": {"a": "../elsewhere.safetensors"}})"));
    const Status s = open_status(dir);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_EQ(s.message(), dir.file("model.safetensors.index.json") +
                               ": shard '../elsewhere.safetensors' of tensor 'a' is not a file name inside " +
                               dir.path().string());
}

TEST(CheckpointTest, CorruptShardNamesIndexShardAndTensor) {
    TempDir dir;
    write_two_shards(dir);
    auto bytes = safetensors_bytes({f32_tensor("c", {4, 5, 6})});
    bytes.erase(bytes.end() - 4, bytes.end());  // cut the last f32 element
    write_file(dir.path() / "model-00002-of-00002.safetensors", bytes);
    write_file(dir.path() / "model.safetensors.index.json", std::string(kTwoShardIndex));
    const Status s = open_status(dir);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_EQ(s.message(),
              dir.file("model.safetensors.index.json") +
                  ": shard of tensor 'c': " + dir.file("model-00002-of-00002.safetensors") +
                  ": tensor 'c': data_offsets [0, 12] exceed the data section of 8 bytes (truncated file?)");
}

}  // namespace
}  // namespace epinfer
