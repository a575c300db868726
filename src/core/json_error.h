// The text of a JSON parse error as a user reads it.
#pragma once

#include <exception>
#include <string>

namespace epinfer {

// nlohmann::json's exception text without its "[json.exception.parse_error.101] " tag, e.g.
// "parse error at line 3, column 7: syntax error while parsing value - invalid literal; last read: '"a": g'".
inline std::string json_error_text(const std::exception& error) {
    std::string what = error.what();
    if (what.rfind("[json.exception.", 0) == 0) {
        if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    }
    return what;
}

}  // namespace epinfer
