"""The chart on synthetic records: the full matrix shape, incomplete and unavailable cases."""

import itertools

from pressure.chart import render, series_key
from pressure.harness import SCHEMA
from pressure.sizes import parse_size


def rec(backend, ssd, mode, payload, procs, threads, **kw):
    r = {k: None for k in SCHEMA}
    r.update(backend=backend, variant=None, ssd=ssd, mode=mode, on_miss="none", order="random", payload_bytes=payload, procs=procs,
             threads=threads, concurrency=f"c{procs * threads}", status="ok", complete=True, hits=1000, misses=100, errors=0,
             hit_rate=1000 / 1100, memory_hits=700 if ssd else 1000, ssd_hits=300 if ssd else 0, unknown_hits=0,
             hit_gib_s=2.0, memory_gib_s=1.4 if ssd else 2.0, ssd_gib_s=0.6 if ssd else 0.0, keys=2560,
             dataset_bytes=2560 * payload, dram_bytes=2 << 30, ssd_bytes=(16 << 30) if ssd else 0, warmup_s=5, window_s=30, zipf_theta=0.99)
    r.update(kw)
    return r


def test_full_matrix_chart(tmp_path):
    payloads = [parse_size(p) for p in ("1MiB-128", "4MiB-128", "8MiB-128", "16MiB-128")]
    records = []
    for p, (procs, threads), mode, b, ssd in itertools.product(payloads, [(1, 2), (1, 4), (2, 4), (4, 4)], ["holder", "bytes"],
                                                               ["fluxkv", "memcached", "redis"], [False, True]):
        if b == "redis" and ssd:
            records.append(rec(b, ssd, mode, p, procs, threads, status="unavailable", complete=False, hits=None, hit_rate=None,
                               hit_gib_s=None, reason="redis has no flash tier"))
        elif b == "memcached" and ssd and mode == "holder" and procs == 4:
            records.append(rec(b, ssd, mode, p, procs, threads, complete=False, status="incomplete", memory_hits=0, ssd_hits=0, unknown_hits=1000))
        else:
            records.append(rec(b, ssd, mode, p, procs, threads))
    out = render(records, tmp_path / "full.png", "synthetic")
    assert out.stat().st_size > 20000


def test_single_panel_chart_and_bar_order(tmp_path):
    p = parse_size("1MiB-128")
    records = [rec("redis", False, "bytes", p, 1, 2), rec("fluxkv", True, "bytes", p, 1, 2), rec("fluxkv", False, "bytes", p, 1, 2),
               rec("memcached", True, "bytes", p, 1, 2, status="failed", complete=False, reason="boom")]
    order = [series_key(r)[1:] for r in sorted(records, key=series_key)]
    assert order == [("fluxkv", "", False), ("fluxkv", "", True), ("memcached", "", True), ("redis", "", False)]
    assert render(records, tmp_path / "one.png").stat().st_size > 5000
