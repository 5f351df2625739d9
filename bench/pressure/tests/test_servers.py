"""Integration: the harness against real servers it starts and stops itself (tiny sizes, short
windows). Each backend's test skips when its binary or client module is missing."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pressure import cli, harness
from pressure.backends.base import module_available, which
from pressure.matrix import Case
from pressure.sizes import parse_size

REPO = Path(__file__).resolve().parents[3]
# A benchmark harness runs the plain binary: `make test` passes it as FLUXKV_BIN_NORACE
# (FLUXKV_BIN is the -race build there, several times slower).
FLUXKV_BIN = os.environ.get("FLUXKV_BIN_NORACE") or os.environ.get("FLUXKV_BIN") or str(REPO / "bin" / "fluxkv")
PAYLOAD = parse_size("1MiB-128")


def opts_for(tmp_path, *extra):
    a = cli.build_parser().parse_args([
        "run", "--out", str(tmp_path / "out"), "--preset", "quick", "--dram", "16MiB", "--warmup", "0.1", "--window", "0.4",
        "--work-dir", str(tmp_path), "--fluxkv-bin", FLUXKV_BIN, "--pace-scale", "0.2", *extra,
    ])
    return cli.resolve(a)


def our_processes(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker`` (a test's temp dir)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                out.append(f"{p.name}: {cmd}")
    return out


def need(binary, module=None):
    if not which(binary):
        pytest.skip(f"{binary} not installed")
    if module and not module_available(module):
        pytest.skip(f"python module {module} missing")


def test_fluxkv_ssd_off_and_on(tmp_path):
    need(FLUXKV_BIN)
    opts = opts_for(tmp_path)
    recs = harness.run([Case("fluxkv", ssd, "bytes", "none", "random", PAYLOAD, 1, 2) for ssd in (False, True)], opts)
    off, on = recs
    assert off["status"] == "ok", off
    assert on["status"] == "ok", on
    assert on["hit_rate"] == 1.0 and on["ssd_hits"] + on["memory_hits"] == on["hits"] > 0
    assert off["ssd_hits"] == 0 and 0 < off["hit_rate"] < 1
    assert on["server"]["ssd_used_bytes"] > 0 and off["errors"] == on["errors"] == 0
    assert our_processes(str(tmp_path)) == []
    assert list(tmp_path.glob("fkp-*")) == []


def test_memcached_extstore_sources_add_up_and_redis(tmp_path):
    need("memcached", "pymemcache")
    opts = opts_for(tmp_path)
    cases = [Case("memcached", True, "bytes", "none", "random", PAYLOAD, 1, 2)]
    if which("redis-server") and module_available("redis"):
        cases.append(Case("redis", False, "bytes", "none", "random", PAYLOAD, 1, 2))
    recs = harness.run(cases, opts)
    mc = recs[0]
    if mc["status"] == "unavailable":
        pytest.skip(mc["reason"])  # a memcached without extstore
    assert mc["status"] == "ok" and mc["source_method"] == "counter", mc
    assert mc["ssd_hits"] > 0 and mc["memory_hits"] + mc["ssd_hits"] == mc["hits"]
    if len(recs) > 1:
        assert recs[1]["status"] == "ok" and recs[1]["memory_hits"] == recs[1]["hits"] > 0
    assert our_processes(str(tmp_path)) == []


def test_ctrl_c_stops_servers_and_removes_temp_dirs(tmp_path):
    need("memcached", "pymemcache")
    env = {**os.environ, "PYTHONPATH": str(REPO / "bench")}
    p = subprocess.Popen(
        [sys.executable, "-m", "pressure", "run", "--preset", "quick", "--backends", "memcached", "--out", str(tmp_path / "out"),
         "--dram", "16MiB", "--warmup", "0.2", "--window", "30", "--work-dir", str(tmp_path), "--no-chart"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not our_processes(str(tmp_path / "fkp-")):
            time.sleep(0.05)
        assert our_processes(str(tmp_path / "fkp-")), "memcached never started"
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out
    assert "interrupted" in out
    assert our_processes(str(tmp_path)) == []
    assert list(tmp_path.glob("fkp-*")) == []
