"""Emulated hosts: each a CPU cgroup with a share of this machine's cores (``--host-cpus``).

On one machine every process of a replay shares the same cores, so N fluxkv owners can never
move more bytes than one node: together they do more work (the pulls between owners, the
master's calls) on the same CPUs. Deployed, each owner and the engine processes attached to
it are a host of their own, and so is the master. With ``--host-cpus C`` each of those gets
a cgroup capped at C CPUs (CFS quota: cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``):

* one fluxkv node, memcached, Redis, Mooncake: one host, the servers and every client process;
* N fluxkv owners: host i is owner ``o<i>`` and the client processes attached to it (process k
  attaches to owner ``attach[k mod len]``), and the master is a host of its own.

The cap bounds CPU only: the owners still talk over loopback, and the disk is shared. Each host
must fit the machine's cores alongside the others (N owners and a master at C CPUs each need
(N + 1) x C cores), or they wait for each other's CPU as before. Needs root and a writable
cgroup filesystem with the cpu controller; :func:`unavailable` says why not."""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

from .cpu import tree_pids

__all__ = ["Hosts", "oversubscribed", "server_host", "worker_host", "unavailable"]

_ROOT = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000
_OWNER = re.compile(r"^o(\d+)$")


def server_host(name: str, owners: int) -> str:
    """The host of a server process named ``name`` (pressure's process names) in a case of
    ``owners`` fluxkv owners."""
    if owners > 1:
        if name == "master":
            return "master"
        if m := _OWNER.match(name):
            return f"host{int(m.group(1))}"
    return "host0"


def worker_host(index: int, endpoint: dict) -> str:
    """The host of replay process ``index``: the one of the owner it attaches to."""
    attach = endpoint.get("attach")
    return f"host{attach[index % len(attach)]}" if attach else "host0"


def oversubscribed(owners: int, cpus: float, cores: int | None = None) -> str | None:
    """A warning when a case's hosts (N owners and a master, or one) at ``cpus`` each need
    more than this machine's cores, else None."""
    cores = cores or os.cpu_count() or 1
    hosts = owners + 1 if owners > 1 else 1
    if hosts * cpus > cores:
        return f"{hosts} hosts of {cpus:g} CPUs need {hosts * cpus:g} of this machine's {cores} cores: they wait for each other's CPU"
    return None


def _flavour(root: Path) -> tuple[str, Path] | None:
    """("v2", root) or ("v1", the cpu hierarchy) where the cpu controller is mounted."""
    ctl = root / "cgroup.controllers"
    if ctl.exists():
        try:
            return ("v2", root) if "cpu" in ctl.read_text().split() else None
        except OSError:
            return None
    for d in (root / "cpu", root / "cpu,cpuacct"):
        if (d / "cgroup.procs").exists():
            return "v1", d
    return None


def unavailable(root: Path = _ROOT) -> str | None:
    """Why hosts cannot be emulated here, or None."""
    f = _flavour(root)
    if f is None:
        return f"no cgroup cpu controller under {root}"
    if not os.access(f[1], os.W_OK):
        return f"{f[1]} is not writable (run as root, with a writable cgroup filesystem)"
    return None


class Hosts:
    """Cgroups of ``cpus`` CPUs each, made on first use of a host name and removed by
    :meth:`close` (processes still in one go back to the root group first)."""

    def __init__(self, cpus: float, root: Path = _ROOT):
        if cpus <= 0:
            raise ValueError(f"a host's CPUs must be above 0, not {cpus}")
        f = _flavour(root)
        if f is None:
            raise RuntimeError(unavailable(root))
        self.cpus = cpus
        self.kind, self.base = f
        self.groups: dict = {}  # host name -> its cgroup directory
        self.members: dict = {}  # host name -> the names of the processes placed in it
        self.marks: dict = {}  # "start", "end" -> throttling() then (mark)

    def _group(self, host: str) -> Path:
        if host in self.groups:
            return self.groups[host]
        if self.kind == "v2":
            sub = self.base / "cgroup.subtree_control"
            if "cpu" not in sub.read_text().split():
                sub.write_text("+cpu")
        d = self.base / f"tracebench-{os.getpid()}-{host}"
        d.mkdir()
        self.groups[host] = d
        quota = max(1000, int(self.cpus * _PERIOD_US))
        if self.kind == "v2":
            (d / "cpu.max").write_text(f"{quota} {_PERIOD_US}")
        else:
            (d / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
            (d / "cpu.cfs_quota_us").write_text(str(quota))
        return d

    def place(self, host: str, name: str, pids) -> None:
        """Move the processes ``pids`` (all their threads) into ``host``; ``name`` is what the
        row's layout calls them."""
        procs = self._group(host) / "cgroup.procs"
        for pid in pids:
            try:
                procs.write_text(str(pid))
            except ProcessLookupError:
                continue  # exited meanwhile
        self.members.setdefault(host, []).append(name)

    def place_servers(self, procs, owners: int) -> None:
        """Place a case's server processes (pressure Procs: name, pid) and their descendants."""
        for p in procs:
            self.place(server_host(p.name, owners), p.name, tree_pids([p.pid]))

    def placer(self, endpoint: dict):
        """replay's ``place``: replay process i goes to the host of the owner it attaches to."""

        def place(i: int, pid: int) -> None:
            self.place(worker_host(i, endpoint), f"replay-{i}", [pid])

        return place

    def mark(self, when: str) -> None:
        """replay's ``mark``: the hosts' throttling at the replay's start and end (layout)."""
        self.marks[when] = self.throttling()

    def throttling(self) -> dict:
        """Host name -> (CFS periods so far, periods in which it used up its quota)."""
        out = {}
        for host, d in self.groups.items():
            try:
                st = dict(line.split() for line in (d / "cpu.stat").read_text().splitlines() if line.strip())
                out[host] = (int(st["nr_periods"]), int(st["nr_throttled"]))
            except (OSError, KeyError, ValueError):
                continue
        return out

    def layout(self) -> dict:
        """The row's fields: the CPUs of each host, host name -> the processes placed in it,
        and, where the replay was marked, the share of its CFS periods in which each host used
        up its CPUs (near 1: that host bound the replay)."""
        out = {"cpus_per_host": self.cpus, "hosts": {h: list(m) for h, m in sorted(self.members.items())}}
        before, after = self.marks.get("start"), self.marks.get("end")
        if before is not None and after is not None:
            out["throttled"] = {h: round((after[h][1] - before[h][1]) / (after[h][0] - before[h][0]), 3)
                                for h in sorted(after) if h in before and after[h][0] > before[h][0]}
        return out

    def close(self) -> None:
        for d in self.groups.values():
            for _ in range(50):
                try:
                    left = (d / "cgroup.procs").read_text().split()
                except OSError:
                    break
                for pid in left:
                    try:
                        (self.base / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass
                try:
                    d.rmdir()
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:  # busy: a process still leaving
                        break
                    time.sleep(0.1)
        self.groups.clear()
