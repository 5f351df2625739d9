"""The cluster benchmark (python3 -m pressure cluster): its logic on synthetic data, and one
end-to-end run against the real binary (3 owners of 16 MiB, one with SSD; tiny windows): the
remote paths, whose rows must show every hit remote; the mixed path differs only in its topology
(tested above) and is left to the benchmark itself, to keep this under 30 s on 2 busy cores."""

import dataclasses
import json
import os
from pathlib import Path

import pytest

from pressure import cli, cluster
from pressure.backends import fluxkv as fx
from pressure.chart import cluster_series, render_cluster
from pressure.stats import PLACES, Tally, split_all_remote, split_by_place

from .test_mooncake import fake  # noqa: F401  (the TEST FAKE Mooncake fixture)
from .test_servers import FLUXKV_BIN, need, our_processes

REPO = Path(__file__).resolve().parents[3]
MiB = 1 << 20


def parse(tmp_path, *extra):
    a = cli.build_parser().parse_args(["cluster", "--out", str(tmp_path / "out"), "--work-dir", str(tmp_path), *extra])
    return cluster.resolve(a)


# -- logic -----------------------------------------------------------------------------------------


def test_split_by_place_adds_up_or_says_why():
    ok = split_by_place(10, {"memory_local": 3, "memory_remote": 4, "ssd_remote": 3})
    assert ok.complete and ok.fields() == {"memory_local_hits": 3, "memory_remote_hits": 4, "ssd_local_hits": 0, "ssd_remote_hits": 3}
    short = split_by_place(10, {"memory_local": 9})
    assert not short.complete and set(short.fields().values()) == {None} and "do not add up" in short.note
    odd = split_by_place(2, {"memory_local": 1, "unknown_remote": 1})
    assert not odd.complete
    assert split_all_remote(5, 3, 2, 0).fields() == {"memory_local_hits": 0, "memory_remote_hits": 3, "ssd_local_hits": 0, "ssd_remote_hits": 2}
    assert not split_all_remote(5, 0, 0, 5).complete


def test_tally_counts_places_and_roundtrips():
    t = Tally()
    t.hit("memory", 0.001, True)
    t.hit("ssd", 0.002, False)
    t.hit("memory", 0.001)  # a backend that does not say: no place
    u = Tally.from_json(json.loads(json.dumps(t.to_json())))
    assert u.by_place == {"memory_remote": 1, "ssd_local": 1} and u.hits == 3
    u.merge(t)
    assert u.by_place == {"memory_remote": 2, "ssd_local": 2}


def test_quick_preset_matrix_and_topologies(tmp_path):
    o = parse(tmp_path)
    assert (o.owners, o.ssd_owners, o.owner_dram, o.worker_list) == (3, 1, 128 * MiB, [(2, 1)])
    assert o.payload_list == [MiB - 128, 16 * MiB - 128] and o.ssd_size == 8 * 3 * 128 * MiB
    cases = cluster.cases_for(o)
    assert cases[0] == cluster.TcpRaw(MiB - 128, 2, 1) and cluster.TcpRaw(MiB - 128, 2, 1, again=True) in cases
    flux = [(c.path, c.ssd, c.on_miss, c.mode) for c in cases if not isinstance(c, cluster.TcpRaw) and c.backend == "fluxkv" and c.payload_bytes == MiB - 128]
    assert flux == [("mixed", False, "none", "bytes"), ("mixed", True, "none", "bytes"), ("mixed", False, "put", "bytes"),
                    ("remote-memory", False, "none", "holder"), ("remote-ssd", True, "none", "holder")]
    moon = [(c.path, c.variant) for c in cases if not isinstance(c, cluster.TcpRaw) and c.backend == "mooncake"]
    # like for like: its own local hits on the mixed path (every process stores and requests)
    assert moon and {(p, v) for p, v in moon} == {("mixed", "per_process"), ("remote-memory", "dedicated_owner")}
    by = {c.path: cluster.topology_for(c, o) for c in cases if not isinstance(c, cluster.TcpRaw) and c.backend == "fluxkv"}
    assert by["mixed"].attach == (0, 1, 2) and by["mixed"].put_via == (0, 1, 2) and not by["mixed"].no_promotion
    # the mixed path's landing areas: twice the gets in flight through one owner (c2 over 3 owners: one)
    mixed = [c for c in cases if not isinstance(c, cluster.TcpRaw) and c.backend == "fluxkv" and c.path == "mixed"]
    assert all(cluster.topology_for(c, o).landing_bytes == 2 * c.payload_bytes for c in mixed) and by["remote-memory"].landing_bytes == 0
    c8 = dataclasses.replace(mixed[0], procs=4, threads=2)
    assert cluster.topology_for(c8, o).landing_bytes == 2 * 2 * 2 * (MiB - 128)  # 4 processes over 3 owners: 2 x 2 threads
    assert cluster.topology_for(c8, parse(tmp_path, "--fluxkv-landing", "0")).landing_bytes == 0
    assert cluster.topology_for(c8, parse(tmp_path, "--fluxkv-landing", "8MiB")).landing_bytes == 8 * MiB
    with pytest.raises(SystemExit, match="--fluxkv-landing"):
        parse(tmp_path, "--fluxkv-landing", "lots")
    rm = by["remote-memory"]  # put through an owner without SSD, read on the others, which hold no replica
    assert rm.put_via == (1,) and 1 not in rm.attach and rm.placement == "local" and rm.no_promotion and rm.cache_grace == "0"
    rs = by["remote-ssd"]  # read on the owners without SSD
    assert rs.ssd_owners == (0,) and rs.attach == (1, 2) and rs.put_via == (0, 1, 2) and rs.no_promotion and rs.cache_grace == "0"
    full = parse(tmp_path, "--preset", "full")
    assert full.worker_list == [(2, 1), (4, 1), (4, 2), (4, 4)] and len(full.payload_list) == 4 and full.path_modes["mixed"] == ["holder", "bytes"]
    assert cluster.mixed_kinds(full) == [(False, "none"), (True, "none"), (False, "put"), (True, "put")]


