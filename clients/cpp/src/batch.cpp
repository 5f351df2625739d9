// Batch calls, as the Python client's. Keys go in chunks of MAX_BATCH (a prefix lookup sends
// a later chunk only when the whole previous one was present). A batch put goes in
// waves (BatchPutStart, copy, BatchPutEnd) of at most MAX_BATCH items holding at most
// segment_size / PUT_WAVE_SEGMENT_DIVISOR bytes started and not ended (a larger item goes
// alone), so a batch never waits for space only it holds.
#include <cstring>
#include <map>

#include "client_impl.hpp"

namespace fluxkv::detail {

namespace {
constexpr std::size_t kChunk = static_cast<std::size_t>(wire::MAX_BATCH);

template <class T>
const std::vector<T>& check_count(const char* method, const BatchResponse<T>& r, std::size_t want) {
  if (!r.has_results || r.results.size() != want)
    throw Error(ErrorCode::INTERNAL, std::string(method) + ": " + (r.has_results ? std::to_string(r.results.size()) : "no") +
                                         " results for " + std::to_string(want) + " items");
  return r.results;
}

std::exception_ptr unknown_ptr(const std::string& why) { return std::make_exception_ptr(OutcomeUnknown(why)); }

// not_written reports whether e is a NotWritten: a put never ended, redone once whatever
// reject_if_exists says.
bool not_written(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const NotWritten&) {
    return true;
  } catch (...) {
    return false;
  }
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}
}  // namespace

