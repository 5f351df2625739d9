#include "messages.hpp"

namespace fluxkv::detail {

bool Status::read_field(Reader& r, TType t, std::int16_t id) {
  if (id == 1 && t == T_I32) {
    code = r.i32();
    return true;
  }
  if (id == 2 && t == T_STRING) {
    message = r.string();
    return true;
  }
  return false;
}

void PutStartResponse::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    if (read_field(r, t, id)) return true;
    if (t != T_I64) return false;
    if (id == 3) put_id = r.i64();
    else if (id == 4) offset = r.i64();
    else return false;
    return true;
  });
}

void GetResponse::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    if (read_field(r, t, id)) return true;
    switch (id) {
      case 3: if (t != T_I64) return false; holder_id = r.i64(); has_holder = true; return true;
      case 4: if (t != T_I64) return false; offset = r.i64(); return true;
      case 5: if (t != T_I64) return false; len = r.i64(); return true;
      case 6: if (t != T_I32) return false; source = r.i32(); return true;
      case 7: if (t != T_I64) return false; put_id = r.i64(); return true;
      case 8: if (t != T_BOOL) return false; remote = r.boolean(); return true;
      default: return false;
    }
  });
}

void PlainResponse::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) { return read_field(r, t, id); });
}

void FlagResponse::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    if (read_field(r, t, id)) return true;
    if (id != 3 || t != T_BOOL) return false;
    flag = r.boolean();
    return true;
  });
}

void ReleaseResponse::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    if (read_field(r, t, id)) return true;
    if (id != 3 || t != T_LIST) return false;
    std::size_t n = r.list_begin(T_I32, kMaxResults);
    results.resize(n);
    for (auto& x : results) x = r.i32();
    return true;
  });
}

void BatchExistsResponse::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    if (read_field(r, t, id)) return true;
    if (id == 3 && t == T_LIST) {
      std::size_t n = r.list_begin(T_STRUCT, kMaxResults);
      results.resize(n);
      for (auto& x : results) x.read(r);
      has_results = true;
      return true;
    }
    if (id == 4 && t == T_I32) {
      found = r.i32();
      return true;
    }
    return false;
  });
}

void CapacityStat::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    if (t != T_I64) return false;
    if (id == 1) capacity_bytes = r.i64();
    else if (id == 2) used_bytes = r.i64();
    else return false;
    return true;
  });
}

void MemberStat::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    switch (id) {
      case 1: if (t != T_STRING) return false; node_id = r.string(); return true;
      case 2: if (t != T_I64) return false; generation = r.i64(); return true;
      case 3: if (t != T_STRUCT) return false; memory_segment.read(r); return true;
      case 4: if (t != T_STRUCT) return false; kv_ssd.read(r); return true;
      case 5: if (t != T_BOOL) return false; alive = r.boolean(); return true;
      case 6: if (t != T_STRING) return false; data_addr = r.string(); return true;
      case 7: if (t != T_STRING) return false; peer_addr = r.string(); return true;
      case 8: if (t != T_I64) return false; memory_replicas = r.i64(); return true;
      case 9: if (t != T_I64) return false; ssd_replicas = r.i64(); return true;
      case 10: if (t != T_I64) return false; holders = r.i64(); return true;
      default: return false;
    }
  });
}

void StatResponse::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    if (read_field(r, t, id)) return true;
    switch (id) {
      case 3: {
        if (t != T_LIST) return false;
        std::size_t n = r.list_begin(T_STRUCT, kMaxMembers);
        members.resize(n);
        for (auto& m : members) m.read(r);
        return true;
      }
      case 4: if (t != T_I64) return false; keys = r.i64(); return true;
      case 5: if (t != T_STRING) return false; node_id = r.string(); return true;
      case 6: if (t != T_I64) return false; client_holders = r.i64(); return true;
      case 7: if (t != T_I64) return false; clients = r.i64(); return true;
      default: return false;
    }
  });
}

void AttachReply::read(Reader& r) {
  read_struct(r, [&](TType t, std::int16_t id) {
    if (read_field(r, t, id)) return true;
    switch (id) {
      case 3: if (t != T_I32) return false; protocol_version = r.i32(); has_protocol_version = true; return true;
      case 4: if (t != T_I64) return false; client_id = r.i64(); return true;
      case 5: if (t != T_I64) return false; session_token = r.i64(); return true;
      case 6: if (t != T_I64) return false; owner_generation = r.i64(); return true;
      case 7: if (t != T_I64) return false; segment_size = r.i64(); return true;
      case 8: if (t != T_STRING) return false; rpc_socket = r.string(); return true;
      case 9: if (t != T_STRING) return false; node_id = r.string(); return true;
      case 10: if (t != T_BOOL) return false; isolated = r.boolean(); return true;
      case 11: if (t != T_I64) return false; put_area_size = r.i64(); return true;
      default: return false;
    }
  });
}

