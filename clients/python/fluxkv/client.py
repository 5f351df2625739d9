"""The fluxkv client: attach to the local owner, then speak ExternalService to it.

One :class:`Client` owns one *attach session* at a time (:class:`_Session`): the attach
connection (kept open for the session's life), both mappings of the segment, a pool of
RPC connections and the queue of holder releases waiting to be acknowledged. The session is
replaced, and the call retried once, when the owner restarted (STALE_GENERATION, or the
attach connection reached EOF after a broken call). After ``fork()`` the child drops the
parent's session (its connections, idle or in a call on another thread, are closed in the
child only) and attaches on its next call. Holders of a replaced session raise on use.

Thread safety: every call borrows one RPC connection from the session's pool (a new one
is opened when none is idle), so any number of threads may share a client. Session
replacement is serialized by ``Client._lock``. Release acks are queued lock-free (they may
be queued from finalizers) and ride on the next call's ``Session.releases``; a flusher
thread sends the ones no call picked up within ``release_delay`` seconds.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import operator
import os
import socket as _socketmod
import sys
import threading
import time
import weakref
from collections.abc import Mapping

from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TApplicationException
from thrift.transport.TTransport import TTransportException

from fluxkv import _codec
from fluxkv._codec import DELETE, EXISTS, GET, NO_RELEASES, decode_batch, decode_one, encode_fields, key_field, releases_field
from fluxkv._gen.common.ttypes import ErrorCode
from fluxkv._gen.external.constants import (
    MAX_BATCH,
    MAX_FRAME_BYTES,
    MAX_PIN_MS,
    MAX_RELEASES_PER_CALL,
    PUT_WAVE_SEGMENT_DIVISOR,
)
from fluxkv._gen.external.ttypes import (
    AreaCopy,
    BatchExistsRequest,
    BatchKeysRequest,
    BatchPutAbortRequest,
    BatchPutEndRequest,
    BatchPutStartRequest,
    PutAbortRequest,
    PutEndItem,
    PutEndRequest,
    PutOptions,
    PutStartItem,
    PutStartRequest,
    PutWriteRequest,
    ReleaseRequest,
    Session,
    StatRequest,
)
from fluxkv._gather import Gather
from fluxkv._segment import PutArea, Segment
from fluxkv._wire import RPCConnection, attach, resolve_socket
from fluxkv.errors import Error, InvalidArgument, Unavailable, error_for, raise_for
from fluxkv.holder import MemHolder, next_pin_token, writable_nbytes

__all__ = ["Client", "connect"]

# The wire contract (protocol/external.thrift, generated constants): the most items of one
# batch request, the most holder ids one call carries, the share of the segment one batch
# put wave may hold started and not ended. Its retry rules are followed by Client._run
# (retry-safe calls), _put_start (retry when unsent) and _put_end (same session only).
BATCH_CHUNK = MAX_BATCH
RELEASE_CHUNK = MAX_RELEASES_PER_CALL
PUT_END_TRIES = 3  # PutEnd sends of one put on one session
# A batch put wave's keys and parents, with WAVE_ITEM_BYTES more per item for the rest of
# its request item, stay within WAVE_NAME_BYTES: MAX_BATCH items of the longest key and
# parent (MAX_KEY_BYTES each) would not fit one frame (MAX_FRAME_BYTES).
WAVE_NAME_BYTES = MAX_FRAME_BYTES // 2
WAVE_ITEM_BYTES = 64
_OK = ErrorCode.OK
_INVALID = ErrorCode.INVALID_ARGUMENT
_KEY_NOT_FOUND = ErrorCode.KEY_NOT_FOUND
_STALE = ErrorCode.STALE_GENERATION
_MSG_PEEK_DONTWAIT = _socketmod.MSG_PEEK | _socketmod.MSG_DONTWAIT
_tokens = itertools.count(1)  # next() is atomic under the GIL
_STOP = b"\x00"  # the rest of a request that holds nothing but its session
# Where the hot responses' tuples (fluxkv._codec layouts) keep their fields.
_G_HID, _G_OFF, _G_LEN, _G_PID, _G_REMOTE, _G_CODE, _G_MSG, _G_SRC = (
    GET.index[n] for n in ("holder_id", "offset", "len", "put_id", "remote", "code", "message", "source")
)
_E_FLAG, _E_CODE, _E_MSG = (EXISTS.index[n] for n in ("exists", "code", "message"))
assert (_E_FLAG, _E_CODE, _E_MSG) == tuple(DELETE.index[n] for n in ("deleted", "code", "message"))  # one reader for both

_CLIENTS: "weakref.WeakSet[Client]" = weakref.WeakSet()
# Every session of this process whose attach connection may be open, whether a client names
# it or not (one closed while a view of it lives, one left by a client collected while a
# holder lives): a forked child closes its copies of them all (_Session.forked).
_SESSIONS: "weakref.WeakSet[_Session]" = weakref.WeakSet()


class _Broken(Exception):
    """The RPC connection failed (EOF, reset, refused, timeout): no response was read.
    ``sent`` is False when the request certainly never left (the connection could not be
    opened), True when it may have reached the owner."""

    def __init__(self, cause: BaseException, timed_out: bool = False, sent: bool = True):
        super().__init__(str(cause))
        self.timed_out = timed_out
        self.sent = sent


class _OutcomeUnknown(Exception):
    """The session that started a put ended, or the owner forgot the put, before the answer
    to its PutEnd came back: whether the value was published is unknown."""


class _NotWritten(_OutcomeUnknown):
    """The session that started a put ended (closed, or replaced by another thread) before
    the value was written: the owner revoked the put with the session, so nothing was
    published, and a redo is safe with reject_if_exists too."""


class _Stale(Exception):
    """The owner answered STALE_GENERATION: it restarted since this session attached."""


def _is_timeout(e: BaseException) -> bool:
    if isinstance(e, TimeoutError):
        return True
    if isinstance(e, TTransportException):
        return e.type == TTransportException.TIMED_OUT or isinstance(getattr(e, "inner", None), TimeoutError)
    return False


class _Session:
    """One attach session: valid while ``state`` is None; "closed", "replaced" or "forked" after."""

    def __init__(self, client: "Client", path: str, name: str, attach_timeout: float, timeout: float, max_idle: int,
                 populate: bool | None = None):
        self.pid = os.getpid()
        # Known to a forked child from before the attach connection exists (forked() copes
        # with a session half built): a fork during attach() closes the child's copy too.
        self.attach_sock = None
        _SESSIONS.add(self)
        try:
            sock, reply, fds = attach(path, name, self.pid, attach_timeout, on_socket=self._attaching)
        except BaseException:
            _SESSIONS.discard(self)
            self.attach_sock = None  # attach() closed it
            raise
        try:
            # Under client isolation the segment is write-sealed: never mapped writable.
            self.segment = Segment(fds[0], reply.segment_size, writable=not reply.isolated, populate=populate)
            self.area = PutArea(fds[1], reply.put_area_size) if reply.isolated else None
        except BaseException:
            _SESSIONS.discard(self)
            self._close_attach()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        # Serializes the puts that use the put area, from the first byte written into it
        # until the PutWrite / PutEnd that copies it is answered.
        self.area_lock = threading.Lock()
        # Under area_lock: (method, request fields) of a PutEnd, BatchPutEnd or PutWrite that
        # named the area and went unanswered on this live session (_settle_area).
        self.area_owed: tuple | None = None
        self.path = path
        self.client_id = reply.client_id
        self.session_token = reply.session_token
        self.generation = reply.owner_generation
        self.node_id = reply.node_id or ""
        self.rpc_path = reply.rpc_socket or path + ".rpc"
        self.timeout = timeout
        self.max_idle = max_idle
        # Every request starts with its Session struct: constant but for the releases.
        self.sess_head = _codec.session_head(self.client_id, self.session_token, self.generation)
        self.sess_bare = self.sess_head + NO_RELEASES
        # Calls carrying releases drained from pending and not yet answered (piggybacked or
        # in Release), one token each: flush_releases waits for them, so stat() reflects
        # releases another thread sends. A set (add/discard are atomic under the GIL) keeps
        # the lock off the call path; releases_cond is taken only while a flush waits.
        self.releases_cond = threading.Condition()
        self.releases_in_flight: set[int] = set()
        self.requeues = 0  # calls that failed and gave their releases back (_give_back)
        # The Release calls of flush_releases in flight (tokens): every other call waits for
        # them first (_await_flushes). On another connection it could reach the owner before
        # the releases it follows and plan room (a get's target, a put) they were about to
        # free: a full owner would evict a value for it.
        self.flushes_in_flight: set[int] = set()
        self.flush_waiters = 0
        self.idle: collections.deque[RPCConnection] = collections.deque()
        # Connections a call is using now.
        self.busy: set[RPCConnection] = set()
        # Every connection this session opened and has not dropped: a forked child closes
        # its copies of all of them, pooled, in a call, or between the two.
        self.conns: weakref.WeakSet[RPCConnection] = weakref.WeakSet()
        self.pending: collections.deque[int] = collections.deque()  # holder ids to release
        self.pins: set[int] = set()  # live exports of every holder of this session
        self.state: str | None = None
        self.closing = False  # closed by the user; the attach socket waits for the last pin
        self.rpc_count = 0
        self.release_errors = 0
        self._client = weakref.ref(client)

    # -- used by holders (may run in finalizers: no locks, no RPCs) ---------------------------

    def unusable_reason(self) -> str | None:
        if self.state is None:
            return None
        return {
            "closed": "the client was closed",
            "replaced": "the owner restarted (its generation changed) or the session was replaced",
            "forked": "it belongs to the parent process (fork)",
        }.get(self.state, self.state)

    def queue_release(self, holder_id: int, wake: bool) -> None:
        if self.state is not None:
            return  # the attach session's end released it
        self.pending.append(holder_id)
        if wake:
            c = self._client()
            if c is not None:
                c._kick()

    def unpin(self, token: int) -> None:
        self.pins.discard(token)
        if self.closing and not self.pins:
            self._close_attach()

    @contextlib.contextmanager
    def writing(self):
        """Pin the session, as an exported view does, while this thread writes a started
        put's range: a user's close meanwhile keeps the attach connection (so the owner keeps
        the put and its range) until the write is over. Closed at once, the owner would have
        freed the range, given it to another value, and this write would overwrite that one.
        Raises _NotWritten when the session already ended (the range may be another's now)."""
        token = next_pin_token()
        self.pins.add(token)  # pin first, then check: a close either sees the pin or is seen
        try:
            if self.state is not None:
                raise _NotWritten(f"the session ended before the value was written: {self.unusable_reason()}")
            yield
        finally:
            self.unpin(token)

    # -- RPC ------------------------------------------------------------------------------------------

    def drain(self, limit: int = RELEASE_CHUNK) -> list[int]:
        pending = self.pending
        if len(pending) == 1:  # a get + release loop: one id per call
            try:
                return [pending.popleft()]
            except IndexError:
                return []
        out: list[int] = []
        if not pending:
            return out
        pop = pending.popleft
        try:
            while len(out) < limit:
                out.append(pop())
        except IndexError:
            pass
        return out

    def call(self, method, rest: bytes = _STOP, decode=None, piggyback: bool = True):
        """One call of ``method`` (an ExternalService method name) on a connection of the pool:
        its request is this session's Session struct (with the queued releases when
        ``piggyback``) then ``rest`` (the other fields of the request and its stop byte).
        The reply is decoded by decode(method, reply frame) (a tuple of a fluxkv._codec
        layout, code included) or, without ``decode``, into the generated response struct.
        Raises _Broken when the connection failed, _Stale on STALE_GENERATION; any other
        response is returned as is. ``method`` may also be fn(generated client, Session
        struct) -> response, the generated client's path (tests and tools)."""
        if self.state is not None:
            if self.state == "replaced":
                raise _Stale("the session was replaced by another thread")
            raise Error(f"session unusable: {self.unusable_reason()}")
        try:
            conn = self.idle.pop()
        except IndexError:
            try:
                conn = RPCConnection(self.rpc_path, self.timeout)
            except OSError as e:
                raise _Broken(e, _is_timeout(e), sent=False) from None
            self.conns.add(conn)
        self.busy.add(conn)
        try:
            if piggyback and self.flushes_in_flight:
                self._await_flushes()
        except BaseException:
            self.busy.discard(conn)
            conn.close()
            raise
        releases = None
        if piggyback and self.pending:
            # In flight before the ids leave the queue: a flush between the two would find
            # neither and return before they reach the owner.
            token = next(_tokens)
            self.releases_in_flight.add(token)
            releases = self.drain()
            if not releases:
                self._answered(token)
        try:
            if type(method) is str:
                data = conn.call(method, self.sess_head + releases_field(releases) if releases else self.sess_bare, rest)
                resp = _codec.decode_reply(method, data) if decode is None else decode(method, data)
            else:
                resp = method(conn.client, Session(self.client_id, self.session_token, self.generation, releases or []))
        except (TTransportException, TProtocolException, OSError, EOFError) as e:
            conn.close()
            self._give_back(releases)
            raise _Broken(e, _is_timeout(e)) from None
        except TApplicationException as e:
            conn.close()
            self._give_back(releases)
            raise Error(f"owner failed the call: {e}", ErrorCode.INTERNAL) from None
        except BaseException:  # InvalidArgument (a request over a frame, not sent) among them
            conn.close()  # the frame may be half written
            self._give_back(releases)
            raise
        finally:
            self.busy.discard(conn)
            if releases:
                self._answered(token)
        self.rpc_count += 1
        if len(self.idle) < self.max_idle and self.state is None:
            self.idle.append(conn)
            if self.state is not None:  # retired meanwhile: its drop_idle may have run before the append
                self.drop_idle()
        else:
            conn.close()
        if (resp[decode.code_at] if type(resp) is tuple else resp.code) == _STALE:
            raise _Stale((resp[decode.message_at] if type(resp) is tuple else resp.message) or "stale generation")
        return resp

    def _give_back(self, releases) -> None:
        """Queue again the releases a failed call carried (first: they were queued first),
        counted in ``requeues`` for flush_releases."""
        if releases:
            self.pending.extendleft(reversed(releases))
            self.requeues += 1

    def _answered(self, token: int) -> None:
        self.releases_in_flight.discard(token)
        self.flushes_in_flight.discard(token)
        if self.flush_waiters:
            with self.releases_cond:
                self.releases_cond.notify_all()

    def _await_flushes(self) -> None:
        """Wait (up to the call timeout) until no Release call of flush_releases is in flight."""
        self._wait_answered(lambda: not self.flushes_in_flight)

    def _wait_answered(self, done) -> None:
        """Wait (up to the call timeout) until done() holds, woken as calls carrying
        releases are answered."""
        with self.releases_cond:
            self.flush_waiters += 1
            try:
                self.releases_cond.wait_for(done, timeout=self.timeout)
            finally:
                self.flush_waiters -= 1

    def flush_releases(self) -> None:
        """Send every queued release with the plain Release call, then wait (up to the call
        timeout) for releases other threads are sending right now. A call of theirs that
        fails gives its releases back: they are sent once more, and if a call carrying
        them fails again meanwhile, Unavailable says they are still queued."""
        for again in (False, True):
            self._send_queued_releases()
            requeues = self.requeues
            self._wait_answered(lambda: not self.releases_in_flight)
            if self.requeues == requeues:
                return  # (what is queued now came after the flush began)
            # A call failed: its releases are queued again, or riding on its retry, which may
            # have taken them since the wait ended (a review): round 2 sends or waits for them.
            if again and self.pending:
                raise Unavailable("a call carrying releases failed twice: they stay queued for a later call")

    def _send_queued_releases(self) -> None:
        """flush_releases' sends: Release calls until the queue is empty."""
        while self.pending:
            token = next(_tokens)  # in flight before the ids leave the queue (see call)
            self.releases_in_flight.add(token)
            self.flushes_in_flight.add(token)
            ids = self.drain()
            if not ids:
                self._answered(token)
                break
            try:
                resp = self.call("Release", encode_fields(ReleaseRequest(None, ids)), piggyback=False)
            except _Stale:
                raise  # the session is gone: its end released them
            except BaseException:
                # NEVER RETRIED (external.thrift): the ids of a failed Release stay queued
                # and ride on later calls (a repeat of one the owner did get answers
                # INVALID_ARGUMENT for it, harmlessly).
                self._give_back(ids)
                raise
            finally:
                self._answered(token)
            if resp.results is None or len(resp.results) != len(ids):
                if resp.code != _OK:
                    self.release_errors += len(ids)
                continue
            # results[i] is INVALID_ARGUMENT for an unknown or double release: a client bug
            # (or a daemon one), counted so tests can assert there is none.
            self.release_errors += sum(1 for code in resp.results if code != _OK)

    def attach_alive(self) -> bool:
        """False once the owner closed the attach connection (it exited or restarted)."""
        sock = self.attach_sock
        if sock is None:
            return False
        try:
            data = sock.recv(1, _MSG_PEEK_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return bool(data)

    def drop_idle(self) -> None:
        while True:
            try:
                self.idle.pop().close()
            except IndexError:
                return

    # -- end -------------------------------------------------------------------------------------------

    def retire(self, state: str) -> None:
        """End the session. A user's close keeps the attach connection (and so every holder's
        bytes) until the last exported view is gone; other ends close it now."""
        if self.state is not None:
            return
        if state == "forked":
            self.forked()
            return
        self.state = state
        self.pending.clear()
        self.drop_idle()
        if state == "closed" and self.pins:
            self.closing = True
            if self.pins:
                return
        self._close_attach()

    def forked(self) -> None:
        """In a forked child: the session is the parent's, whatever its state (a user's close
        waiting for its last view included). The child's copies of its connections close now,
        the attach connection's too, so that the parent's closes reach the owner while the
        child lives; its holders raise. The parent's calls in flight at fork() (on its other
        threads) have connections too, maybe between the pool and the call: they go as well,
        so the parent's close of one (a call that timed out) closes it at the owner, which
        then takes back what its reply handed out. A session another thread was building at
        fork() has only its attach connection yet: that goes first."""
        self.state = "forked"
        self.closing = False
        self._close_attach()
        if not hasattr(self, "pending"):  # (set after idle, busy and conns)
            return  # half built: nothing else is open
        self.pending.clear()
        self.drop_idle()
        for conn in list(self.conns):
            conn.close()
        self.busy.clear()

    def _attaching(self, sock: _socketmod.socket) -> None:
        self.attach_sock = sock

    def _close_attach(self) -> None:
        sock, self.attach_sock = self.attach_sock, None
        if sock is not None:
            try:
                sock.close()  # close(2) only: a forked twin may still use it
            except OSError:
                pass



def _norm_key(key) -> str:
    if type(key) is str:
        k = key
    elif isinstance(key, str):
        k = str(key)
    elif isinstance(key, (bytes, bytearray, memoryview)):
        try:
            k = bytes(key).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"key is not valid UTF-8: {e}") from None
        return k
    else:
        raise TypeError(f"key must be str or UTF-8 bytes, not {type(key).__name__}")
    if not k.isascii():
        try:
            k.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidArgument(f"key cannot be encoded as UTF-8: {e}") from None
    return k


def _norm_parent(parent) -> str | None:
    """A put's parent (see :meth:`Client.put`): None stays None, "" is a chain's first page,
    anything else is normalized like a key."""
    return None if parent is None else _norm_key(parent)


def _norm_value(value):
    """(buffer object or Gather, nbytes) for a C-contiguous buffer or a :class:`Gather`; the
    object itself is copied later."""
    if isinstance(value, Gather):
        return value, value.nbytes
    try:
        mv = memoryview(value)
    except TypeError:
        raise TypeError(f"value must support the buffer protocol, not {type(value).__name__}") from None
    with mv:
        if not mv.c_contiguous:
            raise InvalidArgument("value must be a C-contiguous buffer")
        return value, mv.nbytes


def _default_name() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return f"python:{argv0 or 'python'}"


# _WRITE_ERRORS are what writing one item of a batch may raise that fails that item alone:
# its PutWrite answered with an error, its value changed size or shape since it was checked.
_WRITE_ERRORS = (Error, ValueError, TypeError, BufferError)

# _MAX_TIMEOUT is the longest timeout a client takes (seconds; a socket's limit is not far
# above: settimeout(1e10) overflows).
_MAX_TIMEOUT = 1e6


class Client:
    """A connection to the local fluxkv owner. Thread-safe; use as a context manager or
    call :meth:`close`. See :func:`connect`."""

    def __init__(
        self,
        socket=None,
        *,
        name: str | None = None,
        timeout: float = 60.0,
        attach_timeout: float = 10.0,
        max_idle_connections: int = 16,
        release_delay: float = 0.002,
        populate: bool | None = None,
    ):
        self._path = resolve_socket(socket)
        self._name = name or _default_name()
        self._timeout = float(timeout)
        self._attach_timeout = float(attach_timeout)
        self._max_idle = int(max_idle_connections)
        self._release_delay = float(release_delay)
        # (A zero timeout left the socket non-blocking: every call "timed out" after its
        # request was sent; an infinite one overflowed; a negative delay killed the flusher.)
        if not (0 < self._timeout <= _MAX_TIMEOUT and 0 < self._attach_timeout <= _MAX_TIMEOUT):
            raise InvalidArgument(f"timeout {timeout} and attach_timeout {attach_timeout} must be positive seconds, at most {_MAX_TIMEOUT:g}")
        if not 0 <= self._release_delay < math.inf or self._max_idle < 0:
            raise InvalidArgument(f"release_delay {release_delay} and max_idle_connections {max_idle_connections} must not be negative")
        self._populate = None if populate is None else bool(populate)
        self._lock = threading.RLock()  # protects _s replacement, _closed, _flusher
        self._wake = threading.Event()
        self._flush_armed = False
        self._flusher: threading.Thread | None = None
        self._closed = False
        self._s: _Session | None = None
        self._released_errors_retired = 0
        # What the retry rules and batch waves did (tests, debugging): retries of retry-safe
        # calls, PutEnd resends, whole puts redone, waves and the most bytes one held.
        self._stats = collections.Counter()
        with self._lock:
            self._s = self._new_session_locked()
        _CLIENTS.add(self)

    # -- session management ----------------------------------------------------------------------

    def _new_session_locked(self) -> _Session:
        s = _Session(self, self._path, self._name, self._attach_timeout, self._timeout, self._max_idle, self._populate)
        if self._flusher is None or not self._flusher.is_alive():
            t = threading.Thread(
                target=_flush_loop,
                args=(weakref.ref(self), self._wake, self._release_delay),
                name="fluxkv-release-flusher",
                daemon=True,
            )
            t.start()
            self._flusher = t
        return s

    def _current(self) -> _Session:
        s = self._s
        if s is not None and s.state is None:
            return s
        return self._renew(s)

    def _renew(self, old: _Session | None) -> _Session:
        """The current session, attaching a new one if ``old`` is still current (or none is)."""
        with self._lock:
            if self._closed:
                raise Error("the client is closed")
            cur = self._s
            if cur is not None and cur is not old and cur.state is None:
                return cur
            if cur is not None:
                self._released_errors_retired += cur.release_errors
                cur.retire("replaced")
                self._s = None
            self._s = self._new_session_locked()
            return self._s

    def _run(self, op, *args, lost_reply: bool = True):
        """Run op(session, *args) with one recovery, by the retry rules of protocol/external.thrift:
        on STALE_GENERATION, or a broken connection to an owner whose attach connection has
        closed, attach again and retry once; a broken connection to a live owner is retried
        once on a fresh connection, unless ``lost_reply`` is False (PutStart: a request that
        may have been sent is not sent again on a live session)."""
        s = self._s
        if s is None or s.state is not None:
            s = self._renew(s)
        try:
            return op(s, *args)
        except _Stale as e:
            why = f"the owner restarted ({e})"
            s2 = self._renew(s)
        except _Broken as e:
            if e.timed_out:
                raise Unavailable(f"call to the owner at {s.rpc_path} timed out after {self._timeout} s") from None
            if s.attach_alive():
                if e.sent and not lost_reply:
                    raise Unavailable(f"the connection to the owner broke, the reply was lost ({e})") from None
                why = f"the connection to the owner broke ({e})"
                s.drop_idle()
                s2 = s
            else:
                why = f"the owner closed the session ({e})"
                try:
                    s2 = self._renew(s)
                except Unavailable as u:
                    raise Unavailable(f"{why}; attaching again failed: {u}") from None
        self._stats["retries"] += 1
        try:
            return op(s2, *args)
        except _Stale as e:
            raise Unavailable(f"{why}; the retry failed too: stale generation ({e})") from None
        except _Broken as e:
            raise Unavailable(f"{why}; the retry failed too: {e}") from None

    def _kick(self) -> None:
        if not self._flush_armed:
            self._flush_armed = True
            self._wake.set()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._flush_armed = False
        self._flusher = None
        s, self._s = self._s, None
        if s is not None:
            s.retire("forked")

    # -- public: lifecycle --------------------------------------------------------------------

    @property
    def socket_path(self) -> str:
        return self._path

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def node_id(self) -> str:
        return self._current().node_id

    @property
    def generation(self) -> int:
        """The owner generation of the current attach session."""
        return self._current().generation

    @property
    def client_id(self) -> int:
        return self._current().client_id

    @property
    def segment_size(self) -> int:
        return self._current().segment.size

    @property
    def release_errors(self) -> int:
        """Release acks the owner refused (unknown or double release): 0 unless something is wrong."""
        s = self._s
        return self._released_errors_retired + (s.release_errors if s is not None else 0)

    def flush(self) -> None:
        """Send the queued holder releases now, and wait (up to the call timeout) for those
        other threads' calls are carrying: a call after it finds the owner has them. Raises
        Unavailable when calls carrying them failed twice (they stay queued)."""
        s = self._s
        if s is None or s.state is not None:
            return
        try:
            s.flush_releases()
        except (_Broken, _Stale):
            pass  # the owner is gone; its end of the session released them

    def close(self) -> None:
        """Flush releases and end the attach session. Idempotent. Views still exported keep
        the session (and their bytes) until they go, and so does a put another thread is
        writing (the put then fails); holders raise from now on."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            s, self._s = self._s, None
        self._wake.set()
        _CLIENTS.discard(self)
        if s is None:
            return
        try:
            if s.state is None and s.pending:
                s.flush_releases()
        except (_Broken, _Stale, Error):
            pass
        finally:
            self._released_errors_retired += s.release_errors
            s.retire("closed")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"client_id={self._s.client_id if self._s else None}"
        return f"<fluxkv.Client {self._path} {state}>"

    # -- public: single-key calls ---------------------------------------------------------------

    def put(self, key, value, reject_if_exists: bool = False, parent=None) -> None:
        """Store ``value`` (any C-contiguous buffer, or a :class:`fluxkv.Gather` of several memory
        ranges written back to back) under ``key``: one copy, into shared memory.
        Raises AlreadyExists when ``reject_if_exists`` and the key exists; Unavailable when the
        owner restarted before the put's PutEnd was answered and ``reject_if_exists`` is set
        (the outcome is unknown; without it the put is redone on the new session).

        ``parent`` makes the value a KV page of a prefix chain: the key of the page before it,
        or "" for a chain's first page (None, the default: a plain key). Eviction keeps a
        chain's pages while the pages before them are cached, from the deep end first, and
        evicts first a page whose parent is gone. A parent that is not a valid key, or is
        ``key`` itself, raises InvalidArgument. The :mod:`fluxkv.kv` page store passes it."""
        k = _norm_key(key)
        par = _norm_parent(parent)
        obj, n = _norm_value(value)

        def write(s, put_id, off):
            if s.area is None:
                s.segment.write(off, obj, n)
                return None
            if n <= s.area.size:
                s.area.write(0, obj, n)
                return [AreaCopy(0, 0, n)]
            return self._stream(s, k, put_id, obj, keep_last=True)

        self._put(k, n, bool(reject_if_exists), par, write)

    def put_with(self, key, size: int, fill, reject_if_exists: bool = False, parent=None) -> int:
        """Store ``size`` bytes under ``key`` written by ``fill(put_id, view)`` straight into
        shared memory; returns the put_id (the version ``MemHolder.put_id`` reports), so a
        value may be derived from (key, put_id). ``view`` is a writable memoryview of exactly
        ``size`` bytes, valid only during the call. If ``fill`` raises, the put is aborted
        and the exception propagates. ``fill`` may run twice, with a new put_id, when the
        put is redone after an owner restart (see :meth:`put`). Under client isolation
        ``view`` lies in the session's put area, or, when ``size`` exceeds the area, in a
        scratch buffer that is then streamed through it; ``fill`` must not put through the
        same client then (the area is held while it runs). ``parent``: as for :meth:`put`."""
        k = _norm_key(key)
        par = _norm_parent(parent)
        n = operator.index(size)

        def write(s, put_id, off):
            if s.area is None:
                _fill_view(s.segment.rw, off, n, put_id, fill)
                return None
            if n <= s.area.size:
                _fill_view(s.area.rw, 0, n, put_id, fill)
                return [AreaCopy(0, 0, n)]
            scratch = bytearray(n)
            fill(put_id, memoryview(scratch))
            return self._stream(s, k, put_id, scratch, keep_last=True)

        return self._put(k, n, bool(reject_if_exists), par, write)

    def _stream(self, s: _Session, k: str, put_id: int, obj, keep_last: bool):
        """Client isolation: send a value larger than the put area through it, one area-full
        part at a time, each copied by a PutWrite (resent on the same session after a lost
        reply). With ``keep_last`` the last part is not sent: its copy is returned for the
        PutEnd to carry. The caller holds ``s.area_lock``."""
        with _byte_source(obj) as src:
            n, size = len(src), s.area.size
            off = 0
            while off < n:
                part = min(size, n - off)
                src.copy_part(s.area, off, part)
                cp = AreaCopy(off, 0, part)
                off += part
                if off == n and keep_last:
                    return [cp]
                # A part's outcome unknown leaves the put never ended: the owner revoked it
                # with the session (or forgot it), and the caller aborts it: nothing was
                # published, so it is redone whatever reject_if_exists says (_NotWritten).
                try:
                    r, retried = self._put_end(s, "PutWrite", encode_fields(PutWriteRequest(None, k, put_id, [cp])))
                except _OutcomeUnknown as e:
                    raise _NotWritten(f"a part of the value was not written: {e}") from None
                if retried and r.code == _INVALID:
                    raise _NotWritten(f"the owner no longer knows the put ({r.message})")
                raise_for(r.code, r.message)
        return None

    def _put(self, k: str, n: int, reject: bool, parent: str | None, write) -> int:
        """One put by the retry rules: PutStart (retried only when unsent or after the session
        ended; it carries ``parent``, a redo too), write(session, put_id, offset) (it returns
        the put area copies PutEnd carries under client isolation, None without), then PutEnd
        (resent on the same session after a lost reply). A put whose outcome became unknown
        is redone once without ``reject``, reported Unavailable with it."""
        seg = self.segment_size
        if n <= 0 or n > seg:  # as the C++ client: named as given, even one the wire's i64 cannot carry
            raise InvalidArgument(f"value length {n} must be 1 byte to the segment size {seg}")
        opts = PutOptions(reject)
        for redo in (False, True):
            s, put_id, off = self._run(_put_start, k, n, opts, parent, lost_reply=False)
            try:
                with _area_turn(s):
                    try:
                        if not s.segment.contains(off, n):
                            raise Error(
                                f"PutStart({k!r}, len={n}) returned offset {off} outside the {s.segment.size}-byte segment",
                                ErrorCode.INTERNAL,
                            )
                        _settle_area(s)
                        with s.writing():
                            copies = write(s, put_id, off)
                    except BaseException:
                        _abort(s, [(k, put_id)])
                        raise
                    r, retried = self._put_end(s, "PutEnd", encode_fields(PutEndRequest(None, k, put_id, copies)))
                if retried and r.code == _INVALID:
                    raise _OutcomeUnknown(f"the owner no longer knows the put ({r.message})")
            except _NotWritten as e:
                if redo:
                    raise Unavailable(f"put {k!r} (put_id {put_id}): not stored: {e}") from None
                self._stats["put_redos"] += 1
                continue
            except _OutcomeUnknown as e:
                if reject or redo:
                    raise Unavailable(f"put {k!r} (put_id {put_id}): the outcome is unknown: {e}") from None
                self._stats["put_redos"] += 1
                continue
            raise_for(r.code, r.message)
            return put_id
        raise AssertionError("BUG: unreachable")

    def _put_end(self, s: _Session, method: str, rest: bytes):
        """Send PutEnd/BatchPutEnd/PutWrite (``method``, the request's fields ``rest``) on session ``s``, again on the same session after a
        lost reply (the owner answers a repeat with the first outcome). Returns (response,
        retried); raises _OutcomeUnknown when the session is gone."""
        for attempt in range(PUT_END_TRIES):
            try:
                return s.call(method, rest), attempt > 0
            except _Stale as e:
                self._renew(s)
                raise _OutcomeUnknown(f"the owner restarted before PutEnd was answered ({e})") from None
            except _Broken as e:
                if not s.attach_alive():
                    self._renew(s)
                    raise _OutcomeUnknown(f"the owner closed the session before PutEnd was answered ({e})") from None
                if attempt + 1 == PUT_END_TRIES:
                    if s.area is not None:  # (area_lock held) the owner may still copy from the area
                        s.area_owed = (method, rest)
                    raise _OutcomeUnknown(f"PutEnd sent {PUT_END_TRIES} times without an answer ({e})") from None
                self._stats["put_end_retries"] += 1
                s.drop_idle()
        raise AssertionError("BUG: unreachable")

    def get(self, key) -> MemHolder:
        """A holder of the value of ``key``; raises KeyNotFound on a miss."""
        k = _norm_key(key)
        return self._run(_get_once, k)

    def get_into(self, key, buffer) -> int:
        """Copy the value of ``key`` into a writable buffer; returns its length."""
        size = writable_nbytes(buffer)
        with self.get(key) as h:
            if size < len(h):
                raise InvalidArgument(f"buffer of {size} bytes is smaller than the value of {h.key!r} ({len(h)} bytes)")
            return h.copy_into(buffer)

    def delete(self, key) -> bool:
        """Remove ``key``; True when it existed. Holders of it keep their bytes."""
        k = _norm_key(key)

        return self._run(_flag_once, "Delete", k, _dec_delete)

    def exists(self, key) -> bool:
        k = _norm_key(key)

        return self._run(_flag_once, "Exists", k, _dec_exists)

    # -- public: batch calls ---------------------------------------------------------------------

    def batch_put(self, items, reject_if_exists: bool = False, parents=None) -> None:
        """Store many values: ``items`` is a mapping or an iterable of (key, value), each value a
        buffer or a :class:`fluxkv.Gather` as for :meth:`put`. ``parents``, when given, is a
        list aligned with the items: each None (a plain key), "" (a chain's first page) or
        the key of the page before it (see :meth:`put`); a batch may hold whole chains, in
        order. A bad key or parent, a ``parents`` of another length than the items, or a
        value that is empty or larger than the segment raises InvalidArgument before
        anything is started (a parent the owner refuses, e.g. the item's own key, fails that
        item). The items go in waves (BatchPutStart, copy, BatchPutEnd) of at
        most MAX_BATCH items holding at most segment_size / PUT_WAVE_SEGMENT_DIVISOR bytes
        started and not ended (a larger item goes alone) and keys and parents of at most
        WAVE_NAME_BYTES (half a frame), so a batch larger than the segment costs what the
        same puts one by one cost and each request fits a frame. Every item is attempted; if any failed,
        the first failure is raised with ``errors`` (a list aligned with the items: None or
        the item's exception) attached. The retry rules are :meth:`put`'s, per item."""
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        prepared = []
        for k, v in pairs:
            obj, n = _norm_value(v)
            prepared.append((_norm_key(k), obj, n))
        if parents is None:
            pars: list = [None] * len(prepared)
        else:
            pars = [_norm_parent(p) for p in parents]
            if len(pars) != len(prepared):
                raise InvalidArgument(f"{len(pars)} parents for {len(prepared)} items")
        if not prepared:
            return
        seg = self.segment_size
        for i, (k, _, n) in enumerate(prepared):
            if n <= 0 or n > seg:
                raise InvalidArgument(f"item {i} ({k!r}): value length {n} must be 1 byte to the segment size {seg}")
        opts = PutOptions(bool(reject_if_exists))
        errors: list = [None] * len(prepared)
        budget = max(seg // PUT_WAVE_SEGMENT_DIVISOR, 1)
        area = self._current().area
        if area is not None:
            budget = min(budget, area.size)  # client isolation: a wave's values fit the area together
        names = [
            len(k.encode()) + WAVE_ITEM_BYTES + (len(p.encode()) if p is not None else 0)
            for (k, _, _), p in zip(prepared, pars)
        ]
        lo = 0
        while lo < len(prepared):
            hi, nbytes, nnames = lo, 0, 0
            while (
                hi < len(prepared)
                and hi - lo < MAX_BATCH
                and (hi == lo or (nbytes + prepared[hi][2] <= budget and nnames + names[hi] <= WAVE_NAME_BYTES))
            ):
                nbytes += prepared[hi][2]
                nnames += names[hi]
                hi += 1
            self._put_wave(prepared, pars, list(range(lo, hi)), opts, errors)
            lo = hi
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            first.errors = errors
            raise first

    def _put_wave(self, prepared: list, parents: list, idx: list, opts: PutOptions, errors: list) -> None:
        """Put prepared[i] (under parents[i]) for i in idx as one wave; items whose outcome
        became unknown are redone once as a new wave without reject_if_exists, reported
        Unavailable with it; items whose session ended before they were written
        (_NotWritten) are redone once either way."""
        for redo in (False, True):
            unknown = self._put_wave_once(prepared, parents, idx, opts, errors)
            if not unknown:
                return
            again = []
            for i in unknown:
                e = errors[i]
                if isinstance(e, _NotWritten) and not redo:
                    again.append(i)
                elif isinstance(e, _NotWritten):
                    errors[i] = Unavailable(f"key {prepared[i][0]!r}: not stored: {e}")
                elif opts.reject_if_exists or redo:
                    errors[i] = Unavailable(f"key {prepared[i][0]!r}: the outcome is unknown: {e}")
                else:
                    again.append(i)
            if not again:
                return
            self._stats["put_redos"] += len(again)
            idx = again

    def _put_wave_once(self, prepared: list, parents: list, idx: list, opts: PutOptions, errors: list) -> list:
        """One BatchPutStart, the copies, one BatchPutEnd (resent on the same session after a
        lost reply). Returns the items whose outcome is unknown (errors[i] says why)."""
        for i in idx:
            errors[i] = None  # a redo answers afresh: what an earlier try left is stale
        starts = [PutStartItem(prepared[i][0], prepared[i][2], opts, parents[i]) for i in idx]
        nbytes = sum(prepared[i][2] for i in idx)
        self._stats["waves"] += 1
        self._stats["max_wave_bytes"] = max(self._stats["max_wave_bytes"], nbytes)

        def start(s):
            r = s.call("BatchPutStart", encode_fields(BatchPutStartRequest(None, starts)))
            raise_for(r.code, r.message)
            return s, _check_count("BatchPutStart", r.results, len(starts))

        try:
            s, results = self._run(start, lost_reply=False)
        except Error as e:
            for i in idx:
                errors[i] = e
            return []
        started = []  # (item index, put_id, offset)
        try:
            for i, res in zip(idx, results):
                k, obj, n = prepared[i]
                if res.code != _OK:
                    errors[i] = error_for(res.code, f"key {k!r}: {res.message or ''}")
                elif not s.segment.contains(res.offset, n):
                    errors[i] = Error(
                        f"BatchPutStart returned offset {res.offset} for {k!r} (len {n}) outside the segment",
                        ErrorCode.INTERNAL,
                    )
                    _abort(s, [(k, res.put_id)])
                else:
                    started.append((i, res.put_id, res.offset))
        except BaseException:
            _abort(s, [(prepared[i][0], pid) for i, pid, _ in started])  # none of them was ended
            raise
        if not started:
            return []
        try:
            with _area_turn(s):
                try:
                    _settle_area(s)
                    with s.writing():
                        copies = self._write_wave(s, prepared, started, errors)
                except BaseException:
                    # None of them was ended; those that failed alone were aborted already.
                    _abort(s, [(prepared[i][0], pid) for i, pid, _ in started if errors[i] is None])
                    raise
                # An item whose write failed was aborted and answered: the others go on.
                kept = [j for j, (i, _, _) in enumerate(started) if errors[i] is None]
                started, copies = [started[j] for j in kept], [copies[j] for j in kept]
                if not started:
                    return []
                ends = [PutEndItem(prepared[i][0], pid, cps) for (i, pid, _), cps in zip(started, copies)]
                r, retried = self._put_end(s, "BatchPutEnd", encode_fields(BatchPutEndRequest(None, ends)))
        except _OutcomeUnknown as e:
            unknown = [i for i, _, _ in started if errors[i] is None]  # (those that failed alone keep their error)
            for i in unknown:
                errors[i] = e
            return unknown
        except Error as e:
            # The wave's call failed (the owner could not run it, or the put area is still
            # owed to an unanswered call): its items fail with it, the later waves go on
            # (every item is attempted; it left batch_put at once, the earlier errors lost).
            for i, _, _ in started:
                if errors[i] is None:
                    errors[i] = e
            return []
        try:
            raise_for(r.code, r.message)
            results = _check_count("BatchPutEnd", r.results, len(ends))
        except Error as e:
            for i, _, _ in started:
                errors[i] = e
            return []
        unknown = []
        for (i, pid, _), res in zip(started, results):
            k = prepared[i][0]
            if retried and res.code == _INVALID:
                errors[i] = _OutcomeUnknown(f"the owner no longer knows put {pid} of {k!r} ({res.message})")
                unknown.append(i)
            elif res.code != _OK:
                errors[i] = error_for(res.code, f"key {k!r}: {res.message or ''}")
        return unknown

    def _write_wave(self, s: _Session, prepared: list, started: list, errors: list) -> list:
        """Write a wave's started items (item index, put_id, offset); returns the put area
        copies each item's PutEndItem carries (None without isolation). Under isolation the
        items that fit the area together get distinct offsets; any other (a wave holds such
        an item alone, unless the area changed with a re-attach) is streamed first, every
        part by PutWrite. An item whose write fails (a PutWrite answered with an error, a
        value that changed size) is aborted and its error set in errors; the others go on.
        The caller holds ``s.area_lock``."""

        def failed(i: int, pid: int, e: Exception) -> None:
            if not isinstance(e, Error):  # the value changed size or shape since it was checked
                e = InvalidArgument(f"key {prepared[i][0]!r}: the value could not be written: {e}")
            errors[i] = e
            _abort(s, [(prepared[i][0], pid)])

        if s.area is None:
            for i, pid, off in started:
                _, obj, n = prepared[i]
                try:
                    s.segment.write(off, obj, n)
                except _WRITE_ERRORS as e:
                    failed(i, pid, e)
            return [None] * len(started)
        copies: list = [None] * len(started)
        at, used = {}, 0
        for j, (i, pid, _) in enumerate(started):
            k, obj, n = prepared[i]
            if n <= s.area.size - used:
                at[j], used = used, used + n
                continue
            try:
                self._stream(s, k, pid, obj, keep_last=False)
            except _WRITE_ERRORS as e:
                failed(i, pid, e)
        for j, off in at.items():
            i, pid, _ = started[j]
            _, obj, n = prepared[i]
            try:
                s.area.write(off, obj, n)
            except _WRITE_ERRORS as e:
                failed(i, pid, e)
                continue
            copies[j] = [AreaCopy(0, off, n)]
        return copies

    def batch_get(self, keys, errors: list | None = None) -> list:
        """One holder (or None for a miss) per key, MAX_BATCH keys per call (each call with
        its own recovery, as :meth:`get`'s). A key that failed on its own (NO_SPACE: its
        target did not fit the pool; UNAVAILABLE: its source failed) releases the holders
        obtained and raises, unless ``errors`` is a list: then that key answers None, the
        keys served keep their holders, and (index, exception) of each such key is appended
        to ``errors``. A failed call raises either way, the holders obtained released."""
        ks = [_norm_key(k) for k in keys]
        out: list = []
        try:
            for base, chunk in _chunks(ks):
                out += self._run(_batch_get_once, chunk, base, errors)
        except BaseException:
            for h in out:
                if h is not None:
                    h.release()
            raise
        return out

    def batch_exists(self, keys, prefix: bool = False, pin_ms: int = 0):
        """Without ``prefix``: one bool per key (present or not). With ``prefix`` (the keys
        are the pages of one prompt, in order): the count of leading keys present, as an
        int, stopping at the first absent one; the owner evaluates up to MAX_BATCH keys in
        one call, and the next MAX_BATCH only when all before were present. ``pin_ms`` > 0
        (prefix only, at most MAX_PIN_MS) also pins the pages counted for that long, so the
        get that follows finds them in the owner's memory; a pin needs no release (it ends
        with its time, the session, a get of the key, or an overwrite or delete of it reaching
        the owner; until then this session's get may read the version the lookup found,
        docs/hot-set.md), and a page that cannot be pinned
        ends the count like an absent one. Pages the owner does not hold in memory (on another
        owner or on SSD) are brought in only as far as half its landing area takes; the rest
        are counted unpinned, and the load brings them in."""
        prefix = bool(prefix)
        try:
            pin = operator.index(pin_ms)
        except TypeError:
            raise TypeError(f"pin_ms must be an int (milliseconds), not {type(pin_ms).__name__}") from None
        if pin < 0 or pin > MAX_PIN_MS:
            raise InvalidArgument(f"pin_ms {pin} is out of range: a prefix lookup pins for 0 to {MAX_PIN_MS} ms")
        if pin and not prefix:
            raise InvalidArgument(f"pin_ms {pin} needs prefix=True: only a prefix lookup pins what it found")
        ks = [_norm_key(k) for k in keys]
        if not ks:
            return 0 if prefix else []
        if prefix:
            return self._run(_prefix_count, ks, pin)
        return self._batch_flags(ks, "BatchExists", _dec_batch_exists)

    def batch_delete(self, keys) -> list:
        """One flag per key: deleted (True) or absent (False), MAX_BATCH keys per call, each
        call with its own recovery (a retried call, after a lost reply, may answer False for
        a key it deleted). A key the owner could not delete raises, as :meth:`delete`: the
        keys of its call may or may not be deleted."""
        return self._batch_flags([_norm_key(k) for k in keys], "BatchDelete", _dec_batch_delete)

    def _batch_flags(self, ks: list, method: str, decode) -> list:
        out: list = []
        for _, chunk in _chunks(ks):
            out += self._run(_batch_flags, chunk, method, decode)
        return out

    def delete_namespace(self, namespace) -> int:
        """Delete every key of ``namespace`` cluster-wide and return how many existed. A key's
        namespace is the text before its last '/' (namespaces do not nest: "a/b/k" is in "a/b",
        not in "a"); ``namespace`` must be non-empty ("a/" holds keys such as "a//x"). Holders of the
        deleted keys keep their bytes; afterwards no owner answers a get of them. It costs one
        master call per MAX_BATCH keys of the namespace, whatever the size of the cache.
        Retried like :meth:`delete`: a retry may count fewer keys."""
        return self._run(_namespace_call, "DeleteNamespace", _norm_key(namespace)).deleted

    def namespace_stat(self, namespace) -> dict:
        """``{"keys": n, "bytes": n}`` of ``namespace`` (see :meth:`delete_namespace`): its keys
        and their values' bytes (each key's current version once, however many replicas), as
        the master knows them."""
        r = self._run(_namespace_call, "NamespaceStat", _norm_key(namespace))
        return {"keys": r.keys, "bytes": r.bytes}

    # -- public: status ------------------------------------------------------------------------------

    def stat(self, keep_hot_set: bool = False) -> dict:
        """The owner's status: members with memory and SSD capacity/used, key count, distinct
        values in memory (``memory_values``) and duplicate bytes (``memory_duplicate_bytes``),
        holders and clients, and the masters (``masters``: a list of ``{"addr", "leader", "epoch"}``,
        the leader's epoch > 0). Queued releases are sent first, so status reflects them, and the
        owner lets its hot set's idle holdings go, so holder counts are exact; ``keep_hot_set``
        leaves them (they are then counted), for status polls that should not send the owner's
        next gets of every cached key to the master."""
        rest = encode_fields(StatRequest(None, True)) if keep_hot_set else _STOP

        def op(s):
            try:
                s.flush_releases()
            except Unavailable:
                pass  # (releases a failed call gave back: the status is asked for all the same)
            r = s.call("Stat", rest, piggyback=False)
            raise_for(r.code, r.message)
            return _stat_dict(r)

        return self._run(op)


def connect(socket=None, **kwargs) -> Client:
    """Attach to the local fluxkv owner and return a :class:`Client`.

    ``socket`` is the owner's attach socket (``DIR/fluxkv.sock``) or its directory; by
    default ``$FLUXKV_SOCKET``, else ``$XDG_RUNTIME_DIR/fluxkv/fluxkv.sock`` if it exists, else
    ``/run/fluxkv/fluxkv.sock``. Raises Unavailable when no owner listens there.
    Keyword arguments: ``name`` (shown by the owner), ``timeout`` (seconds each send and each
    receive of a call may take, > 0: a call of several round trips, or one that waits for
    releases in flight, may take a few), ``attach_timeout``, ``max_idle_connections``, ``release_delay``, ``populate`` (map every
    page of the segment ahead on a background thread, so no put or get takes a first-touch
    page fault: True, False, or None, the default, for segments up to 16 GiB whose owner
    allocated them whole, ``--prefault``)."""
    return Client(socket, **kwargs)


# -- the operations, each run against one session (Client._run retries them once) ----------------


class _byte_source:
    """A value to stream through the put area part by part (Client._stream): a buffer's
    bytes, or a Gather's ranges."""

    def __init__(self, obj):
        self._obj = obj
        self._mv = None

    def __enter__(self) -> "_byte_source":
        if isinstance(self._obj, Gather):
            self._len = self._obj.nbytes
        else:
            self._mv = memoryview(self._obj).cast("B")
            self._len = len(self._mv)
        return self

    def __exit__(self, *exc) -> None:
        if self._mv is not None:
            self._mv.release()

    def __len__(self) -> int:
        return self._len

    def copy_part(self, area: PutArea, off: int, n: int) -> None:
        """Bytes [off, off+n) of the value to the start of the put area."""
        if self._mv is None:
            self._obj.copy_to(area.rw_base, off, n)
        else:
            area.write(0, self._mv[off : off + n], n)


def _put_start(s: _Session, k: str, n: int, opts: PutOptions, parent: str | None):
    r = s.call("PutStart", encode_fields(PutStartRequest(None, k, n, opts, parent)))
    raise_for(r.code, r.message)
    return s, r.put_id, r.offset


class _NoTurn:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NO_TURN = _NoTurn()


def _settle_area(s: _Session) -> None:
    """Before a put writes the put area (``s.area_lock`` held): an earlier PutEnd, BatchPutEnd
    or PutWrite that named the area and went unanswered is sent again; until it is answered, or
    the session ends, the area is not written (the owner may still copy it into the earlier
    put's range, which would then be published with this put's bytes)."""
    if s.area is None or s.area_owed is None:
        return
    method, rest = s.area_owed
    try:
        s.call(method, rest)
    except _Broken as e:
        if s.attach_alive():
            raise Unavailable(f"the put area waits for the owner's answer to an earlier put ({e})") from None
    except (_Stale, Error):
        pass  # the session ended, its area with it
    s.area_owed = None


def _area_turn(s: _Session):
    """The put area lock of an isolated session (the threads sharing a client take turns on
    the area); nothing to hold without isolation."""
    return s.area_lock if s.area is not None else _NO_TURN


def _fill_view(mapping, off: int, n: int, put_id: int, fill) -> None:
    """fill(put_id, view) over mapping[off:off+n], the view released afterwards."""
    base = memoryview(mapping)
    view = base[off : off + n]
    try:
        fill(put_id, view)
    finally:
        try:
            view.release()
            base.release()
        except BufferError:
            pass  # fill kept an export of the view: the mapping outlives it anyway


def _abort(s: _Session, puts) -> None:
    """Best effort PutAbort of (key, put_id) pairs; the owner also revokes them when the
    session ends or their TTL passes."""
    try:
        if len(puts) == 1:
            k, pid = puts[0]
            s.call("PutAbort", encode_fields(PutAbortRequest(None, k, pid)))
        elif puts:
            items = [PutEndItem(k, pid) for k, pid in puts]
            s.call("BatchPutAbort", encode_fields(BatchPutAbortRequest(None, items)))
    except Exception:
        pass


def _decoder(method_layout, batch: bool):
    """decode(method, reply frame) for Session.call: a tuple of ``method_layout`` (one-key
    calls) or (code, message, results, found) (batch calls), with where code and message lie."""
    if batch:

        def decode(method, data):
            return decode_batch(method, method_layout, data)

        decode.code_at, decode.message_at = 0, 1
    else:

        def decode(method, data):
            return decode_one(method, method_layout, data)

        decode.code_at, decode.message_at = method_layout.index["code"], method_layout.index["message"]
    return decode


_dec_get = _decoder(GET, False)
_dec_exists = _decoder(EXISTS, False)
_dec_delete = _decoder(DELETE, False)
_dec_batch_get = _decoder(GET, True)
_dec_batch_exists = _decoder(EXISTS, True)
_dec_batch_delete = _decoder(DELETE, True)


def _holder(s: _Session, k: str, r: tuple) -> MemHolder:
    """The holder of a GetResponse tuple (fluxkv._codec.GET) whose code is OK."""
    hid, off, n = r[_G_HID], r[_G_OFF], r[_G_LEN]
    if hid is None or off is None or n is None or not s.segment.contains(off, n):
        if hid is not None:
            s.queue_release(hid, wake=True)
        raise Error(
            f"Get({k!r}) returned holder {hid} at offset {off} len {n}, outside the {s.segment.size}-byte segment",
            ErrorCode.INTERNAL,
        )
    return MemHolder(s, k, hid, off, n, r[_G_SRC], r[_G_PID], bool(r[_G_REMOTE]))


def _get_once(s: _Session, k: str) -> MemHolder:
    r = s.call("Get", key_field(2, k), _dec_get)
    if r[_G_CODE] != _OK:
        raise_for(r[_G_CODE], r[_G_MSG] or "")
    return _holder(s, k, r)


def _flag_once(s: _Session, method: str, k: str, decode) -> bool:
    """Exists / Delete of one key: its flag; False on KEY_NOT_FOUND."""
    r = s.call(method, key_field(2, k), decode)
    code = r[_E_CODE]
    if code == _KEY_NOT_FOUND:
        return False
    if code != _OK:
        raise_for(code, r[_E_MSG] or "")
    return bool(r[_E_FLAG])


def _namespace_call(s: _Session, method: str, namespace: str):
    """DeleteNamespace / NamespaceStat (a NamespaceRequest: the session, then the name as
    field 2): the generated response, raised unless OK."""
    r = s.call(method, key_field(2, namespace))
    raise_for(r.code, r.message)
    return r


def _chunks(seq, size=None):
    size = size or BATCH_CHUNK
    for i in range(0, len(seq), size):
        yield i, seq[i : i + size]


def _check_count(name: str, results, want: int):
    if results is None or len(results) != want:
        got = "no" if results is None else len(results)
        raise Error(f"{name}: {got} results for {want} items", ErrorCode.INTERNAL)
    return results


def _batch_get_once(s: _Session, ks: list, base: int = 0, errors: list | None = None) -> list:
    """BatchGet of ks (keys base.. of the caller's); see Client.batch_get for ``errors``."""
    out: list = []
    failed: list = []
    try:
        for _, chunk in _chunks(ks):
            code, message, results, _ = s.call("BatchGet", encode_fields(BatchKeysRequest(None, chunk)), _dec_batch_get)
            try:
                raise_for(code, message)
                _check_count("BatchGet", results, len(chunk))
            except Error:
                for res in results or ():  # a refused or malformed answer: what it granted goes back
                    if res[_G_CODE] == _OK and res[_G_HID]:
                        s.queue_release(res[_G_HID], wake=True)
                raise
            i = 0
            try:
                for i, res in enumerate(results):
                    c = res[_G_CODE]
                    if c == _OK:
                        out.append(_holder(s, chunk[i], res))  # (a holder it refuses, it releases)
                    elif c == _KEY_NOT_FOUND:
                        out.append(None)
                    elif errors is not None:
                        failed.append((base + len(out), error_for(c, f"key {chunk[i]!r}: {res[_G_MSG] or ''}")))
                        out.append(None)
                    else:
                        raise error_for(c, f"key {chunk[i]!r}: {res[_G_MSG] or ''}")
            except BaseException:
                for later in results[i + 1 if results[i][_G_CODE] == _OK else i :]:
                    if later[_G_HID]:  # the owner granted them: give them back
                        s.queue_release(later[_G_HID], wake=True)
                raise
    except BaseException:
        for h in out:
            if h is not None:
                h.release()
        raise
    if failed:
        errors.extend(failed)
    return out


def _batch_flags(s: _Session, ks: list, method: str, decode) -> list:
    """BatchExists (without prefix) / BatchDelete: one flag per key, False on KEY_NOT_FOUND."""
    out: list = []
    req = BatchExistsRequest if method == "BatchExists" else BatchKeysRequest
    for _, chunk in _chunks(ks):
        code, message, results, _ = s.call(method, encode_fields(req(None, chunk)), decode)
        raise_for(code, message)
        _check_count(method, results, len(chunk))
        for k, res in zip(chunk, results):
            c = res[_E_CODE]
            if c == _OK:
                out.append(bool(res[_E_FLAG]))
            elif c == _KEY_NOT_FOUND:
                out.append(False)
            else:
                raise error_for(c, f"key {k!r}: {res[_E_MSG] or ''}")
    return out


def _prefix_count(s: _Session, ks: list, pin_ms: int) -> int:
    """BatchExists with prefix: the count of leading keys present, the owner evaluating each
    chunk of MAX_BATCH keys in one call; a chunk is sent only when every key before it was
    present. The count is the response's ``found`` when the owner stopped early (results
    shorter than the keys) or counted something; else the leading present results (an
    owner that answers every key and leaves ``found`` out). The key that ended the count
    may have failed (absent, unpinnable, its pull or refill failed, the master out of
    reach): the count is what was found before it, as the Go and C++ clients answer."""
    total = 0
    for _, chunk in _chunks(ks):
        req = BatchExistsRequest(None, chunk, True, pin_ms if pin_ms > 0 else None)
        code, message, results, found = s.call("BatchExists", encode_fields(req), _dec_batch_exists)
        raise_for(code, message)
        if results is None or len(results) > len(chunk):
            got = "no" if results is None else len(results)
            raise Error(f"BatchExists: {got} results for {len(chunk)} keys", ErrorCode.INTERNAL)
        lead = 0
        for res in results:
            if res[_E_CODE] != _OK or not res[_E_FLAG]:
                break
            lead += 1
        found = found or 0
        n = found if (len(results) < len(chunk) or found > 0) else lead
        if n < 0 or n > len(chunk) or n > len(results):
            raise Error(f"BatchExists: found {found} of {len(chunk)} keys with {len(results)} results", ErrorCode.INTERNAL)
        total += n
        if n < len(chunk):
            break
    return total


def _cap(c) -> dict:
    if c is None:
        return {"capacity_bytes": 0, "used_bytes": 0}
    return {"capacity_bytes": c.capacity_bytes or 0, "used_bytes": c.used_bytes or 0}


def _stat_dict(r) -> dict:
    members = []
    for m in r.members or ():
        members.append(
            {
                "node_id": m.node_id or "",
                "generation": m.generation or 0,
                "alive": bool(m.alive),
                "memory_segment": _cap(m.memory_segment),
                "kv_ssd": _cap(m.kv_ssd),
                "data_addr": m.data_addr or "",
                "peer_addr": m.peer_addr or "",
                "memory_replicas": m.memory_replicas or 0,
                "ssd_replicas": m.ssd_replicas or 0,
                "holders": m.holders or 0,
                "ssd_persists": m.ssd_persists or 0,
                "ssd_persists_dropped": m.ssd_persists_dropped or 0,
                "ssd_persists_pending": m.ssd_persists_pending or 0,
                "ssd_unwritten": getattr(m, "ssd_unwritten", None) or 0,
                "transfer_area": _cap(getattr(m, "transfer_area", None)),
                "transfer_area_replicas": getattr(m, "transfer_area_replicas", None) or 0,
                "landing_area": _cap(getattr(m, "landing_area", None)),
            }
        )
    masters = [
        {"addr": m.addr or "", "leader": bool(m.leader), "epoch": m.epoch or 0}
        for m in getattr(r, "masters", None) or ()
        if m is not None
    ]
    return {
        "node_id": r.node_id or "",
        "keys": r.keys or 0,
        "memory_values": getattr(r, "memory_values", None) or 0,
        "memory_duplicate_bytes": getattr(r, "memory_duplicate_bytes", None) or 0,
        "client_holders": r.client_holders or 0,
        "clients": r.clients or 0,
        "members": members,
        "masters": masters,
    }


def _flush_loop(client_ref, wake: threading.Event, delay: float) -> None:
    """Send queued releases that no call picked up within ``delay`` seconds.

    Sleeps on ``wake`` while idle, waking every second for acks queued by finalizers (they
    never kick it). Once kicked it stays armed, checking every ``delay``: while calls flow
    they carry the releases and it does nothing; after a quiet ``delay`` it sends what is
    queued, and disarms once the queue is empty. A busy get/release loop therefore costs no
    kicks. Exits when the client is closed, collected, or replaced its event (fork)."""
    while True:
        wake.wait(1.0)
        c = client_ref()
        if c is None or c._closed or c._wake is not wake:
            return
        s = c._s
        failed = False
        while s is not None and s.state is None:
            seen = s.rpc_count
            time.sleep(delay)
            if c._closed or s.state is not None or s.rpc_count != seen:
                continue  # calls are flowing: they carry the releases
            if not s.pending:
                break  # quiet and nothing queued: disarm
            try:
                s.flush_releases()
            except Exception:
                # The owner is gone or the session ended (its end released them), or the
                # Release failed: its ids stay queued for the next call or the next wake-up.
                failed = True
                break
        c._flush_armed = False
        wake.clear()
        if not failed and s is not None and s.state is None and s.pending:
            c._kick()  # queued while disarming
        del c, s


def _after_fork_in_child() -> None:
    for s in list(_SESSIONS):
        try:
            s.forked()
        except Exception:
            pass
    for c in list(_CLIENTS):
        try:
            c._after_fork_in_child()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
