"""The backends a trace replays against, started by the pressure harness's own servers
(bench/pressure/backends): ``fluxkv up`` for one owner, ``pressure.backends.fluxkv.Cluster``
(a master and N owners with a fresh cluster secret and master key pair) for several,
Redis and memcached on Unix sockets, Mooncake Store where it is installed.

Sizes. Every backend gets the same cache memory for a capacity of C blocks: C x block bytes
(the pressure harness's rule: every peer gets the same DRAM and flash, and its defaults
otherwise), and with SSD on ``--ssd-ratio`` times that in flash. A fluxkv owner's transfer
reserve is inside its segment: one node runs without one (``--transfer-reserve off``: it has
nobody to place values on), each owner of a cluster gets min(segment/8, 256 MiB) of its share
(the owner's default; the master lends its idle room to the pool). What each backend really
holds is read back at the end of the replay (:meth:`Running.held`): per-value overheads (fluxkv's
64-byte page header and 512-byte granule, memcached's slab classes, Redis's allocator classes)
make it fewer blocks than C, and the summary says how many."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from pressure.backends import fluxkv as fx
from pressure.backends import mooncake as mc
from pressure.backends import load as load_backend
from pressure.backends.base import CaseSpec
from pressure.procs import fs_type

from fluxkv.kv import PAGE_HEADER_BYTES

__all__ = ["NAMES", "Target", "Running", "add_arguments", "prepare", "transfer_reserve", "landing_reserve"]

NAMES = ("fluxkv", "redis", "memcached", "mooncake")
MOONCAKE_VARIANT = "dedicated_owner"  # one resident store holds all the memory; replay processes only request
_PAGE = 4096
_RESERVE_CAP = 256 << 20


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Each pressure backend's own flags (binaries, Python paths, extra server flags)."""
    for name in NAMES:
        mod = load_backend(name)
        if hasattr(mod, "add_arguments"):
            mod.add_arguments(ap.add_argument_group(name))


@dataclass(frozen=True)
class Target:
    """One backend configuration."""

    backend: str
    owners: int  # fluxkv: owners; every other backend: 1 server
    ssd: bool

    @property
    def label(self) -> str:
        shape = f" {self.owners} owners" if self.owners > 1 else ""
        return f"{self.backend}{shape} SSD {'on' if self.ssd else 'off'}"


