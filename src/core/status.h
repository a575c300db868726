// Status and Result<T>: how every function in src/ reports failure (no exceptions cross a boundary).
//
// A Status is a code plus a one-line message; context is prepended as it propagates, e.g.
//   EPI_RETURN_IF_ERROR(load(x), "loading layer " + std::to_string(il));
// so the user sees "loading layer 3: model.safetensors: tensor 'x': truncated".
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace epinfer {

enum class StatusCode {
    kOk = 0,
    kInvalidArgument,  // bad user input: flags, request fields, prompt ids
    kNotFound,         // missing file or tensor
    kDataLoss,         // corrupt or truncated file
    kNotSupported,     // valid input that this build or backend cannot run
    kOutOfMemory,      // a memory plan that does not fit
    kCommFailure,      // a peer rank failed
    kTimeout,          // a bounded wait expired
    kUnavailable,      // overloaded or shutting down: try again later (HTTP 503)
    kInternal,         // a bug
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status ok() { return Status(); }
    bool is_ok() const { return code_ == StatusCode::kOk; }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }
    // Returns a copy with "context: " prepended to the message.
    Status with_context(const std::string& context) const {
        return is_ok() ? *this : Status(code_, context + ": " + message_);
    }
    std::string to_string() const;

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

inline Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
inline Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
inline Status data_loss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
inline Status not_supported(std::string msg) { return {StatusCode::kNotSupported, std::move(msg)}; }
inline Status internal_error(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

// A value or an error, never both.
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
    Result(Status status) : status_(std::move(status)) {   // NOLINT: implicit by design
        if (status_.is_ok()) status_ = internal_error("Result constructed from an OK status");
    }
    bool is_ok() const { return value_.has_value(); }
    const Status& status() const { return status_; }
    T& value() & { return *value_; }
    const T& value() const& { return *value_; }
    T&& value() && { return std::move(*value_); }
    T* operator->() { return &*value_; }
    const T* operator->() const { return &*value_; }
    T& operator*() { return *value_; }
    const T& operator*() const { return *value_; }

private:
    std::optional<T> value_;
    Status status_;
};

}  // namespace epinfer

#define EPI_CONCAT_INNER(a, b) a##b
#define EPI_CONCAT(a, b) EPI_CONCAT_INNER(a, b)

// Returns the error of `expr` (a Status) from the enclosing function.
#define EPI_RETURN_IF_ERROR(expr)                          \
    do {                                                   \
        ::epinfer::Status epi_status_ = (expr);            \
        if (!epi_status_.is_ok()) return epi_status_;      \
    } while (0)

// Same, with "context: " prepended to the message (context is any std::string expression).
#define EPI_RETURN_IF_ERROR_CTX(expr, context)                                   \
    do {                                                                         \
        ::epinfer::Status epi_status_ = (expr);                                  \
        if (!epi_status_.is_ok()) return epi_status_.with_context(context);      \
    } while (0)

// Declares `lhs` from a Result<T> expression, or returns its error.
#define EPI_ASSIGN_OR_RETURN(lhs, expr) EPI_ASSIGN_OR_RETURN_IMPL(EPI_CONCAT(epi_result_, __LINE__), lhs, expr)
#define EPI_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
    auto tmp = (expr);                            \
    if (!tmp.is_ok()) return tmp.status();        \
    lhs = std::move(tmp).value()
