// The hand-written TBinaryProtocol codec and the generated wire constants, without an owner.
#include <fstream>
#include <sstream>

#include "binary_protocol.hpp"
#include "fluxkv/fluxkv.hpp"
#include "messages.hpp"
#include "testing.hpp"
#include "wire_constants.hpp"

using namespace fluxkv::detail;
using fkvtest::fail;

TEST(generated_constants_match_the_idl) {
  std::ifstream f(FLUXKV_EXTERNAL_THRIFT);
  CHECK(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  std::string idl = ss.str();
  auto value = [&](const std::string& name) {
    std::string at = "\nconst i32 " + name + " = ";
    auto i = idl.find(at);
    if (i == std::string::npos) fail("no constant " + name + " in the IDL", __FILE__, __LINE__);
    return std::stoi(idl.substr(i + at.size()));
  };
  CHECK_EQ(fluxkv::wire::PROTOCOL_VERSION, value("PROTOCOL_VERSION"));
  CHECK_EQ(fluxkv::wire::MAX_KEY_BYTES, value("MAX_KEY_BYTES"));
  CHECK_EQ(fluxkv::wire::MAX_FRAME_BYTES, value("MAX_FRAME_BYTES"));
  CHECK_EQ(fluxkv::wire::MAX_ATTACH_FRAME_BYTES, value("MAX_ATTACH_FRAME_BYTES"));
  CHECK_EQ(fluxkv::wire::MAX_HELLO_NAME_BYTES, value("MAX_HELLO_NAME_BYTES"));
  CHECK_EQ(fluxkv::wire::MAX_BATCH, value("MAX_BATCH"));
  CHECK_EQ(fluxkv::wire::MAX_RELEASES_PER_CALL, value("MAX_RELEASES_PER_CALL"));
  CHECK_EQ(fluxkv::wire::MAX_PIN_MS, value("MAX_PIN_MS"));
  CHECK_EQ(fluxkv::kMaxPin.count(), value("MAX_PIN_MS"));
  CHECK_EQ(fluxkv::wire::PUT_END_MEMORY, value("PUT_END_MEMORY"));
  CHECK_EQ(fluxkv::wire::PUT_WAVE_SEGMENT_DIVISOR, value("PUT_WAVE_SEGMENT_DIVISOR"));
  // The owner accepts frames above the Debian libthrift default (16,384,000 bytes): the
  // reason this client has its own codec.
  CHECK(fluxkv::wire::MAX_FRAME_BYTES > 16384000);
}

TEST(request_encoding_is_strict_binary) {
  std::vector<std::uint8_t> buf;
  Writer w(buf);
  w.message_begin("Get", M_CALL, 7);
  std::int64_t rel[] = {5, 6};
  w.field(T_STRUCT, 1);
  write_key_request(w, SessionRef{1, 2, 3, rel}, "k");
  w.stop();
  Reader r(buf.data(), buf.size());
  std::string name;
  MessageType type;
  std::int32_t seq;
  r.message_begin(name, type, seq);
  CHECK_EQ(name, std::string("Get"));
  CHECK(type == M_CALL);
  CHECK_EQ(seq, 7);
  // args { 1: req { 1: session { 1,2,3, 4: [5,6] }, 2: "k" } }
  TType t;
  std::int16_t id;
  CHECK(r.field(t, id) && t == T_STRUCT && id == 1);
  CHECK(r.field(t, id) && t == T_STRUCT && id == 1);
  for (std::int64_t want : {1, 2, 3}) {
    CHECK(r.field(t, id) && t == T_I64);
    CHECK_EQ(r.i64(), want);
  }
  CHECK(r.field(t, id) && t == T_LIST && id == 4);
  CHECK_EQ(r.list_begin(T_I64), 2u);
  CHECK_EQ(r.i64(), 5);
  CHECK_EQ(r.i64(), 6);
  CHECK(!r.field(t, id));
  CHECK(r.field(t, id) && t == T_STRING && id == 2);
  CHECK_EQ(r.string(), std::string("k"));
  CHECK(!r.field(t, id));
  CHECK(!r.field(t, id));
  CHECK_EQ(r.remaining(), 0u);
}

TEST(response_decoding_skips_unknown_fields_and_rejects_garbage) {
  std::vector<std::uint8_t> buf;
  Writer w(buf);
  w.field(T_I32, 1);
  w.i32(0);
  w.field(T_LIST, 99);  // a field from a newer IDL
  w.list_begin(T_STRING, 2);
  w.string("a");
  w.string("bc");
  w.field(T_I64, 3);
  w.i64(42);
  w.field(T_I64, 4);
  w.i64(4096);
  w.field(T_I64, 5);
  w.i64(100);
  w.field(T_I32, 6);
  w.i32(2);
  w.field(T_BOOL, 8);
  w.boolean(true);
  w.field(T_STRING, 5);  // a known id with an unexpected type: skipped
  w.string("x");
  w.stop();
  GetResponse g;
  Reader r(buf.data(), buf.size());
  g.read(r);
  CHECK_EQ(g.code, 0);
  CHECK(g.has_holder);
  CHECK_EQ(g.holder_id, 42);
  CHECK_EQ(g.offset, 4096);
  CHECK_EQ(g.len, 100);
  CHECK_EQ(g.source, 2);
  CHECK(g.remote);
  CHECK_EQ(r.remaining(), 0u);

  for (std::size_t cut = 0; cut < buf.size(); ++cut) {  // every truncation is an error
    GetResponse x;
    Reader rr(buf.data(), cut);
    CHECK_THROWS(ProtocolError, x.read(rr));
  }
  std::vector<std::uint8_t> neg;
  Writer wn(neg);
  wn.field(T_STRING, 2);
  wn.i32(-5);
  PlainResponse p;
  Reader rn(neg.data(), neg.size());
  CHECK_THROWS(ProtocolError, p.read(rn));
  std::vector<std::uint8_t> big;
  Writer wb(big);
  wb.field(T_LIST, 3);
  wb.list_begin(T_STRUCT, 1000000);  // more elements than bytes
  BatchResponse<GetResponse> b;
  Reader rb(big.data(), big.size());
  CHECK_THROWS(ProtocolError, b.read(rb));
}
