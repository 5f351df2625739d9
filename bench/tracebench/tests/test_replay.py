"""Replays of a small synthetic trace against a real ``fluxkv up``: with room for every block the
hits per request are the infinite cache's, every page loaded is checked byte for byte (a wrong
one fails the case), and the CLI writes summary.jsonl and trace.png. Without a daemon: the
chain's parent handed to put_pages, page contents, capacity flags."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pstats
from types import SimpleNamespace

import numpy as np
import pytest

from pressure.backends.base import module_available, which
from pressure.procs import Group
from tracebench import backends as tb
from tracebench import cli, cpu, report, sim, worker
from tracebench.clients import FluxkvPages
from tracebench.pages import Pages
from tracebench.replay import ReplayConfig, replay
from tracebench.trace import load

BLOCK = 4096
NAMESPACE = ReplayConfig().namespace


def write_trace(path) -> str:
    """Four conversations of five turns, interleaved; every prompt starts with block 0 (a shared
    system prompt) and turn t of conversation c extends turn t - 1 by one block."""
    lines = []
    for t in range(5):
        for c in range(4):
            ids = [0] + [100 * (c + 1) + j for j in range(t + 1)]
            lines.append(json.dumps({"timestamp": 10 * len(lines), "input_length": 512 * len(ids) - 100, "output_length": 5, "hash_ids": ids}))
    f = path / "synthetic.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return str(f)


def options(fluxkv_bin: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    tb.add_arguments(ap)
    return ap.parse_args(["--fluxkv-bin", fluxkv_bin])


def test_replay_hits_equal_the_infinite_cache_with_room_for_every_block(fluxkv_bin, tmp_path, monkeypatch):
    prof = tmp_path / "prof"
    prof.mkdir()
    monkeypatch.setenv("TRACEBENCH_PROFILE", str(prof))  # each process profiles its share
    t = load(write_trace(tmp_path))
    run = tb.prepare(tb.Target("fluxkv", 1, False), options(fluxkv_bin), 2 * t.distinct, BLOCK, 5, 2, t.distinct)
    with Group() as g:
        run.start(g.mkdtemp(str(tmp_path), "tb-"), g)
        assert run.warm(BLOCK) == 0  # fluxkv's owner touches its memory at start, its clients before they are ready
        res = replay(t, "fluxkv", run.endpoint, run.spec, BLOCK, ReplayConfig(procs=2, window=1, verify_every=1),
                     server_cpu=lambda: cpu.tree_cpu_s([p.pid for p in g.procs]))
        held = run.held()
    # Both measured (neither was checked: a review). The servers' CPU is read from /proc in
    # clock ticks: a replay this short may take none of them.
    assert res.server_cpu_s is not None and res.server_cpu_s >= 0 and res.client_cpu_s > 0
    ideal = sim.simulate(t, sim.Infinite())
    assert res.hits == ideal.per_request
    assert res.loaded == res.verified == sum(ideal.per_request) > 0
    assert res.wrong_bytes == 0 and res.put_failed == 0 and res.errors == 0
    assert dict(res.sources) == {"memory_local": res.loaded}
    assert held["memory"] == t.distinct
    for i in range(2):
        stats = pstats.Stats(str(prof / f"worker-{i}.prof"))
        assert any(fn == "serve" for (_, _, fn) in stats.stats)


@pytest.mark.parametrize("backend", ["memcached", "redis"])
def test_byte_stores_per_key_and_batched_hit_the_infinite_cache_with_room_for_every_block(backend, fluxkv_bin, tmp_path):
    """Redis and memcached, one get and put per page or a multi-get and a pipelined
    multi-put per chunk (``--byte-access batch``, chunks of 2 pages here so a request
    takes several): with room for every block both find the infinite cache's hits, every
    page loaded byte for byte, none refused."""
    binary, module = {"memcached": ("memcached", "pymemcache"), "redis": ("redis-server", "redis")}[backend]
    if not which(binary) or not module_available(module):
        pytest.skip(f"{binary} or python module {module} missing")
    t = load(write_trace(tmp_path))
    ideal = sim.simulate(t, sim.Infinite())
    room = (64 << 20) // BLOCK  # the stores' own overhead needs MiBs, not the blocks' 84 KiB
    for access in ("per-key", "batch"):
        run = tb.prepare(tb.Target(backend, 1, False), options(fluxkv_bin), room, BLOCK, 5, 2, t.distinct)
        with Group() as g:
            run.start(g.mkdtemp(str(tmp_path), "tb-"), g)
            assert run.warm(BLOCK) > room  # its memory touched, and nothing of it left
            assert run.held()["memory"] == 0, access
            res = replay(t, backend, run.endpoint, run.spec, BLOCK,
                         ReplayConfig(procs=2, window=1, verify_every=1, buffer_bytes=2 * BLOCK, byte_access=access))
        assert res.hits == ideal.per_request, access
        assert res.loaded == res.verified == sum(ideal.per_request) > 0, access
        assert res.wrong_bytes == 0 and res.put_failed == 0 and res.errors == 0, access


def test_three_owners_count_pinned_pulls_as_remote_hits(fluxkv_bin, tmp_path):
    """A master and 3 owners, a client process on each: the turns of a conversation go to
    different owners, so a prefix is often found on another owner. The lookup's pin pulls it
    and the load that follows reports the pull (memory_remote), not a local hit."""
    t = load(write_trace(tmp_path))
    run = tb.prepare(tb.Target("fluxkv", 3, False), options(fluxkv_bin), 4096, BLOCK, 5, 3, t.distinct)
    with Group() as g:
        run.start(g.mkdtemp(str(tmp_path), "tb-"), g)
        res = replay(t, "fluxkv", run.endpoint, run.spec, BLOCK, ReplayConfig(procs=3, window=1, verify_every=1))
    ideal = sim.simulate(t, sim.Infinite())
    assert res.hits == ideal.per_request
    assert res.wrong_bytes == 0 and res.put_failed == 0 and res.errors == 0
    assert set(res.sources) <= {"memory_local", "memory_remote"} and sum(res.sources.values()) == res.loaded
    assert res.sources["memory_remote"] > 0, dict(res.sources)


def test_three_owners_routed_by_prefix_hit_on_the_owner_they_are_attached_to(fluxkv_bin, tmp_path):
    """The same cluster with ``route="prefix"`` and conversations that share no block: each
    conversation's turns go to the process that served its first turn, so every page loaded
    is on the owner that process is attached to (all hits memory_local, none pulled)."""
    lines = []
    for turn in range(5):
        for c in range(4):
            ids = [100 * (c + 1) + j for j in range(turn + 1)]
            lines.append(json.dumps({"timestamp": 10 * len(lines), "input_length": 512 * len(ids), "output_length": 5, "hash_ids": ids}))
    f = tmp_path / "conversations.jsonl"
    f.write_text("\n".join(lines) + "\n")
    t = load(str(f))
    run = tb.prepare(tb.Target("fluxkv", 3, False), options(fluxkv_bin), 4096, BLOCK, 5, 3, t.distinct)
    with Group() as g:
        run.start(g.mkdtemp(str(tmp_path), "tb-"), g)
        res = replay(t, "fluxkv", run.endpoint, run.spec, BLOCK, ReplayConfig(procs=3, window=1, verify_every=1, route="prefix"))
    ideal = sim.simulate(t, sim.Infinite())
    assert res.hits == ideal.per_request
    assert res.wrong_bytes == 0 and res.put_failed == 0 and res.errors == 0
    assert dict(res.sources) == {"memory_local": res.loaded} and res.loaded > 0, dict(res.sources)


def test_a_wrong_page_fails_the_case(fluxkv_bin, tmp_path):
    import fluxkv
    from fluxkv import kv

    t = load(write_trace(tmp_path))
    run = tb.prepare(tb.Target("fluxkv", 1, False), options(fluxkv_bin), 2 * t.distinct, BLOCK, 5, 1, t.distinct)
    pages = Pages(BLOCK)
    wrong = pages.buffers(1)[0]
    pages.fill(wrong, 7)  # block 7's bytes under block 0's key
    with Group() as g:
        run.start(g.mkdtemp(str(tmp_path), "tb-"), g)
        with fluxkv.connect(run.endpoint["socket"]) as c:
            assert kv.PageStore(c, NAMESPACE).put_pages([0], [wrong]) == [True]
        res = replay(t, "fluxkv", run.endpoint, run.spec, BLOCK, ReplayConfig(procs=1, verify_every=1))
        row = report.replay_row(run, t, 2 * t.distinct, res, BLOCK, run.held(), [], {})
    assert res.wrong_bytes > 0
    assert row["status"] == "failed" and "wrong bytes" in row["reason"]


def test_cli_writes_summary_rows_and_chart(fluxkv_bin, tmp_path):
    f = write_trace(tmp_path)
    ample = 2 * load(f).distinct
    out = tmp_path / "out"
    rc = cli.main(["--trace", f, "--backends", "fluxkv", "--ssd", "off", "--capacity", "2.0,8b", "--procs", "2", "--window", "1",
                   "--block-bytes", "4KiB", "--out", str(out), "--fluxkv-bin", fluxkv_bin, "--work-dir", str(tmp_path), "--request-hits"])
    assert rc == 0
    rows = [json.loads(line) for line in (out / "summary.jsonl").read_text().splitlines()]
    assert {(r["backend"], r["capacity_blocks"]) for r in rows} == {(b, c) for b in ("fluxkv", *sim.POLICIES) for c in (ample, 8)}
    for r in rows:
        for k in ("backend", "capacity_fraction", "capacity_blocks", "owners", "ssd", "hit_rate", "token_hit_rate", "status"):
            assert k in r, k
        assert r["status"] == "ok"
    fx = {r["capacity_blocks"]: r for r in rows if r["backend"] == "fluxkv"}
    ideal = next(r for r in rows if r["backend"] == "ideal")
    assert fx[ample]["hit_rate"] == ideal["hit_rate"] > 0 and fx[ample]["token_hit_rate"] == ideal["token_hit_rate"]
    assert 0 < fx[8]["held_blocks"] <= 8 and fx[8]["hit_rate"] < ideal["hit_rate"]
    assert fx[8]["access"] == "batch"
    for k in ("p50_ms", "p99_ms", "gib_per_s", "hits_by_source", "wrong_bytes", "held_blocks"):
        assert fx[8][k] is not None, k
    assert (out / "trace.png").stat().st_size > 10_000
    for r in rows:  # --request-hits: each request's, in trace order, adding up to the row's hits
        assert len(r["request_hits"]) == len(load(f).requests) and sum(r["request_hits"]) == r["hits"], r["backend"]


class FakePages:
    """A page client that remembers what was stored and the parent each store named."""

    def __init__(self):
        self.cached: set = set()
        self.stores: list = []

    def lookup(self, ids) -> int:
        n = 0
        while n < len(ids) and ids[n] in self.cached:
            n += 1
        return n

    def load(self, ids, bufs) -> int:
        return len(ids)

    def store_pages(self, ids, bufs, parent) -> int:
        self.stores.append((list(ids), parent))
        self.cached.update(ids)
        return 0


def test_stores_name_the_chain_parent_in_chunks_of_the_buffers():
    sync = worker.Sync(mp.get_context("spawn"), 2)
    sync.start_at.value = 0.0
    plan = worker.Plan(0, "fake", {}, {}, [(0, 0, (1, 2, 3)), (1, 0, (1, 2, 4, 5, 6))], 64, 2, 1, 0, 0.0, 1, NAMESPACE)
    pc = FakePages()
    out = worker.serve(plan, sync, pc, worker.prepare(plan, pc))
    assert pc.stores == [([1, 2], None), ([3], 2), ([4, 5], 2), ([6], 5)]
    assert [r[1] for r in out["rows"]] == [0, 2]


def test_buffers_are_prepared_before_the_process_is_ready(monkeypatch):
    """The page buffers (written, and registered with a zero-copy client) exist, and the
    client's own set-up is done (fluxkv's segment mapped ahead), before the process says it is
    ready: none of it runs inside the timed window."""
    events = []

    class Registering(FakePages):
        def register(self, bufs):
            events.append(("register", len(bufs)))

        def settle(self):
            events.append("settle")

        def counters(self):
            return {}

    class Side:
        def ssd_counter(self):
            return None

        def close(self):
            pass

    class Out:
        def put(self, msg):
            events.append(msg[0])

    made = Pages.buffers

    def buffers(self, n):
        events.append(("buffers", n))
        return made(self, n)

    monkeypatch.setattr(Pages, "buffers", buffers)
    monkeypatch.setattr(worker, "open_pages", lambda plan: (Registering(), Side(), None))
    sync = worker.Sync(mp.get_context("spawn"), 1)
    sync.go.set()
    plan = worker.Plan(0, "fake", {}, {}, [(0, 0, (1, 2, 3))], 64, 2, 1, 0, 0.0, 1, NAMESPACE)
    worker.main(plan, sync, Out())
    assert events == [("buffers", 2), ("buffers", 2), ("register", 4), "settle", "ready", "done"]


def test_put_pages_gets_the_parent_only_where_page_store_takes_it(monkeypatch):
    from fluxkv import kv

    seen = []

    class ChainedStore:
        def __init__(self, client, namespace, **kw):
            pass

        def put_pages(self, hashes, tensors, parent=None):
            seen.append(parent)
            return [True] * len(hashes)

    class PlainStore(ChainedStore):
        def put_pages(self, hashes, tensors):
            seen.append("plain")
            return [True] * len(hashes)

    client = argparse.Namespace(batch_get=lambda keys: [])
    for store, expect in ((ChainedStore, 9), (PlainStore, "plain")):
        monkeypatch.setattr(kv, "PageStore", store)
        assert FluxkvPages(client, NAMESPACE, 0).store_pages([10], [np.zeros(8, np.uint8)], 9) == 0
        assert seen[-1] == expect


def test_hit_sources_count_the_loaded_prefix_only(monkeypatch):
    """A page found after a miss (its predecessor evicted since the lookup) is no hit: its
    holder's source is not tallied, so the sources add up to the hits."""
    from fluxkv import kv

    holder = argparse.Namespace(source="ssd", remote=False)

    class Store:
        def __init__(self, client, namespace, **kw):
            self.client = client

        def key(self, h):
            return f"k{h}"

        def get_pages_into(self, hashes, tensors):
            holders = self.client.batch_get([self.key(h) for h in hashes])
            return [h is not None for h in holders]

        def put_pages(self, hashes, tensors, parent=None):
            return [True] * len(hashes)

        def counters(self):
            return {"errors": 0, "skipped": 0}

    client = argparse.Namespace(batch_get=lambda keys: [holder, None, holder])
    monkeypatch.setattr(kv, "PageStore", Store)
    pages = FluxkvPages(client, NAMESPACE, 0)
    assert pages.load([1, 2, 3], [None] * 3) == 1
    assert pages.counters()["sources"] == {"ssd_local": 1}


