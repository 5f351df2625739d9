"""TEST FAKE of Mooncake Store, NOT Mooncake: just enough of the ``mooncake.store`` Python binding
and of the ``mooncake_master`` binary for the pressure harness's Mooncake adapter
(``backends/mooncake.py``) to run end to end on a machine without Mooncake. Nothing measured
against it says anything about Mooncake.

test_mooncake.py copies this file to ``TMP/mooncake/store.py`` (the binding, put on
``--mooncake-pythonpath``) and starts it as ``TMP/bin/mooncake_master`` (the master).

* The fake master takes the real master's flags (and, like gflags, exits 1 on one it does not
  define unless ``--undefok`` lists it: the flag set of v0.3.12.post1, the latest release tag, or
  of main with ``FAKE_MOONCAKE_MASTER_VERSION=main``), listens on the HTTP metadata, RPC and metrics
  ports, and keeps every value itself: memory capacity = the sum of the clients'
  ``global_segment_size``; with ``--enable_offload=true``, values evicted from memory move to a
  "disk" of the clients' ``MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE`` (only of clients that set up
  with ``enable_ssd_offload``; unset: unbounded, as upstream's default of 90 % of the file system
  is for these sizes; ``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`` does not bound it, as upstream's
  bucket backend ignores it), else they are dropped. Like Mooncake's bucket SSD backend, evicted
  values are written in buckets: a bucket is written once it holds
  ``MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT`` keys (default 500) or
  ``MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES`` (default 256 MiB), as the flash-holding client's
  environment said at setup; a part-filled bucket's values are lost (upstream hands them back to the
  master unwritten and they are later evicted), so with the defaults and small data nothing reaches
  the disk. A put larger than the free space after
  eviction, or with no memory at all, is refused with -200 (NO_AVAILABLE_HANDLE). It dies of
  SIGTERM (no handler).
* The fake client mirrors the binding's calls (``setup`` with the seven positional arguments and
  ``enable_ssd_offload`` / ``ssd_offload_path``, refusing a non-zero segment below one 16 MiB
  slab and an SSD path that is not an absolute directory with INVALID_PARAMS; ``put`` → 0 (also for
  a key already there, as upstream's client maps OBJECT_ALREADY_EXISTS) or an error code,
  ``get`` → bytes or b"", ``get_buffer`` → a handle with ``ptr()`` / ``size()`` or None,
  ``register_buffer``, ``is_exist`` / ``batch_is_exist`` (1 / 0), ``batch_get_into`` (bytes read,
  OBJECT_NOT_FOUND, or INVALID_PARAMS for memory outside every registered buffer),
  ``batch_put_from``, ``get_offload_rpc_read_count``, ``close``); like upstream's counter, the one of the client that
  *requested* a read from disk goes up, by one per call: a ``batch_get_into`` whose keys come
  from disk adds 1 however many they are (upstream: one offload RPC per call and storage endpoint;
  the fake has one disk).

Test knobs (environment): ``FAKE_MOONCAKE_LOG`` (append every setup call, with the client's
``MOONCAKE_*`` / ``MC_*`` environment at that moment, and the master's start, with its environment,
as JSON lines),
``FAKE_MOONCAKE_REFUSE_PUTS=N`` (the master refuses its first N puts for space),
``FAKE_MOONCAKE_COUNTER=backwards|inflate`` (a counter that goes backwards / rises a million per
read), ``FAKE_MOONCAKE_FAIL_SETUP=owner|bench`` (setup returns -1 in the client with (owner) or
without (bench) a segment), ``FAKE_MOONCAKE_SEGMENT_MIN=BYTES`` (the smallest non-zero segment
setup takes; default 16 MiB, upstream's slab: the tests' pools are smaller).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import socketserver
import sys
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(("MOONCAKE_", "MC_"))}


def _log(kind: str, **kw) -> None:
    path = os.environ.get("FAKE_MOONCAKE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, "pid": os.getpid(), **kw}) + "\n")


# -- the binding (mooncake.store) ------------------------------------------------------------------


class BufferHandle:
    """TEST FAKE of mooncake.store.BufferHandle: a private copy at a stable address."""

    def __init__(self, data: bytes):
        self._n = len(data)
        self._buf = ctypes.create_string_buffer(data, max(1, self._n))

    def ptr(self) -> int:
        return ctypes.addressof(self._buf)

    def size(self) -> int:
        return self._n

    def __len__(self) -> int:
        return self._n


class MooncakeDistributedStore:
    """TEST FAKE of mooncake.store.MooncakeDistributedStore (a TCP client of the fake master)."""

    def __init__(self):
        self._local = threading.local()
        self._socks: list = []
        self._mu = threading.Lock()
        self._addr = None
        self._reads = 0
        self._registered: dict = {}  # register_buffer: address -> size

    def setup(self, local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol, rdma_devices,
              master_server_addr, engine=None, enable_ssd_offload=False, ssd_offload_path=""):
        ssd_limit = os.environ.get("MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE")
        _log("setup", args=[local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol, rdma_devices, master_server_addr],
             enable_ssd_offload=enable_ssd_offload, ssd_offload_path=ssd_offload_path, ssd_limit_env=ssd_limit, env=_env())
        if not (isinstance(global_segment_size, int) and global_segment_size >= 0 and isinstance(local_buffer_size, int)
                and protocol == "tcp" and metadata_server.startswith("http://") and isinstance(local_hostname, str)):
            return INVALID_PARAMS
        if 0 < global_segment_size < int(os.environ.get("FAKE_MOONCAKE_SEGMENT_MIN") or 16 * 1024 * 1024):
            return INVALID_PARAMS
        fail = os.environ.get("FAKE_MOONCAKE_FAIL_SETUP")
        if (fail == "owner" and global_segment_size > 0) or (fail == "bench" and global_segment_size == 0):
            return -1
        ssd = 0
        bucket = None
        if enable_ssd_offload:
            if not ssd_offload_path or not os.path.isabs(ssd_offload_path) or not os.path.isdir(ssd_offload_path):
                return INVALID_PARAMS
            ssd = int(ssd_limit or 1 << 62)
            bucket = [int(os.environ.get("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT") or 500),
                      int(os.environ.get("MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES") or 256 * 1024 * 1024)]
        host, port = master_server_addr.rsplit(":", 1)
        self._addr = (host, int(port))
        rep, _ = self._call({"op": "mount", "dram": global_segment_size, "ssd": ssd, "bucket": bucket,
                                 "path": ssd_offload_path if enable_ssd_offload else None})
        return rep["rc"]

    def _conn(self):
        c = getattr(self._local, "c", None)
        if c is None:
            s = socket.create_connection(self._addr, timeout=30)
            c = self._local.c = (s, s.makefile("rb"))
            with self._mu:
                self._socks.append(s)
        return c

    def _call(self, req: dict, body: bytes = b""):
        s, r = self._conn()
        s.sendall(json.dumps(req).encode() + b"\n" + body)
        rep = json.loads(r.readline())
        data = r.read(rep["size"]) if rep.get("size") else b""
        return rep, data

    def put(self, key, value, config=None) -> int:
        data = bytes(value)
        rep, _ = self._call({"op": "put", "key": key, "size": len(data)}, data)
        return rep["rc"]

    def _get(self, key, disk_reads=None):
        rep, data = self._call({"op": "get", "key": key})
        if rep["rc"] != 0:
            return None
        if rep["tier"] == "disk":
            if disk_reads is not None:
                disk_reads.append(key)  # a batch call: one offload RPC for all its disk keys
            else:
                with self._mu:
                    self._reads += 1  # the requester's offload-RPC read, as upstream counts it
        return data

    def get(self, key) -> bytes:
        v = self._get(key)
        return b"" if v is None else v

    def get_buffer(self, key):
        v = self._get(key)
        return None if v is None else BufferHandle(v)

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        if size <= 0:
            return INVALID_PARAMS
        with self._mu:
            self._registered[int(buffer_ptr)] = int(size)
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        with self._mu:
            return 0 if self._registered.pop(int(buffer_ptr), None) is not None else INVALID_PARAMS

    def _inside(self, ptr: int, size: int) -> bool:
        """Whether [ptr, ptr + size) lies in one registered buffer (upstream: Store-managed memory)."""
        with self._mu:
            return any(b <= ptr and ptr + size <= b + n for b, n in self._registered.items())

    def is_exist(self, key) -> int:
        rep, _ = self._call({"op": "exists", "key": key})
        return rep["rc"]

    def batch_is_exist(self, keys) -> list:
        return [self.is_exist(k) for k in keys]

    def batch_get_into(self, keys, buffer_ptrs, sizes) -> list:
        if not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(keys)
        out = []
        disk: list = []
        for k, ptr, size in zip(keys, buffer_ptrs, sizes):
            if not self._inside(ptr, size):
                out.append(INVALID_PARAMS)
                continue
            v = self._get(k, disk)
            if v is None:
                out.append(OBJECT_NOT_FOUND)
            elif len(v) > size:
                out.append(INVALID_PARAMS)
            else:
                ctypes.memmove(ptr, v, len(v))
                out.append(len(v))
        if disk:
            with self._mu:
                self._reads += 1  # upstream: one offload RPC per call and storage endpoint, whatever the keys
        return out

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None) -> list:
        if not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(keys)
        return [self.put(k, ctypes.string_at(ptr, size)) if self._inside(ptr, size) else INVALID_PARAMS
                for k, ptr, size in zip(keys, buffer_ptrs, sizes)]

    def get_offload_rpc_read_count(self) -> int:
        mode = os.environ.get("FAKE_MOONCAKE_COUNTER", "")
        if mode == "backwards":
            return 10**9 - self._reads
        if mode == "inflate":
            return self._reads * 10**6
        return self._reads

    def close(self) -> int:
        with self._mu:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
        return 0


def install(dst) -> tuple:
    """Lay this fake out under ``dst`` as the tests use it: ``(pythonpath, master)``, a directory
    holding the package ``mooncake`` (its ``store`` is this file) for ``--mooncake-pythonpath`` and a
    ``mooncake_master`` wrapper (shaped like pip's, mooncake/cli.py: a Python script running the
    "binary" as its child) for ``--mooncake-master``."""
    from pathlib import Path

    here = Path(__file__).resolve()
    py = Path(dst) / "fakepy"
    (py / "mooncake").mkdir(parents=True)
    (py / "mooncake" / "__init__.py").write_text("# TEST FAKE package, not Mooncake\n")
    (py / "mooncake" / "store.py").write_text(here.read_text())
    b = Path(dst) / "fakebin"
    b.mkdir()
    master = b / "mooncake_master"
    master.write_text(f"#!{sys.executable}\n# TEST FAKE mooncake_master wrapper, not Mooncake\nimport subprocess, sys\n"
                      f"sys.exit(subprocess.call([sys.executable, {str(here)!r}] + sys.argv[1:]))\n")
    master.chmod(0o755)
    return py, master


# -- the master (mooncake_master) ------------------------------------------------------------------


class _Cluster:
    def __init__(self, offload: bool, refuse: int):
        self.mu = threading.Lock()
        self.mem: OrderedDict = OrderedDict()
        self.disk: dict = {}
        self.mem_cap = self.disk_cap = self.mem_used = self.disk_used = 0
        self.clients = 0
        self.offload = offload
        self.refuse = refuse
        self.bucket_limits = None  # (keys, bytes) of the flash holders (the first one's)
        self.bucket_dir = None  # where written buckets go as files (the first flash holder's directory)
        self.buckets = 0
        self.pending: list = []  # a part-filled bucket: evicted, not yet written

    def mount(self, dram: int, ssd: int, bucket=None, path=None) -> int:
        with self.mu:
            self.mem_cap += dram
            if self.offload:
                self.disk_cap += ssd
                if bucket and self.bucket_limits is None:
                    self.bucket_limits = tuple(bucket)
                    self.bucket_dir = path
            self.clients += 1
        return 0

    def _offload(self, k: str, v: bytes) -> None:
        """An evicted value into the current bucket; a full bucket goes to disk (what fits)."""
        if not self.disk_cap or self.bucket_limits is None:
            return
        self.pending.append((k, v))
        keys, size = self.bucket_limits
        if len(self.pending) >= keys or sum(len(x) for _, x in self.pending) >= size:
            written = []
            for pk, pv in self.pending:
                if self.disk_used + len(pv) <= self.disk_cap:
                    self.disk[pk] = pv
                    self.disk_used += len(pv)
                    written.append(pv)
            self.pending = []
            if written and self.bucket_dir:
                self.buckets += 1
                with open(os.path.join(self.bucket_dir, f"bucket-{self.buckets}"), "wb") as f:
                    f.write(b"".join(written))

    def put(self, key: str, data: bytes) -> int:
        with self.mu:
            if self.refuse > 0:
                self.refuse -= 1
                return NO_AVAILABLE_HANDLE
            if key in self.mem or key in self.disk:
                return 0  # upstream's client turns OBJECT_ALREADY_EXISTS into success
            n = len(data)
            if n > self.mem_cap:
                return NO_AVAILABLE_HANDLE
            while self.mem_used + n > self.mem_cap:
                k, v = self.mem.popitem(last=False)
                self.mem_used -= len(v)
                self._offload(k, v)
            self.mem[key] = data
            self.mem_used += n
            return 0

    def get(self, key: str):
        with self.mu:
            v = self.mem.get(key)
            if v is not None:
                self.mem.move_to_end(key)
                return v, "memory"
            v = self.disk.get(key)
            return (v, "disk") if v is not None else (None, None)

    def exists(self, key: str) -> bool:
        with self.mu:
            return key in self.mem or key in self.disk

    def metrics(self) -> str:
        with self.mu:
            return (f"# TEST FAKE\nmaster_key_count {len(self.mem) + len(self.disk)}\nmaster_allocated_bytes {self.mem_used}\n"
                    f"master_total_capacity_bytes {self.mem_cap}\nmaster_active_clients {self.clients}\n")


class _Rpc(socketserver.StreamRequestHandler):
    def handle(self):
        cl = self.server.cluster
        while True:
            line = self.rfile.readline()
            if not line:
                return
            req = json.loads(line)
            op = req["op"]
            body = b""
            if op == "mount":
                rep = {"rc": cl.mount(req["dram"], req["ssd"], req.get("bucket"), req.get("path"))}
            elif op == "put":
                rep = {"rc": cl.put(req["key"], self.rfile.read(req["size"]))}
            elif op == "exists":
                rep = {"rc": 1 if cl.exists(req["key"]) else 0}
            elif op == "get":
                v, tier = cl.get(req["key"])
                rep = {"rc": OBJECT_NOT_FOUND} if v is None else {"rc": 0, "tier": tier, "size": len(v)}
                body = v or b""
            else:
                rep = {"rc": INVALID_PARAMS}
            self.wfile.write(json.dumps(rep).encode() + b"\n" + body)
            self.wfile.flush()


# The real master's flags the adapter may pass (mooncake-store/src/master.cpp). Like gflags there,
# the fake exits 1 on a flag it does not define unless ``--undefok`` names it. ``metrics_host`` is
# defined on main (3b5a594) but not in the latest release tag, v0.3.12.post1, which the fake
# follows unless FAKE_MOONCAKE_MASTER_VERSION=main.
MASTER_FLAGS_RELEASE = frozenset({
    "enable_http_metadata_server", "http_metadata_server_host", "http_metadata_server_port", "rpc_port", "rpc_address",
    "port", "metrics_port", "eviction_high_watermark_ratio", "eviction_ratio", "default_kv_lease_ttl", "enable_offload",
    "offload_on_evict", "promotion_on_hit", "rpc_thread_num", "enable_metric_reporting", "config_path", "undefok",
})
MASTER_FLAGS_MAIN = MASTER_FLAGS_RELEASE | {"metrics_host"}


def master_main(argv: list[str]) -> int:
    flags = {}
    for a in argv:
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            flags[k] = v
    known = MASTER_FLAGS_MAIN if os.environ.get("FAKE_MOONCAKE_MASTER_VERSION") == "main" else MASTER_FLAGS_RELEASE
    undefok = set(filter(None, flags.get("undefok", "").split(",")))
    for a in argv:
        name = a[2:].split("=", 1)[0] if a.startswith("--") else None
        if name is not None and name not in known and name not in undefok:
            print(f"ERROR: unknown command line flag '{name}'", file=sys.stderr, flush=True)
            return 1
    cluster = _Cluster(flags.get("enable_offload") == "true", int(os.environ.get("FAKE_MOONCAKE_REFUSE_PUTS") or 0))

    class Http(BaseHTTPRequestHandler):
        def do_GET(self):
            body = cluster.metrics().encode() if self.path.startswith("/metrics") else b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    for host_flag, port_flag in (("http_metadata_server_host", "http_metadata_server_port"), ("metrics_host", "metrics_port")):
        host = flags.get(host_flag, "0.0.0.0") if host_flag in known else "0.0.0.0"  # an undefok'd flag is ignored
        h = ThreadingHTTPServer((host, int(flags[port_flag])), Http)
        threading.Thread(target=h.serve_forever, daemon=True).start()

    class Rpc(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    rpc = Rpc((flags.get("rpc_address", "127.0.0.1"), int(flags["rpc_port"])), _Rpc)
    rpc.cluster = cluster
    _log("master", argv=argv, env=_env())
    print(f"TEST FAKE mooncake_master: {' '.join(argv)}", file=sys.stderr, flush=True)
    rpc.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(master_main(sys.argv[1:]))
