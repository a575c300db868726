#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <utility>

#include "checkpoint/file_kind.h"

namespace epinfer {

namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// A name or value read from a file, made safe for a one-line message: control bytes are escaped and
// long strings cut.
std::string printable(std::string_view text) {
    constexpr size_t kMaxChars = 200;
    std::string out;
    for (size_t i = 0; i < text.size() && i < kMaxChars; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c < 0x20 || c == 0x7f) {
            constexpr char kHex[] = "0123456789abcdef";
            out += "\\x";
            out += kHex[c >> 4];
            out += kHex[c & 0xf];
        } else {
            out += static_cast<char>(c);
        }
    }
    if (text.size() > kMaxChars) out += "...";
    return out;
}

Status tensor_error(const std::string& source, const std::string& name, const std::string& what) {
    return data_loss(source + ": tensor '" + printable(name) + "': " + what);
}

// A JSON integer ≥ 0 (floats such as 2.0 or 2.5 are rejected, as in the reference implementation).
bool get_unsigned(const Json& value, uint64_t* out) {
    if (value.is_number_unsigned()) {
        *out = value.get<uint64_t>();
        return true;
    }
    if (value.is_number_integer() && value.get<int64_t>() >= 0) {  // "-0"
        *out = static_cast<uint64_t>(value.get<int64_t>());
        return true;
    }
    return false;
}

std::string offsets_text(const TensorInfo& t) {
    // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "[" + std::to_string(...).
    std::string out = "[";
    out += std::to_string(t.data_begin);
    out += ", ";
    out += std::to_string(t.data_end);
    out += "]";
    return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
    constexpr size_t kMaxDims = 8;  // a hostile header may list a million dims of 1
    std::string out = "[";
    for (size_t i = 0; i < shape.size() && i < kMaxDims; ++i)
        out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + (shape.size() > kMaxDims ? ", ...]" : "]");
}

// One header entry {"dtype", "shape", "data_offsets"} → TensorInfo.
Result<TensorInfo> parse_entry(const std::string& name, const Json& entry, uint64_t data_bytes,
                               const std::string& source) {
    if (!entry.is_object()) return tensor_error(source, name, "entry is not a JSON object");
    TensorInfo info;
    info.name = name;

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string())
        return tensor_error(source, name, "'dtype' is missing or not a string");
    const auto& dtype_text = dtype_it->get_ref<const std::string&>();
    const std::optional<DType> dtype = dtype_from_name(dtype_text);
    if (!dtype) {
        return not_supported("unsupported dtype '" + printable(dtype_text) + "' of tensor '" +
                             printable(name) + "' in " + source);
    }
    info.dtype = *dtype;

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array())
        return tensor_error(source, name, "'shape' is missing or not an array");
    int64_t numel = 1;
    for (size_t i = 0; i < shape_it->size(); ++i) {
        uint64_t dim = 0;
        if (!get_unsigned((*shape_it)[i], &dim) ||
            dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return tensor_error(source, name,
                                "shape[" + std::to_string(i) + "] is not a non-negative integer");
        }
        info.shape.push_back(static_cast<int64_t>(dim));
        if (__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel))
            return tensor_error(source, name, "the product of shape overflows int64");
    }

    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !get_unsigned((*offsets_it)[0], &info.data_begin) ||
        !get_unsigned((*offsets_it)[1], &info.data_end)) {
        return tensor_error(source, name, "'data_offsets' is missing or not 2 non-negative integers");
    }
    if (info.data_begin > info.data_end)
        return tensor_error(source, name, "data_offsets " + offsets_text(info) + " begin after they end");
    if (info.data_end > data_bytes) {
        return tensor_error(source, name,
                            "data_offsets " + offsets_text(info) + " exceed the data section of " +
                                std::to_string(data_bytes) + " bytes (truncated file?)");
    }
    const std::string typed_shape = std::string(dtype_name(info.dtype)) + " " + shape_text(info.shape);
    uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(dtype_size(info.dtype)),
                               &expected_bytes)) {
        return tensor_error(source, name, "the byte size of " + typed_shape + " overflows uint64");
    }
    if (info.num_bytes() != expected_bytes) {
        return tensor_error(source, name,
                            "data_offsets " + offsets_text(info) + " hold " +
                                std::to_string(info.num_bytes()) + " bytes, but " + typed_shape + " needs " +
                                std::to_string(expected_bytes));
    }
    return info;
}

