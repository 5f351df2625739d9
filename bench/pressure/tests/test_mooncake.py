"""The Mooncake adapter (backends/mooncake.py) on a machine without Mooncake: the master's command
line, setup() arguments per topology and SSD state, the DRAM / SSD splits, counter attribution,
put retries, the skip path (module or binary missing: reason printed, the run goes on), and the
adapter end to end through the harness against the TEST FAKE of ``mooncake.store`` and
``mooncake_master`` in fake_mooncake.py. None of this ran against a live Mooncake."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pressure import cli, harness
from pressure.backends import mooncake as mc
from pressure.backends.base import BytesGot, CaseSpec
from pressure.chart import not_run_notes
from pressure.matrix import Case, cross, quick
from pressure.sizes import GiB, KiB, MiB
from pressure.stats import attribute_counter
from pressure.tests.fake_mooncake import BufferHandle as FakeHandle
from pressure.tests.fake_mooncake import install as fake_install

BENCH = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_mooncake.py")
PAYLOAD = 4 * KiB
DRAM = 64 * KiB  # 20 keys of 4 KiB at 1.25x, 16 fit


def spec(variant, ssd, procs=1, threads=2, mode="bytes", dram=2 * GiB, ssd_bytes=16 * GiB):
    return CaseSpec("mooncake", variant, ssd, mode, 1 * MiB - 128, 2560, dram, ssd_bytes, procs, threads)


PORTS = mc.Ports(http=18080, rpc=15051, metrics=19003)
# Caller's variables that change Mooncake's results: removed in every Mooncake process.
CLEARED = {k: None for k in ("MC_STORE_LOCAL_HOT_CACHE_SIZE", "MC_STORE_MEMCPY", "MC_STORE_USE_HUGEPAGE",
                             "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "MOONCAKE_BUCKET_EVICTION_POLICY",
                             "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR", "MOONCAKE_CONFIG_PATH")}
POOL = {"MC_TCP_ENABLE_CONNECTION_POOL": "1", **CLEARED}
BUCKET_VARS = ("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES", "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS")


# -- argument building -----------------------------------------------------------------------------


def test_master_command_line_ssd_off_and_on():
    want = [
        "/opt/mc/bin/mooncake_master",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1",
        "--http_metadata_server_port=18080",
        "--rpc_port=15051",
        "--rpc_address=127.0.0.1",
        "--metrics_port=19003",
        "--metrics_host=127.0.0.1",
        "--eviction_high_watermark_ratio=0.95",
        "--eviction_ratio=0.01",  # evict 1 % at the watermark, not Mooncake's 5 %
        "--default_kv_lease_ttl=500",
        "--undefok=metrics_host",
    ]
    assert mc.master_args("/opt/mc/bin/mooncake_master", PORTS, ssd=False) == want
    assert mc.master_args("/opt/mc/bin/mooncake_master", PORTS, ssd=True) == want + ["--enable_offload=true"]
    # tracebench: Mooncake's default 10 s lease (its batches may take longer than 500 ms)
    ten = mc.master_args("/opt/mc/bin/mooncake_master", PORTS, ssd=False, lease_ttl_ms=mc.DEFAULT_LEASE_TTL_MS)
    assert ten == [a if a != "--default_kv_lease_ttl=500" else "--default_kv_lease_ttl=10000" for a in want]
    # --mooncake-offload-on-evict: only with SSD on
    on_evict = ["--enable_offload=true", "--offload_on_evict=true", "--promotion_on_hit=true"]
    assert mc.master_args("/opt/mc/bin/mooncake_master", PORTS, ssd=True, offload_on_evict=True) == want + on_evict
    assert mc.master_args("/opt/mc/bin/mooncake_master", PORTS, ssd=False, offload_on_evict=True) == want
    assert mc.metadata_url(PORTS) == "http://127.0.0.1:18080/metadata"
    assert mc.master_address(PORTS) == "127.0.0.1:15051"


@pytest.mark.parametrize("version", ["v0.3.12.post1", "main"])
def test_master_flags_start_the_latest_release_and_main(tmp_path, monkeypatch, version):
    """gflags in mooncake_master exits on a flag it does not define: --metrics_host exists on main
    (3b5a594) but not in v0.3.12.post1, so the adapter lists it in --undefok. The TEST FAKE master
    refuses unknown flags as gflags does, with either version's flag set."""
    from pressure.procs import free_port, tcp_open

    monkeypatch.setenv("FAKE_MOONCAKE_MASTER_VERSION", version)
    ports = mc.pick_ports(free_port)
    args = mc.master_args(sys.executable, ports, ssd=True, lease_ttl_ms=mc.DEFAULT_LEASE_TTL_MS, offload_on_evict=True)
    bad = [a for a in args if not a.startswith("--undefok=")]
    if version != "main":
        out = subprocess.run([sys.executable, str(FAKE)] + bad[1:], capture_output=True, text=True, timeout=30)
        assert out.returncode == 1 and "unknown command line flag 'metrics_host'" in out.stderr
    p = subprocess.Popen([sys.executable, str(FAKE)] + args[1:], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not tcp_open(mc.HOST, ports.rpc) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None and tcp_open(mc.HOST, ports.rpc), p.stderr.read() if p.poll() is not None else "not up"
    finally:
        p.kill()
        p.wait()


def test_ports_are_distinct():
    seq = iter([5000, 5000, 5001, 5000, 5001, 5002])
    assert mc.pick_ports(lambda: next(seq)) == mc.Ports(5000, 5001, 5002)
    p = mc.pick_ports()
    assert len({p.http, p.rpc, p.metrics}) == 3


def test_split_evenly_adds_up():
    assert mc.split_evenly(10, 4) == [3, 3, 2, 2]
    assert mc.split_evenly(2 * GiB, 4) == [512 * MiB] * 4  # the seed's c16 shares
    assert mc.split_evenly(16 * GiB, 2) == [8 * GiB] * 2  # c8
    for total, n in ((2 * GiB + 3, 4), (7, 3), (1, 4)):
        s = mc.split_evenly(total, n)
        assert sum(s) == total and max(s) - min(s) <= 1
    with pytest.raises(ValueError):
        mc.split_evenly(1, 0)


def test_physical_cap_fits_the_share():
    """One key per bucket costs a .bucket (key and value) and a .meta file, each whole 4 KiB blocks:
    a physical cap equal to the share would hold ~89 % of it at 64 KiB values. The cap the adapter
    sets holds the whole share."""
    share = 64 * MiB
    assert mc.physical_cap(share, 64 * KiB) == 1024 * (68 * KiB + 4 * KiB)
    assert 1024 * 64 * KiB / mc.physical_cap(share, 64 * KiB) == pytest.approx(0.889, abs=0.001)  # what a cap = share held
    for payload in (4 * KiB, 64 * KiB, 1 * MiB - 128, 16 * MiB - 128, 28 * MiB, 1000):
        values = -(-share // payload)
        on_disk = -(-(payload + len("kv1/tracebench/123456789")) // 4096) * 4096 + 4096
        assert mc.physical_cap(share, payload) >= values * on_disk >= share


def test_setup_arguments_dedicated_owner(tmp_path):
    buf = 512 * MiB
    owner, bench = mc.plan_clients(spec("dedicated_owner", True, procs=4), tmp_path, PORTS, buf)
    assert owner["args"] == ["127.0.0.1", "http://127.0.0.1:18080/metadata", 2 * GiB, buf, "tcp", "", "127.0.0.1:15051"]
    d = str(tmp_path / "ssd-owner-0")
    assert owner["kwargs"] == {"enable_ssd_offload": True, "ssd_offload_path": d}
    # the flash share where the bucket backend obeys it (BUCKET_MAX_*), not only TOTAL_SIZE_LIMIT
    assert owner["env"] == {"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(16 * GiB), "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": d,
                            "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(16 * GiB),
                            # the share's files on disk: 16387 values of 1 MiB - 128 B (rounded up), each a .bucket
                            # of one 1 MiB (value and key) and a .meta of one 4 KiB block
                            "MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES": str(16387 * (1 * MiB + 4 * KiB)),
                            # no proactive eviction at 90 % of the share down to 80 %
                            "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION": "false",
                            # the flash holder writes one value per bucket, on a 1 s heartbeat (issue 14 item 5)
                            "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "1", "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES": str(1 * MiB - 128),
                            "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1", "MC_TCP_ENABLE_CONNECTION_POOL": "1", **CLEARED}
    assert len(bench) == 4
    for i, b in enumerate(bench):  # requesters only: no segment, no flash, but the TCP connection pool
        assert b["args"] == ["127.0.0.1", "http://127.0.0.1:18080/metadata", 0, buf, "tcp", "", "127.0.0.1:15051"]
        assert b["kwargs"] == {} and b["env"] == POOL and b["ssd_dir"] is None and b["index"] == i
    owner, bench = mc.plan_clients(spec("dedicated_owner", False, procs=2), tmp_path, PORTS, buf)
    assert owner["args"][2] == 2 * GiB and owner["kwargs"] == {} and owner["env"] == POOL and owner["ssd_bytes"] == 0
    assert [b["args"][2] for b in bench] == [0, 0]


def test_setup_arguments_default_offload_variant(tmp_path):
    """``mooncake-default-offload``: the dedicated_owner topology with Mooncake's own bucket
    settings: the three offload variables are removed (None), the pool stays."""
    buf = 512 * MiB
    owner, bench = mc.plan_clients(spec(mc.DEFAULT_OFFLOAD, True, procs=2), tmp_path, PORTS, buf)
    d = str(tmp_path / "ssd-owner-0")
    assert owner["args"][2] == 2 * GiB and owner["kwargs"] == {"enable_ssd_offload": True, "ssd_offload_path": d}
    # the flash share where the bucket backend obeys it (BUCKET_MAX_*), not only TOTAL_SIZE_LIMIT
    phys = str(mc.physical_cap(16 * GiB, 1 * MiB - 128))
    assert owner["env"] == {"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(16 * GiB), "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": d,
                            "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(16 * GiB),
                            "MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES": phys,
                            "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION": "false",  # the share, as in the tuned variants
                            "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": None, "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES": None,
                            "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": None, "MC_TCP_ENABLE_CONNECTION_POOL": "1", **CLEARED}
    assert [b["args"][2] for b in bench] == [0, 0] and all(b["env"] == POOL for b in bench)
    assert mc.topology(spec(mc.DEFAULT_OFFLOAD, True)) == "dedicated_owner"
    # applied to an environment that had them, they are gone; set values replace
    env = {"MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "7", "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1", "MC_TCP_ENABLE_CONNECTION_POOL": "0", "X": "y",
           "MC_STORE_LOCAL_HOT_CACHE_SIZE": str(GiB), "MOONCAKE_CONFIG_PATH": "/etc/mc.json"}
    mc.apply_env(owner["env"], env)
    assert env == {"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(16 * GiB), "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": d,
                   "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(16 * GiB), "MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES": phys,
                   "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION": "false", "MC_TCP_ENABLE_CONNECTION_POOL": "1", "X": "y"}
    # the bucket holds the value: its size limit follows the payload
    big, _ = mc.plan_clients(CaseSpec("mooncake", "dedicated_owner", True, "bytes", 16 * MiB - 128, 160, GiB, 8 * GiB, 1, 2), tmp_path, PORTS, buf)
    assert big["env"]["MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES"] == str(16 * MiB - 128)


def test_setup_arguments_per_process(tmp_path):
    buf = 256 * MiB
    owner, bench = mc.plan_clients(spec("per_process", True, procs=4), tmp_path, PORTS, buf)
    assert owner is None and len(bench) == 4
    assert [b["args"][2] for b in bench] == [512 * MiB] * 4
    assert [b["env"]["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"] for b in bench] == [str(4 * GiB)] * 4
    dirs = [b["kwargs"]["ssd_offload_path"] for b in bench]
    assert len(set(dirs)) == 4 and all(d.startswith(str(tmp_path)) for d in dirs)
    assert all(b["kwargs"]["enable_ssd_offload"] is True and b["args"][3] == buf for b in bench)
    # c2 / c4: one process holds everything, as the seed's 2 GiB + 16 GiB instance
    _, (one,) = mc.plan_clients(spec("per_process", True, procs=1), tmp_path, PORTS, buf)
    assert one["args"][2] == 2 * GiB and one["ssd_bytes"] == 16 * GiB
    _, bench = mc.plan_clients(spec("per_process", False, procs=2), tmp_path, PORTS, buf)
    assert [b["args"][2] for b in bench] == [GiB, GiB] and all(b["kwargs"] == {} and b["env"] == POOL for b in bench)
    _, bench = mc.plan_clients(spec("per_process", True, procs=2), tmp_path, PORTS, buf)
    for b in bench:  # every flash holder gets the bucket settings
        assert {k: b["env"][k] for k in BUCKET_VARS} == {BUCKET_VARS[0]: "1", BUCKET_VARS[1]: str(1 * MiB - 128), BUCKET_VARS[2]: "1"}
    with pytest.raises(ValueError):
        mc.plan_clients(spec(mc.DEFAULT_OFFLOAD + "x", True), tmp_path, PORTS, buf)
    with pytest.raises(ValueError):
        mc.plan_clients(spec("sideways", False), tmp_path, PORTS, buf)


# -- attribution arithmetic ------------------------------------------------------------------------


def test_counter_attribution_as_the_adapter_samples_it():
    # per_process, 4 storage processes: one (start, end) pair each, increases summed
    a = attribute_counter(200, [(0, 10), (5, 25), (7, 7), (100, 130)])
    assert (a.memory, a.ssd, a.unknown, a.complete) == (140, 60, 0, True)
    # dedicated_owner: the owner (flat: it issues no gets) and two requesting benchmark processes
    b = attribute_counter(50, [(3, 3), (0, 20), (4, 9)])
    assert (b.memory, b.ssd, b.complete) == (25, 25, True)
    assert attribute_counter(10, [(0, 10)]).ssd == 10  # every hit from SSD is still consistent
    for samples, why in (([(0, 10), (30, 29)], "backwards"), ([(0, 8), (0, 3)], "exceeds"), ([(0, 1), (2, None)], "missing"), ([], "no counter")):
        r = attribute_counter(10, samples)
        assert not r.complete and r.unknown == 10 and r.memory == r.ssd == 0 and why in r.note


# -- puts ------------------------------------------------------------------------------------------


def scripted(*codes):
    calls = []
    it = iter(codes)

    def put(key, value):
        calls.append(key)
        return next(it)

    return put, calls


def test_put_retries_a_refusal_for_space_then_counts_it_failed():
    slept = []
    st = mc.PutStats()
    put, calls = scripted(-200, -200, 0)
    assert mc.put_with_retry(put, "k", b"v", 8, st, slept.append) == 2
    assert slept == [0.01, 0.02] and len(calls) == 3
    assert (st.ok, st.retried, st.retries, st.failed) == (1, 1, 2, 0)
    put, calls = scripted(*([-200] * 4))
    with pytest.raises(mc.PutError, match="NO_AVAILABLE_HANDLE"):
        mc.put_with_retry(put, "k2", b"v", 3, st, slept.append)
    assert len(calls) == 4 and (st.gave_up, st.failed, st.retries) == (1, 1, 5)
    slept.clear()
    put, calls = scripted(-900)  # any other error: no retry
    with pytest.raises(mc.PutError, match="RPC_FAIL"):
        mc.put_with_retry(put, "k3", b"v", 8, st, slept.append)
    assert slept == [] and st.failed == 2 and st.gave_up == 1
    put, _ = scripted(-705)  # already there (a read-through race): stored, not an error
    assert mc.put_with_retry(put, "k4", b"v", 8, st, slept.append) == 0 and st.existed == 1
    put, calls = scripted(-600)  # no room in the client's local buffer: failed at once, counted apart
    with pytest.raises(mc.PutError, match="INVALID_PARAMS"):
        mc.put_with_retry(put, "k5", b"v", 8, st, slept.append)
    assert len(calls) == 1 and st.local_full == 1 and st.failed == 3
    assert [mc.backoff_s(i) for i in range(8)] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5]


class ScriptedStore:
    """A stand-in for MooncakeDistributedStore in this process (no master)."""

    def __init__(self, data: dict, refusals: int = 0):
        self.data = dict(data)
        self.refusals = refusals

    def get(self, key):
        return self.data.get(key, b"")

    def get_buffer(self, key):
        v = self.data.get(key)
        return None if v is None else FakeHandle(v)

    def put(self, key, value):
        if self.refusals:
            self.refusals -= 1
            return -200
        self.data[key] = bytes(value)
        return 0


def test_thread_client_modes_and_bootstrap_stats(tmp_path, monkeypatch):
    monkeypatch.setattr(mc.time, "sleep", lambda s: None)
    store = ScriptedStore({"a": b"x" * 100}, refusals=2)
    t = mc.MooncakeThread(store, "bytes", "memory", 8)
    g = t.get("a")
    assert isinstance(g, BytesGot) and g.materialize() == b"x" * 100 and g.source == "memory"
    assert t.get("nope") is None  # empty bytes: a miss
    h = mc.MooncakeThread(store, "holder", None, 8)
    g = h.get("a")
    assert isinstance(g, mc.HandleGot) and len(g) == 100 and g.source is None
    assert g.materialize() == b"x" * 100 and g.host_pointer() == g.h.ptr()
    g.release()
    assert g.h is None and h.get("nope") is None
    path = str(tmp_path / "puts.json")
    boot = mc.MooncakeThread(store, "cuda", None, 8, path)
    boot.put("b", memoryview(b"yy"))
    boot.close()
    assert store.data["b"] == b"yy"
    assert json.loads(Path(path).read_text()) == {"ok": 1, "existed": 0, "local_full": 0, "retried": 1, "retries": 2, "gave_up": 0, "failed": 0}


# -- the fake Mooncake, and the skip path ----------------------------------------------------------


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """TEST FAKE mooncake.store on a temp path and a TEST FAKE mooncake_master binary."""
    py, master = fake_install(tmp_path)
    log = tmp_path / "fake-setup.jsonl"
    monkeypatch.setenv("FAKE_MOONCAKE_LOG", str(log))
    # in the harness's environment: the tuned variants override it, mooncake-default-offload removes it
    monkeypatch.setenv("MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", "3")
    monkeypatch.delenv("MC_TCP_ENABLE_CONNECTION_POOL", raising=False)
    monkeypatch.setattr(mc, "_probes", {})
    monkeypatch.setattr(mc, "_announced", set())
    # The tests' pools (64 KiB) are far below Mooncake's 16 MiB slab: both the adapter's check and
    # the fake's setup are lowered to the tests' sizes (test_segment_below_a_slab keeps the real one).
    monkeypatch.setattr(mc, "SEGMENT_MIN", 4 * KiB)
    monkeypatch.setenv("FAKE_MOONCAKE_SEGMENT_MIN", str(4 * KiB))
    return SimpleNamespace(pythonpath=py, master=master, log=log)


@pytest.fixture
def broken(tmp_path):
    """A mooncake package whose store fails to import (as a wheel missing its shared library)."""
    d = tmp_path / "brokenpy"
    (d / "mooncake").mkdir(parents=True)
    (d / "mooncake" / "__init__.py").write_text("")
    (d / "mooncake" / "store.py").write_text("raise ImportError('TEST FAKE: libtransfer_engine.so: cannot open shared object file')\n")
    return d


def opts_for(tmp_path, *extra):
    a = cli.build_parser().parse_args([
        "run", "--out", str(tmp_path / "out"), "--preset", "quick", "--backends", "mooncake", "--dram", "64KiB", "--payloads", "4KiB",
        "--warmup", "0.05", "--window", "0.3", "--work-dir", str(tmp_path), "--pace-scale", "0", "--settle-timeout", "3", *extra,
    ])
    return cli.resolve(a)


def test_unavailable_says_why_once(tmp_path, fake, broken, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    srv = mc.Server(opts_for(tmp_path, "--mooncake-pythonpath", str(broken)))
    r = srv.unavailable(spec("dedicated_owner", False))
    assert "no mooncake_master on PATH" in r and "mooncake.store not importable" in r and "libtransfer_engine.so" in r
    assert srv.unavailable(spec("per_process", True)) == r
    err = capsys.readouterr().err
    assert err.count("mooncake: SKIPPED on this machine") == 1 and "libtransfer_engine.so" in err
    # module importable, binary missing (given explicitly)
    srv = mc.Server(opts_for(tmp_path, "--mooncake-pythonpath", str(fake.pythonpath), "--mooncake-master", str(tmp_path / "nope" / "mooncake_master")))
    r = srv.unavailable(spec("per_process", False))
    assert "mooncake_master binary" in r and "nope" in r and "not importable" not in r
    # binary on PATH, module missing
    monkeypatch.setenv("PATH", str(fake.master.parent))
    srv = mc.Server(opts_for(tmp_path, "--mooncake-pythonpath", str(broken)))
    r = srv.unavailable(spec("per_process", False))
    assert "mooncake_master" not in r and "not importable" in r
    # both there
    srv = mc.Server(opts_for(tmp_path, "--mooncake-pythonpath", str(fake.pythonpath)))
    assert srv.unavailable(spec("dedicated_owner", True, mode="holder")) is None
    assert srv.info()["counter"] is True and srv.info()["ssd_offload"] is True


def test_cases_mooncake_cannot_set_up_are_unavailable(tmp_path, fake, monkeypatch):
    """A client's non-zero segment below one 16 MiB slab (setup() refuses it) and a value larger than
    the local buffer (every put and get goes through it) are reported unavailable, with the reason."""
    monkeypatch.setattr(mc, "SEGMENT_MIN", 16 * MiB)  # Mooncake's, not the fixture's
    srv = mc.Server(opts_for(tmp_path, "--mooncake-pythonpath", str(fake.pythonpath), "--mooncake-master", str(fake.master),
                             "--mooncake-local-buffer", "64MiB"))
    assert srv.unavailable(spec("dedicated_owner", False, dram=16 * MiB)) is None
    r = srv.unavailable(spec("dedicated_owner", False, dram=8 * MiB))
    assert "at least 16MiB" in r and "one 8MiB" in r, r
    assert "one 12MiB" in srv.unavailable(spec("per_process", False, procs=4, dram=48 * MiB))  # 12 MiB shares
    big = CaseSpec("mooncake", "dedicated_owner", False, "bytes", 128 * MiB, 4, GiB, 0, 1, 2)
    assert "local buffer" in srv.unavailable(big)


def test_fake_setup_refuses_what_mooncake_refuses(tmp_path, monkeypatch):
    """The fake's setup() (before it calls its master) refuses as upstream does: a segment below the
    slab, an SSD path that is not absolute."""
    from pressure.tests import fake_mooncake as fm

    monkeypatch.delenv("FAKE_MOONCAKE_SEGMENT_MIN", raising=False)
    args = ["127.0.0.1", "http://127.0.0.1:1/metadata"]
    tail = [0, "tcp", "", "127.0.0.1:1"]
    assert fm.MooncakeDistributedStore().setup(*args, 4 * MiB, *tail) == fm.INVALID_PARAMS
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    assert fm.MooncakeDistributedStore().setup(*args, 0, *tail, enable_ssd_offload=True, ssd_offload_path="rel") == fm.INVALID_PARAMS


def test_quick_run_skips_mooncake_and_goes_on(tmp_path, broken):
    """The harness's quick path with Mooncake absent: its cases are reported not run, with the
    reason, and the rest of the run (the in-process test fake backend) goes on."""
    env = {**os.environ, "PYTHONPATH": str(BENCH), "PRESSURE_EXTRA_BACKENDS": "fake=pressure.tests.fake_backend"}
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "pressure", "run", "--preset", "quick", "--backends", "fake,mooncake", "--out", str(out), "--dram", "64KiB",
         "--payloads", "4KiB", "--warmup", "0.05", "--window", "0.3", "--work-dir", str(tmp_path), "--no-chart",
         "--mooncake-master", str(tmp_path / "absent" / "mooncake_master"), "--mooncake-pythonpath", str(broken)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("mooncake: SKIPPED on this machine") == 1
    recs = [json.loads(x) for x in (out / "summary.jsonl").read_text().splitlines()]
    moon = [r for r in recs if r["backend"] == "mooncake"]
    assert sorted((r["variant"], r["ssd"]) for r in moon) == [("dedicated_owner", False), ("dedicated_owner", True),
                                                               (mc.DEFAULT_OFFLOAD, True), ("per_process", False), ("per_process", True)]
    for r in moon:
        assert r["status"] == "unavailable" and "mooncake_master" in r["reason"] and "not importable" in r["reason"]
    assert [r["status"] for r in recs if r["backend"] == "fake"] == ["ok", "ok"]
    notes = not_run_notes(recs)
    assert len(notes) == 1 and "not run (5 cases)" in notes[0] and "mooncake/per_process SSD on bytes" in notes[0]
    assert "UNAVAILABLE" in p.stdout  # the table
    assert list(tmp_path.glob("fkp-*")) == []


# -- the adapter end to end, on the fake -----------------------------------------------------------


def our_processes(marker: str) -> list[str]:
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


def fake_log(log: Path, kind: str) -> list[dict]:
    return [r for r in (json.loads(x) for x in log.read_text().splitlines()) if r["kind"] == kind] if log.exists() else []


def setup_calls(log: Path) -> list[dict]:
    return fake_log(log, "setup")


def test_both_topologies_on_the_fake(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_MOONCAKE_REFUSE_PUTS", "3")  # each master refuses its first 3 puts: retried
    # the caller's shell: a local hot cache, a config file; no Mooncake process of the case may see them
    monkeypatch.setenv("MC_STORE_LOCAL_HOT_CACHE_SIZE", str(GiB))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(tmp_path / "mooncake.json"))
    opts = opts_for(tmp_path, "--mooncake-master", str(fake.master), "--mooncake-pythonpath", str(fake.pythonpath))
    cases = [
        Case("mooncake", False, "bytes", "none", "random", PAYLOAD, 1, 2, "dedicated_owner"),
        Case("mooncake", True, "holder", "none", "random", PAYLOAD, 1, 2, "dedicated_owner"),
        Case("mooncake", True, "bytes", "none", "random", PAYLOAD, 2, 1, "per_process"),
        Case("mooncake", False, "bytes", "put", "random", PAYLOAD, 1, 2, "per_process"),
    ]
    off, on, pp, rt = recs = harness.run(cases, opts)
    for r in recs:
        assert r["status"] == "ok" and r["complete"] and r["errors"] == 0, r
        assert r["bootstrap"]["puts"] == 20 and r["bootstrap"]["failed"] == 0
        assert r["server"]["bootstrap_puts"]["retried"] == 1 and any("refused for space" in n for n in r["notes"])
        assert not any("servers exited" in n for n in r["notes"])  # the fake master dies of SIGTERM: a clean stop
    assert off["source_method"] == "per-get" and off["memory_hits"] == off["hits"] > 0 and 0 < off["hit_rate"] < 1
    assert "--enable_offload=true" not in off["server"]["cmd"] and "--default_kv_lease_ttl=500" in off["server"]["cmd"]
    assert off["client"]["native_type"] == "bytes" and off["client"]["global_segment_size"] == 0
    assert off["server"]["master_total_capacity_bytes"] == DRAM and off["server"]["storage_processes"] == 1
    assert on["source_method"] == "counter" and on["hit_rate"] == 1.0 and on["ssd_hits"] > 0
    assert on["memory_hits"] + on["ssd_hits"] == on["hits"] and on["client"]["native_type"] == "BufferHandle"
    assert on["server"]["cmd"].endswith("--enable_offload=true") and on["server"]["ssd_limit_bytes"] == [8 * DRAM]
    assert pp["hit_rate"] == 1.0 and pp["ssd_hits"] > 0 and pp["memory_hits"] + pp["ssd_hits"] == pp["hits"]
    assert pp["server"]["segment_bytes"] == [DRAM // 2] * 2 and pp["server"]["ssd_limit_bytes"] == [4 * DRAM] * 2
    assert rt["read_through"]["puts"] > 0 and rt["hit_rate"] > off["hit_rate"] - 0.2

    calls = setup_calls(fake.log)
    by_case = [calls[0:2], calls[2:4], calls[4:6], calls[6:7]]  # owner + 1 benchmark process, ..., 2 per-process, 1
    assert len(calls) == 7
    owner, req = by_case[0]
    assert owner["args"][2] == DRAM and not owner["enable_ssd_offload"] and req["args"][2] == 0
    owner, req = by_case[1]
    assert owner["args"][2] == DRAM and owner["enable_ssd_offload"] and owner["ssd_limit_env"] == str(8 * DRAM)
    assert req["args"][2] == 0 and not req["enable_ssd_offload"]
    assert all(c["args"][4] == "tcp" and c["args"][6].startswith("127.0.0.1:") and c["args"][3] == 512 * MiB for c in calls)
    a, b = by_case[2]
    assert a["args"][2] == b["args"][2] == DRAM // 2 and a["ssd_limit_env"] == b["ssd_limit_env"] == str(4 * DRAM)
    assert a["ssd_offload_path"] != b["ssd_offload_path"]
    # the TCP connection pool in every Mooncake process: each client at setup() and each master
    assert all(c["env"].get("MC_TCP_ENABLE_CONNECTION_POOL") == "1" for c in calls)
    masters = fake_log(fake.log, "master")
    assert len(masters) == 4 and all(m["env"].get("MC_TCP_ENABLE_CONNECTION_POOL") == "1" for m in masters)
    # the caller's variables that change Mooncake's results reach no Mooncake process, and are recorded as removed
    assert not any(k in c["env"] for c in calls + masters for k in CLEARED), [c["env"] for c in calls + masters]
    for r in recs:
        assert all(r["client"]["env_at_setup"][k] is None for k in CLEARED) and r["server"]["master_env"] == POOL
    assert all(on["server"]["owner_env_at_setup"][k] is None for k in CLEARED)
    # flash kept to the share, not 80-90 % of it: no proactive disk watermark eviction where the flash is
    for c in calls:
        assert c["env"].get("MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION") == ("false" if c["enable_ssd_offload"] else None), c
    assert on["server"]["owner_env_at_setup"]["MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION"] == "false"
    assert "--eviction_ratio=0.01" in off["server"]["cmd"] and on["server"]["offload_on_evict"] is False
    # the bucket settings only where the flash is, as the summary says
    for c in calls:
        want = {BUCKET_VARS[0]: "1", BUCKET_VARS[1]: str(PAYLOAD), BUCKET_VARS[2]: "1"} if c["enable_ssd_offload"] else \
            {BUCKET_VARS[2]: "3"}  # a requester / SSD off keeps the harness's environment
        assert {k: c["env"][k] for k in BUCKET_VARS if k in c["env"]} == want, c
    assert on["server"]["offload"] == "bucket-per-value" and on["server"]["offload_heartbeat_s"] == 1 and on["server"]["ssd_files_bytes"] > 0
    assert on["server"]["owner_env_at_setup"][BUCKET_VARS[0]] == "1" and on["server"]["master_env"] == POOL
    assert on["client"]["env_at_setup"]["MC_TCP_ENABLE_CONNECTION_POOL"] == "1" and on["client"]["env_at_setup"][BUCKET_VARS[0]] is None
    assert off["server"]["offload"] is None and off["server"]["owner_env_at_setup"]["MC_TCP_ENABLE_CONNECTION_POOL"] == "1"
    assert pp["client"]["env_at_setup"][BUCKET_VARS[1]] == str(PAYLOAD) and pp["server"]["client_env"][0][BUCKET_VARS[0]] == "1"
    assert our_processes(str(tmp_path / "fkp-")) == [] and our_processes(str(fake.master)) == [] and our_processes(str(FAKE)) == []
    assert list(tmp_path.glob("fkp-*")) == []


def test_default_offload_variant_against_the_tuned_one_on_the_fake(tmp_path, fake, monkeypatch):
    """The fake writes buckets as Mooncake's bucket backend does: with the adapter's settings each
    evicted value reaches its disk (all hits, SSD hits counted); with Mooncake's defaults, which the
    default variant restores even over the harness's environment, nothing does (as the live run)."""
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "1")  # must not leak into the default variant
    opts = opts_for(tmp_path, "--mooncake-master", str(fake.master), "--mooncake-pythonpath", str(fake.pythonpath))
    tuned, default = harness.run([Case("mooncake", True, "bytes", "none", "random", PAYLOAD, 1, 2, "dedicated_owner"),
                                  Case("mooncake", True, "bytes", "none", "random", PAYLOAD, 1, 2, mc.DEFAULT_OFFLOAD)], opts)
    for r in (tuned, default):
        assert r["status"] == "ok" and r["complete"] and r["errors"] == 0 and r["bootstrap"]["failed"] == 0, r
        assert r["server"]["topology"] == "dedicated_owner" and r["client"]["global_segment_size"] == 0
        assert r["server"]["master_env"] == POOL and r["server"]["requester_env"] == [POOL]
    assert tuned["hit_rate"] == 1.0 and tuned["ssd_hits"] > 0 and tuned["server"]["ssd_files_bytes"] > 0
    assert default["variant"] == mc.DEFAULT_OFFLOAD and default["ssd_hits"] == 0 and default["hit_rate"] < 1.0
    assert default["server"]["ssd_files_bytes"] == 0 and default["server"]["offload"] == "mooncake-default"
    assert default["server"]["offload_heartbeat_s"] == 10 and any("mooncake-default-offload" in n for n in default["notes"])
    assert not any("mooncake-default-offload" in n for n in tuned["notes"])
    seen = default["server"]["owner_env_at_setup"]
    assert seen["MC_TCP_ENABLE_CONNECTION_POOL"] == "1" and all(seen[k] is None for k in BUCKET_VARS), seen
    assert tuned["server"]["owner_env_at_setup"][BUCKET_VARS[2]] == "1"
    owner_tuned, req_tuned, owner_default, req_default = setup_calls(fake.log)
    assert owner_tuned["enable_ssd_offload"] and owner_default["enable_ssd_offload"]
    assert {k: owner_tuned["env"].get(k) for k in BUCKET_VARS} == {BUCKET_VARS[0]: "1", BUCKET_VARS[1]: str(PAYLOAD), BUCKET_VARS[2]: "1"}
    assert not any(k in owner_default["env"] for k in BUCKET_VARS), owner_default["env"]
    for c in (owner_tuned, req_tuned, owner_default, req_default):
        assert c["env"]["MC_TCP_ENABLE_CONNECTION_POOL"] == "1"
    assert [m["env"].get("MC_TCP_ENABLE_CONNECTION_POOL") for m in fake_log(fake.log, "master")] == ["1", "1"]


@pytest.mark.parametrize("mode,why", [("backwards", "backwards"), ("inflate", "exceeds")])
def test_a_bad_counter_makes_the_case_incomplete(tmp_path, fake, monkeypatch, mode, why):
    monkeypatch.setenv("FAKE_MOONCAKE_COUNTER", mode)
    opts = opts_for(tmp_path, "--mooncake-master", str(fake.master), "--mooncake-pythonpath", str(fake.pythonpath))
    (r,) = harness.run([Case("mooncake", True, "bytes", "none", "random", PAYLOAD, 1, 2, "per_process")], opts)
    assert r["status"] == "incomplete" and not r["complete"], r
    assert r["unknown_hits"] == r["hits"] > 0 and r["memory_hits"] == r["ssd_hits"] == 0
    assert any(why in n for n in r["notes"])


@pytest.mark.parametrize("who", ["owner", "bench"])
def test_a_failed_setup_fails_the_case_and_stops_everything(tmp_path, fake, monkeypatch, who):
    monkeypatch.setenv("FAKE_MOONCAKE_FAIL_SETUP", who)  # the owner's / a benchmark process's setup() returns -1
    opts = opts_for(tmp_path, "--mooncake-master", str(fake.master), "--mooncake-pythonpath", str(fake.pythonpath))
    (r,) = harness.run([Case("mooncake", True, "bytes", "none", "random", PAYLOAD, 1, 2, "dedicated_owner")], opts)
    assert r["status"] == "failed" and "returned -1 (INTERNAL_ERROR)" in r["reason"], r
    assert ("mooncake-owner exited" in r["reason"]) == (who == "owner")
    assert our_processes(str(tmp_path / "fkp-")) == [] and our_processes(str(fake.master)) == [] and our_processes(str(FAKE)) == []
    assert list(tmp_path.glob("fkp-*")) == []


def test_ctrl_c_stops_the_master_and_the_owner(tmp_path, fake):
    # A subprocess: the fixture's lowered segment check does not reach its adapter, so the owner gets
    # one whole 16 MiB slab.
    env = {**os.environ, "PYTHONPATH": str(BENCH)}
    p = subprocess.Popen(
        [sys.executable, "-m", "pressure", "run", "--preset", "quick", "--backends", "mooncake", "--out", str(tmp_path / "out"), "--dram", "16MiB",
         "--payloads", "64KiB", "--warmup", "0.2", "--window", "30", "--work-dir", str(tmp_path), "--no-chart", "--pace-scale", "0",
         "--mooncake-master", str(fake.master), "--mooncake-pythonpath", str(fake.pythonpath)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("pressure.backends.mooncake owner" in x for x in our_processes(str(tmp_path / "fkp-"))):
            time.sleep(0.05)
        live = our_processes(str(tmp_path / "fkp-")) + our_processes(str(fake.master))
        assert any("pressure.backends.mooncake owner" in x for x in live) and any("mooncake_master" in x for x in live), live
        time.sleep(1.5)  # workers connected, bootstrap done (no pacing): inside the 30 s window
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "interrupted" in out, out
    assert our_processes(str(tmp_path / "fkp-")) == [] and our_processes(str(fake.master)) == [] and our_processes(str(FAKE)) == []
    assert list(tmp_path.glob("fkp-*")) == []


# -- matrix and flags ------------------------------------------------------------------------------


def test_matrix_runs_both_topologies_and_the_default_offload_with_ssd_on():
    full = cross(["fluxkv", "mooncake"], [False, True], ["holder"], ["none"], ["random"], [1], [(1, 2)])
    assert [(c.backend, c.variant, c.ssd) for c in full] == [
        ("fluxkv", None, False), ("fluxkv", None, True),
        ("mooncake", "dedicated_owner", False), ("mooncake", "dedicated_owner", True),
        ("mooncake", "per_process", False), ("mooncake", "per_process", True),
        ("mooncake", "mooncake-default-offload", True),  # SSD off it would be dedicated_owner again
    ]
    assert [c.variant for c in cross(["mooncake"], [False], ["bytes"], ["none"], ["random"], [1], [(1, 2)])] == ["dedicated_owner", "per_process"]
    q = quick(["fluxkv", "mooncake"], 1000, (1, 2), "random")
    assert [(c.variant, c.ssd, c.mode) for c in q if c.backend == "mooncake"] == [
        ("dedicated_owner", False, "bytes"), ("dedicated_owner", True, "bytes"), ("per_process", False, "bytes"), ("per_process", True, "bytes"),
        ("mooncake-default-offload", True, "bytes")]


def test_flags(tmp_path):
    a = opts_for(tmp_path)
    assert a.mooncake_master is None and a.mooncake_pythonpath is None and a.mooncake_local_buffer == "512MiB" and a.mooncake_put_retries == 8
    assert a.mooncake_offload_on_evict is False and mc.Server(a).offload_on_evict is False and mc.Server(a).lease_ttl_ms == 500
    assert mc.Server(opts_for(tmp_path, "--mooncake-offload-on-evict")).offload_on_evict is True
    d = cli.resolve(cli.build_parser().parse_args(["run", "--out", str(tmp_path), "--work-dir", str(tmp_path)]))
    assert "mooncake" in d.backend_list
    s = mc.Server(opts_for(tmp_path, "--mooncake-local-buffer", "256MiB", "--mooncake-put-retries", "2", "--mooncake-pythonpath", "rel"))
    assert s.local_buffer == 256 * MiB and s.put_retries == 2 and s.pythonpath == (str(Path("rel").resolve()),)
