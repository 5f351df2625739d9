"""What the client speaks on the owner's sockets (docs/architecture.md §3, protocol/external.thrift).

Attach: one frame each way on DIR/fluxkv.sock. A frame is a 4-byte big-endian length and a
TBinaryProtocol struct: AttachHello out, AttachReply back, with the segment's memfd riding
as SCM_RIGHTS ancillary data on the first bytes of the reply. The attach connection stays
open for the client's life; its close makes the owner release everything the client holds.

RPC: framed binary thrift (TFramedTransport's format + TBinaryProtocol) to ExternalService
on the socket the reply names: RPCConnection sends each request frame in one send and reads
each reply frame whole, encoded and decoded by fluxkv._codec (the same bytes the generated
ExternalService.Client writes over TFramedTransport; FramedUnixTransport is that client's
transport, kept for tests and tools).
"""

from __future__ import annotations

import array
import os
import socket
import time
import struct
from io import BytesIO

from thrift.protocol import TBinaryProtocol
from thrift.protocol.TProtocol import TProtocolException
from thrift.transport import TTransport

from fluxkv import _codec
from fluxkv._gen.common.ttypes import ErrorCode
from fluxkv._gen.external import ExternalService
from fluxkv._gen.external.constants import MAX_ATTACH_FRAME_BYTES, MAX_FRAME_BYTES, PROTOCOL_VERSION
from fluxkv._gen.external.ttypes import AttachHello, AttachReply
from fluxkv.errors import Error, InvalidArgument, PermissionDenied, Unavailable, error_for

__all__ = [
    "SOCKET_NAME",
    "MAX_ATTACH_FRAME",
    "default_socket",
    "resolve_socket",
    "encode_struct",
    "decode_struct",
    "frame",
    "attach",
    "recv_frame_with_fds",
    "RPCConnection",
    "FramedUnixTransport",
    "ACCELERATED",
]

SOCKET_NAME = "fluxkv.sock"
# The wire limits come from protocol/external.thrift (generated constants): one source.
MAX_ATTACH_FRAME = MAX_ATTACH_FRAME_BYTES  # body of an attach frame
_RECV_SIZE = 65536
_LEN = struct.Struct(">I")
_MAX_FDS = 4

ACCELERATED = _codec.ACCELERATED  # the fastbinary C extension is present


def default_socket() -> str:
    """The daemon's default attach socket: $FLUXKV_SOCKET, else
    $XDG_RUNTIME_DIR/fluxkv/fluxkv.sock when it exists (a node this user runs), else
    /run/fluxkv/fluxkv.sock (the system's node: a login sets XDG_RUNTIME_DIR, and the
    systemd owner listens in /run/fluxkv)."""
    env = os.environ.get("FLUXKV_SOCKET")
    if env:
        return env
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        own = os.path.join(runtime, "fluxkv", SOCKET_NAME)
        if os.path.exists(own):
            return own
    return os.path.join("/run/fluxkv", SOCKET_NAME)


def resolve_socket(sock) -> str:
    """A path given by the user: None means the default; a directory means DIR/fluxkv.sock."""
    if sock is None:
        return default_socket()
    path = os.fspath(sock)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if os.path.isdir(path):
        path = os.path.join(path, SOCKET_NAME)
    return path


def _protocol_factory():
    if ACCELERATED:
        return TBinaryProtocol.TBinaryProtocolAcceleratedFactory()
    return TBinaryProtocol.TBinaryProtocolFactory()


def encode_struct(obj) -> bytes:
    buf = TTransport.TMemoryBuffer()
    obj.write(_protocol_factory().getProtocol(buf))
    return buf.getvalue()