void write_attach_hello(Writer& w, std::int32_t protocol_version, std::string_view name, std::int32_t pid) {
  w.field(T_I32, 1);
  w.i32(protocol_version);
  w.field(T_STRING, 2);
  w.string(name);
  w.field(T_I32, 3);
  w.i32(pid);
  w.stop();
}

void write_session(Writer& w, const SessionRef& s) {
  w.field(T_STRUCT, 1);
  w.field(T_I64, 1);
  w.i64(s.client_id);
  w.field(T_I64, 2);
  w.i64(s.session_token);
  w.field(T_I64, 3);
  w.i64(s.owner_generation);
  w.field(T_LIST, 4);
  w.list_begin(T_I64, s.releases.size());
  for (std::int64_t id : s.releases) w.i64(id);
  w.stop();
}

void write_key_request(Writer& w, const SessionRef& s, std::string_view key) {
  write_session(w, s);
  w.field(T_STRING, 2);
  w.string(key);
  w.stop();
}

void write_put_start(Writer& w, const SessionRef& s, std::string_view key, std::int64_t len, bool reject_if_exists) {
  write_session(w, s);
  w.field(T_STRING, 2);
  w.string(key);
  w.field(T_I64, 3);
  w.i64(len);
  w.field(T_STRUCT, 4);
  w.field(T_BOOL, 1);
  w.boolean(reject_if_exists);
  w.stop();
  w.stop();
}

namespace {
void write_copies(Writer& w, std::int16_t field, const std::vector<AreaCopy>& copies) {
  w.field(T_LIST, field);
  w.list_begin(T_STRUCT, copies.size());
  for (const AreaCopy& c : copies) {
    w.field(T_I64, 1);
    w.i64(c.value_offset);
    w.field(T_I64, 2);
    w.i64(c.area_offset);
    w.field(T_I64, 3);
    w.i64(c.len);
    w.stop();
  }
}
}  // namespace

void write_put_ref(Writer& w, const SessionRef& s, std::string_view key, std::int64_t put_id,
                   const std::vector<AreaCopy>* copies) {
  write_session(w, s);
  w.field(T_STRING, 2);
  w.string(key);
  w.field(T_I64, 3);
  w.i64(put_id);
  if (copies != nullptr && !copies->empty()) write_copies(w, 4, *copies);
  w.stop();
}

void write_release(Writer& w, const SessionRef& s, std::span<const std::int64_t> ids) {
  write_session(w, s);
  w.field(T_LIST, 2);
  w.list_begin(T_I64, ids.size());
  for (std::int64_t id : ids) w.i64(id);
  w.stop();
}

void write_keys(Writer& w, const SessionRef& s, std::span<const std::string_view> keys) {
  write_session(w, s);
  w.field(T_LIST, 2);
  w.list_begin(T_STRING, keys.size());
  for (std::string_view k : keys) w.string(k);
  w.stop();
}

void write_batch_exists(Writer& w, const SessionRef& s, std::span<const std::string_view> keys, bool prefix,
                        std::int64_t pin_ms) {
  write_session(w, s);
  w.field(T_LIST, 2);
  w.list_begin(T_STRING, keys.size());
  for (std::string_view k : keys) w.string(k);
  w.field(T_BOOL, 3);
  w.boolean(prefix);
  w.field(T_I64, 4);
  w.i64(pin_ms);
  w.stop();
}

void write_batch_put_start(Writer& w, const SessionRef& s, std::span<const PutStartItem> items, bool reject_if_exists) {
  write_session(w, s);
  w.field(T_LIST, 2);
  w.list_begin(T_STRUCT, items.size());
  for (const PutStartItem& it : items) {
    w.field(T_STRING, 1);
    w.string(it.key);
    w.field(T_I64, 2);
    w.i64(it.len);
    w.field(T_STRUCT, 3);
    w.field(T_BOOL, 1);
    w.boolean(reject_if_exists);
    w.stop();
    w.stop();
  }
  w.stop();
}

void write_batch_put_end(Writer& w, const SessionRef& s, std::span<const PutEndItem> items) {
  write_session(w, s);
  w.field(T_LIST, 2);
  w.list_begin(T_STRUCT, items.size());
  for (const PutEndItem& it : items) {
    w.field(T_STRING, 1);
    w.string(it.key);
    w.field(T_I64, 2);
    w.i64(it.put_id);
    if (!it.copies.empty()) write_copies(w, 3, it.copies);
    w.stop();
  }
  w.stop();
}

void write_stat(Writer& w, const SessionRef& s) {
  write_session(w, s);
  w.stop();
}

}  // namespace fluxkv::detail
