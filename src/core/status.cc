#include "core/status.h"

namespace epinfer {

const char* status_code_name(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return "ok";
        case StatusCode::kInvalidArgument: return "invalid argument";
        case StatusCode::kNotFound: return "not found";
        case StatusCode::kDataLoss: return "data loss";
        case StatusCode::kNotSupported: return "not supported";
        case StatusCode::kOutOfMemory: return "out of memory";
        case StatusCode::kCommFailure: return "communication failure";
        case StatusCode::kTimeout: return "timeout";
        case StatusCode::kUnavailable: return "unavailable";
        case StatusCode::kInternal: return "internal error";
    }
    return "unknown";
}

std::string Status::to_string() const {
    if (is_ok()) return "ok";
    return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace epinfer
