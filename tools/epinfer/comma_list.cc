#include "comma_list.h"

#include <fmt/format.h>

#include <algorithm>

namespace epinfer::cli {

Result<std::vector<std::string>> split_comma_lists(const std::vector<std::string>& values, const std::string& command,
                                                   const std::string& flag, const std::string& expected) {
    std::vector<std::string> items;
    for (const std::string& text : values) {
        size_t begin = 0;
        for (;;) {
            const size_t end = std::min(text.find(',', begin), text.size());
            if (end == begin) {
                return invalid_argument(
                    fmt::format("{}: {} '{}': empty item (expected {})", command, flag, text, expected));
            }
            items.push_back(text.substr(begin, end - begin));
            if (end == text.size()) break;
            begin = end + 1;
        }
    }
    return items;
}

}  // namespace epinfer::cli