def transfer_reserve(segment: int) -> int:
    """A cluster owner's transfer reserve in a segment of ``segment`` bytes: an eighth of it (the
    owner's default), in pages."""
    return min(_RESERVE_CAP, segment // 8 // _PAGE * _PAGE)


def landing_reserve(segment: int, value: int, procs: int, owners: int) -> int:
    """A cluster owner's landing area (``fluxkv owner --landing-reserve``): room beyond its
    segment for the pages of one batch load (128 pages) of each replay process attached to it,
    at most an eighth of the segment. It holds only reads and transfers in flight, never a
    cached page: the counterpart of the other backends' clients' receive buffers (Mooncake's
    512 MiB local buffer per process). Without it a load of pages another owner holds, on an
    owner whose pool is full, evicts a page there for each page in flight."""
    per_owner = -(-procs // owners)
    return min(segment // 8, _round_page(128 * value * per_owner))


def _round_page(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


@dataclass
class Running:
    """A backend prepared for one (target, capacity): its server object, case and sizes;
    ``start`` runs it in a process group."""

    target: Target
    server: object
    spec: CaseSpec
    dram_bytes: int  # cache memory, all servers together
    ssd_bytes: int
    transfer_reserve_bytes: int  # per fluxkv owner, inside its segment
    endpoint: dict | None = None
    workdir: Path | None = None

    def unavailable(self) -> str | None:
        return self.server.unavailable(self.spec)

    def start(self, workdir: Path, group) -> dict:
        self.endpoint = self.server.start(self.spec, workdir, group)
        self.workdir = workdir
        return self.endpoint

    def warm(self, block_bytes: int) -> int:
        """Touch the memory a byte store caches in before the timed window, as fluxkv's owners
        do at start (their prefault) and its clients before they report ready (their
        populate): write a little more than the capacity in values of ``block_bytes`` (the
        replay's own slab class in memcached) and delete them. A fresh memcached filled 64 KiB
        values about a third slower at its first touch of each page than once its slabs were
        there (a review). Memcached keeps its slab pages; Redis frees the values to its
        allocator, which keeps the pages for a while. Only with SSD off: with it, memcached
        would also push the fillers to flash. Returns how many values it wrote."""
        b = self.target.backend
        if b not in ("memcached", "redis") or self.target.ssd or self.endpoint is None:
            return 0
        n, chunk = self.dram_bytes * 9 // 8 // block_bytes + 1, max(1, (4 << 20) // block_bytes)
        value = bytes(block_bytes)
        keys = [f"tracebench-warm/{i}" for i in range(n)]
        if b == "memcached":
            from pymemcache.client.base import Client

            c = Client(self.endpoint["socket"])
            try:
                for lo in range(0, n, chunk):
                    c.set_many(dict.fromkeys(keys[lo : lo + chunk], value), noreply=False)
                for lo in range(0, n, chunk):
                    c.delete_many(keys[lo : lo + chunk], noreply=False)
            finally:
                c.close()
            return n
        import redis

        r = redis.Redis(unix_socket_path=self.endpoint["socket"])
        try:
            for lo in range(0, n, chunk):
                r.mset(dict.fromkeys(keys[lo : lo + chunk], value))
            for lo in range(0, n, chunk):
                r.delete(*keys[lo : lo + chunk])
        finally:
            r.close()
        return n

    def stop(self) -> None:
        """What the server does before its process group is stopped (Mooncake: its master as a
        process group, since pip's ``mooncake_master`` of v0.3.12.post1 is a wrapper that runs the
        real binary as its child; a newer one execs it)."""
        self.server.stop()

    def settle(self) -> None:
        """Wait for background SSD writes to drain, so what is held can be counted."""
        if self.target.ssd:
            self.server.settle(60)

    def ssd_counter(self):
        return self.server.ssd_counter()

    def held(self) -> dict:
        """Blocks held now: in memory and, SSD on, in flash (None where the backend does not say).
        memcached's memory count is items less extstore objects, which its counters report with
        some lag while flushing: approximate with SSD on. Mooncake's master counts its objects,
        not where they are: told with SSD off only."""
        d = self.server.describe()
        b = self.target.backend
        if b == "fluxkv":
            # Distinct values in memory (a value copied to a second owner is one block held).
            memory = d.get("memory_values")
            return {"memory": d.get("memory_replicas") if memory is None else memory,
                    "ssd": d.get("ssd_replicas") if self.target.ssd else 0}
        if b == "redis":
            return {"memory": d.get("keys"), "ssd": 0}
        if b == "memcached":
            items, flash = d.get("curr_items"), d.get("extstore_objects_used") or 0
            return {"memory": None if items is None else items - flash, "ssd": flash}
        if b == "mooncake" and not self.target.ssd:
            # The master's key count is every object, in memory or on flash: split only with SSD off.
            return {"memory": d.get("master_key_count"), "ssd": 0}
        return {"memory": None, "ssd": None}

    def describe(self) -> dict:
        out = {"dram_bytes": self.dram_bytes, "ssd_bytes": self.ssd_bytes}
        if self.target.backend == "fluxkv" and self.target.owners > 1:
            out["transfer_reserve_bytes_per_owner"] = self.transfer_reserve_bytes
            out["landing_reserve_bytes_per_owner"] = self.server.topo.landing_bytes
        if self.target.ssd and self.workdir is not None:
            out["ssd_fs"] = fs_type(str(self.workdir))
        if self.target.backend == "fluxkv":
            out["shmem_thp"] = shmem_thp()
        cmd = getattr(self.server, "cmdline", None)
        if cmd:
            out["server_cmd"] = " ".join(str(a) for a in cmd)
        return out


def shmem_thp(path: str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled") -> str:
    """The kernel's policy for huge pages of shared memory (the bracketed word of ``path``),
    which decides whether an owner's segment gets them; "" where the kernel does not say."""
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return ""
    return next((w[1:-1] for w in words if len(w) > 2 and w[0] == "[" and w[-1] == "]"), "")


# The slowest a replay process's batch_get_into is taken to read at (8 processes sharing TCP
# loopback on a busy machine): what sizes Mooncake's lease to its longest call.
MOONCAKE_LEASE_READ_RATE = 256 << 20


def mooncake_lease_ms(call_bytes: int | None) -> int:
    """Mooncake's lease for a replay whose load calls move at most ``call_bytes``: long enough
    for the longest to finish at MOONCAKE_LEASE_READ_RATE (upstream fails every key of a
    batch whose lease ran out since its query began, LEASE_EXPIRED), at least the pressure
    harness's 500 ms and at most Mooncake's default 10 s (None: the default). Not longer: a
    leased object cannot be evicted, and at the quick preset's 64 KiB blocks a 10 s lease
    kept most of what the run read unevictable for the whole run. Cutting the batches
    instead would change the calls an engine's connector makes."""
    if call_bytes is None:
        return mc.DEFAULT_LEASE_TTL_MS
    need = math.ceil(call_bytes / MOONCAKE_LEASE_READ_RATE * 1000)
    return min(mc.DEFAULT_LEASE_TTL_MS, max(mc.LEASE_TTL_MS, need))


def prepare(target: Target, opts, capacity_blocks: int, block_bytes: int, ssd_ratio: float, procs: int, distinct: int,
            call_bytes: int | None = None) -> Running:
    """The server and case for ``target`` at ``capacity_blocks`` blocks of ``block_bytes``;
    ``call_bytes``: the most one load call of the replay moves (None: not known), which sizes
    Mooncake's lease (mooncake_lease_ms)."""
    dram = capacity_blocks * block_bytes
    ssd = int(ssd_ratio * dram) if target.ssd else 0
    fluxkv = target.backend == "fluxkv"
    value = block_bytes + PAGE_HEADER_BYTES if fluxkv else block_bytes
    o = argparse.Namespace(**vars(opts))
    reserve = 0
    if fluxkv and target.owners > 1:
        # The owners' segments together are the capacity: the transfer area is inside, since the
        # master lends its idle room to the pool (a reserve beyond the capacity held 13 % more
        # blocks than the other backends were given).
        segment = _round_page(math.ceil(dram / target.owners))
        reserve = transfer_reserve(segment)
        landing = landing_reserve(segment, value, procs, target.owners)
        o.fluxkv_owner_args = f"{getattr(o, 'fluxkv_owner_args', '') or ''} --transfer-reserve {reserve} --landing-reserve {landing}".strip()
        topo = fx.Topology(
            owners=target.owners,
            landing_bytes=landing,
            dram_bytes=segment,
            ssd_owners=tuple(range(target.owners)) if target.ssd else (),
            ssd_bytes=_round_page(ssd // target.owners) if target.ssd else 0,
            attach=tuple(range(target.owners)),
            put_via=tuple(range(target.owners)),
        )
        server = fx.Cluster(o, topo)
        per_server_dram, per_server_ssd = segment, topo.ssd_bytes
    else:
        if fluxkv:
            o.fluxkv_up_args = f"{o.fluxkv_up_args or ''} --transfer-reserve off".strip()
        elif target.owners != 1:
            raise ValueError(f"{target.backend} runs as one server, not {target.owners}")
        if target.backend == "mooncake":
            o.mooncake_lease_ttl_ms = mooncake_lease_ms(call_bytes)
        server = load_backend(target.backend).Server(o)
        per_server_dram, per_server_ssd = _round_page(dram) if fluxkv else dram, ssd
    variant = MOONCAKE_VARIANT if target.backend == "mooncake" else None
    spec = CaseSpec(target.backend, variant, target.ssd, "bytes", value, distinct, per_server_dram, per_server_ssd, procs, 1)
    return Running(target, server, spec, dram, ssd, reserve)
