"""memcached (the Debian package) on a Unix socket: ``-m`` = the case's DRAM in MiB; SSD on adds
extstore, ``-o ext_path=FILE:SIZE`` with the case's flash size; ``-I`` only when the payload needs a
larger item limit (and then, SSD on, ``ext_wbuf_size`` of at least an item, which memcached
requires); defaults otherwise. Clients: ``pymemcache`` (one per thread).

Sources by counter: memcached tells no per-get source, so SSD hits are the increase, over the
window, of extstore reads that returned a value:
``get_extstore - miss_from_extstore - get_aborted_extstore`` (``badcrc_from_extstore`` is a subset
of ``miss_from_extstore``). The rest of the hits are memory hits."""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from ..procs import unix_request, unix_socket_ready, wait_for
from ..sizes import KiB, MiB
from .base import BytesGot, CaseSpec, Server as _Server, ThreadClient, WorkerSide as _WorkerSide, module_available, settle_by_polling, which

# An item is header (48) + CAS (8) + key + 1 + value + "\r\n": 75 bytes beyond the value for the
# harness's 16-byte keys (measured: 1 MiB - 75 B is the largest value -I 1m takes). 128 covers keys up
# to 69 bytes, and a seed payload (N MiB - 128 B) then needs exactly N MiB.
_ITEM_OVERHEAD = 128
_SLAB_CHUNK_MAX = 512 * KiB  # memcached's default; -I must be a multiple of it


def add_arguments(g) -> None:
    g.add_argument("--memcached-bin", default="memcached", help="memcached binary (Debian: memcached, with extstore)")
    g.add_argument("--memcached-ext-opts", default="", help="extra extstore -o options for SSD-on cases, e.g. ext_item_age=0 "
                   "(at its defaults memcached 1.6.18 evicts 8/16 MiB items instead of flushing them to extstore)")


_EXT_WBUF_DEFAULT = 4 * MiB  # extstore's default write buffer; memcached refuses -I above it


