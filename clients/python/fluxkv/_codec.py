"""ExternalService messages as bytes: what the RPC path encodes and decodes per call.

The generated client assembles every reply through TTransport.readAll and a pure-Python
message header (four socket reads and three readI32 per call); this module does the same
work on a whole reply frame at once:

* requests: the message header (strict binary, CALL, seqid 0, as the generated client
  sends) and the args struct's field header are constant per method (:func:`call_head`);
  the Session struct is constant per attach session but for its releases
  (:func:`session_head`, :func:`releases_field`); the other fields of a request are
  ``fastbinary.encode_binary`` of the generated request struct with its session left out
  (:func:`encode_fields`), or hand-written for the one-key calls. Field order does not
  matter in thrift, so the session goes first.
* replies: :func:`reply_start` parses the message header of a frame, raising the owner's
  TApplicationException; :func:`decode_result` decodes the result with
  ``fastbinary.decode_binary`` straight from the frame (no copy of the body).
* the hot responses (GetResponse, ExistsResponse, DeleteResponse, and the lists of them
  in batch replies) have a :class:`Layout`: the exact bytes the owner's Kitex codec writes
  for them when their message is empty. A reply that matches its layout (checked as one
  masked integer compare) is unpacked by one precompiled ``struct`` call per response (or
  ``iter_unpack`` for a list); anything else (a message, another field order, an unknown
  field) goes through the generic decoder, so the fast path never changes an answer.

Without the ``fastbinary`` C extension (a pure-Python thrift runtime) the generic paths use
TBinaryProtocol over a memory buffer.
"""

from __future__ import annotations

import io
import struct

from thrift.protocol import TBinaryProtocol
from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport import TTransport

from fluxkv._gen.external import ExternalService
from fluxkv._gen.external.constants import MAX_FRAME_BYTES
from fluxkv._gen.external.ttypes import DeleteResponse, ExistsResponse, GetResponse

try:
    from thrift.protocol import fastbinary

    ACCELERATED = True
except ImportError:  # pure-Python thrift runtime
    fastbinary = None
    ACCELERATED = False

__all__ = [
    "ACCELERATED",
    "Layout",
    "GET",
    "EXISTS",
    "DELETE",
    "call_head",
    "session_head",
    "releases_field",
    "NO_RELEASES",
    "encode_fields",
    "key_field",
    "reply_start",
    "decode_reply",
    "decode_result",
    "decode_one",
    "decode_batch",
]

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_VERSION_MASK = -65536  # 0xffff0000 as a signed i32
_VERSION_1 = -2147418112  # 0x80010000 as a signed i32
_STRUCT_FIELD0 = b"\x0c\x00\x00"  # a result's field 0 (success), a struct

# -- requests ----------------------------------------------------------------------------------------

_HEADS: dict[str, bytes] = {}


def call_head(method: str) -> bytes:
    """The message header of a CALL of ``method`` (strict binary, seqid 0) and the header of
    its args struct's field 1 (the request struct)."""
    head = _HEADS.get(method)
    if head is None:
        name = method.encode("ascii")
        head = _U32.pack(0x80010000 | TMessageType.CALL) + _I32.pack(len(name)) + name + b"\x00\x00\x00\x00" + b"\x0c\x00\x01"
        _HEADS[method] = head
    return head


def session_head(client_id: int, session_token: int, generation: int) -> bytes:
    """A request's field 1 (Session) up to its releases: the bytes every call of one attach
    session starts with."""
    return (
        b"\x0c\x00\x01"
        + b"\x0a\x00\x01" + _I64.pack(client_id)
        + b"\x0a\x00\x02" + _I64.pack(session_token)
        + b"\x0a\x00\x03" + _I64.pack(generation)
    )


_REL1 = struct.Struct(">BhBiqx")  # one release, then the Session's stop
_RELN = struct.Struct(">BhBi")
# Session.releases empty, then the Session's stop.
NO_RELEASES = b"\x0f\x00\x04\x0a\x00\x00\x00\x00\x00"


