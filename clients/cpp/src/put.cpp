// The put path, as the Python client's: PutStart (retried only when unsent or after the
// session ended), the value written once, then PutEnd (resent on the same session after a
// lost reply). Without isolation the value goes straight into the segment at the put's
// offset; under client isolation (docs/architecture.md §11) into the session's put area, which the owner
// copies from (AreaCopy in PutEnd), a value larger than the area streamed through it by
// PutWrite. A put whose outcome became unknown is redone once without reject_if_exists,
// reported Unavailable with it.
#include <cstring>

#include "client_impl.hpp"

namespace fluxkv::detail {

PutTxn::PutTxn(ClientImpl& c, std::string_view key, std::size_t len, bool reject) : c_(c), key_(key) {
  validate_key(key);
  n_ = validate_len(len, c.current()->segment_size);
  std::int64_t n = n_;
  c.run(
      [&](std::shared_ptr<Session>& s) {
        PutStartResponse r;
        s->call("PutStart", [&](Writer& w, const SessionRef& ref) { write_put_start(w, ref, key, n, reject); }, r);
        raise_for(r.code, r.message);
        s_ = s;
        put_id_ = r.put_id;
        offset_ = r.offset;
      },
      false);
  if (!s_->ro.contains(offset_, n_)) {
    PutEndItem it{key_, put_id_, {}};
    c_.abort(s_, {&it, 1});
    done_ = true;
    throw Error(ErrorCode::INTERNAL, "PutStart(" + quote(key_) + ", len=" + std::to_string(n_) + ") returned offset " +
                                         std::to_string(offset_) + " outside the " + std::to_string(s_->ro.size()) + "-byte segment");
  }
  if (s_->isolated) {
    s_->area_turn.acquire();
    turn_ = true;
    try {
      c.settle_area(s_);
    } catch (...) {
      abort();  // (ends the turn; no destructor runs for a constructor that throws)
      throw;
    }
  }
}

void ClientImpl::settle_area(const std::shared_ptr<Session>& s) {
  if (!s->isolated || !s->area_owed) return;
  const Session::OwedCall& owed = *s->area_owed;
  PlainResponse r;  // (any answer will do; the fields past code and message are skipped)
  try {
    s->call(owed.method, [&](Writer& w, const SessionRef&) { w.raw(owed.body); }, r, false);
  } catch (const Broken& e) {
    if (s->attach_alive())
      throw Unavailable(ErrorCode::UNAVAILABLE,
                        std::string("the put area waits for the owner's answer to an earlier put (") + e.what() + ")");
  } catch (const Stale&) {
    // The session ended, its area with it.
  } catch (const Error&) {
    // An answer (the owner failed the call) or a session no longer usable: either ends it.
  }
  s->area_owed.reset();
}

PutTxn::~PutTxn() {
  if (!done_) abort();
}

std::span<std::byte> PutTxn::writable() {
  auto n = static_cast<std::size_t>(n_);
  if (saved_) return {scratch_.data(), n};
  if (!s_->isolated) return {s_->rw.data() + offset_, n};
  if (n <= s_->area.size()) return {s_->area.data(), n};
  if (scratch_.size() != n) scratch_.resize(n);
  return {scratch_.data(), n};
}

bool PutTxn::kept() const noexcept {
  return saved_ || (s_->isolated && n_ > static_cast<std::int64_t>(s_->area.size()) && scratch_.size() == static_cast<std::size_t>(n_));
}

void PutTxn::end_turn() noexcept {
  if (turn_) {
    turn_ = false;
    s_->area_turn.release();
  }
}

void PutTxn::abort() noexcept {
  if (done_) return;
  done_ = true;
  PutEndItem it{key_, put_id_, {}};
  c_.abort(s_, {&it, 1});
  end_turn();
}

void PutTxn::commit(const std::byte* src) {
  if (done_) throw Error(ErrorCode::INVALID_ARGUMENT, "put of " + quote(key_) + " already committed or aborted");
  auto n = static_cast<std::size_t>(n_);
  std::vector<AreaCopy> copies;
  try {
    if (!s_->isolated) {
      // memmove: a redone put copies from the first attempt's bytes, which may overlap.
      if (src != nullptr) std::memmove(s_->rw.data() + offset_, src, n);
    } else if (n <= s_->area.size()) {
      if (src != nullptr) std::memmove(s_->area.data(), src, n);
      copies.push_back(AreaCopy{0, 0, n_});
    } else {
      copies = c_.stream(s_, key_, put_id_, src != nullptr ? src : scratch_.data(), n_, true);
    }
  } catch (...) {
    abort();
    throw;
  }
  done_ = true;  // from here on the put is ended (or its outcome unknown), never aborted
  // An unknown outcome: the put may be redone from writable() (fluxkv_put_commit). Keep
  // the bytes in this process before giving the put area back (another put of the session
  // overwrites it as soon as it has the turn) and before the segment range can be reused;
  // a value streamed from scratch_ stays there. in_range: the segment range still holds
  // them (the owner may not have freed it yet).
  auto keep_for_redo = [&](bool in_range) noexcept {
    if (src == nullptr && !(s_->isolated && n > s_->area.size()) && (s_->isolated || in_range)) {
      try {
        std::span<std::byte> at = writable();
        std::vector<std::byte> keep(at.begin(), at.end());
        scratch_ = std::move(keep);
        saved_ = true;
      } catch (...) {
        // Out of memory: the redo copies from shared memory as before.
      }
    }
    end_turn();
  };
  PlainResponse r;
  bool retried;
  try {
    retried = c_.put_end(
        s_, "PutEnd", [&](Writer& w, const SessionRef& ref) { write_put_ref(w, ref, key_, put_id_, &copies); }, r);
  } catch (const OutcomeUnknown&) {
    keep_for_redo(true);
    throw;
  } catch (...) {
    end_turn();
    throw;
  }
  if (retried && r.code == kInvalid) {
    // The repeat of a PutEnd whose reply was lost, answered by an owner that forgot the
    // put (expired, or its outcome out of PUT_END_MEMORY), so it may have given the
    // segment range to another value already: kept() says whether writable() still holds
    // this put's bytes. (They were given up before this: the redo published zeros, or
    // the area's or the range's next value, as this put's.)
    keep_for_redo(false);
    throw OutcomeUnknown("the owner no longer knows the put (" + r.message + ")");
  }
  end_turn();
  scratch_ = {};
  raise_for(r.code, r.message);
}

std::vector<AreaCopy> ClientImpl::stream(const std::shared_ptr<Session>& s, std::string_view key, std::int64_t put_id,
                                         const std::byte* src, std::int64_t n, bool keep_last) {
  auto size = static_cast<std::int64_t>(s->area.size());
  for (std::int64_t off = 0; off < n;) {
    std::int64_t part = std::min(size, n - off);
    std::memcpy(s->area.data(), src + off, static_cast<std::size_t>(part));
    std::vector<AreaCopy> cp{AreaCopy{off, 0, part}};
    off += part;
    if (off == n && keep_last) return cp;
    PlainResponse r;
    bool retried;
    try {
      retried = put_end(
          s, "PutWrite", [&](Writer& w, const SessionRef& ref) { write_put_ref(w, ref, key, put_id, &cp); }, r);
    } catch (const OutcomeUnknown& e) {
      // A part's outcome unknown leaves the put never ended: the caller aborts it.
      throw NotWritten(std::string("a part of the value was not written: ") + e.what());
    }
    if (retried && r.code == kInvalid) throw NotWritten("the owner no longer knows the put (" + r.message + ")");
    raise_for(r.code, r.message);
  }
  return {};
}

std::int64_t ClientImpl::put(std::string_view key, std::size_t n, bool reject, const std::byte* src,
                             const std::function<void(std::span<std::byte>)>* fill) {
  for (int redo = 0;; ++redo) {
    std::int64_t put_id = 0;
    try {
      PutTxn t(*this, key, n, reject);
      put_id = t.put_id();
      if (fill != nullptr) (*fill)(t.writable());  // a throw aborts the put (PutTxn's destructor)
      t.commit(src);
      return put_id;
    } catch (const OutcomeUnknown& e) {
      bool not_written = dynamic_cast<const NotWritten*>(&e) != nullptr;
      if (redo > 0 || (reject && !not_written))
        throw Unavailable(ErrorCode::UNAVAILABLE, "put " + quote(key) + " (put_id " + std::to_string(put_id) + "): " +
                                                      (not_written ? "not stored: " : "the outcome is unknown: ") + e.what());
      put_redos.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

}  // namespace fluxkv::detail
