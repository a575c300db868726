// safetensors checkpoints: a memory-mapped reader for one file and for sharded checkpoints.
//
// Format (https://github.com/huggingface/safetensors): u64 little-endian header length N, N bytes of
// JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data
// section; offsets are relative to the data section. The header is validated on open: offsets inside
// the file, ordered, no two tensors overlapping, end − begin == dtype size × product(shape).
// Every error message is one line naming the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace epinfer {

// Largest header accepted, as the reference implementation (safetensors MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct TensorInfo {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;  // outermost first, as PyTorch
    uint64_t data_begin = 0;     // byte offset into the data section
    uint64_t data_end = 0;
    int64_t numel() const;  // product of shape; 1 for a scalar (shape [])
    uint64_t num_bytes() const { return data_end - data_begin; }
};

// Parses and validates a header. `header` is the JSON text, `data_bytes` the size of the data section,
// `source` names the file in errors. Returns the tensors sorted by name ("__metadata__" is checked to be
// a string→string map and skipped). Errors: kDataLoss (not a JSON object, a malformed entry, offsets
// outside the data section, byte length ≠ dtype size × numel, overlapping tensors, header larger than
// kMaxSafetensorsHeaderBytes), kNotSupported (unknown dtype). Never crashes or throws on any input
// (fuzzed: tests/fuzz/fuzz_safetensors_header.cc).
Result<std::vector<TensorInfo>> parse_safetensors_header(const std::string& header, uint64_t data_bytes,
                                                         const std::string& source);

// One memory-mapped .safetensors file.
class SafetensorsFile {
public:
    // Errors: kNotFound (no file; a folder, a FIFO, ... instead of one, named as such and never opened:
    // check_regular_file in file_kind.h), kDataLoss (truncated, corrupt header or offsets), kNotSupported
    // (dtype).
    static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find(const std::string& name) const;
    // Pointer to the tensor's first byte inside the read-only mapping (valid while this object lives).
    // Not necessarily aligned to the dtype's size: read elements with memcpy or convert_to_f32.
    const void* data(const TensorInfo& info) const;

private:
    SafetensorsFile() = default;
    std::string path_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t> index_;
    const uint8_t* map_ = nullptr;
    size_t map_bytes_ = 0;
    uint64_t data_offset_ = 0;  // 8 + header length
};

// A checkpoint folder: model.safetensors when present (as transformers), else
// model.safetensors.index.json with its shards ({"weight_map": {tensor: shard file name}}), else every
// model*.safetensors file in the folder (shards whose index is absent). Other *.safetensors files (a
// fixture's golden.safetensors) are never read. Every tensor of every opened file is visible, also one
// that the weight_map does not list.
class Checkpoint {
public:
    // Errors: kNotFound (no folder, a missing shard, no weight file: "DIR: no model weights: neither
    // model.safetensors.index.json nor model*.safetensors"; model.safetensors, the index, a shard or a
    // model*.safetensors that is a folder, a FIFO, ...: "DIR/model.safetensors: is a directory, not a
    // file"), kNotSupported (as SafetensorsFile), kDataLoss
    // (as SafetensorsFile, a malformed index, a shard that is not a plain file name, a tensor in two
    // files, an index naming a tensor its shard does not hold).
    static Result<std::unique_ptr<Checkpoint>> open(const std::string& model_dir);

    struct Entry {
        const TensorInfo* info;
        const SafetensorsFile* file;
        const void* data() const { return file->data(*info); }
    };
    // The tensor called `name`, or {nullptr, nullptr} when absent.
    Entry find(const std::string& name) const;
    // Every tensor name, sorted.
    std::vector<std::string> names() const;
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, Entry> entries_;
};

}  // namespace epinfer
