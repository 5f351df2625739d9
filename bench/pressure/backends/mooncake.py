"""Mooncake Store (kvcache-ai/Mooncake) as a peer backend, on a machine where it is installed: the
Python binding ``mooncake.store`` importable (``--mooncake-pythonpath DIR`` prepends a path) and a
``mooncake_master`` binary (``--mooncake-master PATH``, else the one on PATH). Otherwise every
Mooncake case is reported unavailable with the reason, printed once, and the run goes on.

Per case the harness starts ``mooncake_master`` on free loopback ports (HTTP metadata server
embedded; ``--enable_offload=true`` when SSD is on), waits for its ports, and then, by topology
(docs/architecture.md §8, one ``variant`` each):

* ``dedicated_owner``: one resident store process (``python -m pressure.backends.mooncake owner``)
  contributes all the DRAM (``global_segment_size``) and, SSD on, all the flash; the benchmark
  processes contribute nothing (``global_segment_size = 0``) and only request.
* ``per_process``: no owner; every benchmark process is requester and storage endpoint at once
  and contributes DRAM / procs and flash / procs.
* ``mooncake-default-offload`` (SSD on only): dedicated_owner with Mooncake's default bucket
  offload settings, to show what they do (issue 14 item 5: nothing reaches flash).

Clients: one ``MooncakeDistributedStore`` per process, shared by its threads, set up with
``setup("127.0.0.1", "http://127.0.0.1:P/metadata", segment, local_buffer, "tcp", "",
"127.0.0.1:R")``; a storage process with SSD on adds ``enable_ssd_offload=True,
ssd_offload_path=DIR`` (its own directory, an absolute path) and its flash share in
``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`` and ``MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE``, the
share's size on disk in ``MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES`` (``physical_cap``: the
default bucket backend obeys the last two; the first alone leaves it 90 % of the file system) and
``MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION=false`` (else it keeps flash 80-90 % full).
Variables of the caller's shell that would change Mooncake's results (``CLEARED_ENV``) are removed
in every Mooncake process. A case is unavailable when a client's non-zero
segment is under one 16 MiB slab (setup() refuses it) or a value exceeds the local buffer. Environment, applied before ``setup()`` and recorded
per case (``server.master_env``, ``client_env``, ``owner_env_at_setup``; ``client.env_at_setup``):
``MC_TCP_ENABLE_CONNECTION_POOL=1`` in every Mooncake process (master, owner, benchmark processes;
without it the TCP transport opens a connection per transfer and a long run runs out of ephemeral
ports); in a flash-holding process, except in ``mooncake-default-offload`` where the three are
removed, ``MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT=1``, ``MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES=<payload>``
and ``MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS=1`` (``offload_env``). Output modes: holder and cuda use ``get_buffer(key)``
(a ``BufferHandle``, None on a miss; cuda copies from ``ptr()``/``size()``), bytes uses ``get(key)``
(the payload as ``bytes``, empty on a miss). Puts: ``put(key, value)`` returns 0; a put refused
for space (``NO_AVAILABLE_HANDLE``, -200: DRAM full while eviction catches up, or leased objects)
is retried with a short backoff a bounded number of times (``--mooncake-put-retries``) and then
counted as failed; one the client's local buffer has no room for (``INVALID_PARAMS``, -600: every
put and get first takes the whole value from it) fails at once and is counted apart
(``local_full``). Not told apart: a get that fails (local buffer full, a transfer or SSD read
error) returns what a miss does, and counts as one.

Sources by counter: Mooncake tells no per-get source. ``get_offload_rpc_read_count()`` counts the
client's offload-RPC reads of ``LOCAL_DISK`` replicas (upstream: every call of
``batch_get_into_offload_object_internal``, the single path of an SSD read). It is sampled at the
window's start and end in every Mooncake client of the case, the benchmark processes and the
resident owner, and the increases are summed: those are the SSD hits, the rest of the hits memory
hits. A counter that goes backwards, is missing, or rises by more than the hits makes every hit
unknown and the case incomplete (``stats.attribute_counter``).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from ..procs import free_port, tcp_open, unix_request, unix_socket_ready, wait_for
from ..sizes import format_size, parse_size
from .base import BytesGot, CaseSpec, Got, Server as _Server, ThreadClient, WorkerSide as _WorkerSide, settle_by_polling, which

TOPOLOGIES = ("dedicated_owner", "per_process")
# Mooncake's default bucket SSD offload, kept as a variant of its own (SSD on only, dedicated_owner
# topology): the adapter's other variants tune the bucket backend so that each value is written.
DEFAULT_OFFLOAD = "mooncake-default-offload"
VARIANTS = TOPOLOGIES + (DEFAULT_OFFLOAD,)
TOPOLOGY_OF = {"dedicated_owner": "dedicated_owner", "per_process": "per_process", DEFAULT_OFFLOAD: "dedicated_owner"}
HOST = "127.0.0.1"
PROTOCOL = "tcp"
DEFAULT_LOCAL_BUFFER = "512MiB"
DEFAULT_PUT_RETRIES = 8
# Mooncake's ErrorCode values (mooncake-store/include/types.h); the Python binding returns them as ints.
ERROR_NAMES = {
    -1: "INTERNAL_ERROR", -10: "BUFFER_OVERFLOW", -100: "SHARD_INDEX_OUT_OF_RANGE", -101: "SEGMENT_NOT_FOUND",
    -200: "NO_AVAILABLE_HANDLE", -600: "INVALID_PARAMS", -703: "REPLICA_IS_NOT_READY", -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS", -706: "OBJECT_HAS_LEASE", -707: "LEASE_EXPIRED", -714: "OBJECT_REPLICA_BUSY",
    -800: "TRANSFER_FAIL", -900: "RPC_FAIL", -901: "RPC_TIMEOUT", -1700: "TENANT_QUOTA_EXCEEDED",
}
NO_AVAILABLE_HANDLE = -200
OBJECT_NOT_FOUND = -704  # a batch_get_into of a key that is not there
# A key whose put (another process's) is still in flight: upstream's batch_get_into_internal
# (real_client.cpp at 3b5a594, ~5102-5106) logs it as it does OBJECT_NOT_FOUND, not as a failure.
REPLICA_IS_NOT_READY = -703
MISS_CODES = (OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY)  # answers to a get that are misses, not errors
# A put the client's local buffer has no room for (every put and get first takes the whole value
# from it): not a refusal for space in the store, so not retried; counted apart (PutStats).
INVALID_PARAMS = -600
# Mooncake 3b5a594's client turns OBJECT_ALREADY_EXISTS from PutStart into 0; an older binding (or
# another path) may still return it, and it is counted apart, not as an error.
OBJECT_ALREADY_EXISTS = -705
# The largest value Mooncake's SSD offload takes in one slice (kMaxSliceSize at 3b5a594).
SSD_SLICE_MAX = 0xFFFFF0
# The smallest non-zero global segment a client can mount: its memory is allocated in whole 16 MiB
# slabs, and setup() fails (INVALID_PARAMS) below one.
SEGMENT_MIN = 16 * 1024 * 1024
# The flash share: TOTAL_SIZE_LIMIT only gates offloading without an eviction policy; the default
# bucket backend obeys BUCKET_MAX_TOTAL_SIZE (0: 90 % of the file system; counts keys, values and
# .meta bytes) and, for the blocks its files take on disk (st_blocks), BUCKET_MAX_PHYSICAL_BYTES
# (storage_backend.cpp at 3b5a594, ~127-134, ~2915-2960, ~3034-3046). The first two are set to the
# share, the third to the share's size on disk (physical_cap).
ENV_SSD_LIMIT = "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"
ENV_SSD_BUCKET_TOTAL = "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE"
ENV_SSD_BUCKET_PHYSICAL = "MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES"
# Since 9c6125f (in v0.3.12.post1) a flash holder's heartbeat evicts from 90 % of
# BUCKET_MAX_TOTAL_SIZE down to 80 % (include/storage_backend.h ~367-369, storage_backend.cpp
# ~3303-3330 at 3b5a594): flash would hold 10-20 % less than the share the others get. "false"
# turns it off (file_storage.cpp ~60-66, ~141: true/false, 1/0, any case); eviction at the cap stays.
ENV_SSD_WATERMARK = "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION"
ENV_SSD_PATH = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
ENV_HEARTBEAT = "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS"
ENV_BUCKET_KEYS = "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT"
ENV_BUCKET_BYTES = "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES"
# Mooncake's TCP transport (TcpTransport's constructor, at setup) opens a connection per transfer unless
# this is set; a long run then runs out of ephemeral ports (TIME_WAIT) and decays to TRANSFER_FAIL.
ENV_TCP_POOL = "MC_TCP_ENABLE_CONNECTION_POOL"
TCP_POOL_ENV = {ENV_TCP_POOL: "1"}  # every Mooncake process of every case: the master and every client
# Variables a caller's shell may hold that change Mooncake's results: removed (None) in every
# Mooncake process of every case (the master and every client; at 3b5a594): a local hot cache
# outside the segment (client_service.cpp ~4979: DRAM beyond the case's), local memcpy instead of
# the transport (transfer_task.cpp ~962), huge pages for the segment (real_client.cpp ~720), the
# bucket backend's eviction policy (storage_backend.cpp ~138-148, with its older name; anything but
# fifo / lru turns eviction off), another offload storage backend (file_storage.cpp ~90), a config
# file (master.cpp ~84; the wheel's mooncake_config.py).
CLEARED_ENV = {k: None for k in ("MC_STORE_LOCAL_HOT_CACHE_SIZE", "MC_STORE_MEMCPY", "MC_STORE_USE_HUGEPAGE",
                                 "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "MOONCAKE_BUCKET_EVICTION_POLICY",
                                 "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR", "MOONCAKE_CONFIG_PATH")}
BASE_ENV = {**CLEARED_ENV, **TCP_POOL_ENV}  # every Mooncake process of every case
OFFLOAD_ENV_KEYS = (ENV_BUCKET_KEYS, ENV_BUCKET_BYTES, ENV_HEARTBEAT)
# What each process's summary reports as seen in its environment at setup().
TRACKED_ENV = (ENV_TCP_POOL, ENV_BUCKET_KEYS, ENV_BUCKET_BYTES, ENV_HEARTBEAT, ENV_SSD_LIMIT, ENV_SSD_BUCKET_TOTAL,
               ENV_SSD_BUCKET_PHYSICAL, ENV_SSD_PATH, ENV_SSD_WATERMARK) + tuple(CLEARED_ENV)
DEFAULT_HEARTBEAT_S = 10  # Mooncake's default offload heartbeat: how often clients offload to SSD
DEFAULT_BUCKET_KEYS = 500  # Mooncake's default bucket: written when one heartbeat's batch fills it
DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024
TUNED_HEARTBEAT_S = 1
# One key per bucket costs two files, NAME.bucket (key + value) and NAME.meta (a few hundred bytes),
# each a whole number of file-system blocks on disk: at 64 KiB values a physical cap equal to the
# share would hold ~89 % of it. physical_cap sizes the cap so that the share's values fit.
FS_BLOCK = 4096
KEY_BYTES_MAX = 128  # the adapter's keys are far shorter (pressure-0000123, kv1/tracebench/123)
# The master's lease on an object just read (--default_kv_lease_ttl, ms; it cannot be evicted
# meanwhile). The pressure harness's gets are one key each: 500 ms covers them and lets eviction
# catch up. tracebench sizes it to its longest batch_get_into (tracebench.backends.mooncake_lease_ms:
# up to --buffer-bytes, 1 GiB, per call), up to Mooncake's default, 10 s (master.cpp at 3b5a594,
# kDefaultKvLeaseTtlFlagValue): upstream fails every key of a BatchGet whose lease ran out since
# its BatchQuery began (client_service.cpp ~1800-1808, LEASE_EXPIRED; no refresh).
LEASE_TTL_MS = 500
DEFAULT_LEASE_TTL_MS = 10000
# DRAM eviction: from 95 % of the segments down by 1 % of them (Mooncake's default ratio, 5 %,
# would swing occupancy between 90 and 95 %).
EVICTION_HIGH_WATERMARK = 0.95
EVICTION_RATIO = 0.01
BENCH_DIR = Path(__file__).resolve().parents[2]


def add_arguments(g) -> None:
    g.add_argument("--mooncake-master", help="the mooncake_master binary (default: mooncake_master on PATH)")
    g.add_argument("--mooncake-pythonpath", help="directory prepended to sys.path of every process so that mooncake.store imports "
                   "(e.g. a venv's site-packages holding the mooncake-transfer-engine wheel)")
    g.add_argument("--mooncake-local-buffer", default=DEFAULT_LOCAL_BUFFER, help="local_buffer_size of every Mooncake client "
                   f"(default {DEFAULT_LOCAL_BUFFER})")
    g.add_argument("--mooncake-put-retries", type=int, default=DEFAULT_PUT_RETRIES,
                   help=f"retries of a put refused for space (NO_AVAILABLE_HANDLE) before it counts as failed (default {DEFAULT_PUT_RETRIES})")
    g.add_argument("--mooncake-offload-on-evict", action="store_true",
                   help="SSD on: start the master with --offload_on_evict=true --promotion_on_hit=true (flash holds what DRAM "
                   "evicted, a flash hit is promoted back) instead of Mooncake's default (every object written to flash at put, "
                   "none promoted)")


# -- the master ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ports:
    http: int  # HTTP metadata server (embedded in the master)
    rpc: int  # master RPC
    metrics: int  # master's HTTP metrics


def pick_ports(free=free_port) -> Ports:
    """Three distinct free loopback ports."""
    seen: list[int] = []
    while len(seen) < 3:
        p = free()
        if p not in seen:
            seen.append(p)
    return Ports(*seen)


# Flags master_args passes that Mooncake's latest release tag (v0.3.12.post1) does not define.
MASTER_FLAGS_AFTER_RELEASE = ("metrics_host",)


def master_args(binary: str, ports: Ports, ssd: bool, lease_ttl_ms: int = LEASE_TTL_MS, offload_on_evict: bool = False) -> list[str]:
    """The master's command line. ``lease_ttl_ms``: ``LEASE_TTL_MS`` (the pressure harness) or
    tracebench's, sized to its longest load call (tracebench.backends.mooncake_lease_ms). ``offload_on_evict`` (SSD on,
    ``--mooncake-offload-on-evict``): flash holds what DRAM evicted and hits are promoted
    (master.cpp ~188, ~226 at 3b5a594; both flags also in v0.3.12.post1), as fluxkv's tiers do;
    off, Mooncake's default writes every object to flash at put and promotes none."""
    args = [
        binary,
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={HOST}",
        f"--http_metadata_server_port={ports.http}",
        f"--rpc_port={ports.rpc}",
        f"--rpc_address={HOST}",
        f"--metrics_port={ports.metrics}",
        f"--metrics_host={HOST}",
        f"--eviction_high_watermark_ratio={EVICTION_HIGH_WATERMARK}",
        # defined in v0.3.12.post1 too (master.cpp there ~132), so not in --undefok
        f"--eviction_ratio={EVICTION_RATIO}",
        f"--default_kv_lease_ttl={int(lease_ttl_ms)}",
        # gflags aborts on an unknown flag; --metrics_host came after the latest release
        # (mooncake-store/src/master.cpp: defined at 3b5a594, absent at v0.3.12.post1): that
        # release, pip's, ignores it instead of refusing to start (its metrics then listen on 0.0.0.0).
        "--undefok=" + ",".join(MASTER_FLAGS_AFTER_RELEASE),
    ]
    if ssd:
        args.append("--enable_offload=true")
        if offload_on_evict:
            args += ["--offload_on_evict=true", "--promotion_on_hit=true"]
    return args


