"""Redis (the Debian package) on a Unix socket: ``maxmemory`` = the case's DRAM with
``allkeys-lru`` (a cache, not the default ``noeviction`` store), persistence off, defaults
otherwise. Redis has no flash tier: its SSD-on cases are unavailable. Clients: ``redis-py`` (one
per thread; it uses the hiredis parser when python3-hiredis is installed)."""

from __future__ import annotations

import socket
from pathlib import Path

from ..procs import unix_request, unix_socket_ready, wait_for
from .base import BytesGot, CaseSpec, Server as _Server, ThreadClient, WorkerSide as _WorkerSide, module_available, which


def server_args(binary: str, sock: str, workdir: str, case: CaseSpec) -> list[str]:
    return [
        binary,
        "--port", "0",
        "--unixsocket", sock,
        "--unixsocketperm", "600",
        "--dir", workdir,
        "--save", "",
        "--appendonly", "no",
        "--maxmemory", str(case.dram_bytes),
        "--maxmemory-policy", "allkeys-lru",
    ]


def add_arguments(g) -> None:
    g.add_argument("--redis-bin", default="redis-server", help="redis-server binary")


def bulk_request(sock_path: str, command: bytes, timeout: float = 5.0) -> bytes:
    """Send an inline command, return its bulk-string reply's body."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(command)
        buf = bytearray()
        while b"\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("redis closed the connection")
            buf += chunk
        head, _, rest = bytes(buf).partition(b"\r\n")
        if not head.startswith(b"$"):
            raise OSError(f"redis replied {head[:200]!r}")
        want = int(head[1:]) + 2
        body = bytearray(rest)
        while len(body) < want:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("redis closed the connection")
            body += chunk
        return bytes(body[: want - 2])
    finally:
        s.close()


def parse_info(raw: bytes) -> dict[str, str]:
    out = {}
    for line in raw.decode(errors="replace").splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k.strip()] = v.strip()
    return out


class Server(_Server):
    name = "redis"
    source_method = "per-get"  # DRAM only: every hit says "memory"

    def __init__(self, opts):
        super().__init__(opts)
        self.bin = opts.redis_bin
        self.sock: str | None = None

    def unavailable(self, case: CaseSpec) -> str | None:
        if case.ssd:
            return "redis has no flash tier (DRAM only)"
        if not which(self.bin):
            return f"redis-server binary {self.bin!r} not found (apt-get install redis-server)"
        if not module_available("redis"):
            return "Python module 'redis' not importable (apt-get install python3-redis)"
        return None

    def start(self, case: CaseSpec, workdir: Path, group) -> dict:
        self.sock = str(workdir / "redis.sock")
        self.cmdline = server_args(which(self.bin), self.sock, str(workdir), case)
        proc = group.start("redis", self.cmdline, workdir / "redis.log")
        wait_for(lambda: unix_socket_ready(self.sock) and self._ping(), 30, "redis socket", proc)
        return {"socket": self.sock}

    def _ping(self) -> bool:
        try:
            return unix_request(self.sock, b"PING\r\n", b"\r\n", timeout=1.0).startswith(b"+PONG")
        except OSError:
            return False

    def info(self) -> dict[str, str]:
        return parse_info(bulk_request(self.sock, b"INFO\r\n"))

    def describe(self) -> dict:
        i = self.info()
        keys = 0
        db0 = i.get("db0", "")
        for part in db0.split(","):
            if part.startswith("keys="):
                keys = int(part[5:])
        out = {"keys": keys, "redis_version": i.get("redis_version")}
        for k in ("used_memory", "maxmemory", "evicted_keys", "maxmemory_policy"):
            if k in i:
                out[k] = int(i[k]) if i[k].isdigit() else i[k]
        return out


class RedisThread(ThreadClient):
    def __init__(self, sock: str):
        import redis

        self.r = redis.Redis(unix_socket_path=sock)

    def get(self, key: str):
        v = self.r.get(key)
        return None if v is None else BytesGot(v, "memory")

    def put(self, key: str, value) -> None:
        self.r.set(key, bytes(value))

    def get_many(self, keys: list) -> list:
        return [None if v is None else BytesGot(v, "memory") for v in self.r.mget(keys)]

    def put_many(self, items: list) -> list:
        self.r.mset({k: bytes(v) for k, v in items})  # MSET cannot refuse a key
        return []

    def close(self) -> None:
        self.r.close()


class WorkerSide(_WorkerSide):
    native_type = "bytes"

    def thread_client(self, thread_index: int) -> ThreadClient:
        return RedisThread(self.endpoint["socket"])

    def describe(self) -> dict:
        try:
            from redis.connection import HIREDIS_AVAILABLE
        except ImportError:
            HIREDIS_AVAILABLE = False
        return {"parser": "hiredis" if HIREDIS_AVAILABLE else "python"}