def test_persist_counts_from_status():
    st = {"members": [
        {"node_id": "o0", "ssd_persists": 30, "ssd_persists_dropped": 1, "ssd_persists_pending": 2, "ssd_unwritten": 4},
        {"node_id": "o1", "ssd_persists": 0, "ssd_persists_dropped": 0, "ssd_unwritten": 1},
        {"node_id": "o2"},
    ]}
    c = fx.persist_counts(st)
    assert (c["asked"], c["dropped"], c["pending"], c["unwritten"]) == (30, 1, 2, 5)
    assert c["by_member"]["o0"] == {"asked": 30, "dropped": 1, "pending": 2, "unwritten": 4}
    assert c["by_member"]["o2"] == {"asked": 0, "dropped": 0, "pending": 0, "unwritten": 0}


def test_pool_counts_from_status():
    st = {"keys": 9, "memory_values": 7, "memory_duplicate_bytes": 3 * MiB,
          "members": [{"memory_replicas": 6, "memory_segment": {"used_bytes": 6 * MiB}}, {"memory_replicas": 4}]}
    assert fx.pool_counts(st) == {"values": 7, "duplicate_bytes": 3 * MiB, "replicas": 10, "used_bytes": 6 * MiB, "keys": 9}
    assert fx.pool_counts({"members": []})["values"] is None  # a build that does not report them


def _row(backend, path, payload, gib, **kw):
    r = {k: None for k in cluster.SCHEMA}
    r.update(backend=backend, path=path, variant=None, ssd=kw.pop("ssd", path != "remote-memory"), mode=kw.pop("mode", "holder"), on_miss="none",
             payload_bytes=payload, procs=2 if backend != "tcp-raw" else 1, threads=1 if backend != "tcp-raw" else 2, concurrency="c2",
             status="ok", complete=True, hits=100, misses=0, errors=0, hit_rate=1.0, hit_gib_s=gib, memory_hits=100, ssd_hits=0, unknown_hits=0,
             memory_local_hits=10, memory_remote_hits=90, ssd_local_hits=0, ssd_remote_hits=0, owners=3, owner_dram_bytes=128 * MiB,
             dram_bytes=384 * MiB, ssd_bytes=3 << 30, dataset_bytes=480 * MiB, dropped_persists=0, zipf_theta=0.99, warmup_s=1, window_s=4,
             kind="baseline" if backend == "tcp-raw" else "measured")
    r.update(kw)
    return r


