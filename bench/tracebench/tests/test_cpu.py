"""CPU of process trees from /proc, and the replay row's CPU fields."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from tracebench import cpu, report

_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('done', flush=True)\ntime.sleep(30)"


def test_a_tree_counts_its_descendants():
    # A shell whose child burns 0.3 s of CPU: counted under the shell's pid, not under an unrelated one.
    p = subprocess.Popen(["/bin/sh", "-c", f'"{sys.executable}" -c "$0"; :', _BURN], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "done"
        got = cpu.tree_cpu_s([p.pid])
        assert got is not None and got >= 0.25, got
        assert cpu.tree_cpu_s([]) == 0.0
        assert cpu.tree_cpu_s([2**22 + 12345]) == 0.0  # no such process
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the shell and its child
        p.wait()
        p.stdout.close()


def test_own_cpu_rises():
    a = cpu.tree_cpu_s([os.getpid()])
    t = time.process_time()
    while time.process_time() - t < 0.1:
        pass
    assert cpu.tree_cpu_s([os.getpid()]) >= a + 0.05


def test_cpu_fields():
    GiB = 1 << 30
    res = SimpleNamespace(client_cpu_s=3.0, server_cpu_s=1.0)
    assert report.cpu_fields(res, 2 * GiB) == {"client_cpu_s": 3.0, "server_cpu_s": 1.0, "cpu_s_per_gib": 2.0}
    assert report.cpu_fields(SimpleNamespace(client_cpu_s=3.0, server_cpu_s=None), 2 * GiB)["cpu_s_per_gib"] is None
    assert report.cpu_fields(res, 0)["cpu_s_per_gib"] is None
