"""Tests of the client's pure parts, without a daemon: error mapping, socket paths, attach
framing (against a scripted peer on a socketpair, with a real memfd passed over
SCM_RIGHTS), the read-only segment mappings, DLPack capsules and the holder's pin/release
bookkeeping."""

from __future__ import annotations

import collections
import ctypes
import fcntl
import gc
import os
import socket
import struct
import threading
import weakref

import numpy as np
import pytest

import fluxkv
from fluxkv import _codec, _dlpack, _wire
from fluxkv._gen.common.ttypes import ErrorCode
from fluxkv._gen.external.constants import PROTOCOL_VERSION
from fluxkv._gen.external.ttypes import AttachHello, AttachReply
from fluxkv._segment import Segment, buffer_address
from fluxkv.client import _norm_key, _norm_value
from fluxkv.errors import error_for, raise_for
from fluxkv.holder import MemHolder

# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code,cls",
    [
        (ErrorCode.KEY_NOT_FOUND, fluxkv.KeyNotFound),
        (ErrorCode.ALREADY_EXISTS, fluxkv.AlreadyExists),
        (ErrorCode.NO_SPACE, fluxkv.NoSpace),
        (ErrorCode.INVALID_ARGUMENT, fluxkv.InvalidArgument),
        (ErrorCode.UNAVAILABLE, fluxkv.Unavailable),
        (ErrorCode.BUSY, fluxkv.Error),
        (ErrorCode.INTERNAL, fluxkv.Error),
        (ErrorCode.STALE_GENERATION, fluxkv.Error),
        (99, fluxkv.Error),
    ],
)
def test_error_mapping(code, cls):
    e = error_for(code, "why")
    assert type(e) is cls
    assert isinstance(e, fluxkv.Error)
    assert e.code == code and e.message == "why"
    assert "why" in str(e)
    with pytest.raises(cls):
        raise_for(code, "why")


def test_error_ok_and_missing_code():
    raise_for(ErrorCode.OK, "")
    with pytest.raises(fluxkv.Error) as ei:
        raise_for(None, "no code")
    assert ei.value.code == ErrorCode.INTERNAL
    assert str(error_for(ErrorCode.NO_SPACE, "")) == "NO_SPACE"
    assert str(error_for(ErrorCode.NO_SPACE, "full")) == "NO_SPACE: full"


def test_exception_hierarchy():
    for cls in (fluxkv.KeyNotFound, fluxkv.AlreadyExists, fluxkv.NoSpace, fluxkv.InvalidArgument, fluxkv.Unavailable):
        assert issubclass(cls, fluxkv.Error)
    assert issubclass(fluxkv.Error, Exception)


# -- socket paths ----------------------------------------------------------------------------


