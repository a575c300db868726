// What is at a path of a checkpoint folder, so that a folder, a FIFO or a dangling link where a file is
// expected is named as such instead of "not found" (and a FIFO is never opened: opening one blocks).
#pragma once

#include <string>

#include "core/status.h"

namespace epinfer {

// True when anything is at `path`: a file, a folder, a FIFO, a socket, a device, a link (also one that
// points nowhere).
bool path_exists(const std::string& path);

// OK when `path`, links followed, is a regular file. Else kNotFound, one line naming `path` and what is
// there instead: "PATH: not found" (nothing), "PATH: is a directory, not a file", "PATH: is a FIFO, not a
// regular file" (likewise a socket, a block or character device), "PATH: is a dangling symbolic link",
// "PATH: cannot stat: REASON" (e.g. a folder without search permission).
Status check_regular_file(const std::string& path);

}  // namespace epinfer