def test_ratios_goals_table_and_chart(tmp_path):
    big = 16 * MiB - 128
    rows = [
        _row("tcp-raw", None, big, 2.0, mode="raw"),
        _row("fluxkv", "remote-memory", big, 1.6, memory_local_hits=0, memory_remote_hits=100),
        _row("fluxkv", "remote-ssd", big, 0.6, memory_local_hits=0, memory_remote_hits=0, ssd_remote_hits=100, memory_hits=0, ssd_hits=100),
        _row("fluxkv", "local-ssd", big, 1.0, memory_local_hits=0, memory_remote_hits=0, ssd_local_hits=100, memory_hits=0, ssd_hits=100, kind="reference"),
        _row("fluxkv", "mixed", big, 1.2, mode="bytes", misses=3, hit_rate=0.97),
        _row("mooncake", "remote-memory", big, 0.5, ssd=False, owners=1),
        _row("mooncake", "mixed", big, 0.5, mode="bytes", status="unavailable", reason="not installed", hits=None, hit_gib_s=None),
    ]
    rows[2]["x_local_ssd"] = 0.6
    cluster.add_ratios(rows)
    assert rows[1]["x_tcp_raw"] == pytest.approx(0.8) and rows[0]["x_tcp_raw"] is None
    gs = {g["goal"]: g for g in cluster.goals(rows)}
    assert gs["remote-memory >= 0.7x tcp-raw"]["met"]
    assert not gs["remote-ssd >= 0.7x local SSD-hit GiB/s"]["met"]
    assert not gs["mixed SSD-on get-only: 0 misses and 0 dropped persists (SSD >= dataset)"]["met"]
    assert gs["fluxkv >= 2x Mooncake"]["value"] == pytest.approx(3.2) and gs["fluxkv >= 2x Mooncake"]["met"]
    lines = [cluster.fmt_row(r) for r in rows]
    assert "UNAVAILABLE" in lines[-1] and "0.80" in lines[1]
    # A remote-memory row whose hits were local moved nothing over the network; a row with
    # errors, or a hit rate under Mooncake's, meets no goal (they were not checked).
    local = [dict(rows[0]), dict(rows[1], memory_local_hits=100, memory_remote_hits=0)]
    cluster.add_ratios(local)
    assert not {g["goal"]: g for g in cluster.goals(local)}["remote-memory >= 0.7x tcp-raw"]["met"]
    failing = [dict(rows[0]), dict(rows[1], errors=500), dict(rows[5])]
    cluster.add_ratios(failing)
    gs = {g["goal"]: g for g in cluster.goals(failing)}
    assert not gs["remote-memory >= 0.7x tcp-raw"]["met"] and not gs["fluxkv >= 2x Mooncake"]["met"]
    mixed = [dict(rows[4], ssd=True, misses=0, hit_rate=1.0, errors=5000)]
    assert not cluster.goals(mixed)[0]["met"] and cluster.goals([dict(mixed[0], errors=0)])[0]["met"]
    lower = [dict(rows[1], hit_rate=0.8), dict(rows[5], hit_rate=0.9)]
    assert not {g["goal"]: g for g in cluster.goals(lower)}["fluxkv >= 2x Mooncake"]["met"]
    assert len({cluster_series(r) for r in rows}) == len(rows)
    assert render_cluster(rows, tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mooncake_rows_through_the_pressure_backend(tmp_path, fake):  # noqa: F811
    """Against the TEST FAKE of Mooncake (never a live one): each topology gets the cluster's total
    DRAM; on the remote path (dedicated_owner) every hit counts as remote (its benchmark processes
    store nothing), on the mixed path (per_process) where a hit came from is not known."""
    o = parse(tmp_path, "--backends", "mooncake", "--owner-dram", "64KiB", "--payloads", "4KiB", "--paths", "remote-memory,mixed",
              "--ssd", "off", "--on-miss", "none", "--warmup", "0.05", "--window", "0.3", "--pace-scale", "0", "--no-tcp-raw",
              "--mooncake-pythonpath", str(fake.pythonpath), "--mooncake-master", str(fake.master))
    cases = [c for c in cluster.cases_for(o) if not isinstance(c, cluster.TcpRaw)]
    assert [(c.backend, c.variant, c.path, c.ssd) for c in cases] == [("mooncake", "dedicated_owner", "remote-memory", False),
                                                                     ("mooncake", "per_process", "mixed", False)]
    ctx = cluster.harness.Context(o)
    for c in cases:
        r = cluster.run_mooncake(c, ctx)
        assert r["path"] == c.path and r["owners"] == 1 and r["kind"] == "measured" and r["dram_bytes"] == 3 * 64 * 1024
        assert r["variant"] == c.variant and r["hits"] > 0 and set(cluster.SCHEMA) <= set(r)
        if c.variant == "dedicated_owner":
            assert r["status"] == "ok", r
            assert r["memory_remote_hits"] == r["hits"] and r["memory_local_hits"] == r["ssd_local_hits"] == 0 and r["place_method"] == "topology"
        else:
            assert r["status"] == "incomplete", r
            assert r["memory_remote_hits"] is None and r["memory_local_hits"] is None and r["place_method"] == "none"
        if c.path == "remote-memory":  # a dataset that fits one owner's DRAM
            assert r["keys"] == int(0.75 * 64 * 1024) // 4096


# -- end to end against the real binary ------------------------------------------------------------


def test_cluster_end_to_end_three_owners(tmp_path):
    need(FLUXKV_BIN)
    rg = os.environ.get("FLUXKV_REMOTEGET_BIN") or str(REPO / "bin" / "fluxkv-remoteget")
    o = parse(tmp_path, "--owner-dram", "16MiB", "--payloads", "1MiB-128", "--paths", "remote-memory,remote-ssd", "--backends", "fluxkv", "--warmup", "0.1", "--window", "0.4", "--pace-scale", "0", "--fluxkv-bin", FLUXKV_BIN,
              "--remoteget-bin", rg)
    records = cluster.run(o)
    lines = [json.loads(x) for x in (tmp_path / "out" / "summary.jsonl").read_text().splitlines()]
    assert [r["status"] for r in lines] == [r["status"] for r in records]
    by = {(r["backend"], r["path"]): r for r in lines}
    assert set(by) == {("tcp-raw", None), ("fluxkv", "remote-memory"), ("fluxkv", "remote-ssd"), ("fluxkv", "local-ssd")}
    tcp = by[("tcp-raw", None)]
    assert tcp["kind"] == "baseline" and tcp["concurrency"] == "c2" and len(lines) == 4
    if tcp["status"] == "ok":
        # measured at the start and the end of the group, each time with the sender in a child process
        # and in the same process; the row is the better two-process run
        runs = tcp["client"]["runs"]
        assert [x["pair"] for x in runs] == ["processes", "one process"] * 2
        assert tcp["hit_gib_s"] == max(x["gib_s"] for x in runs if x["pair"] == "processes")
        assert tcp["one_process_gib_s"] == max(x["gib_s"] for x in runs if x["pair"] == "one process")
    assert tcp["status"] == "ok" or (tcp["status"] == "unavailable" and "go" in tcp["reason"]), tcp
    for (backend, path), r in by.items():
        assert set(cluster.SCHEMA) <= set(r)
        if backend != "fluxkv":
            continue
        assert r["status"] == "ok", r
        assert r["owners"] == 3 and r["errors"] == 0 and r["hits"] > 0 and isinstance(r["dropped_persists"], int)
        assert r["memory_hits"] + r["ssd_hits"] == r["hits"] and r["unknown_hits"] == 0
        assert sum(r[f"{p}_hits"] for p in PLACES) == r["hits"]
        if tcp["status"] == "ok":
            assert r["x_tcp_raw"] == pytest.approx(r["hit_gib_s"] / tcp["hit_gib_s"])
    rm, rs, ls = by[("fluxkv", "remote-memory")], by[("fluxkv", "remote-ssd")], by[("fluxkv", "local-ssd")]
    assert rm["memory_remote_hits"] == rm["hits"] and rm["misses"] == 0  # every hit a pull
    # remote-memory: no promotion, so the window leaves every value once and no duplicate
    assert rm["distinct_values"] == rm["keys"] and rm["duplicate_bytes"] == 0, rm["pool"]
    assert rm["pool"]["after_bootstrap"]["values"] == rm["keys"] and rm["pool"]["end"]["replicas"] == rm["keys"]
    assert rs["ssd_remote_hits"] == rs["hits"]  # every hit a remote SSD refill
    assert ls["ssd_local_hits"] == ls["hits"] and ls["kind"] == "reference"
    assert rs["x_local_ssd"] == pytest.approx(rs["hit_gib_s"] / ls["hit_gib_s"])
    assert set(rs["client"]["attach"]) == {1, 2} and set(ls["client"]["attach"]) == {0}
    assert rs["filler"]["puts"] > 0 and rs["persists"]["ssd_replicas_after_bootstrap"] > 0
    assert our_processes(str(tmp_path)) == []
    assert list(tmp_path.glob("fkc-*")) == []
    cluster.finish(records, o)
    assert (tmp_path / "out" / "cluster.png").stat().st_size > 5000
    assert json.loads((tmp_path / "out" / "goals.json").read_text())