def releases_field(ids: list) -> bytes:
    """Session.releases (list<i64>) holding ``ids``, then the Session's stop."""
    n = len(ids)
    if n == 1:
        return _REL1.pack(TType.LIST, 4, TType.I64, 1, ids[0])
    return _RELN.pack(TType.LIST, 4, TType.I64, n) + struct.pack(f">{n}q", *ids) + b"\x00"


_STRHDR = struct.Struct(">Bhi")


def key_field(fid: int, key: str) -> bytes:
    """A string field ``fid`` holding ``key`` (UTF-8), then the struct's stop: the rest of a
    one-key request (GetRequest, ExistsRequest, DeleteRequest)."""
    kb = key.encode("utf-8")
    return b"".join((_STRHDR.pack(TType.STRING, fid, len(kb)), kb, b"\x00"))


def encode_fields(obj) -> bytes:
    """The fields of a generated struct (None fields left out) and its stop byte."""
    if fastbinary is not None:
        return fastbinary.encode_binary(obj, [obj.__class__, obj.thrift_spec])
    buf = TTransport.TMemoryBuffer()
    obj.write(TBinaryProtocol.TBinaryProtocol(buf))
    return buf.getvalue()


# -- replies -----------------------------------------------------------------------------------------


def reply_start(data: bytes) -> int:
    """The offset of the result struct in a reply frame ``data`` (4-byte length included).
    Raises the owner's TApplicationException for an EXCEPTION reply, TProtocolException for
    a header that does not parse."""
    end = len(data)
    try:
        v = _I32.unpack_from(data, 4)[0]
        if v < 0:
            if v & _VERSION_MASK != _VERSION_1:
                raise TProtocolException(TProtocolException.BAD_VERSION, f"bad version in the reply header: {v}")
            mtype = v & 0xFF
            n = _I32.unpack_from(data, 8)[0]
            pos = 12 + n + 4
        else:  # the old non-strict header: name, type byte, seqid
            pos = 8 + v
            mtype = data[pos]
            pos += 5
    except (struct.error, IndexError):
        raise TProtocolException(TProtocolException.INVALID_DATA, "truncated reply header") from None
    if pos > end or pos < 8:
        raise TProtocolException(TProtocolException.INVALID_DATA, "truncated reply header")
    if mtype == TMessageType.EXCEPTION:
        x = TApplicationException()
        x.read(TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(data[pos:])))
        raise x
    if mtype != TMessageType.REPLY:
        raise TProtocolException(TProtocolException.INVALID_DATA, f"reply of message type {mtype}")
    return pos


# _MAX_LIST bounds a reply's lists: MAX_BATCH results, or a Stat's members and masters.
_MAX_LIST = 1 << 16


class _Reader:
    """What ``fastbinary.decode_binary`` reads from: a protocol (its ``trans``, the length
    limits) whose transport is a BytesIO over one whole frame (CReadableTransport)."""

    __slots__ = ("cstringio_buf", "trans")
    # What a reply's string or list may announce before anything is allocated for it: no
    # more than a frame holds, and no more elements than any answer has (MAX_BATCH results,
    # a cluster's members). Unbounded, a short malformed reply announcing 2**31 elements
    # had the decoder allocate 16 GiB.
    string_length_limit = MAX_FRAME_BYTES
    container_length_limit = _MAX_LIST

    def __init__(self, data: bytes, pos: int):
        buf = io.BytesIO(data)  # shares the bytes object: no copy
        buf.seek(pos)
        self.cstringio_buf = buf
        self.trans = self

    def cstringio_refill(self, partial, need):
        raise TProtocolException(TProtocolException.INVALID_DATA, "reply ends inside a struct")


def _decode_struct(cls, data: bytes, pos: int):
    obj = cls()
    if fastbinary is not None:
        try:
            fastbinary.decode_binary(obj, _Reader(data, pos), [cls, cls.thrift_spec])
        except OverflowError as e:  # a length past _Reader's limits
            raise TProtocolException(TProtocolException.SIZE_LIMIT, f"reply: {e}") from None
    else:
        obj.read(TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(data[pos:]), string_length_limit=MAX_FRAME_BYTES,
                                                 container_length_limit=_MAX_LIST))
    return obj


_RESULTS: dict[str, tuple] = {}