def test_pages_are_a_function_of_the_id_and_wrong_bytes_count():
    p = Pages(3 * 4096)
    a, b = p.buffers(2)
    p.fill(a, 1)
    p.fill(b, 1)
    assert np.array_equal(a, b) and p.wrong_bytes(a, 1) == 0
    assert p.wrong_bytes(a, 2) == 3  # ids 1 and 2 differ in one byte of each 4 KiB's id word
    a[5000] ^= 0xFF
    assert p.wrong_bytes(a, 1) == 1
    # A page of several runs of the check (1 MiB: four): a byte of the last run counts,
    # the check leaves nothing behind (the next page checks afresh), a short buffer is all wrong.
    big = Pages(1 << 20)
    c, d = big.buffers(2)
    big.fill(c, 7)
    big.fill(d, 8)
    assert big.wrong_bytes(c, 7) == 0 and big.wrong_bytes(d, 8) == 0
    c[-1] ^= 1
    assert big.wrong_bytes(c, 7) == 1 and big.wrong_bytes(d, 7) == 256 and big.wrong_bytes(d, 8) == 0
    assert big.wrong_bytes(c[:4096], 7) == 1 << 20


class _DictPages:
    """A page client over a dict: stores copy the pages, loads copy them back."""

    def __init__(self):
        self.held = {}

    def lookup(self, ids) -> int:
        n = 0
        while n < len(ids) and ids[n] in self.held:
            n += 1
        return n

    def load(self, ids, bufs) -> int:
        for b, i in zip(bufs, ids):
            np.copyto(b, self.held[i])
        return len(ids)

    def store_pages(self, ids, bufs, parent) -> int:
        for i, b in zip(ids, bufs):
            self.held[i] = b.copy()
        return 0


