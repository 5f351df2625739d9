"""The harness end to end on the TEST FAKE backend (tests/fake_backend.py): worker processes,
protocol, bootstrap, window, attribution, summary.jsonl, chart; no servers."""

import json
import math

import pytest

from pressure import cli, harness
from pressure.matrix import Case, cross, quick
from pressure.sizes import KiB
from pressure.workload import bootstrap_order, expected_hit_rate

REQUIRED = {
    "backend": str, "ssd": bool, "mode": str, "on_miss": str, "order": str, "payload_bytes": int, "procs": int, "threads": int,
    "hits": int, "misses": int, "errors": int, "hit_rate": float, "memory_hits": int, "ssd_hits": int, "hit_gib_s": float,
    "p50_us": float, "p95_us": float, "p99_us": float, "complete": bool,
}
PAYLOAD = 4 * KiB


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("PRESSURE_EXTRA_BACKENDS", "fake=pressure.tests.fake_backend")


def opts_for(tmp_path, *extra):
    a = cli.build_parser().parse_args([
        "run", "--out", str(tmp_path / "out"), "--preset", "quick", "--backends", "fake", "--dram", "64KiB",
        "--payloads", "4KiB", "--warmup", "0.05", "--window", "0.3", "--work-dir", str(tmp_path), *extra,
    ])
    return cli.resolve(a)


def hit_rate_tolerance(p: float, gets: int) -> float:
    """How far a measured hit rate may stray from p after ``gets`` Zipf gets: 0.08, or 4 standard
    deviations of the binomial when the window held few gets (a busy machine runs fewer in the
    same seconds), so the check depends on the operations counted, not on the machine's speed."""
    assert gets > 0, "no get in the window"
    return max(0.08, 4 * math.sqrt(p * (1 - p) / gets))


def check_schema(r):
    for k, t in REQUIRED.items():
        assert k in r, k
        if r["status"] in ("ok", "incomplete"):
            assert isinstance(r[k], t) or (t is float and isinstance(r[k], int)), (k, r[k])
    assert r["on_miss"] in ("none", "put")
    if r["hit_rate"] is not None:
        assert 0.0 <= r["hit_rate"] <= 1.0
    assert set(harness.SCHEMA) <= set(r)


def test_fake_matrix_end_to_end(fake, tmp_path):
    opts = opts_for(tmp_path)
    cases = [Case("fake", ssd, mode, om, "random", PAYLOAD, 1, 2) for ssd, mode, om in
             ((False, "bytes", "none"), (True, "bytes", "none"), (False, "holder", "none"), (False, "bytes", "put"))]
    cases.append(Case("fake", False, "bytes", "none", "random", PAYLOAD, 2, 1))
    records = harness.run(cases, opts)
    lines = [json.loads(x) for x in (tmp_path / "out" / "summary.jsonl").read_text().splitlines()]
    assert [r["status"] for r in lines] == [r["status"] for r in records]
    for r in lines:
        check_schema(r)
    by = {(r["ssd"], r["mode"], r["on_miss"], r["procs"]): r for r in lines}
    keys = 20  # 1.25 x 64 KiB of 4 KiB values
    resident = bootstrap_order(keys, "random", 1)[-16:]  # the fake's LRU keeps the last 16 puts
    off = by[(False, "bytes", "none", 1)]
    assert off["status"] == "ok" and off["complete"] and off["errors"] == 0 and off["keys"] == keys
    want = expected_hit_rate(keys, resident)
    assert off["hit_rate"] == pytest.approx(want, abs=hit_rate_tolerance(want, off["hits"] + off["misses"]))
    assert off["ssd_hits"] == 0 and off["memory_hits"] == off["hits"] > 0
    on = by[(True, "bytes", "none", 1)]
    assert on["hit_rate"] == 1.0 and on["ssd_hits"] > 0 and on["memory_hits"] + on["ssd_hits"] == on["hits"]
    assert on["bootstrap"]["puts"] == keys and on["bootstrap"]["failed"] == 0
    holder = by[(False, "holder", "none", 1)]
    assert holder["complete"] and holder["client"]["native_type"] == "bytes (test fake)"
    rt = by[(False, "bytes", "put", 1)]
    assert rt["hit_rate"] > off["hit_rate"] and rt["read_through"]["puts"] > 0
    assert by[(False, "bytes", "none", 2)]["status"] == "unavailable"
    assert list(tmp_path.glob("fkp-*")) == []  # temp dirs removed
    from pressure.chart import render

    png = render(lines, tmp_path / "out" / "pressure.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_counter_attribution_from_worker_samples(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SOURCE_COUNTER", "1")
    opts = opts_for(tmp_path)
    (r,) = harness.run([Case("fake", True, "bytes", "none", "random", PAYLOAD, 1, 2)], opts)
    assert r["source_method"] == "counter" and r["complete"], r
    assert r["ssd_hits"] > 0 and r["memory_hits"] + r["ssd_hits"] == r["hits"]