def metadata_url(ports: Ports) -> str:
    return f"http://{HOST}:{ports.http}/metadata"


def master_address(ports: Ports) -> str:
    return f"{HOST}:{ports.rpc}"


def parse_metrics(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text page (``name value``)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


# -- who stores what -------------------------------------------------------------------------------


def split_evenly(total: int, n: int) -> list[int]:
    """``total`` in ``n`` shares that differ by at most one byte and add up to ``total``."""
    if n <= 0:
        raise ValueError("n must be > 0")
    q, r = divmod(int(total), n)
    return [q + (1 if i < r else 0) for i in range(n)]


def physical_cap(share: int, payload: int) -> int:
    """``MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES`` for a flash share of ``share`` bytes of
    ``payload``-byte values, one per bucket: the blocks their files take (a .bucket of key and
    value, a .meta of one block each), so that the physical cap does not bind before the share."""
    payload = max(1, int(payload))
    values = -(-int(share) // payload)
    per_value = -(-(payload + KEY_BYTES_MAX) // FS_BLOCK) * FS_BLOCK + FS_BLOCK
    return values * per_value


def offload_env(case: CaseSpec) -> dict:
    """The bucket-offload settings of a flash-holding process (before its ``setup()``). Mooncake's
    default bucket backend writes a bucket only when one heartbeat's batch fills it (500 keys or
    256 MiB, a 10 s heartbeat); a part-filled bucket's keys go back to the master unwritten and are
    later evicted, so on this workload nothing reaches flash. Tuned (every variant but
    ``mooncake-default-offload``): one key per bucket, a bucket as large as the value, a 1 s
    heartbeat. ``mooncake-default-offload``: the three are removed (None: unset), so Mooncake's
    defaults hold whatever the harness's environment says."""
    if case.variant == DEFAULT_OFFLOAD:
        return {k: None for k in OFFLOAD_ENV_KEYS}
    return {ENV_BUCKET_KEYS: "1", ENV_BUCKET_BYTES: str(int(case.payload_bytes)), ENV_HEARTBEAT: str(TUNED_HEARTBEAT_S)}


def client_config(case: CaseSpec, role: str, index: int, segment_bytes: int, ssd_bytes: int, workdir, ports: Ports, local_buffer: int) -> dict:
    """How one Mooncake client is set up: ``setup(*args, **kwargs)`` after ``env`` is applied to its
    environment (a None value: unset). Every client gets the TCP connection pool and ``CLEARED_ENV``
    removed; only a process that contributes flash (SSD on, a share > 0) gets the SSD arguments and
    the offload settings."""
    cfg = {
        "role": role,
        "index": index,
        "args": [HOST, metadata_url(ports), int(segment_bytes), int(local_buffer), PROTOCOL, "", master_address(ports)],
        "kwargs": {},
        "env": dict(BASE_ENV),
        "segment_bytes": int(segment_bytes),
        "ssd_bytes": 0,
        "ssd_dir": None,
    }
    if case.ssd and ssd_bytes > 0:
        d = str(Path(workdir).resolve() / f"ssd-{role}-{index}")  # Mooncake takes only an absolute path
        cfg["kwargs"] = {"enable_ssd_offload": True, "ssd_offload_path": d}
        share = str(int(ssd_bytes))
        cfg["env"].update({ENV_SSD_LIMIT: share, ENV_SSD_BUCKET_TOTAL: share,
                           ENV_SSD_BUCKET_PHYSICAL: str(physical_cap(ssd_bytes, case.payload_bytes)), ENV_SSD_PATH: d,
                           ENV_SSD_WATERMARK: "false"})
        cfg["env"].update(offload_env(case))
        cfg["ssd_bytes"] = int(ssd_bytes)
        cfg["ssd_dir"] = d
    return cfg


def topology(case: CaseSpec) -> str:
    try:
        return TOPOLOGY_OF[case.variant]
    except KeyError:
        raise ValueError(f"mooncake: unknown variant {case.variant!r}: want one of {', '.join(VARIANTS)}") from None


def plan_clients(case: CaseSpec, workdir, ports: Ports, local_buffer: int) -> tuple[dict | None, list[dict]]:
    """(owner config or None, one config per benchmark process) for the case's topology."""
    topo = topology(case)
    if topo == "dedicated_owner":
        owner = client_config(case, "owner", 0, case.dram_bytes, case.ssd_bytes, workdir, ports, local_buffer)
        bench = [client_config(case, "bench", i, 0, 0, workdir, ports, local_buffer) for i in range(case.procs)]
        return owner, bench
    drams = split_evenly(case.dram_bytes, case.procs)
    ssds = split_evenly(case.ssd_bytes, case.procs)
    return None, [client_config(case, "bench", i, drams[i], ssds[i], workdir, ports, local_buffer) for i in range(case.procs)]


def apply_env(env: dict, target=None) -> None:
    """Set (or, for None, remove) each variable in ``target`` (default ``os.environ``)."""
    target = os.environ if target is None else target
    for k, v in env.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = v


def tracked_env(source=None) -> dict:
    """The Mooncake variables this adapter sets, as ``source`` (default ``os.environ``) holds them."""
    source = os.environ if source is None else source
    return {k: source.get(k) for k in TRACKED_ENV}


def open_store(cfg: dict):
    """A ``MooncakeDistributedStore`` set up as ``cfg`` says (``client_config``)."""
    apply_env(cfg["env"])  # read by the transport and the client's offload config at setup
    if cfg.get("ssd_dir"):
        os.makedirs(cfg["ssd_dir"], exist_ok=True)
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(*cfg["args"], **cfg["kwargs"])
    if rc not in (0, None):
        raise RuntimeError(f"MooncakeDistributedStore.setup{tuple(cfg['args'])} {cfg['kwargs'] or ''} returned {rc} ({error_name(rc)})")
    return store


def read_counter(store) -> int | None:
    """The client's offload-RPC read count, or None when this binding does not expose it."""
    f = getattr(store, "get_offload_rpc_read_count", None)
    return None if f is None else int(f())


def error_name(rc) -> str:
    return ERROR_NAMES.get(rc, "unknown error") if isinstance(rc, int) else f"{type(rc).__name__}"


# -- puts ------------------------------------------------------------------------------------------


class PutError(RuntimeError):
    pass


@dataclass
class PutStats:
    ok: int = 0  # stored (after retries or not)
    existed: int = 0  # OBJECT_ALREADY_EXISTS: the key was there already (read-through races); not an error
    local_full: int = 0  # INVALID_PARAMS: the client's local buffer had no room for the value (failed, not retried)
    retried: int = 0  # puts that needed at least one retry
    retries: int = 0  # retries in all
    gave_up: int = 0  # refused for space on every attempt
    failed: int = 0  # gave_up + other errors


def backoff_s(attempt: int) -> float:
    """Pause before retry ``attempt`` (0-based): 10 ms doubling to 0.5 s; eight retries span ~1.6 s,
    a few times the pressure harness's 500 ms lease that keeps a just-read object from being
    evicted. Under tracebench's longer leases (up to 10 s for its largest calls) a refusal that
    lasts longer counts as a failed store, as an engine skips a store it cannot make."""
    return min(0.5, 0.01 * (2 ** attempt))


def put_with_retry(put, key: str, value, retries: int, stats: PutStats, sleep=time.sleep) -> int:
    """``put(key, value)``; a refusal for space is retried up to ``retries`` times. Returns the
    number of retries used; raises ``PutError`` (counted in ``stats``) when the put failed."""
    for attempt in range(retries + 1):
        rc = put(key, value)
        if rc == 0 or rc == OBJECT_ALREADY_EXISTS:
            if rc == 0:
                stats.ok += 1
            else:
                stats.existed += 1
            if attempt:
                stats.retried += 1
                stats.retries += attempt
            return attempt
        if rc != NO_AVAILABLE_HANDLE:
            stats.failed += 1
            stats.retries += attempt
            if rc == INVALID_PARAMS:
                stats.local_full += 1
            raise PutError(f"mooncake put {key}: error {rc} ({error_name(rc)})")
        if attempt < retries:
            sleep(backoff_s(attempt))
    stats.failed += 1
    stats.gave_up += 1
    stats.retries += retries
    raise PutError(f"mooncake put {key}: refused for space (NO_AVAILABLE_HANDLE) on all {retries + 1} attempts")


# -- benchmark-process side ------------------------------------------------------------------------


class HandleGot(Got):
    """A hit as Mooncake's ``BufferHandle`` (holder and cuda modes): no copy until asked."""

    __slots__ = ("h", "source")

    def __init__(self, h, source):
        self.h = h
        self.source = source

    def __len__(self) -> int:
        return int(self.h.size())

    def materialize(self) -> bytes:
        return ctypes.string_at(int(self.h.ptr()), int(self.h.size()))

    def host_pointer(self) -> int:
        return int(self.h.ptr())

    def release(self) -> None:
        self.h = None  # the binding frees the buffer with the last reference


class MooncakeThread(ThreadClient):
    def __init__(self, store, mode: str, source: str | None, retries: int, stats_path: str | None = None):
        self.store = store
        self.handles = mode in ("holder", "cuda")
        self.source = source
        self.retries = retries
        self.stats = PutStats()
        self.stats_path = stats_path  # the bootstrap's client leaves its put counts for the Server

    def get(self, key: str):
        if self.handles:
            h = self.store.get_buffer(key)
            return None if h is None else HandleGot(h, self.source)
        v = self.store.get(key)
        return BytesGot(v, self.source) if v else None  # empty bytes: a miss

    def put(self, key: str, value) -> None:
        put_with_retry(self.store.put, key, value, self.retries, self.stats)

    def close(self) -> None:
        if self.stats_path:
            tmp = self.stats_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(asdict(self.stats), f)
            os.replace(tmp, self.stats_path)


def bootstrap_stats_path(endpoint: dict, proc_index: int) -> str:
    return str(Path(endpoint["stats_dir"]) / f"puts-bootstrap-p{proc_index}.json")


class WorkerSide(_WorkerSide):
    def __init__(self, endpoint: dict, case: CaseSpec, proc_index: int):
        super().__init__(endpoint, case, proc_index)
        for p in reversed(endpoint.get("pythonpath", [])):
            if p not in sys.path:
                sys.path.insert(0, p)
        self.native_type = "BufferHandle" if case.mode in ("holder", "cuda") else "bytes"
        self.cfg = endpoint["clients"][proc_index]
        self.store = open_store(self.cfg)
        self.env_at_setup = tracked_env()
        # SSD off: every hit is a memory hit; SSD on: sources come from the counters.
        self.source = None if case.ssd else "memory"

    def thread_client(self, thread_index: int) -> ThreadClient:
        path = bootstrap_stats_path(self.endpoint, self.proc_index) if thread_index < 0 else None
        return MooncakeThread(self.store, self.case.mode, self.source, int(self.endpoint.get("put_retries", DEFAULT_PUT_RETRIES)), path)

    def ssd_counter(self) -> float | None:
        return read_counter(self.store) if self.case.ssd else None

    def describe(self) -> dict:
        mod = sys.modules.get("mooncake.store")
        return {
            "topology": topology(self.case),
            "global_segment_size": self.cfg["segment_bytes"],
            "local_buffer_size": self.cfg["args"][3],
            "ssd_bytes": self.cfg["ssd_bytes"],
            "module": getattr(mod, "__file__", None),
            "env_at_setup": self.env_at_setup,
        }

    def close(self) -> None:
        self.store.close()


# -- the resident owner (dedicated_owner) ----------------------------------------------------------


def owner_main(config_path: str) -> int:
    """``python -m pressure.backends.mooncake owner CONFIG``: set up one store that contributes the
    case's DRAM (and flash), then answer ``count`` / ``env`` / ``ping`` on a Unix socket until SIGTERM."""
    with open(config_path) as f:
        cfg = json.load(f)
    for p in reversed(cfg.get("pythonpath", [])):
        if p not in sys.path:
            sys.path.insert(0, p)

    def on_term(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    store = open_store(cfg["client"])
    env_reply = (json.dumps(tracked_env()) + "\n").encode()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    code = 0
    try:
        srv.bind(cfg["socket"])
        srv.listen(16)
        print(f"mooncake owner ready: segment {cfg['client']['segment_bytes']} B, ssd {cfg['client']['ssd_bytes']} B", file=sys.stderr, flush=True)
        while True:
            conn, _ = srv.accept()
            try:
                conn.settimeout(5.0)
                req = conn.recv(64).strip()
                if req == b"count":
                    v = read_counter(store)
                    conn.sendall(b"none\n" if v is None else f"{v}\n".encode())
                elif req == b"env":
                    conn.sendall(env_reply)
                elif req == b"ping":
                    conn.sendall(b"pong\n")
            except OSError:
                pass
            finally:
                conn.close()
    except (SystemExit, KeyboardInterrupt):
        pass
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        srv.close()
        closer = threading.Thread(target=store.close, daemon=True)
        closer.start()
        closer.join(5.0)  # a teardown that hangs must not hold the case
        sys.stderr.flush()
        os._exit(code)
    return code


# -- the coordinator side --------------------------------------------------------------------------

_PROBE = r"""
import inspect, json, sys
out = {"importable": False}
try:
    import mooncake.store as m
    S = m.MooncakeDistributedStore
except BaseException as e:
    out["error"] = f"{type(e).__name__}: {e}"
else:
    out["importable"] = True
    out["file"] = getattr(m, "__file__", None)
    out["counter"] = hasattr(S, "get_offload_rpc_read_count")
    out["get_buffer"] = hasattr(S, "get_buffer")
    ssd = None
    try:
        ps = inspect.signature(S.setup).parameters
        ssd = "enable_ssd_offload" in ps and "ssd_offload_path" in ps
    except (TypeError, ValueError):
        doc = getattr(S.setup, "__doc__", None) or ""
        if doc:
            ssd = "enable_ssd_offload" in doc and "ssd_offload_path" in doc
    out["ssd_offload"] = ssd
    version = None
    try:
        import importlib.metadata as md
        for d in md.distributions():
            name = d.metadata.get("Name") or ""
            if name.lower().startswith("mooncake"):
                version = f"{name} {d.version}"
                break
    except Exception:
        pass
    out["version"] = version or getattr(sys.modules.get("mooncake"), "__version__", None)
print(json.dumps(out))
"""

_probes: dict[tuple, dict] = {}
_announced: set[str] = set()


def probe(paths) -> dict:
    """Import ``mooncake.store`` in a child Python with ``paths`` first on sys.path (an import can
    fail on a missing shared library, not only a missing package); cached per path list."""
    key = (tuple(str(p) for p in paths), os.environ.get("PYTHONPATH", ""))
    if key not in _probes:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(p) for p in paths] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        try:
            out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env)
            lines = out.stdout.strip().splitlines()
            info = json.loads(lines[-1]) if lines else {"importable": False, "error": f"probe exited {out.returncode}: {out.stderr.strip()[-400:]}"}
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            info = {"importable": False, "error": f"probe failed: {type(e).__name__}: {e}"}
        _probes[key] = info
    return _probes[key]


def announce(reason: str) -> None:
    if reason not in _announced:
        _announced.add(reason)
        print(f"mooncake: SKIPPED on this machine: {reason}", file=sys.stderr, flush=True)


def dir_bytes(paths) -> int:
    n = 0
    for d in paths:
        for root, _, files in os.walk(d):
            for name in files:
                try:
                    n += os.stat(os.path.join(root, name)).st_blocks * 512
                except OSError:
                    pass
    return n


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not count: an orphan's zombie
    waits for an init that may never reap it)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = None
    if entries is None:
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def stop_process_group(p: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM to the process group led by ``p`` (the harness starts servers in their own session,
    so the group is the server and whatever it started), wait for every member to go, SIGKILL what
    is left after ``timeout``."""
    pgid = p.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p.poll()  # reap the leader
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    print(f"warning: mooncake_master's process group {pgid} ignored SIGTERM for {timeout:g} s; killing it", file=sys.stderr)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


class Server(_Server):
    name = "mooncake"
    source_method = "counter"
    variants = VARIANTS
    ssd_only_variants = (DEFAULT_OFFLOAD,)  # SSD off it is dedicated_owner: not run twice

    def __init__(self, opts):
        super().__init__(opts)
        pp = getattr(opts, "mooncake_pythonpath", None)
        self.pythonpath = (str(Path(pp).resolve()),) if pp else ()
        self.master_flag = getattr(opts, "mooncake_master", None)
        self.local_buffer = parse_size(str(getattr(opts, "mooncake_local_buffer", None) or DEFAULT_LOCAL_BUFFER))
        self.put_retries = int(getattr(opts, "mooncake_put_retries", DEFAULT_PUT_RETRIES))
        self.lease_ttl_ms = int(getattr(opts, "mooncake_lease_ttl_ms", None) or LEASE_TTL_MS)  # tracebench: mooncake_lease_ms
        self.offload_on_evict = bool(getattr(opts, "mooncake_offload_on_evict", False))
        self.case: CaseSpec | None = None
        self.ports: Ports | None = None
        self.owner_socket: str | None = None
        self.ssd_dirs: list[str] = []
        self.stats_dir: Path | None = None
        self.plan: tuple | None = None
        self.master_proc = None
        self.owner_proc = None
        self.master_env: dict = {}
        self.settled: bool | None = None

    def _paths(self) -> list[str]:
        return list(self.pythonpath) + [str(p) for p in getattr(self.opts, "pythonpath", [])]

    def master_binary(self) -> str | None:
        return which(self.master_flag) if self.master_flag else shutil.which("mooncake_master")

    def info(self) -> dict:
        return probe(self._paths())

    # -- availability --------------------------------------------------------------------------

    def unavailable(self, case: CaseSpec) -> str | None:
        missing = []
        if not self.master_binary():
            missing.append(f"mooncake_master binary {self.master_flag!r} not found" if self.master_flag
                           else "no mooncake_master on PATH (--mooncake-master PATH)")
        info = self.info()
        if not info.get("importable"):
            where = f" from {self.pythonpath[0]}" if self.pythonpath else ""
            missing.append(f"Python module mooncake.store not importable{where} ({info.get('error')}; --mooncake-pythonpath DIR)")
        if missing:
            reason = "; ".join(missing)
            announce(reason)
            return reason
        if case.mode in ("holder", "cuda") and not info.get("get_buffer"):
            return "this mooncake.store has no MooncakeDistributedStore.get_buffer() (holder / cuda modes need a BufferHandle)"
        if case.ssd and info.get("ssd_offload") is False:
            return "this mooncake.store's setup() takes no enable_ssd_offload / ssd_offload_path (no client SSD offload)"
        if case.variant not in VARIANTS:
            return f"unknown variant {case.variant!r}"
        owner, bench = plan_clients(case, Path("."), Ports(0, 0, 0), self.local_buffer)
        small = [c["segment_bytes"] for c in ([owner] if owner else []) + bench if 0 < c["segment_bytes"] < SEGMENT_MIN]
        if small:
            return (f"a Mooncake client's global segment must be 0 or at least {format_size(SEGMENT_MIN)} (whole slabs); "
                    f"this case gives one {format_size(min(small))}")
        if case.payload_bytes > self.local_buffer:
            return (f"a {format_size(case.payload_bytes)} value does not fit a client's {format_size(self.local_buffer)} local buffer "
                    "(--mooncake-local-buffer), which every put and get goes through")
        return None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, case: CaseSpec, workdir: Path, group) -> dict:
        self.case = case
        self.stats_dir = Path(workdir)
        self.ports = ports = pick_ports()
        self.cmdline = master_args(self.master_binary(), ports, case.ssd, self.lease_ttl_ms, self.offload_on_evict)
        self.master_env = dict(BASE_ENV)
        menv = dict(os.environ)
        apply_env(self.master_env, menv)
        self.master_proc = master = group.start("mooncake_master", self.cmdline, workdir / "mooncake_master.log", env=menv)
        wait_for(lambda: tcp_open(HOST, ports.rpc) and tcp_open(HOST, ports.http), 60, "mooncake_master RPC and metadata ports", master)

        owner, bench = plan_clients(case, workdir, ports, self.local_buffer)
        self.plan = (owner, bench)
        self.ssd_dirs = [c["ssd_dir"] for c in ([owner] if owner else []) + bench if c["ssd_dir"]]
        for d in self.ssd_dirs:
            os.makedirs(d, exist_ok=True)
        if owner is not None:
            self.owner_socket = str(workdir / "owner.sock")
            cfg_path = workdir / "owner.json"
            cfg_path.write_text(json.dumps({"client": owner, "socket": self.owner_socket, "pythonpath": self._paths()}))
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR)] + self._paths() + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
            env["PYTHONUNBUFFERED"] = "1"
            apply_env(owner["env"], env)  # open_store applies it again before setup()
            self.owner_proc = proc = group.start("mooncake-owner", [sys.executable, "-m", "pressure.backends.mooncake", "owner", str(cfg_path)],
                               workdir / "mooncake-owner.log", env=env)
            wait_for(lambda: unix_socket_ready(self.owner_socket), 300, "the Mooncake owner's store (setup)", proc)
        return {
            "clients": bench,
            "put_retries": self.put_retries,
            "stats_dir": str(workdir),
            "pythonpath": list(self.pythonpath),
            "topology": topology(case),
        }

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://{HOST}:{self.ports.metrics}/metrics", timeout=5) as r:
            return parse_metrics(r.read().decode(errors="replace"))

    def heartbeat_s(self) -> int:
        """The offload heartbeat of the case's flash holders: as their environment sets it (the
        tuned variants: 1 s), else as the harness's environment does, else Mooncake's 10 s."""
        env = dict(os.environ)
        owner, bench = self.plan or (None, [])
        for c in ([owner] if owner else []) + bench:
            if c["ssd_dir"]:
                apply_env(c["env"], env)
                break
        try:
            return max(1, int(env.get(ENV_HEARTBEAT) or DEFAULT_HEARTBEAT_S))
        except ValueError:
            return DEFAULT_HEARTBEAT_S

    def settle(self, timeout: float) -> None:
        """SSD on, clients offload to flash on their heartbeat: wait until the SSD files and the
        master's key / allocation counts hold still for longer than one beat."""
        if not (self.case and self.case.ssd):
            return
        beat = self.heartbeat_s()

        def sample():
            try:
                m = self.metrics()
                mt = tuple(m.get(k) for k in ("master_key_count", "master_allocated_bytes"))
            except (OSError, ValueError):
                mt = None
            return (dir_bytes(self.ssd_dirs), mt)

        self.settled = settle_by_polling(sample, timeout, interval=0.5, stable_for=2 * (beat + 1) + 1)

    def bootstrap_puts(self) -> dict | None:
        try:
            with open(Path(self.stats_dir) / "puts-bootstrap-p0.json") as f:
                return json.load(f)
        except (OSError, ValueError, TypeError):
            return None

    def describe(self) -> dict:
        owner, bench = self.plan
        storage = ([owner] if owner else []) + [c for c in bench if c["segment_bytes"] or c["ssd_bytes"]]
        info = self.info()
        out = {
            "topology": topology(self.case),
            "offload": ("mooncake-default" if self.case.variant == DEFAULT_OFFLOAD else "bucket-per-value") if self.case.ssd else None,
            "master_env": self.master_env,
            "client_env": [c["env"] for c in storage],
            "requester_env": [c["env"] for c in bench if not (c["segment_bytes"] or c["ssd_bytes"])],
            "storage_processes": len(storage),
            "segment_bytes": [c["segment_bytes"] for c in storage],
            "ssd_limit_bytes": [c["ssd_bytes"] for c in storage] if self.case.ssd else [],
            "local_buffer_bytes": self.local_buffer,
            "mooncake": info.get("version"),
            "module": info.get("file"),
            "bootstrap_puts": self.bootstrap_puts(),
        }
        if self.case.ssd:
            out["ssd_files_bytes"] = dir_bytes(self.ssd_dirs)
            out["offload_heartbeat_s"] = self.heartbeat_s()
            out["offload_on_evict"] = self.offload_on_evict  # --mooncake-offload-on-evict (with promotion_on_hit)
            out["settled"] = self.settled
        if self.owner_socket:
            try:
                out["owner_env_at_setup"] = json.loads(unix_request(self.owner_socket, b"env\n", b"\n", timeout=5.0))
            except (OSError, ValueError) as e:
                out["owner_env_at_setup"] = {"error": f"{type(e).__name__}: {e}"[:200]}
        try:
            m = self.metrics()
            for k, v in m.items():
                if k.startswith("master_") and (k in ("master_key_count", "master_allocated_bytes", "master_total_capacity_bytes", "master_active_clients")
                                                or "evict" in k or "offload" in k):
                    out[k] = int(v) if v.is_integer() else v
        except (OSError, ValueError) as e:
            out["metrics_error"] = f"{type(e).__name__}: {e}"[:300]
        return out

    def ssd_counter(self) -> float | None:
        """The resident owner's counter (dedicated_owner, SSD on); the benchmark processes sample
        their own. Raises if the owner does not answer: a sample cannot be made up."""
        if not (self.case and self.case.ssd and self.owner_socket):
            return None
        reply = unix_request(self.owner_socket, b"count\n", b"\n", timeout=5.0).strip()
        if reply == b"none":
            return None
        try:
            return int(reply)
        except ValueError:
            raise RuntimeError(f"mooncake owner answered {reply[:100]!r} to count") from None

    def stop(self) -> None:
        """The owner first (its client says goodbye to a live master), then the master as a process
        group: pip's ``mooncake_master`` is a Python wrapper (mooncake-wheel/mooncake/cli.py) that in
        v0.3.12.post1 runs the real binary as its child (``subprocess.call``), which a signal to the
        wrapper alone would leave running; since 11357fb (2026-08-13, on main) it ``os.execv``s the
        binary, which then leads the group itself. Stopping the group is right for both. The harness's
        group then finds both gone (and still stops the benchmark processes, and everything on error)."""
        if self.owner_proc is not None:
            self.owner_proc.stop()
        if self.master_proc is not None:
            stop_process_group(self.master_proc.p)

    def notes(self, described: dict) -> list[str]:
        out = []
        puts = described.get("bootstrap_puts") or {}
        if puts.get("retried") or puts.get("gave_up"):
            out.append(f"mooncake: {puts.get('retried', 0)} bootstrap puts were refused for space (NO_AVAILABLE_HANDLE) and stored on a retry "
                       f"({puts.get('retries', 0)} retries); {puts.get('gave_up', 0)} gave up after {self.put_retries + 1} attempts")
        if self.case.ssd:
            if self.info().get("counter") is False:
                out.append("mooncake: this binding has no get_offload_rpc_read_count(): SSD hits cannot be attributed (case incomplete)")
            if self.case.variant == DEFAULT_OFFLOAD:
                out.append(f"mooncake-default-offload: Mooncake's default bucket offload ({DEFAULT_BUCKET_KEYS} keys or "
                           f"{format_size(DEFAULT_BUCKET_BYTES)} per bucket, one heartbeat's batch; {DEFAULT_HEARTBEAT_S} s heartbeat): "
                           "a part-filled bucket is not written, its keys are later evicted")
            elif described.get("ssd_files_bytes") == 0:
                out.append("mooncake: nothing was written to flash after the bootstrap (ssd_files_bytes 0): SSD hits will be 0")
            if self.case.payload_bytes > SSD_SLICE_MAX:
                out.append(f"mooncake: values of {format_size(self.case.payload_bytes)} exceed its SSD-offload slice limit "
                           f"({SSD_SLICE_MAX} B at 3b5a594): they may stay DRAM-only")
        return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "owner":
        sys.exit(owner_main(sys.argv[2]))
    print("usage: python -m pressure.backends.mooncake owner CONFIG.json (started by the harness)", file=sys.stderr)
    sys.exit(2)