class _LazyPages(_DictPages):
    """Reports every page it holds found, and copies none."""

    def load(self, ids, bufs) -> int:
        return len(ids)


@pytest.mark.parametrize("client, wrong", [(_DictPages, False), (_LazyPages, True)])
def test_a_load_that_copies_nothing_fails_the_byte_check(client, wrong):
    """The same prompt twice in one process: the second request finds its pages, and a client
    that says so without copying them is caught, though its buffers last held those very pages
    before the load (the load buffers are poisoned; stores come from buffers of their own)."""
    plan = worker.Plan(index=0, backend="test", endpoint={}, spec={}, requests=[(0, 0, [3, 4, 5]), (1, 0, [3, 4, 5])],
                       block_bytes=2 * 4096, buffer_pages=4, verify_every=1, pin_ms=0, speed=0, window=0, namespace="t")
    pc = client()
    out = worker.serve(plan, worker.Sync(mp.get_context("spawn"), 2), pc, worker.prepare(plan, pc))
    assert out["loaded"] == 3 and out["verified"] == 3
    assert (out["wrong_bytes"] > 0) == wrong, out


def test_batched_byte_loads_ask_for_a_bounded_reply_and_stop_at_the_first_miss():
    """--byte-access batch multi-gets at most BATCH_REPLY_BYTES of pages per call (Redis evicts
    cached keys for a large reply waiting in its output buffer; a review), and asks for none
    past the call that met the first miss."""
    from tracebench.clients import BATCH_REPLY_BYTES, BytePages

    block = BATCH_REPLY_BYTES // 2
    calls = []

    class Got:
        source = "memory"

        def __init__(self, data):
            self.data = data

        def materialize(self):
            return self.data

        def release(self):
            pass

    class Store:
        def get_many(self, keys):
            calls.append(list(keys))
            return [None if k.endswith("/3") else Got(bytes(block)) for k in keys]

    pages = BytePages(Store(), "p", block, batch=True)
    bufs = [np.empty(block, dtype=np.uint8) for _ in range(7)]
    assert pages.load(list(range(7)), bufs) == 3
    assert calls == [["p/0", "p/1"], ["p/2", "p/3"]]
    assert pages.tally["memory_local"] == 3 and pages.wrong_bytes == 0