def _result_of(method: str) -> tuple:
    """(``method``_result class, its success struct class)."""
    r = _RESULTS.get(method)
    if r is None:
        cls = getattr(ExternalService, method + "_result")
        r = (cls, cls.thrift_spec[0][3][0])
        _RESULTS[method] = r
    return r


def decode_reply(method: str, data: bytes):
    """The success struct of a reply frame of ``method`` (the generic decoder)."""
    return decode_result(method, data, reply_start(data))


def decode_result(method: str, data: bytes, pos: int):
    """The success struct of ``method``'s result at data[pos:]; TApplicationException
    MISSING_RESULT when the result carries none (as the generated client)."""
    result_cls, cls = _result_of(method)
    if data[pos : pos + 3] == _STRUCT_FIELD0:
        return _decode_struct(cls, data, pos + 3)  # the success struct itself: one object fewer
    r = _decode_struct(result_cls, data, pos)
    if r.success is None:
        raise TApplicationException(TApplicationException.MISSING_RESULT, f"{method} failed: unknown result")
    return r.success


class Layout:
    """The bytes the owner writes for one response struct whose message is empty: its fields
    in the owner's order (``fields``: (ttype, id, name)), each of fixed size. ``unpack``
    gives a tuple in that order (names in ``names``); the message's slot holds 0 on the fast
    path and the message (a str) when the generic decoder made the tuple."""

    def __init__(self, cls, fields):
        self.cls = cls
        fmt, mask, expect = [">"], bytearray(), bytearray()
        for ttype, fid, _ in fields:
            tag = bytes((ttype,)) + fid.to_bytes(2, "big")
            fmt.append("3x")
            mask += b"\xff\xff\xff"
            expect += tag
            if ttype == TType.I64:
                fmt.append("q")
                mask += bytes(8)
            elif ttype == TType.I32:
                fmt.append("i")
                mask += bytes(4)
            elif ttype == TType.BOOL:
                fmt.append("?")
                mask += bytes(1)
            elif ttype == TType.STRING:  # the message: empty, so its length (0) is checked
                fmt.append("i")
                mask += b"\xff\xff\xff\xff"
            else:
                raise ValueError(f"layout field type {ttype}")
            expect += bytes(len(mask) - len(expect))
        fmt.append("x")  # the struct's stop
        mask += b"\xff"
        expect += b"\x00"
        self.struct = struct.Struct("".join(fmt))
        self.size = self.struct.size
        assert self.size == len(mask) == len(expect)
        self._mask_bytes = bytes(mask)
        self._expect_bytes = bytes(expect)
        self.mask = int.from_bytes(mask, "big")
        self.expect = int.from_bytes(expect, "big")
        self.names = tuple(name for _, _, name in fields)
        self.index = {name: i for i, name in enumerate(self.names)}
        self._many: dict[int, tuple[int, int]] = {}
        self._frames: dict[str, tuple] = {}

    def matches(self, data, pos: int, count: int = 1) -> bool:
        """Whether data[pos:] holds ``count`` responses laid out exactly so."""
        n = self.size * count
        if pos + n > len(data):
            return False
        if count == 1:
            mask, expect = self.mask, self.expect
        else:
            me = self._many.get(count)
            if me is None:
                me = (int.from_bytes(self._mask_bytes * count, "big"), int.from_bytes(self._expect_bytes * count, "big"))
                if count <= 1024 and len(self._many) < 64:
                    self._many[count] = me
            mask, expect = me
        return int.from_bytes(data[pos : pos + n], "big") & mask == expect

    def frame(self, method: str) -> tuple:
        """(mask, expect, size, offset) of a whole reply frame of ``method`` whose success
        struct has this layout: the frame length, the header (any seqid), the result's field
        0 and stop are checked with it; offset is where the struct's fields begin."""
        f = self._frames.get(method)
        if f is None:
            name = method.encode("ascii")
            head = _U32.pack(0x80010000 | TMessageType.REPLY) + _I32.pack(len(name)) + name
            size = 4 + len(head) + 4 + 3 + self.size + 1
            mask = b"\xff" * (4 + len(head)) + bytes(4) + b"\xff\xff\xff" + self._mask_bytes + b"\xff"
            expect = _U32.pack(size - 4) + head + bytes(4) + _STRUCT_FIELD0 + self._expect_bytes + b"\x00"
            f = (int.from_bytes(mask, "big"), int.from_bytes(expect, "big"), size, 4 + len(head) + 4 + 3)
            self._frames[method] = f
        return f

    def from_obj(self, obj) -> tuple:
        """The tuple of a generated response struct (the generic decoder's answer)."""
        return tuple(getattr(obj, name) for name in self.names)


