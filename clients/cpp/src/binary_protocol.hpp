// A hand-written TBinaryProtocol (strict) codec for the few ExternalService messages this
// client speaks: the same bytes the generated thrift code of every other client writes.
// Writer appends to a byte buffer; Reader walks a received frame and throws
// ProtocolError on anything malformed (a short frame, a negative length, a wrong type).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <span>
#include <vector>

namespace fluxkv::detail {

// TType values of TBinaryProtocol.
enum TType : std::uint8_t {
  T_STOP = 0,
  T_BOOL = 2,
  T_BYTE = 3,
  T_DOUBLE = 4,
  T_I16 = 6,
  T_I32 = 8,
  T_I64 = 10,
  T_STRING = 11,
  T_STRUCT = 12,
  T_MAP = 13,
  T_SET = 14,
  T_LIST = 15,
};

// TMessageType.
enum MessageType : std::uint8_t { M_CALL = 1, M_REPLY = 2, M_EXCEPTION = 3, M_ONEWAY = 4 };

class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Writer {
 public:
  explicit Writer(std::vector<std::uint8_t>& out) : out_(out) {}

  void i8(std::int8_t v) { out_.push_back(static_cast<std::uint8_t>(v)); }
  void boolean(bool v) { out_.push_back(v ? 1 : 0); }
  void i16(std::int16_t v) { be(static_cast<std::uint16_t>(v), 2); }
  void i32(std::int32_t v) { be(static_cast<std::uint32_t>(v), 4); }
  void i64(std::int64_t v) { be(static_cast<std::uint64_t>(v), 8); }
  void string(std::string_view s);
  void field(TType type, std::int16_t id) {
    out_.push_back(type);
    i16(id);
  }
  void stop() { out_.push_back(T_STOP); }
  // Bytes another Writer wrote (a request kept to be sent again).
  void raw(std::span<const std::uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  void list_begin(TType elem, std::size_t n);
  void message_begin(std::string_view name, MessageType type, std::int32_t seq);

 private:
  void be(std::uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  std::vector<std::uint8_t>& out_;
};

class Reader {
 public:
  Reader(const std::uint8_t* p, std::size_t n) : p_(p), end_(p + n) {}

  std::int8_t i8() { return static_cast<std::int8_t>(*take(1)); }
  bool boolean() { return *take(1) != 0; }
  std::int16_t i16() { return static_cast<std::int16_t>(be(2)); }
  std::int32_t i32() { return static_cast<std::int32_t>(be(4)); }
  std::int64_t i64() { return static_cast<std::int64_t>(be(8)); }
  std::string string();
  // The next field's type and id; false at the struct's STOP.
  bool field(TType& type, std::int16_t& id);
  // A list header: its element count, after checking the element type.
  // list_begin reads a list header of elements of want_elem, at most max of them (a count
  // beyond it, or beyond the bytes left, is malformed: it bounds what callers allocate).
  std::size_t list_begin(TType want_elem, std::size_t max = SIZE_MAX);
  // Skips a value of the given type (unknown fields).
  void skip(TType type, int depth = 0);
  // Message header: name, type and sequence id (strict or old non-strict form).
  void message_begin(std::string& name, MessageType& type, std::int32_t& seq);
  std::size_t remaining() const { return static_cast<std::size_t>(end_ - p_); }

 private:
  const std::uint8_t* take(std::size_t n) {
    if (static_cast<std::size_t>(end_ - p_) < n) throw ProtocolError("truncated message");
    const std::uint8_t* at = p_;
    p_ += n;
    return at;
  }
  std::uint64_t be(int n) {
    const std::uint8_t* b = take(static_cast<std::size_t>(n));
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | b[i];
    return v;
  }
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

// Reads a field value of an expected type, or skips it when the type differs (a peer with
// a different IDL version): the caller keeps the field's default then.
template <class F>
inline void expect(Reader& r, TType got, TType want, F&& read) {
  if (got == want) {
    read();
  } else {
    r.skip(got);
  }
}

}  // namespace fluxkv::detail
