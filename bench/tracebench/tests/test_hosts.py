"""Emulated hosts (tracebench/hosts.py): which host each process is on, the cgroup files a
host is made of (on a directory laid out as cgroup v1 or v2), and, where this machine lets
it, a real CPU cap."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracebench import cpu, hosts


def test_which_host():
    assert hosts.server_host("fluxkv", 1) == "host0"
    assert hosts.server_host("memcached", 1) == "host0"
    assert [hosts.server_host(n, 3) for n in ("master", "o0", "o2")] == ["master", "host0", "host2"]
    assert hosts.server_host("master", 1) == "host0"  # one node: a single host
    ep = {"attach": [0, 1, 2]}
    assert [hosts.worker_host(i, ep) for i in range(5)] == ["host0", "host1", "host2", "host0", "host1"]
    assert hosts.worker_host(4, {"attach": [2]}) == "host2"
    assert hosts.worker_host(1, {"socket": "/x"}) == "host0"


def test_oversubscribed():
    assert hosts.oversubscribed(3, 0.45, cores=2) is None  # 4 hosts: 1.8 cores
    assert "4 hosts of 0.6 CPUs need 2.4 of this machine's 2 cores" in hosts.oversubscribed(3, 0.6, cores=2)
    assert hosts.oversubscribed(1, 2.0, cores=2) is None
    assert hosts.oversubscribed(1, 2.5, cores=2) is not None


def _v1(tmp_path: Path) -> Path:
    (tmp_path / "cpu").mkdir(parents=True)
    (tmp_path / "cpu" / "cgroup.procs").write_text("")
    return tmp_path


def test_v1_files(tmp_path):
    root = _v1(tmp_path)
    assert hosts.unavailable(root) is None
    h = hosts.Hosts(0.45, root=root)
    h.place("host1", "o1", [111, 112])
    h.place("host1", "replay-1", [113])
    h.place("master", "master", [114])
    d = root / "cpu" / f"tracebench-{os.getpid()}-host1"
    assert (d / "cpu.cfs_quota_us").read_text() == "45000"
    assert (d / "cpu.cfs_period_us").read_text() == "100000"
    assert (d / "cgroup.procs").read_text() == "113"  # each pid written on its own (a file keeps the last here)
    (d / "cpu.stat").write_text("nr_periods 10\nnr_throttled 2\nthrottled_time 5\n")
    h.mark("start")
    (d / "cpu.stat").write_text("nr_periods 30\nnr_throttled 17\nthrottled_time 9\n")
    h.mark("end")
    assert h.layout() == {"cpus_per_host": 0.45, "hosts": {"host1": ["o1", "replay-1"], "master": ["master"]},
                          "throttled": {"host1": 0.75}}  # the master's cpu.stat is absent here: left out
    h.close()  # a plain directory is not a cgroup: it stays, and close does not wait on it


def test_v2_files(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    assert hosts.unavailable(tmp_path) is None
    h = hosts.Hosts(1.5, root=tmp_path)
    h.place("host0", "fluxkv", [7])
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / f"tracebench-{os.getpid()}-host0" / "cpu.max").read_text() == "150000 100000"


def test_unavailable(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("io memory\n")
    assert "no cgroup cpu controller" in hosts.unavailable(tmp_path)
    assert "no cgroup cpu controller" in hosts.unavailable(tmp_path / "absent")
    with pytest.raises(RuntimeError):
        hosts.Hosts(0.5, root=tmp_path)
    with pytest.raises(ValueError):
        hosts.Hosts(0, root=_v1(tmp_path / "x"))


_SPIN = ("import sys, time\nsys.stdin.readline()\nt, c = time.monotonic(), time.process_time()\n"
         "while time.monotonic() - t < 1.5: pass\nprint(time.monotonic() - t, time.process_time() - c)\n")


@pytest.mark.skipif(hosts.unavailable() is not None, reason=f"no writable cgroup cpu controller: {hosts.unavailable()}")
def test_a_real_cap():
    # A process spinning 1.5 s of wall time in a host of 0.2 CPUs gets about 0.3 s of CPU. Only
    # an upper bound, with slack: a busy machine may give it less CPU anyway.
    h = hosts.Hosts(0.2)
    p = subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        h.place("host0", "spin", cpu.tree_pids([p.pid]))
        group = next(iter(h.groups.values()))
        assert str(p.pid) in (group / "cgroup.procs").read_text().split()
        h.mark("start")
        out, _ = p.communicate("go\n", timeout=60)
        h.mark("end")
        wall, used = map(float, out.split())
        assert used < 0.2 * wall * 2 + 0.1, f"{used:.2f} s of CPU in {wall:.2f} s under a cap of 0.2 CPUs"
        assert "host0" in h.layout()["throttled"]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        h.close()
    assert not group.exists()
