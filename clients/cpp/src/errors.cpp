// fluxkv::Error and the mapping from wire ErrorCode to exception classes.
#include <cstdint>
#include <string>

#include "client_impl.hpp"
#include "fluxkv/fluxkv.h"
#include "wire_constants.hpp"

namespace fluxkv {

// The public enums (C++ and C) are written out by hand so the headers stand alone; these
// checks hold them equal to protocol/common.thrift (wire_constants.hpp is generated from it).
#define FLUXKV_SAME_CODE(NAME)                                                                   \
  static_assert(static_cast<int>(ErrorCode::NAME) == static_cast<int>(wire::Code::NAME));       \
  static_assert(FLUXKV_##NAME == static_cast<int>(wire::Code::NAME));
FLUXKV_SAME_CODE(OK)
FLUXKV_SAME_CODE(KEY_NOT_FOUND)
FLUXKV_SAME_CODE(NO_SPACE)
FLUXKV_SAME_CODE(INVALID_ARGUMENT)
FLUXKV_SAME_CODE(ALREADY_EXISTS)
FLUXKV_SAME_CODE(BUSY)
FLUXKV_SAME_CODE(STALE_GENERATION)
FLUXKV_SAME_CODE(UNAVAILABLE)
FLUXKV_SAME_CODE(INTERNAL)
FLUXKV_SAME_CODE(PERMISSION_DENIED)
FLUXKV_SAME_CODE(NOT_LEADER)
#undef FLUXKV_SAME_CODE
// A new code in the IDL must be added to both public headers too.
static_assert(wire::code_name(11) == nullptr, "protocol/common.thrift has a new ErrorCode: add it to fluxkv.hpp and fluxkv.h");

namespace {
std::string with_code(ErrorCode code, const std::string& message) {
  const char* name = wire::code_name(static_cast<std::int32_t>(code));
  std::string n = name != nullptr ? name : "CODE_" + std::to_string(static_cast<int>(code));
  return message.empty() ? n : n + ": " + message;
}
}  // namespace

Error::Error(ErrorCode code, const std::string& message, int sys_errno)
    : std::runtime_error(with_code(code, message)), code_(code), errno_(sys_errno), message_(message) {}

void throw_error(ErrorCode code, const std::string& message, int sys_errno) {
  switch (code) {
    case ErrorCode::KEY_NOT_FOUND: throw KeyNotFound(code, message, sys_errno);
    case ErrorCode::NO_SPACE: throw NoSpace(code, message, sys_errno);
    case ErrorCode::INVALID_ARGUMENT: throw InvalidArgument(code, message, sys_errno);
    case ErrorCode::ALREADY_EXISTS: throw AlreadyExists(code, message, sys_errno);
    case ErrorCode::UNAVAILABLE: throw Unavailable(code, message, sys_errno);
    case ErrorCode::PERMISSION_DENIED: throw PermissionDenied(code, message, sys_errno);
    default: throw Error(code, message, sys_errno);
  }
}

namespace detail {

void raise_for(std::int32_t code, const std::string& message) {
  if (code == static_cast<std::int32_t>(wire::Code::OK)) return;
  if (code < 0) throw Error(ErrorCode::INTERNAL, "response carries no error code: " + message);
  throw_error(static_cast<ErrorCode>(code), message);
}

std::exception_ptr error_ptr(std::int32_t code, const std::string& message) {
  try {
    raise_for(code, message);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void validate_key(std::string_view key) {
  if (key.empty()) throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "empty key");
  if (key.size() > static_cast<std::size_t>(wire::MAX_KEY_BYTES))
    throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "key of " + std::to_string(key.size()) +
                                                           " bytes exceeds the limit of " + std::to_string(wire::MAX_KEY_BYTES));
}

std::int64_t validate_len(std::size_t n, std::int64_t seg) {
  if (n == 0 || n > static_cast<std::uint64_t>(seg)) {
    std::string len = std::to_string(n);
    if (n == SIZE_MAX) len += " (SIZE_MAX)";
    throw InvalidArgument(ErrorCode::INVALID_ARGUMENT,
                          "value length " + len + " must be 1 byte to the segment size " + std::to_string(seg));
  }
  return static_cast<std::int64_t>(n);
}

std::string quote(std::string_view key) {
  constexpr std::size_t kShown = 80;
  std::string q = "'";
  q.append(key.substr(0, kShown));
  if (key.size() > kShown) q += "...";
  q += "'";
  return q;
}

}  // namespace detail
}  // namespace fluxkv