# The owner's Kitex codec writes a struct's fixed-size fields first, then its strings
# and containers, each group in field-id order (protocol/kitex_gen/external/k-external.go).
GET = Layout(
    GetResponse,
    (
        (TType.I64, 3, "holder_id"),
        (TType.I64, 4, "offset"),
        (TType.I64, 5, "len"),
        (TType.I64, 7, "put_id"),
        (TType.BOOL, 8, "remote"),
        (TType.I32, 1, "code"),
        (TType.STRING, 2, "message"),
        (TType.I32, 6, "source"),
    ),
)
EXISTS = Layout(ExistsResponse, ((TType.BOOL, 3, "exists"), (TType.I32, 1, "code"), (TType.STRING, 2, "message")))
DELETE = Layout(DeleteResponse, ((TType.BOOL, 3, "deleted"), (TType.I32, 1, "code"), (TType.STRING, 2, "message")))


def decode_one(method: str, layout: Layout, data: bytes) -> tuple:
    """The tuple (``layout``'s order) of the response in a one-key call's reply frame: one
    masked compare of the whole frame and one unpack when it is laid out as the owner
    writes it with an empty message, the generic decoder otherwise."""
    mask, expect, size, off = layout._frames.get(method) or layout.frame(method)
    if len(data) == size and int.from_bytes(data, "big") & mask == expect:
        return layout.struct.unpack_from(data, off)
    pos = reply_start(data)
    p = pos + 3
    if data[pos:p] == _STRUCT_FIELD0 and layout.matches(data, p):
        return layout.struct.unpack_from(data, p)
    return layout.from_obj(decode_result(method, data, pos))


class _Mismatch(Exception):
    pass


def decode_batch(method: str, layout: Layout, data: bytes):
    """(code, message, results, found) of the batch response (code, message, results list
    of ``layout`` structs, optional found) in a reply frame; results are tuples in
    ``layout``'s order, None when the response carries none; found is None when absent."""
    pos = reply_start(data)
    try:
        return _batch_fast(layout, data, pos)
    except (_Mismatch, struct.error, IndexError):
        pass
    r = decode_result(method, data, pos)
    results = None if r.results is None else [layout.from_obj(x) for x in r.results]
    return r.code, r.message, results, getattr(r, "found", None)


def _batch_fast(layout: Layout, data: bytes, pos: int):
    if data[pos : pos + 3] != _STRUCT_FIELD0:
        raise _Mismatch()
    p = pos + 3
    code = found = results = None
    message = None
    unpack_i32 = _I32.unpack_from
    while True:
        t = data[p]
        if t == TType.STOP:
            break
        fid = (data[p + 1] << 8) | data[p + 2]
        p += 3
        if t == TType.I32 and (fid == 1 or fid == 4):
            v = unpack_i32(data, p)[0]
            p += 4
            if fid == 1:
                code = v
            else:
                found = v
        elif t == TType.STRING and fid == 2:
            n = unpack_i32(data, p)[0]
            p += 4
            if n < 0 or p + n > len(data):
                raise _Mismatch()
            message = data[p : p + n].decode("utf-8", "replace")
            p += n
        elif t == TType.LIST and fid == 3:
            if data[p] != TType.STRUCT:
                raise _Mismatch()
            n = unpack_i32(data, p + 1)[0]
            p += 5
            if n < 0 or not layout.matches(data, p, n):
                raise _Mismatch()
            end = p + n * layout.size
            results = list(layout.struct.iter_unpack(memoryview(data)[p:end])) if n else []
            p = end
        else:
            raise _Mismatch()  # any other field: the generic decoder skips it properly
    return code, message, results, found