def test_default_socket(monkeypatch, tmp_path):
    monkeypatch.delenv("FLUXKV_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert fluxkv.default_socket() == "/run/fluxkv/fluxkv.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert fluxkv.default_socket() == "/run/fluxkv/fluxkv.sock"  # no node of this user's
    (tmp_path / "fluxkv").mkdir()
    (tmp_path / "fluxkv" / "fluxkv.sock").touch()
    assert fluxkv.default_socket() == str(tmp_path / "fluxkv" / "fluxkv.sock")
    monkeypatch.setenv("FLUXKV_SOCKET", "/x/y.sock")
    assert fluxkv.default_socket() == "/x/y.sock"
    assert _wire.resolve_socket(None) == "/x/y.sock"
    assert _wire.resolve_socket(tmp_path) == str(tmp_path / "fluxkv.sock")
    assert _wire.resolve_socket(str(tmp_path / "a.sock")) == str(tmp_path / "a.sock")


def test_connect_nobody_listening(tmp_path):
    with pytest.raises(fluxkv.Unavailable):
        fluxkv.connect(tmp_path / "none.sock")
    # a socket file nobody accepts on
    path = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    with pytest.raises(fluxkv.Unavailable):
        fluxkv.connect(path)


# -- keys and values -----------------------------------------------------------------------


def test_key_normalization():
    assert _norm_key("abc") == "abc"
    assert _norm_key(b"abc") == "abc"
    assert _norm_key("ключ") == "ключ"
    assert _norm_key("ключ".encode()) == "ключ"
    with pytest.raises(fluxkv.InvalidArgument):
        _norm_key(b"\xff\xfe")
    with pytest.raises(fluxkv.InvalidArgument):
        _norm_key("\udc80")  # a lone surrogate cannot be encoded
    with pytest.raises(TypeError):
        _norm_key(42)
    # length is the server's to judge: the client passes empty and long keys through
    assert _norm_key("") == ""
    assert len(_norm_key("k" * 5000)) == 5000


def test_value_normalization():
    assert _norm_value(b"abc")[1] == 3
    assert _norm_value(bytearray(5))[1] == 5
    assert _norm_value(np.zeros((3, 4), dtype=np.float64))[1] == 96
    assert _norm_value(np.zeros(3, dtype=np.complex128))[1] == 48
    with pytest.raises(fluxkv.InvalidArgument):
        _norm_value(np.zeros((4, 4))[:, 1])
    with pytest.raises(TypeError):
        _norm_value("a str is not a buffer")


# -- attach framing ------------------------------------------------------------------------


def _memfd(size: int, fill: bytes = b"", sealed: bool = True) -> int:
    """A memfd of size bytes, sealed against shrinking and growing as the owner's are."""
    fd = os.memfd_create("fluxkv-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if fill:
        os.pwrite(fd, fill, 0)
    if sealed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def _reply(**kw) -> AttachReply:
    base = dict(
        code=ErrorCode.OK,
        message="",
        protocol_version=PROTOCOL_VERSION,
        client_id=7,
        session_token=99,
        owner_generation=5,
        segment_size=1 << 20,
        rpc_socket="/x/fluxkv.sock.rpc",
        node_id="n1",
    )
    base.update(kw)
    return AttachReply(**base)


class FakeAttachPeer:
    """Accepts one attach on a listening Unix socket, records the hello, answers with a
    scripted reply: the frame split into chunks, fds attached to the first chunk."""

    def __init__(self, path: str, reply: AttachReply | None, fds=(), chunks=(3, 1), trailing=b""):
        self.path = path
        self.reply = reply
        self.fds = list(fds)
        self.chunks = chunks
        self.trailing = trailing
        self.hello: AttachHello | None = None
        self.ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ln.bind(path)
        self.ln.listen(1)
        self.closed = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        conn, _ = self.ln.accept()
        with conn:
            hdr = conn.recv(4, socket.MSG_WAITALL)
            (n,) = struct.unpack(">I", hdr)
            self.hello = _wire.decode_struct(AttachHello, conn.recv(n, socket.MSG_WAITALL))
            if self.reply is None:
                return  # close without answering
            data = _wire.frame(_wire.encode_struct(self.reply)) + self.trailing
            first, rest = data[: self.chunks[0]], data[self.chunks[0] :]
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(self.fds)}i", *self.fds))] if self.fds else []
            conn.sendmsg([first], anc)
            step = max(1, self.chunks[1])
            for i in range(0, len(rest), step):
                conn.sendall(rest[i : i + step])
            # keep the connection until the client goes, like the owner does
            conn.recv(1)
            self.closed.set()

    def close(self):
        self.ln.close()


def test_attach_roundtrip_split_frame(tmp_path):
    path = str(tmp_path / "a.sock")
    fd = _memfd(1 << 20, b"segment!")
    peer = FakeAttachPeer(path, _reply(), fds=[fd], chunks=(3, 5), trailing=b"NEXT")
    try:
        sock, reply, got_fds = _wire.attach(path, "unit", 4242, timeout=5)
        assert len(got_fds) == 1
        got_fd = got_fds[0]
        try:
            assert reply.client_id == 7 and reply.session_token == 99 and reply.owner_generation == 5
            assert reply.segment_size == 1 << 20 and reply.rpc_socket == "/x/fluxkv.sock.rpc"
            assert peer.hello.protocol_version == PROTOCOL_VERSION and peer.hello.name == "unit" and peer.hello.pid == 4242
            assert os.pread(got_fd, 8, 0) == b"segment!"
            assert os.get_inheritable(got_fd) is False  # MSG_CMSG_CLOEXEC
            # the reader stopped at the end of the frame: what follows is still queued
            assert sock.recv(4) == b"NEXT"
        finally:
            os.close(got_fd)
            sock.close()
        assert peer.closed.wait(5)  # our close is what the owner sees as the client's end
    finally:
        peer.close()
        os.close(fd)


def test_attach_isolated_takes_two_fds(tmp_path):
    path = str(tmp_path / "a.sock")
    seg, area = _memfd(1 << 20, b"segment!"), _memfd(4096, b"area")
    try:
        peer = FakeAttachPeer(path, _reply(isolated=True, put_area_size=4096), fds=[seg, area])
        try:
            sock, reply, got = _wire.attach(path, "unit", 1, timeout=5)
            try:
                assert reply.isolated and len(got) == 2
                assert os.pread(got[0], 8, 0) == b"segment!" and os.pread(got[1], 4, 0) == b"area"
            finally:
                for fd in got:
                    os.close(fd)
                sock.close()
        finally:
            peer.close()
        peer = FakeAttachPeer(str(tmp_path / "b.sock"), _reply(isolated=True, put_area_size=4096), fds=[seg])
        try:
            with pytest.raises(fluxkv.Error, match="expected 2"):
                _wire.attach(str(tmp_path / "b.sock"), "unit", 1, timeout=5)
        finally:
            peer.close()
    finally:
        os.close(seg)
        os.close(area)


def test_attach_refused_reply(tmp_path):
    path = str(tmp_path / "a.sock")
    peer = FakeAttachPeer(path, _reply(code=ErrorCode.INVALID_ARGUMENT, message="caller not allowed"))
    try:
        with pytest.raises(fluxkv.InvalidArgument, match="caller not allowed"):
            _wire.attach(path, "unit", 1, timeout=5)
    finally:
        peer.close()


def test_attach_reply_without_fd(tmp_path):
    path = str(tmp_path / "a.sock")
    peer = FakeAttachPeer(path, _reply())
    try:
        with pytest.raises(fluxkv.Error, match="file descriptors"):
            _wire.attach(path, "unit", 1, timeout=5)
    finally:
        peer.close()


def test_attach_peer_closes_early(tmp_path):
    path = str(tmp_path / "a.sock")
    peer = FakeAttachPeer(path, None)
    try:
        with pytest.raises(fluxkv.Unavailable):
            _wire.attach(path, "unit", 1, timeout=5)
    finally:
        peer.close()


def test_recv_frame_rejects_huge_frame():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", 1 << 30))
        with pytest.raises(fluxkv.Error, match="exceeds"):
            _wire.recv_frame_with_fds(b)


# -- segment mappings and DLPack --------------------------------------------------------------


@pytest.fixture
def segment():
    fd = _memfd(1 << 20, bytes(range(256)) * 16)
    try:
        yield Segment(fd, 1 << 20)
    finally:
        os.close(fd)


def test_segment_refuses_an_unsealed_or_resized_memfd():
    """A memfd that could shrink under the mapping would kill a read of it with SIGBUS: the
    owner seals it against shrinking and growing, and it holds exactly the announced size."""
    for fd, why in ((_memfd(1 << 20, sealed=False), "not sealed"), (_memfd(2 << 20), "bytes, not the announced")):
        try:
            with pytest.raises(ValueError, match=why):
                Segment(fd, 1 << 20)
        finally:
            os.close(fd)


def _maps_entry(addr: int) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line
    raise AssertionError(f"{addr:#x} is not mapped")


def test_segment_mappings(segment):
    ro = _maps_entry(segment.ro_base)
    rw = _maps_entry(segment.rw_base)
    assert ro.split()[1] == "r--s", ro
    assert rw.split()[1] == "rw-s", rw
    assert "memfd:fluxkv-test" in ro and "memfd:fluxkv-test" in rw
    segment.write(100, b"xyz", 3)
    assert segment.read_bytes(100, 3) == b"xyz"
    out = bytearray(3)
    segment.read_into(100, 3, out)
    assert out == b"xyz"
    assert buffer_address(segment.ro) == segment.ro_base


def test_segment_write_of_a_value_whose_size_changed_is_a_value_error(segment):
    """A value that is not the length its put began with (another thread resized it) fails
    with ValueError at every size, as batch_put fails one item alone with; the small copy
    raised mmap's IndexError, which escaped it and ended the whole batch."""
    for n in (100, 1 << 15):
        with pytest.raises(ValueError):
            segment.write(0, bytearray(n - 1), n)
        with pytest.raises(ValueError):
            segment.write(0, bytearray(n + 1), n)
    segment.write(0, b"ok", 2)
    assert segment.read_bytes(0, 2) == b"ok"


def test_export_view_is_readonly_and_pins(segment):
    released = []

    class Pin:
        def __del__(self):
            released.append(True)

    mv = memoryview(segment.export(16, 8, Pin())).cast("B").toreadonly()
    assert mv.readonly and mv.format == "B" and len(mv) == 8
    assert bytes(mv) == bytes(range(16, 24))
    sub = mv[2:4]
    del mv
    gc.collect()
    assert released == []  # a derived view still uses the bytes
    assert bytes(sub) == bytes([18, 19])
    del sub
    gc.collect()
    assert released == [True]


def test_dlpack_capsule_numpy_roundtrip(segment):
    released = []

    class Pin:
        def __del__(self):
            released.append(True)

    class Exporter:
        def __dlpack__(self, stream=None):
            arr = segment.export(256, 512, Pin())
            return _dlpack.make_capsule(ctypes.addressof(arr), 512, arr)

        def __dlpack_device__(self):
            return (_dlpack.KDL_CPU, 0)

    before = _dlpack.live_exports()
    a = np.from_dlpack(Exporter())
    assert a.dtype == np.uint8 and a.shape == (512,)
    assert a.ctypes.data == segment.ro_base + 256  # zero copy
    assert bytes(a[:4]) == bytes([0, 1, 2, 3])
    assert _dlpack.live_exports() == before + 1
    b = a.view(np.uint32)
    del a
    gc.collect()
    assert released == []
    del b
    gc.collect()
    assert released == [True]
    assert _dlpack.live_exports() == before
    # a capsule nobody consumes frees its tensor when it goes
    cap = Exporter().__dlpack__()
    assert _dlpack.live_exports() == before + 1
    del cap
    gc.collect()
    assert _dlpack.live_exports() == before
    assert released == [True, True]


# -- holder bookkeeping (a stand-in session over a real segment) ---------------------------------


class StandInSession:
    """What MemHolder needs from a session, recording release acks."""

    def __init__(self, segment):
        self.segment = segment
        self.pins: set[int] = set()
        self.acks: collections.deque[int] = collections.deque()
        self.state = None

    def unusable_reason(self):
        return self.state

    def queue_release(self, holder_id, wake):
        self.acks.append(holder_id)

    def unpin(self, token):
        self.pins.discard(token)


def _holder(sess, hid=1, off=0, n=64):
    return MemHolder(sess, "k", hid, off, n, 1, 10)


def test_batch_get_reply_with_a_bad_holder_gives_every_granted_holder_back(segment):
    """A BatchGet reply naming a holder outside the segment (an owner's protocol error)
    fails the call; every holder the reply granted goes back to the owner: the ones
    before it, the bad one and the ones after it."""
    from fluxkv import client as fc
    from fluxkv._codec import GET

    def item(hid, off):
        t = [None] * len(GET.index)
        t[fc._G_CODE], t[fc._G_HID], t[fc._G_OFF], t[fc._G_LEN] = ErrorCode.OK, hid, off, 64
        t[fc._G_SRC], t[fc._G_PID], t[fc._G_REMOTE] = 1, 10, False
        return tuple(t)

    class Replying(StandInSession):
        def call(self, method, rest, decode):
            return ErrorCode.OK, "", [item(1, 0), item(2, 1 << 30), item(3, 64)], None

    s = Replying(segment)
    with pytest.raises(fluxkv.Error, match="outside"):
        fc._batch_get_once(s, ["a", "b", "c"])
    assert sorted(s.acks) == [1, 2, 3]


@pytest.mark.parametrize("code, n", [(ErrorCode.OK, 3), (ErrorCode.OK, 1), (ErrorCode.INTERNAL, 2)])
def test_batch_get_malformed_or_refused_reply_gives_its_holders_back(segment, code, n):
    """A BatchGet reply with more or fewer results than keys, or refused as a whole, fails
    the call; the holders it granted go back to the owner (no lost reply returns them)."""
    from fluxkv import client as fc
    from fluxkv._codec import GET

    def item(hid):
        t = [None] * len(GET.index)
        t[fc._G_CODE], t[fc._G_HID], t[fc._G_OFF], t[fc._G_LEN] = ErrorCode.OK, hid, 64 * hid, 64
        t[fc._G_SRC], t[fc._G_PID], t[fc._G_REMOTE] = 1, 10, False
        return tuple(t)

    class Replying(StandInSession):
        def call(self, method, rest, decode):
            return code, "refused" if code != ErrorCode.OK else "", [item(i + 1) for i in range(n)], None

    s = Replying(segment)
    with pytest.raises(fluxkv.Error):
        fc._batch_get_once(s, ["a", "b"])
    assert sorted(s.acks) == list(range(1, n + 1))


@pytest.mark.parametrize("collect", [False, True])
def test_batch_get_key_failing_alone(segment, collect):
    """A key of a BatchGet that failed alone (NO_SPACE: its target did not fit the pool):
    without ``errors`` the call raises and gives back every holder it granted; with it, the
    key answers None, the keys served keep their holders, and the failure is named with
    its index (base + position)."""
    from fluxkv import client as fc
    from fluxkv._codec import GET

    def item(code, hid):
        t = [None] * len(GET.index)
        t[fc._G_CODE], t[fc._G_HID], t[fc._G_OFF], t[fc._G_LEN] = code, hid, 64 * hid, 64
        t[fc._G_SRC], t[fc._G_PID], t[fc._G_REMOTE] = 1, 10, False
        t[fc._G_MSG] = "" if code == ErrorCode.OK else "does not fit"
        return tuple(t)

    class Replying(StandInSession):
        def call(self, method, rest, decode):
            return ErrorCode.OK, "", [item(ErrorCode.OK, 1), item(ErrorCode.NO_SPACE, 0), item(ErrorCode.OK, 2)], None

    s = Replying(segment)
    if not collect:
        with pytest.raises(fluxkv.NoSpace, match="'b'"):
            fc._batch_get_once(s, ["a", "b", "c"])
        assert sorted(s.acks) == [1, 2]
        return
    errors: list = []
    hs = fc._batch_get_once(s, ["a", "b", "c"], 10, errors)
    assert [h is not None for h in hs] == [True, False, True] and not s.acks
    assert [(i, type(e)) for i, e in errors] == [(11, fluxkv.NoSpace)]
    for h in hs:
        if h is not None:
            h.release()
    assert sorted(s.acks) == [1, 2]


def test_holder_release_without_views_acks_once(segment):
    s = StandInSession(segment)
    h = _holder(s)
    assert h.bytes() == bytes(range(64))
    h.release()
    h.release()
    assert list(s.acks) == [1]
    for use in (h.bytes, h.memoryview, h.numpy, h.__dlpack__, lambda: h.copy_into(bytearray(64))):
        with pytest.raises(fluxkv.Error, match="released"):
            use()
    del h
    gc.collect()
    assert list(s.acks) == [1]


def test_holder_release_waits_for_views(segment):
    s = StandInSession(segment)
    h = _holder(s, hid=2)
    mv = h.memoryview()
    arr = h.numpy(np.uint16, (4, 8))
    cap_arr = np.from_dlpack(h)
    assert h.exports == 3 and len(s.pins) == 3
    h.release()
    assert list(s.acks) == []  # three views still read the bytes
    assert bytes(mv[:2]) == b"\x00\x01"
    del mv
    gc.collect()
    del arr
    gc.collect()
    assert list(s.acks) == []
    assert cap_arr[63] == 63
    del cap_arr
    gc.collect()
    assert list(s.acks) == [2]
    assert h.exports == 0 and not s.pins


def test_holder_gc_acks(segment):
    s = StandInSession(segment)
    h = _holder(s, hid=3)
    arr = h.numpy()
    del h
    gc.collect()
    assert list(s.acks) == []  # the array pins the holder
    del arr
    gc.collect()
    assert list(s.acks) == [3]


def test_holder_unusable_session(segment):
    s = StandInSession(segment)
    h = _holder(s, hid=4)
    s.state = "the owner restarted"
    with pytest.raises(fluxkv.Error, match="owner restarted"):
        h.bytes()
    assert not s.pins


def test_holder_views_and_copy(segment):
    s = StandInSession(segment)
    with _holder(s, hid=5, off=1, n=32) as h:
        assert len(h) == 32 and h.source == "memory" and h.put_id == 10
        assert h.address == segment.ro_base + 1
        assert h.memoryview().readonly
        a = h.numpy()
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 1
        buf = bytearray(40)
        assert h.copy_into(buf) == 32 and bytes(buf[:32]) == bytes(range(1, 33))
        with pytest.raises(fluxkv.InvalidArgument):
            h.copy_into(bytearray(8))
        with pytest.raises(TypeError):
            h.copy_into(b"read-only bytes" * 4)
        out = np.empty(32, np.uint8)
        h.copy_into(out)
        assert out.tolist() == list(range(1, 33))
        with pytest.raises(BufferError):
            h.__dlpack__(stream=3)
        c = np.from_dlpack(_CopyExporter(h))
        assert c.ctypes.data != h.address and bytes(c) == h.bytes()
        del a, c
    gc.collect()
    assert list(s.acks) == [5]


class _CopyExporter:
    def __init__(self, h):
        self.h = h

    def __dlpack__(self, stream=None):
        return self.h.__dlpack__(copy=True)

    def __dlpack_device__(self):
        return self.h.__dlpack_device__()


# -- framed thrift transport --------------------------------------------------------------------


class _Handler:
    def Get(self, req):
        from fluxkv._gen.external.ttypes import GetResponse

        return GetResponse(code=0, holder_id=len(req.session.releases), offset=4096, len=len(req.key), source=1, put_id=9)


def _serve_reference(sock):
    """Thrift's own TFramedTransport + TSocket + Processor on one end of a socketpair."""
    from thrift.protocol import TBinaryProtocol
    from thrift.transport import TSocket, TTransport

    from fluxkv._gen.external import ExternalService

    ts = TSocket.TSocket()
    ts.setHandle(sock)
    trans = TTransport.TFramedTransport(ts)
    proto = TBinaryProtocol.TBinaryProtocol(trans)
    proc = ExternalService.Processor(_Handler())
    try:
        while True:
            proc.process(proto, proto)
    except TTransport.TTransportException:
        pass


def _client_on(sock):
    from thrift.protocol import TBinaryProtocol

    from fluxkv._gen.external import ExternalService

    t = _wire.FramedUnixTransport(sock)
    return t, ExternalService.Client(TBinaryProtocol.TBinaryProtocolAccelerated(t))


def test_framed_transport_interoperates_with_thrift_reference():
    from fluxkv._gen.external.ttypes import GetRequest, Session

    a, b = socket.socketpair()
    srv = threading.Thread(target=_serve_reference, args=(b,), daemon=True)
    srv.start()
    t, cl = _client_on(a)
    try:
        for i in range(3):
            r = cl.Get(GetRequest(Session(1, 2, 3, list(range(i))), "k" * (i + 1)))
            assert (r.code, r.holder_id, r.offset, r.len, r.source, r.put_id) == (0, i, 4096, i + 1, 1, 9)
        big = "x" * 200_000  # a request frame larger than one socket buffer
        assert cl.Get(GetRequest(Session(1, 2, 3, []), big)).len == len(big)
    finally:
        t.close()
        srv.join(5)
        b.close()


def test_framed_transport_reassembles_split_responses():
    from fluxkv._gen.external.ttypes import GetRequest, GetResponse, Session

    a, b = socket.socketpair()

    def serve():
        # answer each request with a reply written one byte at a time
        from thrift.protocol import TBinaryProtocol
        from thrift.Thrift import TMessageType
        from thrift.transport import TTransport

        from fluxkv._gen.external.ExternalService import Get_result

        with b:
            for _ in range(2):
                hdr = b.recv(4, socket.MSG_WAITALL)
                (n,) = struct.unpack(">I", hdr)
                b.recv(n, socket.MSG_WAITALL)
                buf = TTransport.TMemoryBuffer()
                p = TBinaryProtocol.TBinaryProtocol(buf)
                p.writeMessageBegin("Get", TMessageType.REPLY, 0)
                Get_result(success=GetResponse(code=0, holder_id=77, offset=1, len=2, source=2, put_id=3)).write(p)
                p.writeMessageEnd()
                data = _wire.frame(buf.getvalue())
                for i in range(len(data)):
                    b.sendall(data[i : i + 1])

    srv = threading.Thread(target=serve, daemon=True)
    srv.start()
    t, cl = _client_on(a)
    try:
        for _ in range(2):
            r = cl.Get(GetRequest(Session(1, 2, 3, []), "k"))
            assert r.holder_id == 77 and r.source == 2
    finally:
        t.close()
        srv.join(5)


def test_framed_transport_eof():
    from thrift.transport.TTransport import TTransportException

    from fluxkv._gen.external.ttypes import GetRequest, Session

    a, b = socket.socketpair()
    b.close()
    t, cl = _client_on(a)
    with pytest.raises((TTransportException, OSError)):
        cl.Get(GetRequest(Session(1, 2, 3, []), "k"))
    t.close()


@pytest.mark.parametrize("first", [1, 1 << 20])
def test_bytes_after_a_reply_frame_fail_the_call(tmp_path, first):
    """The owner answers each call with one frame: bytes after it would be read as the next
    call's answer (another thread's), so the call fails (and its connection is not reused),
    whether the frame came in one receive (small) or several (large)."""
    from thrift.protocol.TProtocol import TProtocolException

    path = str(tmp_path / "rpc.sock")
    ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ln.bind(path)
    ln.listen(1)

    def serve():
        c, _ = ln.accept()
        with c:
            c.recv(1 << 16)
            try:
                c.sendall(first.to_bytes(4, "big") + b"A" * first + b"\x00\x00\x00\x01B")  # two frames for one call
                c.recv(1)  # until the client closes
            except OSError:
                pass  # the client closed first

    t = threading.Thread(target=serve)
    t.start()
    conn = _wire.RPCConnection(path, 5)
    try:
        with pytest.raises(TProtocolException, match="after the reply frame"):
            conn.call("Exists", _codec.session_head(1, 2, 3), b"")
    finally:
        conn.close()
        t.join(5)
        ln.close()


def test_fork_while_a_call_waits_closes_the_childs_copy_of_its_connection():
    """A fork() while a call holds a connection it took from the pool (here waiting for a
    flush of releases in flight) finds it among the session's connections, and the child
    closes its copy (the parent's later close then reaches the owner)."""
    from fluxkv import client as fc

    class FakeConn:
        sock = object()

        def close(self):
            self.sock = None

    conn = FakeConn()
    s = fc._Session.__new__(fc._Session)
    s.state, s.pending, s.pins, s.attach_sock = None, collections.deque(), 0, None
    s.idle, s.busy, s.flushes_in_flight = collections.deque([conn]), set(), {1}
    s.conns = weakref.WeakSet([conn])  # it was opened by this session
    seen = {}

    def forked_meanwhile():
        s.retire("forked")  # what the child's at-fork hook does
        seen["closed"] = conn.sock is None
        raise RuntimeError("stop the call here")

    s._await_flushes = forked_meanwhile
    with pytest.raises(RuntimeError):
        s.call("Exists", b"", piggyback=True)
    assert seen["closed"], "the child kept its copy of the connection of a call in flight"


def test_call_timeout_bounds_a_trickled_reply(tmp_path):
    """The call timeout bounds a whole call, not each receive of it: an owner trickling its
    reply (a byte every 100 ms, seconds in all) fails a call of a 0.3 s timeout as timed out.
    SO_RCVTIMEO restarted with every receive, and the call waited the whole reply out (a
    review)."""
    path = str(tmp_path / "rpc.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    ls.listen(1)
    reply = _codec.call_head("Exists") + b"\x00" * 40  # any bytes: the frame never completes in time
    frame = struct.pack(">I", len(reply)) + reply

    def serve():
        c, _ = ls.accept()
        with c:
            c.recv(4096)
            for b in frame:
                try:
                    c.send(bytes([b]))
                except OSError:
                    return
                threading.Event().wait(0.1)

    t = threading.Thread(target=serve)
    t.start()
    conn = _wire.RPCConnection(path, 0.3)
    try:
        with pytest.raises(TimeoutError):
            conn.call("Exists", b"", b"\x00")
    finally:
        conn.close()
        t.join(10)
        ls.close()
