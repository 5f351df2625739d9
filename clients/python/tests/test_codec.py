"""The RPC path without a daemon: fluxkv._codec's encodings and decodings (the layout fast
path must give exactly what the generic decoder gives, and step aside for anything it does
not know), RPCConnection against thrift's own reference server, and the client's prefix
count against owners that do and do not evaluate prefix lookups."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from thrift.protocol import TBinaryProtocol
from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport import TTransport

import fluxkv
from fluxkv import _codec, _wire
from fluxkv import client as fc
from fluxkv._gen.common.ttypes import ErrorCode
from fluxkv._gen.external import ExternalService
from fluxkv._gen.external.ttypes import (
    BatchExistsRequest,
    BatchExistsResponse,
    BatchGetResponse,
    ExistsResponse,
    GetRequest,
    GetResponse,
    Session,
)

# -- building replies the way the owner (Kitex) and the generated Python code write them -----------


def _write_fields(p, fields) -> None:
    """fields: (ttype, id, value) in the order to write; value of a STRUCT field: its fields;
    of a LIST field: (element ttype, [element fields...])."""
    for ttype, fid, v in fields:
        p.writeFieldBegin("", ttype, fid)
        if ttype == TType.I64:
            p.writeI64(v)
        elif ttype == TType.I32:
            p.writeI32(v)
        elif ttype == TType.BOOL:
            p.writeBool(v)
        elif ttype == TType.STRING:
            p.writeString(v)
        elif ttype == TType.STRUCT:
            _write_fields(p, v)
        elif ttype == TType.LIST:
            et, elems = v
            p.writeListBegin(et, len(elems))
            for e in elems:
                _write_fields(p, e)
        p.writeFieldEnd()
    p.writeFieldStop()


def kitex_get(code=0, message="", hid=7, off=4096, n=100, src=1, pid=9, remote=False):
    """GetResponse's fields in the order the owner's Kitex codec writes them."""
    return [
        (TType.I64, 3, hid), (TType.I64, 4, off), (TType.I64, 5, n), (TType.I64, 7, pid),
        (TType.BOOL, 8, remote), (TType.I32, 1, code), (TType.STRING, 2, message), (TType.I32, 6, src),
    ]


def kitex_exists(code=0, message="", exists=True):
    return [(TType.BOOL, 3, exists), (TType.I32, 1, code), (TType.STRING, 2, message)]


def reply_frame(method: str, result_fields, mtype=TMessageType.REPLY) -> bytes:
    buf = TTransport.TMemoryBuffer()
    p = TBinaryProtocol.TBinaryProtocol(buf)
    p.writeMessageBegin(method, mtype, 0)
    _write_fields(p, result_fields)
    p.writeMessageEnd()
    body = buf.getvalue()
    return struct.pack(">I", len(body)) + body


def generated_frame(method: str, success) -> bytes:
    """A reply as the generated Python code writes it (fields in id order, None left out)."""
    buf = TTransport.TMemoryBuffer()
    p = TBinaryProtocol.TBinaryProtocol(buf)
    p.writeMessageBegin(method, TMessageType.REPLY, 0)
    getattr(ExternalService, method + "_result")(success=success).write(p)
    p.writeMessageEnd()
    body = buf.getvalue()
    return struct.pack(">I", len(body)) + body


def decode_get(frame: bytes) -> tuple:
    return _codec.decode_one("Get", _codec.GET, frame)


def test_get_layout_matches_the_owners_bytes():
    frame = reply_frame("Get", [(TType.STRUCT, 0, kitex_get(hid=77, off=123456, n=4096, src=2, pid=3, remote=True))])
    pos = _codec.reply_start(frame)
    assert _codec.GET.matches(frame, pos + 3)  # the struct's layout
    mask, expect, size, off = _codec.GET.frame("Get")
    assert len(frame) == size and int.from_bytes(frame, "big") & mask == expect and off == pos + 3  # the whole frame's
    r = decode_get(frame)
    g = _codec.GET.index
    assert (r[g["holder_id"]], r[g["offset"]], r[g["len"]], r[g["source"]], r[g["put_id"]]) == (77, 123456, 4096, 2, 3)
    assert r[g["remote"]] is True and r[g["code"]] == 0 and not r[g["message"]]


@pytest.mark.parametrize(
    "frame",
    [
        # a message: not the layout
        reply_frame("Get", [(TType.STRUCT, 0, kitex_get(code=ErrorCode.KEY_NOT_FOUND, message="no such key"))]),
        # the generated code's field order
        generated_frame("Get", GetResponse(code=ErrorCode.KEY_NOT_FOUND, message="no such key", holder_id=0, offset=0, len=0, source=0, put_id=0)),
        # an unknown field after the known ones
        reply_frame("Get", [(TType.STRUCT, 0, kitex_get(code=ErrorCode.KEY_NOT_FOUND, message="no such key") + [(TType.I64, 99, 5)])]),
    ],
    ids=["message", "generated-order", "unknown-field"],
)
def test_get_other_layouts_decode_generically(frame):
    r = decode_get(frame)
    g = _codec.GET.index
    assert r[g["code"]] == ErrorCode.KEY_NOT_FOUND and r[g["message"]] == "no such key"


def test_fast_and_generic_get_agree():
    fields = dict(hid=1 << 40, off=8192, n=1, src=1, pid=(1 << 62) + 5, remote=False)
    fast = decode_get(reply_frame("Get", [(TType.STRUCT, 0, kitex_get(**fields))]))
    gen = decode_get(generated_frame("Get", GetResponse(0, "", 1 << 40, 8192, 1, 1, (1 << 62) + 5, False)))
    assert fast[: _codec.GET.index["message"]] == gen[: _codec.GET.index["message"]]
    assert fast[_codec.GET.index["source"]] == gen[_codec.GET.index["source"]]
    assert not fast[_codec.GET.index["message"]] and not gen[_codec.GET.index["message"]]


def test_missing_result_and_exception_replies():
    with pytest.raises(TApplicationException) as e:
        decode_get(reply_frame("Get", []))  # a result without success
    assert e.value.type == TApplicationException.MISSING_RESULT
    buf = TTransport.TMemoryBuffer()
    p = TBinaryProtocol.TBinaryProtocol(buf)
    p.writeMessageBegin("Get", TMessageType.EXCEPTION, 0)
    TApplicationException(TApplicationException.UNKNOWN_METHOD, "unknown method Get").write(p)
    body = buf.getvalue()
    with pytest.raises(TApplicationException, match="unknown method"):
        _codec.reply_start(struct.pack(">I", len(body)) + body)
    with pytest.raises(TProtocolException):
        _codec.reply_start(b"\x00\x00\x00\x08\x80\x01\x00\x02\x00\x00\x00\x40")  # name past the frame
    with pytest.raises(TProtocolException):
        decode_get(reply_frame("Get", [(TType.STRUCT, 0, kitex_get())])[:-10])  # ends inside the struct


@pytest.mark.parametrize("n", [0, 1, 64, 1500])
def test_batch_layouts(n):
    elems = [kitex_exists(exists=i % 3 != 0) for i in range(n)]
    frame = reply_frame("BatchExists", [(TType.STRUCT, 0, [
        (TType.I32, 4, n - n // 3), (TType.I32, 1, 0), (TType.STRING, 2, ""), (TType.LIST, 3, (TType.STRUCT, elems)),
    ])])
    fast = _codec.decode_batch("BatchExists", _codec.EXISTS, frame)
    resp = BatchExistsResponse(0, "", [ExistsResponse(0, "", i % 3 != 0) for i in range(n)], n - n // 3)
    gen = _codec.decode_batch("BatchExists", _codec.EXISTS, generated_frame("BatchExists", resp))
    e = _codec.EXISTS.index
    assert fast[0] == gen[0] == 0 and fast[3] == gen[3] == n - n // 3
    assert [r[e["exists"]] for r in fast[2]] == [r[e["exists"]] for r in gen[2]] == [i % 3 != 0 for i in range(n)]
    assert [r[e["code"]] for r in fast[2]] == [0] * n


def test_batch_with_one_message_decodes_generically():
    elems = [kitex_get(hid=i + 1) for i in range(5)]
    elems[3] = kitex_get(code=ErrorCode.NO_SPACE, message="full", hid=0)
    frame = reply_frame("BatchGet", [(TType.STRUCT, 0, [(TType.I32, 1, 0), (TType.STRING, 2, ""), (TType.LIST, 3, (TType.STRUCT, elems))])])
    code, message, results, found = _codec.decode_batch("BatchGet", _codec.GET, frame)
    g = _codec.GET.index
    assert code == 0 and found is None
    assert [r[g["holder_id"]] for r in results] == [1, 2, 3, 0, 5]
    assert results[3][g["message"]] == "full" and results[3][g["code"]] == ErrorCode.NO_SPACE
    # a whole-call error without results
    frame = generated_frame("BatchGet", BatchGetResponse(ErrorCode.INVALID_ARGUMENT, "too many keys"))
    assert _codec.decode_batch("BatchGet", _codec.GET, frame) == (ErrorCode.INVALID_ARGUMENT, "too many keys", None, None)


def test_reply_lists_are_bounded_before_allocation():
    """A short reply whose list announces 2**31 - 1 results is refused at once, not
    decoded into a list allocated at that length (16 GiB)."""
    buf = TTransport.TMemoryBuffer()
    p = TBinaryProtocol.TBinaryProtocol(buf)
    p.writeMessageBegin("BatchGet", TMessageType.REPLY, 0)
    p.writeFieldBegin("success", TType.STRUCT, 0)
    p.writeFieldBegin("code", TType.I32, 1)
    p.writeI32(0)
    p.writeFieldBegin("results", TType.LIST, 3)
    p.writeListBegin(TType.STRUCT, 0x7FFFFFFF)
    body = buf.getvalue()
    frame = struct.pack(">I", len(body)) + body
    with pytest.raises(TProtocolException):
        _codec.decode_batch("BatchGet", _codec.GET, frame)


def test_request_encoding_is_what_the_generated_client_writes():
    """The hand-made request bytes decode, with the generated code, to the same request."""
    sess = _codec.session_head(11, 22, 33)
    for releases in ([], [5], [1, 2, 1 << 50]):
        tail = _codec.releases_field(releases) if releases else _codec.NO_RELEASES
        for method, rest, want in (
            ("Get", _codec.key_field(2, "ключ/1"), GetRequest(Session(11, 22, 33, releases), "ключ/1")),
            ("BatchExists", _codec.encode_fields(BatchExistsRequest(None, ["a", "b"], True, 2000)),
             BatchExistsRequest(Session(11, 22, 33, releases), ["a", "b"], True, 2000)),
        ):
            body = _codec.call_head(method) + sess + tail + rest + b"\x00"
            p = TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(body))
            assert p.readMessageBegin() == (method, TMessageType.CALL, 0)
            args = getattr(ExternalService, method + "_args")()
            args.read(p)
            assert args.req == want


# -- RPCConnection against thrift's reference server ------------------------------------------------


class _Handler:
    def __init__(self):
        self.seen = []

    def Get(self, req):
        self.seen.append(req)
        return GetResponse(code=0, message="", holder_id=len(req.session.releases), offset=4096, len=len(req.key), source=1, put_id=9, remote=False)


def _serve(listener, handler, conns=1):
    from thrift.transport import TSocket

    for _ in range(conns):
        sock, _ = listener.accept()
        ts = TSocket.TSocket()
        ts.setHandle(sock)
        trans = TTransport.TFramedTransport(ts)
        proto = TBinaryProtocol.TBinaryProtocol(trans)
        proc = ExternalService.Processor(handler)
        try:
            while True:
                proc.process(proto, proto)
        except (TTransport.TTransportException, OSError):
            pass
        finally:
            sock.close()


@pytest.fixture
def listener(tmp_path):
    path = str(tmp_path / "rpc.sock")
    ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ln.bind(path)
    ln.listen(4)
    yield path, ln
    ln.close()


def test_rpc_connection_interoperates_with_thrift_reference(listener):
    path, ln = listener
    h = _Handler()
    srv = threading.Thread(target=_serve, args=(ln, h), daemon=True)
    srv.start()
    conn = _wire.RPCConnection(path, 5)
    try:
        sess = _codec.session_head(1, 2, 3)
        for i in range(3):
            ids = list(range(100, 100 + i))
            tail = _codec.releases_field(ids) if ids else _codec.NO_RELEASES
            data = conn.call("Get", sess + tail, _codec.key_field(2, "k" * (i + 1)))
            r = _codec.decode_one("Get", _codec.GET, data)
            g = _codec.GET.index
            assert (r[g["code"]], r[g["holder_id"]], r[g["offset"]], r[g["len"]], r[g["put_id"]]) == (0, i, 4096, i + 1, 9)
            assert h.seen[-1] == GetRequest(Session(1, 2, 3, ids), "k" * (i + 1))
        big = "x" * 200_000  # a request frame larger than one socket buffer
        data = conn.call("Get", sess + _codec.NO_RELEASES, _codec.key_field(2, big))
        assert _codec.decode_one("Get", _codec.GET, data)[_codec.GET.index["len"]] == len(big)
        # the generated client still works over the same connection (tests and tools use it)
        assert conn.client.Get(GetRequest(Session(1, 2, 3, [7]), "abc")).holder_id == 1
    finally:
        conn.close()
        srv.join(5)


def _scripted(ln, replies):
    """Answer each request with the next (frame, split) of ``replies``, one byte per send when split."""
    sock, _ = ln.accept()
    with sock:
        for frame, split in replies:
            (n,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
            sock.recv(n, socket.MSG_WAITALL)
            if split:
                for i in range(len(frame)):
                    sock.sendall(frame[i : i + 1])
                    time.sleep(0.0005)
            else:
                sock.sendall(frame)


def test_rpc_connection_reassembles_split_and_large_replies(listener):
    path, ln = listener
    small = reply_frame("Get", [(TType.STRUCT, 0, kitex_get(hid=77, src=2))])
    elems = [kitex_get(hid=i + 1) for i in range(3000)]  # ~210 KB: several reads
    large = reply_frame("BatchGet", [(TType.STRUCT, 0, [(TType.I32, 1, 0), (TType.STRING, 2, ""), (TType.LIST, 3, (TType.STRUCT, elems))])])
    srv = threading.Thread(target=_scripted, args=(ln, [(small, True), (small, True), (large, False)]), daemon=True)
    srv.start()
    conn = _wire.RPCConnection(path, 30)
    try:
        sess = _codec.session_head(1, 2, 3) + _codec.NO_RELEASES
        for _ in range(2):
            data = conn.call("Get", sess, _codec.key_field(2, "k"))
            assert data == small
            assert _codec.decode_one("Get", _codec.GET, data)[_codec.GET.index["holder_id"]] == 77
        data = conn.call("BatchGet", sess, b"\x00")
        assert data == large
        results = _codec.decode_batch("BatchGet", _codec.GET, data)[2]
        assert [r[_codec.GET.index["holder_id"]] for r in results] == list(range(1, 3001))
    finally:
        conn.close()
        srv.join(30)


def test_rpc_connection_eof_and_timeout(listener):
    path, ln = listener
    sess = _codec.session_head(1, 2, 3) + _codec.NO_RELEASES

    def accept_then(action):
        sock, _ = ln.accept()
        action(sock)

    t = threading.Thread(target=accept_then, args=(lambda s: s.close(),), daemon=True)
    t.start()
    conn = _wire.RPCConnection(path, 5)
    t.join(5)
    with pytest.raises((TTransport.TTransportException, OSError)):
        conn.call("Get", sess, _codec.key_field(2, "k"))
    conn.close()
    with pytest.raises(TTransport.TTransportException):
        conn.call("Get", sess, _codec.key_field(2, "k"))  # closed

    held = []
    t = threading.Thread(target=accept_then, args=(held.append,), daemon=True)  # never answers
    t.start()
    conn = _wire.RPCConnection(path, 0.3)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        conn.call("Get", sess, _codec.key_field(2, "k"))
    assert fc._is_timeout(e.value)
    assert 0.2 < time.monotonic() - t0 < 5
    conn.close()
    t.join(5)
    for s in held:
        s.close()


# -- the prefix count against owners old and new ----------------------------------------------------


class _FakeSession:
    """Answers BatchExists from a table of present keys, as an owner that evaluates prefix
    lookups (``new``) or one that answers every key and has no ``found`` (old)."""

    def __init__(self, present, new: bool, stop_code=None):
        self.present, self.new, self.stop_code = set(present), new, stop_code
        self.requests = []

    def call(self, method, rest, decode=None, piggyback=True):
        assert method == "BatchExists"
        req = BatchExistsRequest()
        req.read(TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(rest)))
        self.requests.append(req)
        results, found = [], 0
        for k in req.keys:
            ok = k in self.present
            if self.new and req.prefix and not ok and self.stop_code is not None:
                results.append((False, self.stop_code, "cannot pin"))
                break
            results.append((ok, 0 if ok else 0, ""))
            if self.new and req.prefix:
                if not ok:
                    break
                found += 1
        if not self.new:
            return 0, "", results, None
        if not req.prefix:
            found = sum(1 for r in results if r[0])
        return 0, "", results, found


@pytest.mark.parametrize("new", [True, False])
def test_prefix_count_against_owners(new, monkeypatch):
    monkeypatch.setattr(fc, "BATCH_CHUNK", 4)
    keys = [f"k{i}" for i in range(10)]
    for present, want, calls in (
        (keys, 10, 3),
        (keys[:6] + keys[7:], 6, 2),  # a gap in the second chunk
        (keys[1:], 0, 1),  # the first is absent
        (keys[:4], 4, 2),  # the first chunk whole, the second's first absent
        ([], 0, 1),
    ):
        s = _FakeSession(present, new)
        assert fc._prefix_count(s, keys, 0) == want, (present, new)
        assert len(s.requests) == calls
        assert all(r.prefix is True and r.pin_ms is None for r in s.requests)
    s = _FakeSession(keys, new)
    assert fc._prefix_count(s, keys, 1500) == 10
    assert {r.pin_ms for r in s.requests} == {1500}


@pytest.mark.parametrize("code", [ErrorCode.NO_SPACE, ErrorCode.UNAVAILABLE, ErrorCode.INVALID_ARGUMENT])
def test_prefix_count_ends_at_the_key_that_failed(code):
    """The count is what was found before the key that ended it, whatever that key's code:
    a page that could not be pinned, brought in, or asked of the master (the Go and C++
    clients' answer; it raised for UNAVAILABLE, and the pages found counted for nothing)."""
    keys = ["a", "b", "c"]
    s = _FakeSession(["a"], True, stop_code=code)
    assert fc._prefix_count(s, keys, 100) == 1


def test_pure_python_runtime_paths(monkeypatch):
    """Without the fastbinary C extension the generic encoder and decoder use TBinaryProtocol."""
    fast = _codec.encode_fields(BatchExistsRequest(None, ["a", "b"], True, 10))
    monkeypatch.setattr(_codec, "fastbinary", None)
    assert _codec.encode_fields(BatchExistsRequest(None, ["a", "b"], True, 10)) == fast
    resp = BatchExistsResponse(0, "", [ExistsResponse(0, "", True), ExistsResponse(ErrorCode.NO_SPACE, "full", False)], 1)
    frame = generated_frame("BatchExists", resp)
    code, message, results, found = _codec.decode_batch("BatchExists", _codec.EXISTS, frame)
    e = _codec.EXISTS.index
    assert (code, found) == (0, 1) and results[1][e["message"]] == "full" and results[0][e["exists"]] is True
    r = decode_get(generated_frame("Get", GetResponse(ErrorCode.KEY_NOT_FOUND, "no", 0, 0, 0, 0, 0, False)))
    assert r[_codec.GET.index["code"]] == ErrorCode.KEY_NOT_FOUND