def test_store_buffers_stamped_are_the_pages():
    p = Pages(3 * 4096)
    a, = p.store_buffers(1)
    b, = p.buffers(1)
    for block in (7, 9):
        p.stamp(a, block)
        p.fill(b, block)
        assert np.array_equal(a, b) and p.wrong_bytes(a, block) == 0
    p.poison(b)
    assert p.wrong_bytes(b, 9) == 3 * 8  # the id word of each 4 KiB, all of its bytes


def test_capacity_flags():
    assert cli.parse_capacity("0.10", 1000, 4096) == 100
    assert cli.parse_capacity("4000b", 1000, 4096) == 4000
    assert cli.parse_capacity("1MiB", 1000, 4096) == 256
    for bad in ("4000", "x", "1b"):
        with pytest.raises(ValueError):
            cli.parse_capacity(bad, 1000, 4096)
    assert [t.label for t in cli.targets(["fluxkv", "redis"], [1, 3], [False])] == ["fluxkv SSD off", "fluxkv 3 owners SSD off", "redis SSD off"]


def test_held_blocks_of_each_byte_store():
    """What each byte store's description says it holds, as the summary's held_blocks reads it;
    Mooncake's master counts objects wherever they are, so its count stands with SSD off only."""

    class Described:
        def __init__(self, d):
            self.d = d

        def describe(self):
            return self.d

    def held(backend, ssd, d):
        return tb.Running(tb.Target(backend, 1, ssd), Described(d), None, 0, 0, 0).held()

    assert held("redis", False, {"keys": 7}) == {"memory": 7, "ssd": 0}
    assert held("memcached", True, {"curr_items": 9, "extstore_objects_used": 4}) == {"memory": 5, "ssd": 4}
    assert held("mooncake", False, {"master_key_count": 12}) == {"memory": 12, "ssd": 0}
    assert held("mooncake", True, {"master_key_count": 12}) == {"memory": None, "ssd": None}


