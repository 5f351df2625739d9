"""fluxkv: ``fluxkv up`` (embedded master + owner) with ``--dram`` and, SSD on, an SSD cache dir
and limit; the Python client ``fluxkv`` in every benchmark process (one client per process,
shared by its threads, as an inference process would). Sources come per get from
``MemHolder.source``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..procs import free_port, tcp_open, unix_socket_ready, wait_for
from .base import CaseSpec, Got, Server as _Server, ThreadClient, WorkerSide as _WorkerSide, module_available, settle_by_polling, which


REPO = Path(__file__).resolve().parents[3]


def add_arguments(g) -> None:
    g.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"), help="the fluxkv binary (make build)")
    g.add_argument("--fluxkv-pythonpath", default=str(REPO / "clients" / "python"), help="where the fluxkv Python client lives")
    g.add_argument("--fluxkv-up-args", default="", help="extra flags for 'fluxkv up' (ablations: '--no-promotion', '--cache-grace 0'); "
                   "recorded in the summary's server field")


def _ssd_flag_style(binary: str) -> str | None:
    """Which SSD flags this daemon build takes: ``ssd`` (--ssd-path/--ssd-limit), ``large``
    (--large-file-paths/--large-limit-size) or None."""
    try:
        out = subprocess.run([binary, "up", "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout + out.stderr
    if "--ssd-path" in text and "--ssd-limit" in text:
        return "ssd"
    if "--large-file-paths" in text and "--large-limit-size" in text:
        return "large"
    return None


class Server(_Server):
    name = "fluxkv"
    source_method = "per-get"

    def __init__(self, opts):
        super().__init__(opts)
        self.bin = str(Path(opts.fluxkv_bin).resolve()) if opts.fluxkv_bin else None
        self.pythonpath = (str(Path(opts.fluxkv_pythonpath).resolve()),)
        self._flag_style: str | None | bool = False  # False: not probed yet
        self.socket: str | None = None
        self.case_ssd = False
        self.proc = None

    def _ssd_style(self):
        if self._flag_style is False:
            self._flag_style = _ssd_flag_style(self.bin)
        return self._flag_style

    def unavailable(self, case: CaseSpec) -> str | None:
        if not self.bin or not which(self.bin):
            return f"fluxkv binary {self.opts.fluxkv_bin!r} not found (make build)"
        if not module_available("fluxkv", self.pythonpath):
            return f"Python client 'fluxkv' not importable from {self.pythonpath[0]}"
        if not module_available("thrift", self.pythonpath):
            return "Python module 'thrift' (the fluxkv client's runtime) not importable: install python3-thrift or use --pythonpath"
        if case.ssd and self._ssd_style() is None:
            return f"{self.bin} up takes no SSD flags (--ssd-path/--ssd-limit or --large-file-paths/--large-limit-size)"
        return None

    def start(self, case: CaseSpec, workdir: Path, group) -> dict:
        self.socket = str(workdir / "fluxkv.sock")
        self.case_ssd = case.ssd
        args = [self.bin, "--log-level", "warn", "up", "--dir", str(workdir), "--dram", str(case.dram_bytes)]
        if case.ssd:
            ssd_dir = workdir / "ssd"
            ssd_dir.mkdir()
            if self._ssd_style() == "ssd":
                args += ["--ssd-path", str(ssd_dir), "--ssd-limit", str(case.ssd_bytes)]
            else:
                args += ["--large-file-paths", str(ssd_dir), "--large-limit-size", str(case.ssd_bytes)]
        args += shlex.split(self.opts.fluxkv_up_args or "")
        self.cmdline = args
        self.proc = group.start("fluxkv", args, workdir / "fluxkv.log")
        wait_for(lambda: unix_socket_ready(self.socket), 60, "fluxkv socket", self.proc)
        return {"socket": self.socket, "pythonpath": list(self.pythonpath)}

    def _status(self) -> dict:
        out = subprocess.run([self.bin, "status", "--json", "--socket", self.socket], capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            raise RuntimeError(f"fluxkv status: {out.stderr.strip() or out.stdout.strip()}")
        return json.loads(out.stdout)

    def settle(self, timeout: float) -> None:
        """SSD writes run after each put returns: wait until the SSD replica count, used bytes and
        running persists stop moving. ``kv_ssd.used_bytes`` comes with the owner's heartbeat (1 s),
        so watch for more than one heartbeat."""
        if not self.case_ssd:
            return

        def sample():
            st = self._status()
            return tuple((m.get("ssd_replicas"), (m.get("kv_ssd") or {}).get("used_bytes"), m.get("ssd_persists_pending"))
                         for m in st.get("members", []))

        settle_by_polling(sample, timeout, interval=0.3, stable_for=5)

    def describe(self) -> dict:
        st = self._status()
        out = {"keys": st.get("keys")}
        for m in st.get("members", []):
            seg = m.get("memory_segment") or {}
            ssd = m.get("kv_ssd") or {}
            out.update(
                memory_capacity_bytes=seg.get("capacity_bytes"),
                memory_used_bytes=seg.get("used_bytes"),
                ssd_capacity_bytes=ssd.get("capacity_bytes"),
                ssd_used_bytes=ssd.get("used_bytes"),
                memory_replicas=m.get("memory_replicas"),
                ssd_replicas=m.get("ssd_replicas"),
            )
        return out


class FluxGot(Got):
    __slots__ = ("h", "source", "remote")

    def __init__(self, h):
        self.h = h
        self.source = h.source
        self.remote = getattr(h, "remote", None)  # an older client does not tell

    def __len__(self) -> int:
        return len(self.h)

    def materialize(self) -> bytes:
        return self.h.bytes()

    def host_pointer(self) -> int:
        return self.h.address

    def release(self) -> None:
        self.h.release()


class FluxThread(ThreadClient):
    """Gets through ``client``; puts through ``put_clients`` in turn (default: ``client``)."""

    def __init__(self, client, fluxkv_mod, put_clients=None, owned=()):
        self.c = client
        self.KeyNotFound = fluxkv_mod.KeyNotFound
        self.put_clients = list(put_clients or [client])
        self.owned = owned  # clients this thread client opened and closes
        self.puts = 0

    def get(self, key: str):
        try:
            return FluxGot(self.c.get(key))
        except self.KeyNotFound:
            return None

    def put(self, key: str, value) -> None:
        c = self.put_clients[self.puts % len(self.put_clients)]
        self.puts += 1
        c.put(key, value)

    def close(self) -> None:
        for c in self.owned:
            c.close()


class WorkerSide(_WorkerSide):
    """One client per process. A cluster endpoint (``sockets``, ``attach``, ``put_via``) attaches
    process i to owner ``attach[i mod len]``; its bootstrap and filler puts go through the owners
    of ``put_via`` in turn (one client each, opened for the bootstrap)."""

    native_type = "MemHolder"

    def __init__(self, endpoint: dict, case: CaseSpec, proc_index: int):
        super().__init__(endpoint, case, proc_index)
        for p in reversed(endpoint.get("pythonpath", [])):
            if p not in sys.path:
                sys.path.insert(0, p)
        import fluxkv

        self.mod = fluxkv
        if "sockets" in endpoint:
            attach = endpoint["attach"]
            self.owner = attach[proc_index % len(attach)]
            self.socket = endpoint["sockets"][self.owner]
            self.put_via = list(endpoint.get("put_via") or [self.owner])
        else:
            self.owner, self.socket, self.put_via = None, endpoint["socket"], None
        self.client = fluxkv.connect(self.socket)

    def thread_client(self, thread_index: int) -> ThreadClient:
        if thread_index >= 0 or not self.put_via or self.put_via == [self.owner]:
            return FluxThread(self.client, self.mod)
        owned = {i: self.mod.connect(self.endpoint["sockets"][i]) for i in sorted(set(self.put_via)) if i != self.owner}
        puts = [self.client if i == self.owner else owned[i] for i in self.put_via]
        return FluxThread(self.client, self.mod, puts, tuple(owned.values()))

    def describe(self) -> dict:
        return {} if self.owner is None else {"owner": self.owner, "socket": self.socket, "put_via": self.put_via}

    def close(self) -> None:
        self.client.close()


# -- a cluster: one master and N owners (python3 -m pressure cluster) -----------------------------


@dataclass(frozen=True)
class Topology:
    """A fluxkv cluster on this machine, and which owner each benchmark process talks to."""

    owners: int
    dram_bytes: int  # per owner
    ssd_owners: tuple  # indices of the owners with an SSD tier
    ssd_bytes: int  # per SSD owner
    attach: tuple  # owner index of benchmark process i (i mod len)
    put_via: tuple  # bootstrap / filler puts go through these owners in turn
    no_promotion: bool = False  # master --no-promotion
    placement: str | None = None  # master --placement (None: its default, pool)
    cache_grace: str | None = None  # every owner's --cache-grace (None: its default)
    landing_bytes: int = 0  # every owner's --landing-reserve (0: none)

    def to_json(self) -> dict:
        return {**asdict(self), "ssd_owners": list(self.ssd_owners), "attach": list(self.attach), "put_via": list(self.put_via),
                "owner_ids": [owner_id(i) for i in range(self.owners)]}


def owner_id(i: int) -> str:
    return f"o{i}"


def persist_counts(status: dict) -> dict:
    """The master's SSD persist counters from ``fluxkv status --json``: per member, the persists it
    was asked for (``ssd_persists``), those that ended without an SSD copy (``ssd_persists_dropped``:
    failed, queue full, owner gone), those still running (``ssd_persists_pending``) and the KV pages
    of its memory the SSD write-back gave up on (``ssd_unwritten``), and their sums (``asked``,
    ``dropped``, ``pending``, ``unwritten``)."""
    out: dict = {"asked": 0, "dropped": 0, "pending": 0, "unwritten": 0, "by_member": {}}
    for m in status.get("members", []):
        c = {"asked": m.get("ssd_persists") or 0, "dropped": m.get("ssd_persists_dropped") or 0,
             "pending": m.get("ssd_persists_pending") or 0, "unwritten": m.get("ssd_unwritten") or 0}
        out["by_member"][m.get("node_id")] = c
        for k, v in c.items():
            out[k] += v
    return out


def pool_counts(status: dict) -> dict:
    """What the cluster's memory holds, from ``fluxkv status --json``: ``values`` (keys with a memory
    replica: distinct values), ``duplicate_bytes`` (bytes of memory replicas beyond each key's first:
    promoted copies), ``replicas`` and ``used_bytes`` summed over the members, and ``keys`` (routes,
    memory or SSD). ``values`` and ``duplicate_bytes`` are None from a build that does not report them."""
    ms = status.get("members", [])
    return {"values": status.get("memory_values"), "duplicate_bytes": status.get("memory_duplicate_bytes"),
            "replicas": sum(m.get("memory_replicas") or 0 for m in ms),
            "used_bytes": sum((m.get("memory_segment") or {}).get("used_bytes") or 0 for m in ms), "keys": status.get("keys")}


class Cluster(Server):
    """``fluxkv master`` and ``topo.owners`` × ``fluxkv owner`` on loopback, sharing a fresh cluster
    secret (mode 0600): owner i is ``o{i}`` in ``DIR/o{i}`` (socket ``DIR/o{i}/fluxkv.sock``), the
    owners in ``topo.ssd_owners`` with ``--ssd-path DIR/o{i}/ssd --ssd-limit topo.ssd_bytes``. Every
    log goes to a file in the case's dir (warn level, JSON)."""

    def __init__(self, opts, topo: Topology):
        super().__init__(opts)
        self.topo = topo
        self.sockets: list[str] = []
        self.logs: list[Path] = []
        self.cmdlines: dict[str, list] = {}
        self.master_addr: str | None = None

    def unavailable(self, case: CaseSpec) -> str | None:
        why = super().unavailable(CaseSpec(**{**case.__dict__, "ssd": bool(self.topo.ssd_owners)}))
        if why:
            return why
        out = subprocess.run([self.bin, "master", "--help"], capture_output=True, text=True, timeout=20)
        if "--cluster-secret-file" not in out.stdout + out.stderr:
            return f"{self.bin} master takes no --cluster-secret-file (a build before clusters)"
        return None

    def start(self, case: CaseSpec, workdir: Path, group) -> dict:
        t = self.topo
        secret = workdir / "cluster.secret"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(48).hex().encode())
        os.close(fd)
        common = [self.bin, "--log-format", "json", "--log-level", "warn"]
        port = free_port()
        self.master_addr = f"127.0.0.1:{port}"
        margs = common + ["master", "--listen", self.master_addr, "--cluster-secret-file", str(secret)]
        # Builds with master keys (docs/architecture.md §11) need the pair: masters sign, owners verify.
        mkey, mpub = workdir / "master.key", workdir / "master.pub"
        keys = subprocess.run([self.bin, "gen-master-key", "--master-key-file", str(mkey), "--master-pubkey-file", str(mpub)],
                              capture_output=True, timeout=20).returncode == 0
        if keys:
            margs += ["--master-key-file", str(mkey)]
        if t.no_promotion:
            margs.append("--no-promotion")
        if t.placement:
            margs += ["--placement", t.placement]
        margs += shlex.split(getattr(self.opts, "fluxkv_master_args", "") or "")
        self.cmdlines = {"master": margs}
        self.logs = [workdir / "master.log"]
        master = group.start("master", margs, self.logs[0])
        wait_for(lambda: tcp_open("127.0.0.1", port), 60, "fluxkv master port", master)
        procs = []
        self.sockets = []
        for i in range(t.owners):
            d = workdir / owner_id(i)
            d.mkdir()
            args = common + ["owner", "--dir", str(d), "--dram", str(t.dram_bytes), "--master", self.master_addr, "--node-id", owner_id(i),
                             "--cluster-secret-file", str(secret)]
            if keys:
                args += ["--master-pubkey-file", str(mpub)]
            if t.cache_grace is not None:
                args += ["--cache-grace", t.cache_grace]
            if t.landing_bytes:
                args += ["--landing-reserve", str(t.landing_bytes)]
            if i in t.ssd_owners:
                (d / "ssd").mkdir()
                args += ["--ssd-path", str(d / "ssd"), "--ssd-limit", str(t.ssd_bytes)]
            args += shlex.split(getattr(self.opts, "fluxkv_owner_args", "") or "")
            self.cmdlines[owner_id(i)] = args
            self.logs.append(workdir / f"{owner_id(i)}.log")
            procs.append(group.start(owner_id(i), args, self.logs[-1]))
            self.sockets.append(str(d / "fluxkv.sock"))
        for sock, p in zip(self.sockets, procs):
            wait_for(lambda: unix_socket_ready(sock), 60, f"{p.name}'s socket", p)
        self.socket = self.sockets[0]
        self.case_ssd = bool(t.ssd_owners)
        self.proc = master

        def all_alive():
            try:
                ms = self._status().get("members", [])
            except (RuntimeError, ValueError, subprocess.TimeoutExpired):
                return False
            return sum(1 for m in ms if m.get("alive", True)) >= t.owners

        wait_for(all_alive, 60, f"{t.owners} live members in fluxkv status", master, interval=0.1)
        self._settle_writes()
        self.cmdline = margs
        return self.endpoint(t.attach)

    def _settle_writes(self) -> None:
        """Put and delete one key through the first owner: a new master answers publishes and
        deletes only after its write quiet period (master.Options.WriteQuiet, two heartbeat
        intervals from its start: an owner of a previous master may still serve its cached
        holdings), so the case's first puts would wait out the rest of it. A cluster serving
        engines has started long before; the measurement starts after it, as there."""
        script = "import sys, fluxkv\nc = fluxkv.connect(sys.argv[1])\nc.put(sys.argv[2], b'x')\nc.delete(sys.argv[2])\nc.close()\n"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*self.pythonpath, os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", script, self.sockets[0], "pressure/settle-writes"], env=env,
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"a put through {self.sockets[0]} after the cluster started failed: {out.stderr.strip()[-400:]}")

    def endpoint(self, attach) -> dict:
        """What a benchmark process needs; ``attach`` may differ between windows of one case."""
        return {"sockets": list(self.sockets), "attach": list(attach), "put_via": list(self.topo.put_via), "pythonpath": list(self.pythonpath)}

    def persist_counts(self) -> dict:
        """The master's SSD persist counters (``persist_counts``)."""
        return persist_counts(self._status())

    def pool_counts(self) -> dict:
        """What the memory pool holds (``pool_counts``)."""
        return pool_counts(self._status())

    def describe(self) -> dict:
        st = self._status()
        members = []
        for m in st.get("members", []):
            seg = m.get("memory_segment") or {}
            ssd = m.get("kv_ssd") or {}
            members.append({
                "node_id": m.get("node_id"), "alive": m.get("alive"),
                "memory_capacity_bytes": seg.get("capacity_bytes"), "memory_used_bytes": seg.get("used_bytes"),
                "ssd_capacity_bytes": ssd.get("capacity_bytes"), "ssd_used_bytes": ssd.get("used_bytes"),
                "memory_replicas": m.get("memory_replicas"), "ssd_replicas": m.get("ssd_replicas"), "holders": m.get("holders"),
            })
        # memory_values: distinct keys with a memory copy (the members' memory_replicas count a
        # value pulled to another owner once per copy).
        out = {"keys": st.get("keys"), "memory_values": st.get("memory_values"), "members": members, "topology": self.topo.to_json()}
        for k in ("memory_replicas", "ssd_replicas", "memory_used_bytes", "ssd_used_bytes"):
            out[k] = sum(m[k] or 0 for m in members)
        return out

    def cmd(self) -> dict:
        return {name: " ".join(shlex.quote(str(a)) for a in args) for name, args in self.cmdlines.items()}