def test_cuda_cases_skip_cleanly_without_a_gpu(fake, tmp_path):
    opts = opts_for(tmp_path)
    ctx = harness.Context(opts)
    if ctx.cuda().get("available"):
        pytest.skip("this machine has a GPU")
    r = harness.run_case(Case("fake", False, "cuda", "none", "random", PAYLOAD, 1, 2), ctx)
    assert r["status"] == "unavailable" and "cuda" in r["reason"]
    check_schema(r)


def test_matrices():
    full = cross(["fluxkv", "memcached", "redis"], [False, True], ["holder", "bytes", "cuda"], ["none"], ["random"],
                 [1, 2, 3, 4], [(1, 2), (1, 4), (2, 4), (4, 4)])
    assert len(full) == 3 * 2 * 3 * 4 * 4
    assert len(set(full)) == len(full)
    q = quick(["fluxkv", "memcached", "redis"], 1000, (1, 2), "random")
    kinds = [(c.backend, c.ssd, c.mode, c.on_miss) for c in q]
    assert kinds == [
        ("fluxkv", False, "bytes", "none"), ("fluxkv", True, "bytes", "none"),
        ("memcached", False, "bytes", "none"), ("memcached", True, "bytes", "none"),
        ("redis", False, "bytes", "none"), ("redis", True, "bytes", "none"),
        ("fluxkv", False, "holder", "none"), ("fluxkv", True, "holder", "none"),
        ("fluxkv", False, "bytes", "put"),
    ]


def test_cli_sizes_keep_the_seed_ratios(tmp_path):
    a = cli.resolve(cli.build_parser().parse_args(["run", "--out", str(tmp_path), "--work-dir", str(tmp_path)]))
    assert (a.dram, a.ssd_size, a.dataset) == (2 << 30, 16 << 30, int(2.5 * (1 << 30)))
    assert a.worker_list == [(1, 2), (1, 4), (2, 4), (4, 4)] and a.mode_list == ["holder", "bytes", "cuda"]
    q = cli.resolve(cli.build_parser().parse_args(["run", "--preset", "quick", "--out", str(tmp_path), "--work-dir", str(tmp_path), "--dram", "1GiB"]))
    assert (q.dram, q.ssd_size, q.dataset) == (1 << 30, 8 << 30, int(1.25 * (1 << 30)))
    with pytest.raises(SystemExit):
        cli.resolve(cli.build_parser().parse_args(["run", "--out", str(tmp_path), "--work-dir", str(tmp_path), "--modes", "gpu"]))


def test_errors_are_no_hits_in_the_hit_rate():
    """A get that failed counts in the hit rate's denominator: 10 hits and 990 errors are a 1 %
    hit rate, not 100 % (errors were left out, while a backend that answers a failure as a miss,
    as Mooncake's binding does, lost them)."""
    from types import SimpleNamespace

    from pressure.stats import Tally

    case = Case("fluxkv", False, "bytes", "none", "random", 1 << 20, 1, 2)
    opts = SimpleNamespace(dram=1, ssd_size=1, warmup=1, window=1, zipf_theta=0.99, seed=1)
    t = Tally()
    for _ in range(10):
        t.hit("memory", 0.001)
    for _ in range(990):
        t.error("injected")
    rec = harness.base_record(case, opts, 10)
    harness.account(rec, case, SimpleNamespace(source_method="per-get"), [{"tally": t.to_json()}], [], 0, 1.0)
    assert rec["errors"] == 990 and rec["hit_rate"] == pytest.approx(0.01)


def test_a_case_whose_server_died_fails():
    """A server that exited during the case fails it, though its workers' counts look like a
    run (a review: the case was reported ok, a dead owner's failed gets a low hit rate)."""
    from types import SimpleNamespace

    from pressure.procs import Group
    from pressure.stats import Tally

    case = Case("fluxkv", False, "bytes", "none", "random", 1 << 20, 1, 2)
    opts = SimpleNamespace(dram=1, ssd_size=1, warmup=1, window=1, zipf_theta=0.99, seed=1)
    rec = harness.base_record(case, opts, 10)
    g = Group()
    g.start("memcached", ["sh", "-c", "exit 3"], None)
    g.procs[0].p.wait()
    harness.stop_servers(SimpleNamespace(stop=lambda: None), g, rec)
    assert rec["servers_died"] == ["memcached"]
    t = Tally()
    t.hit("memory", 0.001)
    harness.account(rec, case, SimpleNamespace(source_method="per-get"), [{"tally": t.to_json()}], [], 0, 1.0)
    assert rec["status"] == "failed" and "memcached died" in rec["reason"], rec