// Tensors with bytes must not share any; an empty tensor may sit anywhere.
Status check_no_overlap(const std::vector<TensorInfo>& tensors, const std::string& source) {
    std::vector<const TensorInfo*> order;
    for (const auto& t : tensors)
        if (t.num_bytes() > 0) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
        return std::pair(a->data_begin, a->data_end) < std::pair(b->data_begin, b->data_end);
    });
    for (size_t i = 1; i < order.size(); ++i) {
        const TensorInfo& prev = *order[i - 1];
        const TensorInfo& cur = *order[i];
        if (cur.data_begin < prev.data_end) {
            return data_loss(source + ": tensors '" + printable(prev.name) + "' " + offsets_text(prev) +
                             " and '" + printable(cur.name) + "' " + offsets_text(cur) + " overlap");
        }
    }
    return Status::ok();
}

Result<std::vector<TensorInfo>> parse_header_json(const std::string& header, uint64_t data_bytes,
                                                  const std::string& source) {
    if (header.size() > kMaxSafetensorsHeaderBytes) {
        return data_loss(source + ": header of " + std::to_string(header.size()) +
                         " bytes exceeds the limit of " + std::to_string(kMaxSafetensorsHeaderBytes));
    }
    Json root;
    try {
        root = Json::parse(header);
    } catch (const Json::parse_error& e) {
        return data_loss(source + ": header is not valid JSON (error at byte " + std::to_string(e.byte) +
                         ")");
    }
    if (!root.is_object()) return data_loss(source + ": header is not a JSON object");

    std::vector<TensorInfo> tensors;
    for (const auto& [name, entry] : root.items()) {
        if (name == "__metadata__") {
            const bool all_strings =
                entry.is_object() &&
                std::all_of(entry.begin(), entry.end(), [](const Json& v) { return v.is_string(); });
            if (!all_strings) {
                return data_loss(source + ": '__metadata__' is not a map of strings to strings");
            }
            continue;
        }
        EPI_ASSIGN_OR_RETURN(TensorInfo info, parse_entry(name, entry, data_bytes, source));
        tensors.push_back(std::move(info));
    }
    EPI_RETURN_IF_ERROR(check_no_overlap(tensors, source));
    return tensors;  // sorted by name: nlohmann::json objects are ordered maps
}

uint64_t read_le64(const uint8_t* bytes) {
    uint64_t value = 0;
    for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
    return value;
}

}  // namespace

int64_t TensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

Result<std::vector<TensorInfo>> parse_safetensors_header(const std::string& header, uint64_t data_bytes,
                                                         const std::string& source) {
    try {
        return parse_header_json(header, data_bytes, source);
    } catch (const std::exception& e) {  // nlohmann type errors, bad_alloc: never expected, never escaping
        return data_loss(source + ": invalid header: " + printable(e.what()));
    }
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
    if (path_exists(path)) EPI_RETURN_IF_ERROR(check_regular_file(path));  // never open a FIFO: it blocks
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int open_errno = errno;
        return not_found(path + ": cannot open: " + std::strerror(open_errno));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return not_found(path + ": not a regular file");
    }
    const auto file_bytes = static_cast<uint64_t>(st.st_size);
    if (file_bytes < 8) {
        ::close(fd);
        return data_loss(path + ": file of " + std::to_string(file_bytes) +
                         " bytes is too short for the 8-byte header length");
    }
    void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);  // the mapping keeps the file alive
    if (map == MAP_FAILED) return data_loss(path + ": mmap failed: " + std::strerror(map_errno));

    std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());  // unmaps on every return below
    file->path_ = path;
    file->map_ = static_cast<const uint8_t*>(map);
    file->map_bytes_ = file_bytes;

    const uint64_t header_bytes = read_le64(file->map_);
    if (header_bytes > file_bytes - 8) {
        return data_loss(path + ": header length " + std::to_string(header_bytes) +
                         " exceeds the file size " + std::to_string(file_bytes) + " minus 8");
    }
    if (header_bytes > kMaxSafetensorsHeaderBytes) {
        return data_loss(path + ": header length " + std::to_string(header_bytes) + " exceeds the limit of " +
                         std::to_string(kMaxSafetensorsHeaderBytes));
    }
    file->data_offset_ = 8 + header_bytes;
    const std::string header(reinterpret_cast<const char*>(file->map_) + 8, header_bytes);
    EPI_ASSIGN_OR_RETURN(file->tensors_,
                         parse_safetensors_header(header, file_bytes - file->data_offset_, path));
    for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_.emplace(file->tensors_[i].name, i);
    return file;
}

