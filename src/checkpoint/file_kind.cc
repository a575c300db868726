#include "checkpoint/file_kind.h"

#include <filesystem>
#include <system_error>

namespace epinfer {

namespace fs = std::filesystem;

bool path_exists(const std::string& path) {
    std::error_code ec;
    return fs::exists(fs::symlink_status(path, ec));
}

Status check_regular_file(const std::string& path) {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    switch (status.type()) {
        case fs::file_type::regular:
            return Status::ok();
        case fs::file_type::not_found:
            return not_found(path + (path_exists(path) ? ": is a dangling symbolic link" : ": not found"));
        case fs::file_type::directory:
            return not_found(path + ": is a directory, not a file");
        case fs::file_type::fifo:
            return not_found(path + ": is a FIFO, not a regular file");
        case fs::file_type::socket:
            return not_found(path + ": is a socket, not a regular file");
        case fs::file_type::block:
            return not_found(path + ": is a block device, not a regular file");
        case fs::file_type::character:
            return not_found(path + ": is a character device, not a regular file");
        case fs::file_type::none:
            return not_found(path + ": cannot stat: " + ec.message());
        default:
            return not_found(path + ": is not a regular file");
    }
}

}  // namespace epinfer