def decode_struct(cls, data: bytes):
    obj = cls()
    obj.read(_protocol_factory().getProtocol(TTransport.TMemoryBuffer(data)))
    return obj


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def recv_frame_with_fds(sock: socket.socket, max_frame: int = MAX_ATTACH_FRAME) -> tuple[bytes, list[int]]:
    """Read exactly one length-prefixed frame and every fd passed with any of its bytes.
    Never reads past the frame. The fds are close-on-exec; the caller owns them."""
    fds: list[int] = []
    data = bytearray()
    need = 4
    cmsg_space = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
    try:
        while len(data) < need:
            chunk, ancdata, flags, _ = sock.recvmsg(need - len(data), cmsg_space, socket.MSG_CMSG_CLOEXEC)
            for level, kind, cdata in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(cdata[: len(cdata) - len(cdata) % got.itemsize])
                    fds.extend(got)
            if flags & socket.MSG_CTRUNC:
                raise Error("attach reply: ancillary data truncated (too many file descriptors)")
            if not chunk:
                raise Unavailable(f"attach socket closed after {len(data)} of {need} bytes of the reply")
            data += chunk
            if need == 4 and len(data) == 4:
                (size,) = struct.unpack(">I", bytes(data))
                if size > max_frame:
                    raise Error(f"attach reply frame of {size} bytes exceeds {max_frame}")
                need = 4 + size
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return bytes(data[4:]), fds


def attach(path: str, name: str, pid: int, timeout: float, on_socket=None):
    """Attach to the owner at ``path``. Returns (attach socket, AttachReply, fds): the
    segment's memfd, and under client isolation (``reply.isolated``) the session's put area
    second. Raises Unavailable when nobody listens there, the matching Error for a refusal.
    ``on_socket`` gets the socket as soon as it exists (a session keeps it from there, so
    that a fork during the attach closes the child's copy); it is closed on failure."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if on_socket is not None:
            on_socket(sock)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError) as e:
            raise Unavailable(f"no fluxkv owner at {path}: {e.strerror or e}") from None
        except PermissionError as e:
            raise PermissionDenied(
                f"cannot connect to {path}: {e.strerror or e}: the socket admits its owner and members of its group "
                f"(see `ls -l {path}`); add the user with `usermod -aG GROUP USER` (it takes effect at the user's next login)",
                ErrorCode.PERMISSION_DENIED,
            ) from None
        except socket.timeout:
            raise Unavailable(f"connect to {path} timed out") from None
        hello = AttachHello(protocol_version=PROTOCOL_VERSION, name=name, pid=pid)
        try:
            sock.sendall(frame(encode_struct(hello)))
            payload, fds = recv_frame_with_fds(sock)
        except socket.timeout:
            raise Unavailable(f"attach to {path}: no reply within {timeout} s") from None
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Unavailable(f"attach to {path}: {e.strerror or e}") from None
        try:
            reply = decode_struct(AttachReply, payload)
            if reply.code != ErrorCode.OK:
                raise error_for(reply.code if reply.code is not None else ErrorCode.INTERNAL, f"attach refused: {reply.message or ''}")
            if reply.protocol_version not in (None, PROTOCOL_VERSION):
                raise Error(f"owner speaks protocol version {reply.protocol_version}, this client {PROTOCOL_VERSION}")
            want = 2 if reply.isolated else 1
            if len(fds) != want:
                raise Error(
                    f"attach reply carried {len(fds)} file descriptors, expected {want} "
                    f"(the segment's memfd{', then the put area' if reply.isolated else ''})"
                )
            if not reply.segment_size or reply.segment_size <= 0:
                raise Error(f"attach reply announces segment size {reply.segment_size}")
            if reply.isolated and (not reply.put_area_size or reply.put_area_size <= 0):
                raise Error(f"attach reply announces put area size {reply.put_area_size}")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        sock.settimeout(None)
        return sock, reply, fds
    except BaseException:
        sock.close()
        raise


class FramedUnixTransport(TTransport.TTransportBase, TTransport.CReadableTransport):
    """TFramedTransport's wire format (4-byte big-endian length + message) directly on a
    connected socket, tuned for one outstanding call: a request goes out in one send, a
    response usually comes in with one recv. Readable by the accelerated protocol."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._wbuf: list[bytes] = []
        self._rbuf = BytesIO(b"")
        self._extra = b""  # bytes received beyond the current frame

    def isOpen(self) -> bool:
        return self._sock is not None

    def open(self) -> None:
        pass

    def close(self) -> None:
        # close(2) only, never shutdown(2): after fork() the other process may still use it.
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def write(self, buf) -> None:
        self._wbuf.append(buf)

    def flush(self) -> None:
        body = b"".join(self._wbuf)
        self._wbuf = []
        if 4 + len(body) > MAX_FRAME_BYTES:
            raise TTransport.TTransportException(
                TTransport.TTransportException.SIZE_LIMIT,
                f"request frame of {4 + len(body)} bytes exceeds the limit of {MAX_FRAME_BYTES}",
            )
        if self._sock is None:
            raise TTransport.TTransportException(TTransport.TTransportException.NOT_OPEN, "connection closed")
        self._sock.sendall(_LEN.pack(len(body)) + body)

    def read(self, sz: int) -> bytes:
        ret = self._rbuf.read(sz)
        if ret:
            return ret
        self._read_frame()
        return self._rbuf.read(sz)

    def _recv(self, n: int) -> bytes:
        if self._sock is None:
            raise TTransport.TTransportException(TTransport.TTransportException.NOT_OPEN, "connection closed")
        data = self._sock.recv(n)
        if not data:
            raise TTransport.TTransportException(TTransport.TTransportException.END_OF_FILE, "the owner closed the connection")
        return data

    def _read_frame(self) -> None:
        data = self._extra or self._recv(_RECV_SIZE)
        self._extra = b""
        while len(data) < 4:
            data += self._recv(_RECV_SIZE)
        (size,) = _LEN.unpack_from(data)
        if 4 + size > MAX_FRAME_BYTES:
            raise TTransport.TTransportException(
                TTransport.TTransportException.SIZE_LIMIT, f"response frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}"
            )
        need = 4 + size
        if len(data) < need:
            parts = [data]
            have = len(data)
            while have < need:
                chunk = self._recv(need - have)
                parts.append(chunk)
                have += len(chunk)
            data = b"".join(parts)
        if len(data) > need:
            self._extra = data[need:]
        self._rbuf = BytesIO(data[4:need])

    # CReadableTransport: lets the accelerated protocol decode straight from the frame buffer.
    @property
    def cstringio_buf(self):
        return self._rbuf

    def cstringio_refill(self, partialread: bytes, reqlen: int):
        prefix = partialread
        while len(prefix) < reqlen:
            self._read_frame()
            prefix += self._rbuf.getvalue()
        self._rbuf = BytesIO(prefix)
        return self._rbuf


