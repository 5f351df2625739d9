#include "binary_protocol.hpp"

#include <limits>

namespace fluxkv::detail {

namespace {
constexpr std::uint32_t kVersion1 = 0x80010000u;
constexpr std::uint32_t kVersionMask = 0xffff0000u;
constexpr int kMaxDepth = 64;
}  // namespace

void Writer::string(std::string_view s) {
  if (s.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw ProtocolError("string too long to encode");
  i32(static_cast<std::int32_t>(s.size()));
  out_.insert(out_.end(), s.begin(), s.end());
}

void Writer::list_begin(TType elem, std::size_t n) {
  if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw ProtocolError("list too long to encode");
  out_.push_back(elem);
  i32(static_cast<std::int32_t>(n));
}

void Writer::message_begin(std::string_view name, MessageType type, std::int32_t seq) {
  i32(static_cast<std::int32_t>(kVersion1 | type));
  string(name);
  i32(seq);
}

std::string Reader::string() {
  std::int32_t n = i32();
  if (n < 0) throw ProtocolError("negative string length");
  const std::uint8_t* b = take(static_cast<std::size_t>(n));
  return std::string(reinterpret_cast<const char*>(b), static_cast<std::size_t>(n));
}

bool Reader::field(TType& type, std::int16_t& id) {
  type = static_cast<TType>(*take(1));
  if (type == T_STOP) return false;
  id = i16();
  return true;
}

std::size_t Reader::list_begin(TType want_elem, std::size_t max) {
  auto elem = static_cast<TType>(*take(1));
  std::int32_t n = i32();
  if (n < 0) throw ProtocolError("negative list length");
  if (n > 0 && elem != want_elem) throw ProtocolError("list of unexpected element type");
  // Every element takes at least one byte: a count beyond the frame is malformed, and
  // checking it here bounds the reservations callers make from it.
  if (static_cast<std::size_t>(n) > remaining()) throw ProtocolError("list longer than its message");
  if (static_cast<std::size_t>(n) > max)
    throw ProtocolError("list of " + std::to_string(n) + " elements, more than the " + std::to_string(max) + " it may hold");
  return static_cast<std::size_t>(n);
}

void Reader::skip(TType type, int depth) {
  if (depth > kMaxDepth) throw ProtocolError("message nested too deeply");
  switch (type) {
    case T_BOOL:
    case T_BYTE: take(1); return;
    case T_I16: take(2); return;
    case T_I32: take(4); return;
    case T_DOUBLE:
    case T_I64: take(8); return;
    case T_STRING: {
      std::int32_t n = i32();
      if (n < 0) throw ProtocolError("negative string length");
      take(static_cast<std::size_t>(n));
      return;
    }
    case T_STRUCT: {
      TType t;
      std::int16_t id;
      while (field(t, id)) skip(t, depth + 1);
      return;
    }
    case T_MAP: {
      auto k = static_cast<TType>(*take(1));
      auto v = static_cast<TType>(*take(1));
      std::int32_t n = i32();
      if (n < 0) throw ProtocolError("negative map size");
      for (std::int32_t i = 0; i < n; ++i) {
        skip(k, depth + 1);
        skip(v, depth + 1);
      }
      return;
    }
    case T_SET:
    case T_LIST: {
      auto e = static_cast<TType>(*take(1));
      std::int32_t n = i32();
      if (n < 0) throw ProtocolError("negative list size");
      for (std::int32_t i = 0; i < n; ++i) skip(e, depth + 1);
      return;
    }
    default: throw ProtocolError("unknown field type " + std::to_string(static_cast<int>(type)));
  }
}

void Reader::message_begin(std::string& name, MessageType& type, std::int32_t& seq) {
  auto head = static_cast<std::uint32_t>(i32());
  if ((head & kVersionMask) == kVersion1) {
    type = static_cast<MessageType>(head & 0xff);
    name = string();
  } else if (static_cast<std::int32_t>(head) >= 0) {
    // Old non-strict form: the header is the name's length.
    const std::uint8_t* b = take(head);
    name.assign(reinterpret_cast<const char*>(b), head);
    type = static_cast<MessageType>(i8());
  } else {
    throw ProtocolError("bad message version");
  }
  seq = i32();
}

}  // namespace fluxkv::detail