void ClientImpl::batch_put(std::span<const PutItem> items, bool reject) {
  if (items.empty()) return;
  std::int64_t seg;
  std::int64_t budget;
  {
    std::shared_ptr<Session> s = current();
    seg = s->segment_size;
    budget = std::max<std::int64_t>(seg / wire::PUT_WAVE_SEGMENT_DIVISOR, 1);
    // Client isolation: a wave's values fit the put area together.
    if (s->isolated) budget = std::min(budget, static_cast<std::int64_t>(s->area.size()));
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    try {
      validate_key(items[i].key);
    } catch (const Error& e) {
      throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "item " + std::to_string(i) + ": " + e.message());
    }
    try {
      validate_len(items[i].value.size(), seg);
    } catch (const Error& e) {
      throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "item " + std::to_string(i) + " (" + quote(items[i].key) + "): " + e.message());
    }
  }
  std::vector<std::exception_ptr> errors(items.size());
  for (std::size_t lo = 0; lo < items.size();) {
    std::size_t hi = lo;
    std::int64_t nbytes = 0;
    std::vector<std::size_t> idx;
    while (hi < items.size() && hi - lo < kChunk &&
           (hi == lo || nbytes + static_cast<std::int64_t>(items[hi].value.size()) <= budget)) {
      nbytes += static_cast<std::int64_t>(items[hi].value.size());
      idx.push_back(hi++);
    }
    put_wave(items, std::move(idx), reject, errors);
    lo = hi;
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void ClientImpl::put_wave(std::span<const PutItem> items, std::vector<std::size_t> idx, bool reject,
                          std::vector<std::exception_ptr>& errors) {
  for (int redo = 0;; ++redo) {
    std::vector<std::size_t> unknown = put_wave_once(items, idx, reject, errors);
    std::vector<std::size_t> again;
    for (std::size_t i : unknown) {
      bool nw = not_written(errors[i]);
      if (redo > 0 || (reject && !nw)) {
        errors[i] = std::make_exception_ptr(Unavailable(ErrorCode::UNAVAILABLE, "key " + quote(items[i].key) + ": " +
                                                                                    (nw ? "not stored: " : "the outcome is unknown: ") +
                                                                                    what_of(errors[i])));
        continue;
      }
      errors[i] = nullptr;
      again.push_back(i);
    }
    if (again.empty()) return;
    put_redos.fetch_add(static_cast<std::int64_t>(again.size()), std::memory_order_relaxed);
    idx = std::move(again);
  }
}

std::vector<std::size_t> ClientImpl::put_wave_once(std::span<const PutItem> items, const std::vector<std::size_t>& idx,
                                                   bool reject, std::vector<std::exception_ptr>& errors) {
  std::vector<PutStartItem> starts;
  starts.reserve(idx.size());
  for (std::size_t i : idx) starts.push_back(PutStartItem{items[i].key, static_cast<std::int64_t>(items[i].value.size())});
  std::shared_ptr<Session> s;
  std::vector<PutStartResponse> results;
  try {
    run(
        [&](std::shared_ptr<Session>& ss) {
          BatchResponse<PutStartResponse> r;
          ss->call("BatchPutStart", [&](Writer& w, const SessionRef& ref) { write_batch_put_start(w, ref, starts, reject); }, r);
          raise_for(r.code, r.message);
          results = check_count("BatchPutStart", r, starts.size());
          s = ss;
        },
        false);
  } catch (const Error&) {
    for (std::size_t i : idx) errors[i] = std::current_exception();
    return {};
  }
  struct Started {
    std::size_t i;
    std::int64_t put_id;
    std::int64_t offset;
  };
  std::vector<Started> started;
  for (std::size_t j = 0; j < idx.size(); ++j) {
    std::size_t i = idx[j];
    const PutStartResponse& res = results[j];
    auto n = static_cast<std::int64_t>(items[i].value.size());
    if (res.code != kOK) {
      errors[i] = error_ptr(res.code, "key " + quote(items[i].key) + ": " + res.message);
    } else if (!s->ro.contains(res.offset, n)) {
      errors[i] = std::make_exception_ptr(Error(ErrorCode::INTERNAL, "BatchPutStart returned offset " + std::to_string(res.offset) +
                                                                         " for " + quote(items[i].key) + " (len " +
                                                                         std::to_string(n) + ") outside the segment"));
      PutEndItem it{items[i].key, res.put_id, {}};
      abort(s, {&it, 1});
    } else {
      started.push_back(Started{i, res.put_id, res.offset});
    }
  }
  if (started.empty()) return {};

  std::vector<PutEndItem> ends(started.size());
  for (std::size_t j = 0; j < started.size(); ++j) ends[j] = PutEndItem{items[started[j].i].key, started[j].put_id, {}};
  BatchResponse<PlainResponse> r;
  bool retried;
  if (s->isolated) s->area_turn.acquire();
  try {
    // Write the wave. Under isolation the items that fit the area together get distinct
    // offsets; any other (a wave holds such an item alone, unless the area changed with a
    // re-attach) is streamed first, every part by PutWrite.
    try {
      settle_area(s);
      if (!s->isolated) {
        for (const Started& st : started)
          std::memcpy(s->rw.data() + st.offset, items[st.i].value.data(), items[st.i].value.size());
      } else {
        std::size_t used = 0;
        std::map<std::size_t, std::size_t> at;
        std::vector<bool> failed(started.size());
        for (std::size_t j = 0; j < started.size(); ++j) {
          const PutItem& it = items[started[j].i];
          if (it.value.size() <= s->area.size() - used) {
            at[j] = used;
            used += it.value.size();
            continue;
          }
          try {
            stream(s, it.key, started[j].put_id, it.value.data(), static_cast<std::int64_t>(it.value.size()), false);
          } catch (const Error&) {
            // This item failed (its PutWrite was answered with an error): it is aborted
            // and answered; the others of the wave, and the later waves, go on.
            errors[started[j].i] = std::current_exception();
            failed[j] = true;
            abort(s, {&ends[j], 1});
          }
        }
        for (auto [j, off] : at) {
          const PutItem& it = items[started[j].i];
          std::memcpy(s->area.data() + off, it.value.data(), it.value.size());
          ends[j].copies.push_back(AreaCopy{0, static_cast<std::int64_t>(off), static_cast<std::int64_t>(it.value.size())});
        }
        std::size_t k = 0;
        for (std::size_t j = 0; j < started.size(); ++j) {
          if (failed[j]) continue;
          if (k != j) {  // (a self-move would empty the item)
            started[k] = started[j];
            ends[k] = std::move(ends[j]);
          }
          ++k;
        }
        started.resize(k);
        ends.resize(k);
      }
    } catch (...) {
      // None of them was ended; those that failed alone were aborted already.
      std::vector<PutEndItem> open;
      for (std::size_t j = 0; j < started.size(); ++j)
        if (!errors[started[j].i]) open.push_back(ends[j]);
      abort(s, open);
      throw;
    }
    if (ends.empty()) {  // every item of the wave failed while streaming
      if (s->isolated) s->area_turn.release();
      return {};
    }
    retried = put_end(s, "BatchPutEnd", [&](Writer& w, const SessionRef& ref) { write_batch_put_end(w, ref, ends); }, r);
  } catch (const OutcomeUnknown& e) {
    if (s->isolated) s->area_turn.release();
    // NotWritten: none of the wave was ended (a streamed item's PutWrite, or the session
    // replaced before BatchPutEnd was sent), each item aborted: redone whatever
    // reject_if_exists says.
    bool nw = dynamic_cast<const NotWritten*>(&e) != nullptr;
    std::vector<std::size_t> unknown;
    for (const Started& st : started) {
      if (errors[st.i]) continue;  // it failed alone: its own error stands
      errors[st.i] = nw ? std::make_exception_ptr(NotWritten(e.what())) : unknown_ptr(e.what());
      unknown.push_back(st.i);
    }
    return unknown;
  } catch (const Error&) {
    // The wave's call failed (an application exception, or the put area still owed to an
    // unanswered call): its items fail with it, the later waves go on (every item is
    // attempted). It left batch_put at once, the earlier waves' errors dropped.
    if (s->isolated) s->area_turn.release();
    for (const Started& st : started)
      if (!errors[st.i]) errors[st.i] = std::current_exception();
    return {};
  } catch (...) {
    if (s->isolated) s->area_turn.release();
    throw;
  }
  if (s->isolated) s->area_turn.release();
  const std::vector<PlainResponse>* res;
  try {
    raise_for(r.code, r.message);
    res = &check_count("BatchPutEnd", r, ends.size());
  } catch (const Error&) {
    for (const Started& st : started) errors[st.i] = std::current_exception();
    return {};
  }
  std::vector<std::size_t> unknown;
  for (std::size_t j = 0; j < started.size(); ++j) {
    std::size_t i = started[j].i;
    const PlainResponse& x = (*res)[j];
    if (retried && x.code == kInvalid) {
      errors[i] = unknown_ptr("the owner no longer knows put " + std::to_string(started[j].put_id) + " of " +
                              quote(items[i].key) + " (" + x.message + ")");
      unknown.push_back(i);
    } else if (x.code != kOK) {
      errors[i] = error_ptr(x.code, "key " + quote(items[i].key) + ": " + x.message);
    }
  }
  return unknown;
}

std::vector<std::optional<MemHolder>> ClientImpl::batch_get(std::span<const std::string_view> keys) {
  for (std::string_view k : keys) validate_key(k);
  if (keys.empty()) return {};
  std::vector<std::optional<MemHolder>> out;  // a throw releases the holders obtained (RAII)
  out.reserve(keys.size());
  // Each chunk under its own retry, as batch_flags: a lost reply sends again only its
  // chunk, never the chunks already answered (two chunks that each lost one reply
  // failed the whole batch).
  for (std::size_t lo = 0; lo < keys.size(); lo += kChunk) {
    auto chunk = keys.subspan(lo, std::min(kChunk, keys.size() - lo));
    std::size_t mark = out.size();
    run([&](std::shared_ptr<Session>& s) {
      out.resize(mark);  // a retry answers the chunk afresh (what the failed try held goes back: RAII)
      BatchResponse<GetResponse> r;
      s->call("BatchGet", [&](Writer& w, const SessionRef& ref) { write_keys(w, ref, chunk); }, r);
      const std::vector<GetResponse>* checked;
      try {
        raise_for(r.code, r.message);
        checked = &check_count("BatchGet", r, chunk.size());
      } catch (...) {
        // A refused or malformed answer: the holders it granted anyway go back.
        for (const GetResponse& g : r.results)
          if (g.has_holder && g.holder_id != 0) s->queue_release(g.holder_id);
        throw;
      }
      const auto& res = *checked;
      for (std::size_t j = 0; j < chunk.size(); ++j) {
        try {
          if (res[j].code == kOK) {
            out.emplace_back(make_holder(s, chunk[j], res[j]));
          } else if (res[j].code == kNotFound) {
            out.emplace_back(std::nullopt);
          } else {
            if (res[j].has_holder && res[j].holder_id != 0) s->queue_release(res[j].holder_id);
            raise_for(res[j].code, "key " + quote(chunk[j]) + ": " + res[j].message);
          }
        } catch (...) {
          // The owner answered every key on its own: the holders it handed out for the
          // keys after this one are given back too (those before it are in out: RAII).
          for (std::size_t k = j + 1; k < res.size(); ++k)
            if (res[k].has_holder && res[k].holder_id != 0) s->queue_release(res[k].holder_id);
          throw;
        }
      }
      return 0;
    });
  }
  return out;
}

std::vector<bool> ClientImpl::batch_flags(std::string_view method, std::span<const std::string_view> keys) {
  for (std::string_view k : keys) validate_key(k);
  if (keys.empty()) return {};
  std::string m(method);
  std::vector<bool> out;
  out.reserve(keys.size());
  // Each chunk under its own retry: a lost reply (or a re-attach) sends again only the
  // chunk it belonged to, never the chunks already answered (a BatchDelete sent again
  // would find their keys gone and answer false).
  for (std::size_t lo = 0; lo < keys.size(); lo += kChunk) {
    auto chunk = keys.subspan(lo, std::min(kChunk, keys.size() - lo));
    std::vector<bool> part = run([&](std::shared_ptr<Session>& s) {
      BatchResponse<FlagResponse> r;
      s->call(m, [&](Writer& w, const SessionRef& ref) { write_keys(w, ref, chunk); }, r);
      raise_for(r.code, r.message);
      const auto& res = check_count(m.c_str(), r, chunk.size());
      std::vector<bool> flags;
      flags.reserve(chunk.size());
      for (std::size_t j = 0; j < chunk.size(); ++j) {
        if (res[j].code == kNotFound) {
          flags.push_back(false);
          continue;
        }
        if (res[j].code != kOK) raise_for(res[j].code, "key " + quote(chunk[j]) + ": " + res[j].message);
        flags.push_back(res[j].flag);
      }
      return flags;
    });
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// A prefix-aware owner stops its results after the first absent key (or the first error)
// and counts the leading keys present in found; one that predates prefix lookups ignores
// the flag and answers every key with found = 0. So: found when the results are fewer
// than the keys or found > 0, else the number of leading results present.
std::size_t prefix_count(const BatchExistsResponse& r, std::size_t n) {
  if (r.results.size() < n || r.found > 0) return std::min(static_cast<std::size_t>(std::max(r.found, 0)), n);
  std::size_t k = 0;
  while (k < n && r.results[k].code == kOK && r.results[k].flag) ++k;
  return k;
}

std::size_t ClientImpl::batch_exists_prefix(std::span<const std::string_view> keys, std::int64_t pin_ms) {
  if (pin_ms < 0 || pin_ms > wire::MAX_PIN_MS)
    throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "pin of " + std::to_string(pin_ms) + " ms: must be 0 to " +
                                                           std::to_string(wire::MAX_PIN_MS) + " (MAX_PIN_MS)");
  for (std::size_t i = 0; i < keys.size(); ++i) {
    try {
      validate_key(keys[i]);
    } catch (const Error& e) {
      throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "key " + std::to_string(i) + ": " + e.message());
    }
  }
  std::size_t total = 0;
  for (std::size_t lo = 0; lo < keys.size(); lo += kChunk) {
    auto chunk = keys.subspan(lo, std::min(kChunk, keys.size() - lo));
    std::size_t n = run([&](std::shared_ptr<Session>& s) {
      BatchExistsResponse r;
      s->call("BatchExists", [&](Writer& w, const SessionRef& ref) { write_batch_exists(w, ref, chunk, true, pin_ms); }, r);
      raise_for(r.code, r.message);
      return prefix_count(r, chunk.size());
    });
    total += n;
    if (n < chunk.size()) break;
  }
  return total;
}

}  // namespace fluxkv::detail