class RPCConnection:
    """One framed-binary thrift connection to ExternalService. Not safe for concurrent use:
    the client hands each connection to one thread at a time.

    :meth:`call` is the whole exchange of one call: the request frame goes out in one send,
    the reply frame usually comes back in one recv (a larger one is read into one buffer),
    and the caller decodes it with :mod:`fluxkv._codec`. The socket is blocking, its
    timeout set as SO_RCVTIMEO / SO_SNDTIMEO: a socket timeout in Python costs a poll(2)
    before every send and recv. ``client`` is the generated ExternalService client on the
    same socket, for tests and tools (built on first use)."""

    __slots__ = ("sock", "timeout", "_client", "_lowered", "__weakref__")

    def __init__(self, path: str, timeout: float):
        handle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            handle.settimeout(timeout)
            handle.connect(path)
            if timeout is not None and timeout > 0:
                handle.settimeout(None)
                tv = _timeval(timeout)
                handle.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
                handle.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        except BaseException:
            handle.close()
            raise
        self.sock = handle
        self.timeout = timeout
        self._client = None
        self._lowered = False  # SO_RCVTIMEO is below timeout (_fit)

    def call(self, method: str, session: bytes, rest: bytes) -> bytes:
        """Send one call of ``method``: its request struct is ``session`` (field 1, encoded)
        then ``rest`` (the other fields and the struct's stop). Returns the reply frame, its
        4-byte length included (fluxkv._codec decodes it). Raises TTransportException
        (closed, EOF, reply size), TimeoutError, OSError; InvalidArgument for a request larger
        than a frame (nothing is sent: the connection stays good)."""
        head = _codec.call_head(method)
        n = len(head) + len(session) + len(rest) + 1
        if 4 + n > MAX_FRAME_BYTES:
            raise InvalidArgument(f"{method}: a request frame of {4 + n} bytes exceeds the limit of {MAX_FRAME_BYTES}")
        sock = self.sock
        if sock is None:
            raise TTransport.TTransportException(TTransport.TTransportException.NOT_OPEN, "connection closed")
        deadline = None if not self.timeout or self.timeout <= 0 else time.monotonic() + self.timeout
        try:
            sock.sendall(b"".join((_LEN.pack(n), head, session, rest, b"\x00")))
            return self._read_frame(sock, deadline)
        except BlockingIOError:  # SO_RCVTIMEO / SO_SNDTIMEO ran out
            raise TimeoutError(f"no reply from the owner within {self.timeout} s") from None

    def _fit(self, sock, deadline) -> None:
        """Lower SO_RCVTIMEO to what is left of the call, after a read that did not bring the
        whole reply: the socket's timeout bounds each receive, and an owner trickling its
        reply held a call far past its timeout (a review). Restored once the reply is in."""
        if deadline is None:
            return
        left = deadline - time.monotonic()
        if left <= 0.0005:
            raise TimeoutError(f"no whole reply from the owner within {self.timeout} s")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(left))
        self._lowered = True

    def _read_frame(self, sock, deadline=None) -> bytes:
        try:
            return self._read_frame_within(sock, deadline)
        finally:
            if self._lowered:
                self._lowered = False
                if self.sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(self.timeout))

    def _read_frame_within(self, sock, deadline) -> bytes:
        data = sock.recv(_RECV_SIZE)
        if not data:
            raise _eof()
        while len(data) < 4:
            self._fit(sock, deadline)
            more = sock.recv(_RECV_SIZE)
            if not more:
                raise _eof()
            data += more
        need = 4 + _LEN.unpack_from(data)[0]
        if need > MAX_FRAME_BYTES:
            raise TTransport.TTransportException(
                TTransport.TTransportException.SIZE_LIMIT, f"response frame of {need - 4} bytes exceeds the limit of {MAX_FRAME_BYTES}"
            )
        have = len(data)
        if have == need:
            return data
        if have > need:
            # The owner answers each call with one frame: bytes after it would be taken for
            # the next call's answer (another thread's). The connection is not used again.
            raise TProtocolException(TProtocolException.INVALID_DATA, f"{have - need} bytes after the reply frame")
        buf = bytearray(need)
        buf[:have] = data
        view = memoryview(buf)
        try:
            while have < need:
                self._fit(sock, deadline)
                got = sock.recv_into(view[have:])
                if not got:
                    raise _eof()
                have += got
        finally:
            view.release()
        # A frame read in several receives stopped at its end: bytes already behind it are
        # refused as above (one look, without waiting; a small frame's single receive saw them).
        try:
            behind = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            behind = b""
        if behind:
            raise TProtocolException(TProtocolException.INVALID_DATA, "bytes after the reply frame")
        return bytes(buf)

    @property
    def client(self):
        """The generated ExternalService client over this connection (tests, tools)."""
        if self._client is None:
            t = FramedUnixTransport(self.sock)
            proto = TBinaryProtocol.TBinaryProtocolAccelerated(t) if ACCELERATED else TBinaryProtocol.TBinaryProtocol(t)
            self._client = ExternalService.Client(proto)
        return self._client

    def close(self) -> None:
        # close(2) only, never shutdown(2): after fork() the other process may still use it.
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _eof() -> TTransport.TTransportException:
    return TTransport.TTransportException(TTransport.TTransportException.END_OF_FILE, "the owner closed the connection")


def _timeval(seconds: float) -> bytes:
    sec = int(seconds)
    usec = int(round((seconds - sec) * 1e6))
    if usec >= 1_000_000:
        sec, usec = sec + 1, usec - 1_000_000
    if sec == 0 and usec == 0:
        usec = 1  # 0 would mean no timeout at all
    return struct.pack("@ll", sec, usec)
