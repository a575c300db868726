#include "engine/request.h"

namespace epinfer {

const char* finish_reason_name(FinishReason reason) {
    switch (reason) {
        case FinishReason::kNone: return "";
        case FinishReason::kLength: return "length";
        case FinishReason::kStop: return "stop";
        case FinishReason::kAborted: return "abort";
    }
    return "";
}

}  // namespace epinfer