SafetensorsFile::~SafetensorsFile() {
    if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

const void* SafetensorsFile::data(const TensorInfo& info) const {
    return map_ + data_offset_ + info.data_begin;
}

namespace {

constexpr char kIndexFileName[] = "model.safetensors.index.json";
constexpr char kSingleFileName[] = "model.safetensors";

// The "weight_map" of an index file: tensor name → shard file name.
Result<std::map<std::string, std::string>> read_weight_map(const std::string& index_path) {
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return data_loss(index_path + ": cannot read");
    try {
        const Json root = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
        if (root.is_discarded()) return data_loss(index_path + ": not valid JSON");
        const auto map_it = root.is_object() ? root.find("weight_map") : root.end();
        if (map_it == root.end() || !map_it->is_object() || map_it->empty()) {
            return data_loss(index_path + ": 'weight_map' is missing, empty or not an object");
        }
        std::map<std::string, std::string> weight_map;
        for (const auto& [tensor, shard] : map_it->items()) {
            if (!shard.is_string()) {
                return data_loss(index_path + ": weight_map['" + printable(tensor) + "'] is not a string");
            }
            weight_map.emplace(tensor, shard.get<std::string>());
        }
        return weight_map;
    } catch (const std::exception& e) {
        return data_loss(index_path + ": invalid index: " + printable(e.what()));
    }
}

// True for "model*.safetensors" ("model-00001-of-00002.safetensors" of a folder without its index); other
// *.safetensors files beside a model (golden.safetensors of the fixtures) are not weights.
bool is_unindexed_shard_name(const std::string& name) {
    constexpr std::string_view kPrefix = "model", kSuffix = ".safetensors";
    return name.size() >= kPrefix.size() + kSuffix.size() && name.starts_with(kPrefix) &&
           name.ends_with(kSuffix);
}

// True for a name such as "model-00001-of-00002.safetensors": no folder part, not "." or "..".
bool is_plain_file_name(const std::string& name) {
    return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& model_dir) {
    std::error_code ec;
    if (!fs::is_directory(model_dir, ec)) {
        return not_found(model_dir +
                         (fs::exists(model_dir, ec) ? ": not a directory" : ": no such directory"));
    }
    auto ckpt = std::make_unique<Checkpoint>();
    ckpt->dir_ = model_dir;

    // Opens `path` and adds its tensors; a name already seen in another file is an error.
    auto add_file = [&](const fs::path& path) -> Result<const SafetensorsFile*> {
        EPI_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(path.string()));
        for (const TensorInfo& info : file->tensors()) {
            const auto [it, inserted] = ckpt->entries_.emplace(info.name, Entry{&info, file.get()});
            if (!inserted) {
                return data_loss(model_dir + ": tensor '" + printable(info.name) + "' is in both " +
                                 it->second.file->path() + " and " + file->path());
            }
        }
        ckpt->files_.push_back(std::move(file));
        return ckpt->files_.back().get();
    };

    const fs::path dir(model_dir);
    const fs::path index_path = dir / kIndexFileName;
    if (path_exists((dir / kSingleFileName).string())) {  // a folder or a FIFO of that name is an error
        EPI_RETURN_IF_ERROR(add_file(dir / kSingleFileName).status());
    } else if (path_exists(index_path.string())) {
        EPI_RETURN_IF_ERROR(check_regular_file(index_path.string()));
        EPI_ASSIGN_OR_RETURN(const auto weight_map, read_weight_map(index_path.string()));
        std::map<std::string, const SafetensorsFile*> shards;  // shard file name → file
        for (const auto& [tensor, shard] : weight_map) {
            if (shards.count(shard)) continue;
            if (!is_plain_file_name(shard)) {
                return data_loss(index_path.string() + ": shard '" + printable(shard) + "' of tensor '" +
                                 printable(tensor) + "' is not a file name inside " + model_dir);
            }
            auto file = add_file(dir / shard);
            if (!file.is_ok()) {
                return file.status().with_context(index_path.string() + ": shard of tensor '" +
                                                  printable(tensor) + "'");
            }
            shards.emplace(shard, file.value());
        }
        for (const auto& [tensor, shard] : weight_map) {
            if (shards.at(shard)->find(tensor) == nullptr) {
                return data_loss(index_path.string() + ": tensor '" + printable(tensor) +
                                 "' is not in its shard " + shards.at(shard)->path());
            }
        }
    } else {
        std::vector<fs::path> paths;
        for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
            if (is_unindexed_shard_name(it->path().filename().string())) paths.push_back(it->path());
        }
        if (ec) return not_found(model_dir + ": cannot list: " + ec.message());
        if (paths.empty()) {
            return not_found(model_dir + ": no model weights: neither " + kIndexFileName +
                             " nor model*.safetensors");
        }
        std::sort(paths.begin(), paths.end());
        for (const fs::path& path : paths) EPI_RETURN_IF_ERROR(add_file(path).status());
    }
    return ckpt;
}

Checkpoint::Entry Checkpoint::find(const std::string& name) const {
    const auto it = entries_.find(name);
    return it == entries_.end() ? Entry{nullptr, nullptr} : it->second;
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [name, entry] : entries_) out.push_back(name);
    return out;
}

}  // namespace epinfer