def item_size_max(payload_bytes: int) -> int:
    """The item limit a payload needs: memcached's default 1 MiB, else the next multiple of
    slab_chunk_max (which -I must be)."""
    need = payload_bytes + _ITEM_OVERHEAD
    if need <= MiB:
        return MiB
    return -(-need // _SLAB_CHUNK_MAX) * _SLAB_CHUNK_MAX


def item_size_flag(payload_bytes: int) -> list[str]:
    """``-I`` for payloads that do not fit memcached's default 1 MiB item limit."""
    n = item_size_max(payload_bytes)
    return [] if n == MiB else ["-I", f"{n // KiB}k"]


def extstore_options(ext_file: str, case: CaseSpec, extra: str = "") -> str:
    """``-o`` value for extstore: the file and size, plus a write buffer as large as an item
    when items exceed the default 4 MiB buffer (memcached refuses to start otherwise)."""
    opt = f"ext_path={ext_file}:{max(1, case.ssd_bytes // MiB)}M"
    n = item_size_max(case.payload_bytes)
    if n > _EXT_WBUF_DEFAULT:
        opt += f",ext_wbuf_size={-(-n // MiB)}"
    if extra:
        opt += "," + extra.strip(",")
    return opt


def server_args(binary: str, sock: str, case: CaseSpec, ext_file: str | None, user: str | None, ext_extra: str = "") -> list[str]:
    args = [binary, "-s", sock, "-a", "0600", "-m", str(max(1, case.dram_bytes // MiB))]
    args += item_size_flag(case.payload_bytes)
    if user:
        args += ["-u", user]
    if ext_file:
        args += ["-o", extstore_options(ext_file, case, ext_extra)]
    return args


def parse_stats(raw: bytes) -> dict[str, str]:
    out = {}
    for line in raw.decode(errors="replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] == "STAT":
            out[parts[1]] = parts[2]
    return out


def ssd_hits_counter(stats: dict[str, str]) -> int | None:
    try:
        return int(stats["get_extstore"]) - int(stats.get("miss_from_extstore", 0)) - int(stats.get("get_aborted_extstore", 0))
    except (KeyError, ValueError):
        return None


class Server(_Server):
    name = "memcached"
    source_method = "counter"

    def __init__(self, opts):
        super().__init__(opts)
        self.bin = opts.memcached_bin
        self.sock: str | None = None
        self._ext_checked: str | None | bool = False

    def _extstore_missing(self) -> str | None:
        if self._ext_checked is False:
            import subprocess

            try:
                out = subprocess.run([which(self.bin), "-h"], capture_output=True, text=True, timeout=10)
                self._ext_checked = None if "ext_path" in out.stdout + out.stderr else f"{self.bin} was built without extstore (no ext_path in -h)"
            except OSError as e:
                self._ext_checked = f"{self.bin} -h: {e}"
        return self._ext_checked

    def unavailable(self, case: CaseSpec) -> str | None:
        if not which(self.bin):
            return f"memcached binary {self.bin!r} not found (apt-get install memcached)"
        if not module_available("pymemcache"):
            return "Python module 'pymemcache' not importable (apt-get install python3-pymemcache)"
        if case.ssd:
            return self._extstore_missing()
        return None

    def start(self, case: CaseSpec, workdir: Path, group) -> dict:
        self.sock = str(workdir / "memcached.sock")
        ext = str(workdir / "extstore") if case.ssd else None
        user = getpass.getuser() if os.geteuid() == 0 else None  # memcached refuses root without -u
        args = server_args(which(self.bin), self.sock, case, ext, user, getattr(self.opts, "memcached_ext_opts", ""))
        self.cmdline = args
        self.case_ssd = case.ssd
        proc = group.start("memcached", args, workdir / "memcached.log")
        wait_for(lambda: unix_socket_ready(self.sock), 30, "memcached socket", proc)
        return {"socket": self.sock}

    def stats(self) -> dict[str, str]:
        return parse_stats(unix_request(self.sock, b"stats\r\n", b"END\r\n"))

    def settle(self, timeout: float) -> None:
        def sample():
            s = self.stats()
            return (s.get("extstore_bytes_written"), s.get("extstore_io_queue"), s.get("curr_items"))

        settle_by_polling(sample, timeout)

    def describe(self) -> dict:
        s = self.stats()
        keep = ("version", "limit_maxbytes", "bytes", "curr_items", "evictions", "total_items", "extstore_limit_maxbytes",
                "extstore_bytes_used", "extstore_objects_used", "extstore_bytes_written", "extstore_objects_evicted")
        return {k: (int(s[k]) if s[k].isdigit() else s[k]) for k in keep if k in s}

    def ssd_counter(self) -> float | None:
        return ssd_hits_counter(self.stats())

    def notes(self, described: dict) -> list[str]:
        out = []
        ev = described.get("evictions") or 0
        if self.case_ssd and ev:
            out.append(f"memcached evicted {ev} items during the bootstrap with extstore on "
                       f"({described.get('extstore_bytes_used', 0)} of {described.get('extstore_limit_maxbytes', 0)} flash bytes used): "
                       "at its defaults it did not flush them to flash (see --memcached-ext-opts)")
        return out


class MemcachedThread(ThreadClient):
    def __init__(self, sock: str, source: str | None):
        from pymemcache.client.base import Client

        self.c = Client(sock)
        self.source = source

    def get(self, key: str):
        v = self.c.get(key)
        return None if v is None else BytesGot(v, self.source)

    def put(self, key: str, value) -> None:
        if not self.c.set(key, bytes(value), noreply=False):
            raise RuntimeError(f"memcached set {key} refused (NOT_STORED)")

    def get_many(self, keys: list) -> list:
        found = self.c.get_many(keys)  # one "get k1 k2 ..." command
        return [None if (v := found.get(k)) is None else BytesGot(v, self.source) for k in keys]

    def put_many(self, items: list) -> list:
        return self.c.set_many({k: bytes(v) for k, v in items}, noreply=False)  # pipelined sets, one write

    def close(self) -> None:
        self.c.close()


class WorkerSide(_WorkerSide):
    native_type = "bytes"

    def thread_client(self, thread_index: int) -> ThreadClient:
        # SSD off: every hit is a memory hit; SSD on: sources come from the server's counter.
        return MemcachedThread(self.endpoint["socket"], None if self.case.ssd else "memory")