def _fake_masters() -> set:
    """Pids of TEST FAKE mooncake_master processes running now (any test's)."""
    import subprocess

    out = subprocess.run(["pgrep", "-f", "pressure/tests/fake_mooncake.py"], capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


def test_replay_through_mooncake_batch_calls_on_the_fake(tmp_path, monkeypatch):
    """Mooncake is replayed as its engine connectors use it: the page buffers registered once, a
    batch_is_exist prefix lookup, batch_get_into and batch_put_from (the TEST FAKE Mooncake refuses a
    zero-copy call on memory outside a registered buffer). With room for every block its hits are the
    infinite cache's, every page checked byte for byte, and the case stops the master it started,
    wrapper and binary both. Nothing here measures Mooncake."""
    from pressure.backends import mooncake as mc
    from pressure.tests.fake_mooncake import install

    py, master = install(tmp_path)
    # The fake's segment of a few KiB is below Mooncake's 16 MiB slab: the checks follow the test's sizes.
    monkeypatch.setattr(mc, "SEGMENT_MIN", 4096)
    monkeypatch.setenv("FAKE_MOONCAKE_SEGMENT_MIN", "4096")
    monkeypatch.setattr(mc, "_probes", {})
    before = _fake_masters()
    f = write_trace(tmp_path)
    t = load(f)
    out = tmp_path / "out"
    rc = cli.main(["--trace", f, "--backends", "mooncake", "--ssd", "off", "--capacity", "2.0", "--procs", "2", "--window", "1",
                   "--block-bytes", "4KiB", "--verify-every", "1", "--sims", "ideal", "--out", str(out), "--work-dir", str(tmp_path),
                   "--mooncake-master", str(master), "--mooncake-pythonpath", str(py)])
    rows = {r["backend"]: r for r in map(json.loads, (out / "summary.jsonl").read_text().splitlines())}
    mk, ideal = rows["mooncake"], rows["ideal"]
    assert rc == 0 and mk["status"] == "ok", mk
    assert mk["hit_rate"] == ideal["hit_rate"] > 0 and mk["access"] == "batch"
    assert mk["verified_pages"] == mk["hits"] and mk["wrong_bytes"] == 0 and mk["put_failed"] == 0 and mk["errors"] == 0
    assert mk["hits_by_source"]["memory_remote"] == mk["hits"] and mk["held_blocks"] == t.distinct
    # a lease sized to the replay's longest load call (tiny blocks here: 500 ms), 1 % evicted at the watermark
    assert "--default_kv_lease_ttl=500" in mk["server_cmd"] and "--eviction_ratio=0.01" in mk["server_cmd"], mk["server_cmd"]
    assert "--offload_on_evict" not in mk["server_cmd"]
    assert _fake_masters() - before == set()


def test_mooncake_master_gets_a_lease_for_its_longest_call_and_the_opt_in_offload_on_evict():
    """tracebench starts Mooncake's master with a lease long enough for the replay's longest load
    call (upstream fails every key of a batch_get_into whose lease ran out since its query began; a
    batch is up to 1 GiB), between the pressure harness's 500 ms and Mooncake's default 10 s (a
    leased object cannot be evicted); --mooncake-offload-on-evict (SSD on only) asks for flash to
    hold what DRAM evicted and for hits to be promoted. Nothing is started."""
    from pressure.backends import mooncake as mc

    assert tb.mooncake_lease_ms(247 * (64 << 10)) == 500  # the quick preset's longest request
    assert tb.mooncake_lease_ms(1 << 30) == 4000  # a full-preset call of 1 GiB
    assert tb.mooncake_lease_ms(8 << 30) == tb.mooncake_lease_ms(None) == 10000
    ports = mc.Ports(1, 2, 3)
    plain = tb.prepare(tb.Target("mooncake", 1, True), options("fluxkv"), 100, BLOCK, 5, 2, 1000, 1 << 30).server
    assert plain.lease_ttl_ms == 4000 and plain.offload_on_evict is False
    plain = tb.prepare(tb.Target("mooncake", 1, True), options("fluxkv"), 100, BLOCK, 5, 2, 1000).server
    assert plain.lease_ttl_ms == mc.DEFAULT_LEASE_TTL_MS == 10000 and plain.offload_on_evict is False
    cmd = mc.master_args("mm", ports, True, plain.lease_ttl_ms, plain.offload_on_evict)
    assert "--default_kv_lease_ttl=10000" in cmd and cmd[-1] == "--enable_offload=true"
    ap = argparse.ArgumentParser()
    tb.add_arguments(ap)
    o = ap.parse_args(["--mooncake-offload-on-evict"])
    on = tb.prepare(tb.Target("mooncake", 1, True), o, 100, BLOCK, 5, 2, 1000).server
    assert on.offload_on_evict is True
    assert mc.master_args("mm", ports, True, on.lease_ttl_ms, on.offload_on_evict)[-3:] == [
        "--enable_offload=true", "--offload_on_evict=true", "--promotion_on_hit=true"]
    assert mc.Server(argparse.Namespace()).lease_ttl_ms == mc.LEASE_TTL_MS == 500  # the pressure harness
    assert not hasattr(o, "mooncake_lease_ttl_ms")  # prepare set it on its own copy of the options


def test_mooncake_pages_count_errors_and_retry_refusals():
    """MooncakePages against a scripted store: a lookup error ends the prefix and is counted; a
    load stops at the first miss (not an error) or error; a put refused for space is retried alone."""
    from tracebench.clients import MooncakePages

    class Store:
        def __init__(self):
            self.puts = []
            self.got = [BLOCK, -704, BLOCK]
            self.exist = [1, 1, -900, 1]

        def register_buffer(self, ptr, size):
            return 0

        def batch_is_exist(self, keys):
            return self.exist[: len(keys)]

        def batch_get_into(self, keys, ptrs, sizes):
            return self.got[: len(keys)]

        def batch_put_from(self, keys, ptrs, sizes):
            self.puts.append(list(keys))
            return [0 if len(self.puts) > 1 or i != 1 else -200 for i in range(len(keys))]

    st = Store()
    slept = []
    pc = MooncakePages(st, "ns", BLOCK, False, 2, sleep=slept.append)
    bufs = Pages(BLOCK).buffers(3)
    pc.register(bufs)
    assert pc.lookup([1, 2, 3, 4]) == 2 and pc.errors == {"RPC_FAIL": 1}
    assert pc.load([1, 2, 3], bufs) == 1 and pc.errors == {"RPC_FAIL": 1}  # a miss is not an error
    assert pc.store_pages([7, 8, 9], bufs, None) == 0
    assert st.puts == [["ns/7", "ns/8", "ns/9"], ["ns/8"]] and slept == [0.01]
    with pytest.raises(RuntimeError, match="not registered"):
        pc.load([1], Pages(BLOCK).buffers(1))
    assert pc.counters()["sources"] == {"memory_remote": 1}
    # REPLICA_IS_NOT_READY (-703: another process's put still in flight) is a miss, as upstream's
    # client takes it (real_client.cpp at 3b5a594), not an error; LEASE_EXPIRED (-707) is one
    st.got = [BLOCK, -703, BLOCK]
    assert pc.load([1, 2, 3], bufs) == 1 and pc.errors == {"RPC_FAIL": 1}
    st.exist = [1, -703, 1]
    assert pc.lookup([1, 2, 3]) == 1 and pc.errors == {"RPC_FAIL": 1}
    st.got = [-707, BLOCK, BLOCK]
    assert pc.load([1, 2, 3], bufs) == 0 and pc.errors == {"RPC_FAIL": 1, "LEASE_EXPIRED": 1}


def test_mooncake_pages_ssd_on_count_batches_not_pages():
    """Mooncake's get_offload_rpc_read_count() rises once per batch_get_into call that reads from
    flash (one offload RPC per call and storage endpoint: real_client.cpp at 3b5a594), however many
    of its pages were there. The pages of a call that did not move it are memory hits; those of a
    call that did are unknown, and the row's sources are incomplete, not the number of calls."""
    from tracebench.clients import MooncakePages

    class Store:
        reads = 0

        def register_buffer(self, ptr, size):
            return 0

        def batch_get_into(self, keys, ptrs, sizes):
            if keys[0].endswith("/9"):
                self.reads += 1  # three pages from flash, one offload RPC
            return [BLOCK] * len(keys)

        def get_offload_rpc_read_count(self):
            return self.reads

    pc = MooncakePages(Store(), "ns", BLOCK, True, 2)
    bufs = Pages(BLOCK).buffers(3)
    pc.register(bufs)
    assert pc.load([1, 2], bufs[:2]) == 2 and pc.load([9, 10, 11], bufs) == 3
    assert pc.counters()["sources"] == {"memory_remote": 2, "unknown": 3}
    run = SimpleNamespace(target=SimpleNamespace(backend="mooncake", ssd=True))
    res = SimpleNamespace(loaded=5, sources=pc.counters()["sources"])
    out = report.sources(run, res, [(0, 1)])
    assert out["sources_complete"] is False and out["hits_by_source"]["ssd_remote"] is None and "RPCs" in out["sources_note"]
    res = SimpleNamespace(loaded=2, sources={"memory_remote": 2})
    out = report.sources(run, res, [(0, 0)])
    assert out["sources_complete"] is True and out["hits_by_source"]["memory_remote"] == 2 and out["hits_by_source"]["ssd_remote"] == 0


def test_byte_store_multi_gets_with_ssd_leave_the_split_open():
    """memcached's flash-read counter also counts the pages a multi-get read past a request's
    first miss: with --byte-access batch and SSD on, the row's sources are incomplete instead
    of that count taken for SSD hits (a review); per key, the counter splits them."""
    run = SimpleNamespace(target=SimpleNamespace(backend="memcached", ssd=True))
    res = SimpleNamespace(loaded=10, sources={"unattributed": 10})
    out = report.sources(run, res, [(0, 4)], batch=True)
    assert out["sources_complete"] is False and out["hits_by_source"]["ssd_local"] is None and "multi-gets" in out["sources_note"]
    out = report.sources(run, res, [(0, 4)])
    assert out["hits_by_source"]["ssd_local"] == 4 and out["hits_by_source"]["memory_local"] == 6


def test_replay_through_mooncake_ssd_on_the_fake(tmp_path, monkeypatch):
    """SSD on, with room in DRAM for a fraction of the blocks: the TEST FAKE Mooncake moves evicted
    pages to its disk and, as upstream, counts one offload read per batch_get_into call, so the
    row's SSD hits are not made up from that count. Nothing here measures Mooncake."""
    from pressure.backends import mooncake as mc
    from pressure.tests.fake_mooncake import install

    py, master = install(tmp_path)
    monkeypatch.setattr(mc, "SEGMENT_MIN", 4096)
    monkeypatch.setenv("FAKE_MOONCAKE_SEGMENT_MIN", "4096")
    monkeypatch.setattr(mc, "_probes", {})
    f = write_trace(tmp_path)
    out = tmp_path / "out"
    rc = cli.main(["--trace", f, "--backends", "mooncake", "--ssd", "on", "--capacity", "6b", "--procs", "1", "--window", "1",
                   "--block-bytes", "4KiB", "--verify-every", "1", "--sims", "ideal", "--out", str(out), "--work-dir", str(tmp_path),
                   "--mooncake-master", str(master), "--mooncake-pythonpath", str(py)])
    rows = {r["backend"]: r for r in map(json.loads, (out / "summary.jsonl").read_text().splitlines())}
    mk = rows["mooncake"]
    assert rc == 0 and mk["status"] in ("ok", "incomplete"), mk
    assert mk["hits"] > 0 and mk["wrong_bytes"] == 0
    assert mk["sources_complete"] is False and mk["hits_by_source"]["ssd_remote"] is None, mk


def test_three_owners_get_the_capacity_and_no_more(tmp_path):
    """The owners' segments, transfer areas included, add up to the capacity (within a page each):
    the master lends idle transfer area room to the pool, so an area on top would be cache memory
    the other backends are not given. The landing area, never lent and never a page's home, is
    on top."""
    cap = 5528
    run = tb.prepare(tb.Target("fluxkv", 3, False), options("fluxkv"), cap, 64 * 1024, 5, 2, 55287)
    assert run.server.topo.dram_bytes * 3 - cap * 64 * 1024 < 3 * 4096
    assert run.spec.dram_bytes == run.server.topo.dram_bytes and 0 < run.transfer_reserve_bytes < run.spec.dram_bytes
    assert f"--transfer-reserve {run.transfer_reserve_bytes}" in run.server.opts.fluxkv_owner_args
    # beyond the capacity only the landing area, for loads in flight: one 128-page batch of the
    # one process attached to each owner (2 processes over 3 owners), under an eighth of the segment
    assert run.server.topo.landing_bytes == tb.landing_reserve(run.server.topo.dram_bytes, run.spec.payload_bytes, 2, 3)
    assert 128 * run.spec.payload_bytes <= run.server.topo.landing_bytes <= run.server.topo.dram_bytes // 8
