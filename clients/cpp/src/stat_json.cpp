// Client::stat_json: the owner's Stat as JSON, in the shape of the Python client's stat()
// (the fields of `fluxkv status --json` plus node_id, client_holders and clients).
#include <cstdio>

#include "client_impl.hpp"

namespace fluxkv::detail {

namespace {

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void json_capacity(std::string& out, const CapacityStat& c) {
  out += "{\"capacity_bytes\": " + std::to_string(c.capacity_bytes) + ", \"used_bytes\": " + std::to_string(c.used_bytes) + "}";
}

}  // namespace

std::string ClientImpl::stat_json() {
  StatResponse r = run([&](std::shared_ptr<Session>& s) {
    try {
      s->flush_releases();
    } catch (const Unavailable&) {
      // Releases a failed call gave back (flush_releases): the status is asked for all the same.
    }
    StatResponse resp;
    s->call("Stat", [&](Writer& w, const SessionRef& ref) { write_stat(w, ref); }, resp, false);
    raise_for(resp.code, resp.message);
    return resp;
  });
  std::string out = "{\"node_id\": ";
  json_string(out, r.node_id);
  out += ", \"keys\": " + std::to_string(r.keys);
  out += ", \"client_holders\": " + std::to_string(r.client_holders);
  out += ", \"clients\": " + std::to_string(r.clients);
  out += ", \"members\": [";
  for (std::size_t i = 0; i < r.members.size(); ++i) {
    const MemberStat& m = r.members[i];
    if (i > 0) out += ", ";
    out += "{\"node_id\": ";
    json_string(out, m.node_id);
    out += ", \"generation\": " + std::to_string(m.generation);
    out += std::string(", \"alive\": ") + (m.alive ? "true" : "false");
    out += ", \"memory_segment\": ";
    json_capacity(out, m.memory_segment);
    out += ", \"kv_ssd\": ";
    json_capacity(out, m.kv_ssd);
    out += ", \"data_addr\": ";
    json_string(out, m.data_addr);
    out += ", \"peer_addr\": ";
    json_string(out, m.peer_addr);
    out += ", \"memory_replicas\": " + std::to_string(m.memory_replicas);
    out += ", \"ssd_replicas\": " + std::to_string(m.ssd_replicas);
    out += ", \"holders\": " + std::to_string(m.holders) + "}";
  }
  out += "]}";
  return out;
}

}  // namespace fluxkv::detail
