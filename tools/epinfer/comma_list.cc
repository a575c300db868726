#include "comma_list.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

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
                    fmt::format("{}: {} '{}' has an empty item (expected {})", command, flag, text, expected));
            }
            items.push_back(text.substr(begin, end - begin));
            if (end == text.size()) break;
            begin = end + 1;
        }
    }
    return items;
}

Result<std::vector<int64_t>> parse_comma_ints(const std::vector<std::string>& values, const std::string& command,
                                              const std::string& flag) {
    std::vector<int64_t> numbers;
    for (const std::string& text : values) {
        EPI_ASSIGN_OR_RETURN(const std::vector<std::string> items,
                             split_comma_lists({text}, command, flag, "integers separated by single commas"));
        for (const std::string& item : items) {
            int64_t value = 0;
            const char* last = item.data() + item.size();
            const auto [ptr, ec] = std::from_chars(item.data(), last, value);
            if (ec != std::errc() || ptr != last) {
                return invalid_argument(fmt::format("{}: {} '{}': '{}' is not an integer", command, flag, text, item));
            }
            numbers.push_back(value);
        }
    }
    return numbers;
}

}  // namespace epinfer::cli
