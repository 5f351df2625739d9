"""fluxkv.integrations.sglang loaded and driven as SGLang does it: built by the stand-in of
SGLang's storage backend factory (tests/engines/sglang) from the issue's extra_config, fed
the stand-in's host pools (MHA and MLA, layer_first and page_first, float32 and bfloat16) and
called through every method of SGLang's HiCacheStorage, against real daemons; then the
pools it refuses (MXFP8, pools without page buffers) and the asymmetric K/V pool. The stand-in is
on sys.path only while this module runs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch

import fluxkv
from fluxkv import kv

from conftest import child_env, engine_standin, shared_node, wait_until
from tinylm import TinyLM, chain_hashes

# The issue's --hicache-storage-backend-extra-config, socket filled in per test.
ISSUE_EXTRA_CONFIG = '{"backend_name": "fluxkv", "module_path": "fluxkv.integrations.sglang", "class_name": "FluxkvHiCacheStorage", "socket": "%s"}'
PAGE = 16  # tokens per page
LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")  # MHA's; MLA has no page_head
MLA_LAYOUTS = LAYOUTS[:3]
POOL_KINDS = [(False, layout) for layout in LAYOUTS] + [(True, layout) for layout in MLA_LAYOUTS]
DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(scope="module")
def sg():
    """The stand-in SGLang importable for this module's tests only, and the backend module
    imported on top of it (so it subclasses the stand-in's HiCacheStorage)."""
    with engine_standin("sglang"):
        from sglang.srt.managers.cache_controller import StorageController
        from sglang.srt.mem_cache import hicache_storage, pool_host
        from sglang.srt.observability.metrics_collector import StorageMetricsCollector

        import fluxkv.integrations.sglang as backend

        yield SimpleNamespace(
            storage=hicache_storage, pools=pool_host, Controller=StorageController, Collector=StorageMetricsCollector, backend=backend
        )


@pytest.fixture(scope="module")
def node(fluxkv_bin):
    """One 64 MiB node for the module (each test uses its own model name: its own namespaces)."""
    yield from shared_node(fluxkv_bin, "64MiB", "sglang")


def extra_config(socket: str, interface_v1: bool = True, **more) -> dict:
    cfg = json.loads(ISSUE_EXTRA_CONFIG % socket)
    if interface_v1:
        cfg["interface_v1"] = 1
    cfg.update(more)
    return cfg


def make_pool(sg, mla: bool, layout: str, dtype: torch.dtype, pages: int = 8, fill_seed: int | None = None):
    if mla:
        pool = sg.pools.MLATokenToKVPoolHost(pages * PAGE, PAGE, layer_num=3, kv_cache_dim=24, dtype=dtype, layout=layout)
    else:
        pool = sg.pools.MHATokenToKVPoolHost(pages * PAGE, PAGE, layer_num=3, head_num=2, head_dim=8, dtype=dtype, layout=layout)
    if fill_seed is not None:
        g = torch.Generator().manual_seed(fill_seed)
        pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=g).to(dtype))
    return pool


def engine(sg, pool, model: str, socket: str, *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False, metrics: bool = False, **extra):
    """A controller with the fluxkv backend attached, as SGLang builds it."""
    config = sg.storage.HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=metrics,
        is_page_first_layout=pool.layout == "page_first",
        model_name=model,
        extra_config=extra_config(socket, **extra),
    )
    return sg.Controller("dynamic", config, pool)


def slots(*starts: int) -> torch.Tensor:
    """The host indices of the pages starting at these slots."""
    return torch.cat([torch.arange(s, s + PAGE) for s in starts])


def flat(pool, start: int) -> torch.Tensor:
    return pool.get_data_page(start).clone()


def tag_of(layout: str) -> str:
    """The layout's part of the namespace and page tag (a tag holds 20 bytes)."""
    return {"page_first_direct": "page_direct"}.get(layout, layout)


def test_loads_through_the_factory(sg, node):
    pool = make_pool(sg, mla=False, layout="page_first", dtype=torch.bfloat16)
    c = engine(sg, pool, "org/model-a", node.socket, tp_rank=1, tp_size=2, interface_v1=False)
    assert type(c.backend) is sg.backend.FluxkvHiCacheStorage
    assert isinstance(c.backend, sg.storage.HiCacheStorage)
    assert c.backend.mem_pool_host is pool
    assert c.backend.namespace == "kv1/org/model-a/tp1of2/pp0of1/bfloat16/mha-page_first/16x3x2x8"
    assert not c.zero_copy  # the issue's JSON alone: the generic path; interface_v1 selects v1
    c.backend.close()


@pytest.mark.parametrize(
    "ranks, mla, want",
    [
        (dict(tp_rank=1, tp_size=2, pp_rank=1, pp_size=2, attn_cp_rank=0, attn_cp_size=1), False, "kv1/m/tp1of2/pp1of2/float32/mha-page_first/16x3x2x8"),
        (dict(tp_rank=1, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=1, attn_cp_size=2), True, "kv1/m/tp*/pp0of1/float32/mla-page_first/16x3x1x24/cp1of2"),
    ],
    ids=["mha-pp", "mla-cp"],
)
def test_namespace_carries_model_ranks_dtype_layout(sg, node, ranks, mla, want):
    config = sg.storage.HiCacheStorageConfig(
        **ranks, is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True, model_name="m", extra_config=extra_config(node.socket)
    )
    b = sg.backend.FluxkvHiCacheStorage(config, {})
    b.register_mem_pool_host(make_pool(sg, mla, "page_first", torch.float32))
    assert b.namespace == want
    b.close()


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("mla, layout", POOL_KINDS, ids=[f"{'mla' if m else 'mha'}-{lay}" for m, lay in POOL_KINDS])
def test_every_method_round_trips(sg, node, mla, layout, dtype):
    model = f"rt-{int(mla)}-{layout}-{dtype}"
    src = make_pool(sg, mla, layout, dtype, fill_seed=1)
    b = engine(sg, src, model, node.socket, mla=mla).backend
    keys = ["p0", "p1", "p2"]
    at = (32, 0, 80)  # out of order, not contiguous
    assert b.batch_set_v1(keys, slots(*at)) == [True] * 3
    assert b.batch_set_v1(keys, slots(*at)) == [True] * 3  # already there: still held
    assert b.batch_exists(keys + ["nope", "p0"]) == 3
    assert b.exists("p1") and not b.exists("nope")

    dst = make_pool(sg, mla, layout, dtype)  # another engine's host pool, same namespace
    rd = engine(sg, dst, model, node.socket, mla=mla).backend
    back = (16, 112, 48)
    assert rd.batch_get_v1(keys + ["nope"], slots(*back, 64)) == [True, True, True, False]
    for s, d in zip(at, back):
        assert torch.equal(flat(src, s), flat(dst, d))
    assert not flat(dst, 64).any()  # a miss leaves its slots alone

    # the generic calls read the same pages ...
    assert torch.equal(b.get("p0"), flat(src, 32))
    target = src.get_dummy_flat_data_page()
    assert b.get("p1", target) is target and torch.equal(target, flat(src, 0))
    got = b.batch_get(["p2", "nope"], [src.get_dummy_flat_data_page() for _ in range(2)])
    assert torch.equal(got[0], flat(src, 80)) and got[1] is None
    assert b.get("nope") is None
    # ... and write pages the zero-copy calls read
    assert b.set("q0", src.get_data_page(96))
    assert b.batch_set(["q1", "q2"], [src.get_data_page(16), src.get_data_page(112)])
    assert rd.batch_get_v1(["q0", "q1", "q2"], slots(0, 16, 32)) == [True] * 3
    for s, d in zip((96, 16, 112), (0, 16, 32)):
        assert torch.equal(flat(src, s), flat(dst, d))
    b.close()
    rd.close()


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_batch_exists_counts_the_leading_whole_pages(sg, node, mla):
    pool = make_pool(sg, mla, "page_first", torch.float32, fill_seed=2)
    b = engine(sg, pool, f"prefix-{mla}", node.socket, mla=mla).backend
    assert b.batch_set_v1(["a", "b", "c", "e"], slots(0, 16, 32, 48)) == [True] * 4
    assert b.batch_exists(["a", "b", "c", "d", "e"]) == 3
    assert b.batch_exists(["d", "a"]) == 0
    if not mla:  # a page is K and V: with V gone, the page is gone
        with fluxkv.connect(node.socket) as c:
            assert c.delete(f"{b.namespace}/b.v")
        assert b.batch_exists(["a", "b", "c"]) == 1
        assert not b.exists("b")
        assert b.batch_get_v1(["a", "b"], slots(64, 80)) == [True, False]
    b.close()


def test_tp_ranks_of_mha_never_meet_mla_ranks_share(sg, node):
    for mla in (False, True):
        pools = [make_pool(sg, mla, "page_first", torch.float32, fill_seed=3), make_pool(sg, mla, "page_first", torch.float32)]
        rank = [engine(sg, pools[r], "tp-model", node.socket, tp_rank=r, tp_size=2, mla=mla).backend for r in range(2)]
        assert rank[0].batch_set_v1(["x", "y"], slots(0, 16)) == [True, True]
        assert rank[0].batch_exists(["x", "y"]) == 2
        if mla:
            assert rank[0].namespace == rank[1].namespace
            assert rank[1].batch_exists(["x", "y"]) == 2
            assert rank[1].batch_get_v1(["x", "y"], slots(32, 48)) == [True, True]
            assert torch.equal(flat(pools[1], 32), flat(pools[0], 0))
        else:
            assert rank[0].namespace != rank[1].namespace
            assert rank[1].batch_exists(["x", "y"]) == 0
            assert rank[1].batch_get_v1(["x", "y"], slots(32, 48)) == [False, False]
            assert rank[1].get("x") is None
        for b in rank:
            b.close()


def every_call_misses(b, pool) -> None:
    """Each HiCacheStorage call answers 'not cached' / 'not stored', without raising."""
    assert b.batch_exists(["m0", "m1"]) == 0
    assert b.batch_get_v1(["m0", "m1"], slots(0, 16)) == [False, False]
    assert b.batch_set_v1(["m0"], slots(0)) == [False]
    assert b.get("m0") is None
    assert b.batch_get(["m0"], [pool.get_dummy_flat_data_page()]) == [None]
    assert b.set("m0", pool.get_data_page(0)) is False
    assert b.batch_set(["m0"], [pool.get_data_page(0)]) is False
    assert b.exists("m0") is False
    b.clear()


def test_fluxkv_not_there(sg, cluster, caplog):
    pool = make_pool(sg, False, "page_first", torch.float32, fill_seed=4)
    nowhere = str(cluster.root / "nobody" / "fluxkv.sock")
    c = engine(sg, pool, "down-model", nowhere, metrics=True)
    with caplog.at_level(logging.WARNING, logger="fluxkv.kv"):
        every_call_misses(c.backend, pool)
        assert c.hit_pages(["m0"]) == 0 and c.load(["m0"], slots(0)) == 0 and c.backup(["m0"], slots(0)) == 0
    assert any("answered as not cached" in r.getMessage() for r in caplog.records)
    stats = c.backend.get_stats()
    sg.Collector().log_storage_metrics(stats)
    assert stats.pages is None and stats.errors > 0 and stats.stored == 0


def test_fluxkv_stops_mid_use(sg, cluster):
    owner = cluster.up("64MiB", name="leaving")
    pool = make_pool(sg, False, "layer_first", torch.bfloat16, fill_seed=5)
    b = engine(sg, pool, "leaving-model", owner.socket).backend
    assert b.batch_set_v1(["m0", "m1"], slots(0, 16)) == [True, True]
    assert b.batch_exists(["m0", "m1"]) == 2
    owner.stop()
    every_call_misses(b, pool)
    b.close()


def test_get_stats_feeds_sglang_metrics(sg, node, monkeypatch):
    monkeypatch.setattr(sg.backend, "NAMESPACE_STATS_INTERVAL_S", 0.0)
    pool = make_pool(sg, False, "page_first", torch.float32, fill_seed=6)
    b = engine(sg, pool, "stats-model", node.socket, metrics=True).backend
    assert b.batch_set_v1(["s0", "s1", "s2"], slots(0, 16, 32)) == [True] * 3
    assert b.batch_set_v1(["s0"], slots(0)) == [True]  # present: not stored again
    assert b.batch_get_v1(["s0", "s1", "zz"], slots(48, 64, 80)) == [True, True, False]
    stats = b.get_stats()
    collector = sg.Collector()
    collector.log_storage_metrics(stats)
    # the second backup found s0 cached: it counts as backed up (the page is not written again)
    assert collector.observed["backup_pgs"] == [3, 1] and collector.observed["prefetch_pgs"] == [3]
    assert len(collector.observed["prefetch_bandwidth"]) == 1 and collector.observed["prefetch_bandwidth"][0] > 0
    assert (stats.hits, stats.misses, stats.stored, stats.errors) == (2, 1, 4, 0)
    # a page found after a miss is not counted a hit: SGLang uses the leading ones only
    assert b.batch_get_v1(["zz", "s1"], slots(48, 64)) == [False, True]
    stats = b.get_stats()
    assert (stats.hits, stats.misses) == (2, 3)  # (the counters add up across get_stats calls)
    # the namespace's size comes from a refresh in the background
    later = wait_until(lambda: (lambda st: st if st.pages is not None else None)(b.get_stats()), timeout=60)
    page_bytes = 2 * PAGE * 3 * 2 * 8 * 4
    assert later.pages == 3 and later.bytes >= 3 * page_bytes
    assert later.prefetch_pgs == []  # samples are handed over once
    b.close()


def test_get_stats_never_waits_for_the_master(sg, node, monkeypatch):
    """get_stats() runs on SGLang's scheduler thread: a namespace stat stuck on an
    unreachable master (here: held until the test lets it go) must not hold it."""
    monkeypatch.setattr(sg.backend, "NAMESPACE_STATS_INTERVAL_S", 0.0)
    entered, opened, waits = threading.Event(), threading.Event(), []
    orig = kv.PageStore.stats

    def held(store):
        entered.set()
        waits.append(opened.wait(60))
        return orig(store)

    monkeypatch.setattr(kv.PageStore, "stats", held)
    pool = make_pool(sg, False, "page_first", torch.float32, fill_seed=9)
    b = engine(sg, pool, "stuck-master", node.socket).backend
    assert b.batch_set_v1(["w0"], slots(0)) == [True]
    assert b.get_stats().pages is None
    assert entered.wait(60)
    for _ in range(20):  # each returns while the refresh is held: one refresh in flight at most
        st = b.get_stats()
        assert st.pages is None and st.stored == 1
    assert waits == []
    opened.set()
    assert wait_until(lambda: b.get_stats().pages == 1, timeout=60)
    assert waits and all(waits), "a get_stats() call waited for the held refresh"
    threads = [t for t in threading.enumerate() if t.name == f"fluxkv-stats {b.namespace}"]
    assert len(threads) == 1 and threads[0].daemon
    b.close()
    threads[0].join(60)
    assert not threads[0].is_alive(), "close() stops the stats thread"


def test_clear_drops_this_namespace_only(sg, node):
    pools = [make_pool(sg, False, "page_first", torch.float32, fill_seed=7) for _ in range(2)]
    mine, other = (engine(sg, p, name, node.socket).backend for p, name in zip(pools, ("clear-a", "clear-b")))
    for b in (mine, other):
        assert b.batch_set_v1(["c0", "c1"], slots(0, 16)) == [True, True]
    mine.clear()
    assert mine.batch_exists(["c0", "c1"]) == 0
    assert other.batch_exists(["c0", "c1"]) == 2
    mine.close()
    other.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_page_of_another_shape_is_a_miss(sg, node, layout, caplog):
    pool = make_pool(sg, False, layout, torch.float32, fill_seed=8)
    b = engine(sg, pool, f"odd-{layout}", node.socket).backend
    assert b.batch_set_v1(["ok"], slots(0)) == [True]
    with kv.PageStore(node.socket, b.namespace, layout=f"mha-{tag_of(layout)}") as foreign:
        assert foreign.put_pages(["odd.k", "odd.v"], [torch.zeros(3, 5), torch.zeros(3, 5)]) == [True, True]
    with caplog.at_level(logging.ERROR, logger="fluxkv.integrations.sglang"):
        assert b.batch_get_v1(["odd"], slots(16)) == [False]
        assert b.get("odd") is None
    assert any("another layout" in r.getMessage() for r in caplog.records)
    assert b.batch_get_v1(["ok"], slots(16)) == [True]
    b.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_before_one_of_another_shape_still_load(sg, node, layout, caplog):
    """SGLang's prefetch (cache_controller._page_get_zero_copy) uses the leading pages a
    batch_get_v1 found: a page of another layout in a batch is a miss, and so are the pages
    after it, but the pages before it load."""
    pool = make_pool(sg, False, layout, torch.float32, pages=16, fill_seed=9)
    b = engine(sg, pool, f"odd-run-{layout}", node.socket).backend
    assert b.batch_set_v1(["a", "b", "c"], slots(0, 16, 32)) == [True, True, True]
    with kv.PageStore(node.socket, b.namespace, layout=f"mha-{tag_of(layout)}") as foreign:
        assert foreign.put_pages(["odd.k", "odd.v"], [torch.zeros(3, 5), torch.zeros(3, 5)]) == [True, True]
    want = [flat(pool, s) for s in (0, 16)]
    with caplog.at_level(logging.ERROR, logger="fluxkv.integrations.sglang"):
        assert b.batch_get_v1(["a", "b", "odd", "c"], slots(64, 80, 96, 112)) == [True, True, False, False]
        assert [torch.equal(flat(pool, s), w) for s, w in zip((64, 80), want)] == [True, True]
        got = b.batch_get(["a", "odd", "c"])
        assert torch.equal(got[0], want[0]) and got[1:] == [None, None]
        assert b.batch_get_v1(["odd", "a"], slots(64, 80)) == [False, False]
    assert any("another layout" in r.getMessage() for r in caplog.records)
    b.close()


def test_a_host_pool_dtype_fluxkv_cannot_store_is_refused(sg, node):
    pool = make_pool(sg, False, "page_first", torch.complex64)
    with pytest.raises(ValueError, match=r"host pool dtype complex64: fluxkv pages hold float32, .*bfloat16"):
        engine(sg, pool, "complex-model", node.socket)


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_pools_of_other_page_shapes_keep_their_own_pages(sg, node, mla):
    """One model served with and without MTP speculative decoding: the host pool of the MTP
    engine holds the draft layers too (pool_host/mha.py at sglang 0047d999,
    get_size_per_token: ``layer_num = target_layer_num + len(mtp_draft_device_pools)``), so
    its pages are larger. Each engine must load the pages it backed up."""

    def pool(layers: int, seed: int):
        if mla:
            p = sg.pools.MLATokenToKVPoolHost(8 * PAGE, PAGE, layer_num=layers, kv_cache_dim=24, dtype=torch.float32, layout="page_first")
        else:
            p = sg.pools.MHATokenToKVPoolHost(8 * PAGE, PAGE, layer_num=layers, head_num=2, head_dim=8, dtype=torch.float32, layout="page_first")
        p.kv_buffer.copy_(torch.randn(p.kv_buffer.shape, generator=torch.Generator().manual_seed(seed)))
        return p

    plain, mtp = pool(3, 13), pool(4, 14)
    a = engine(sg, plain, "mtp-model", node.socket, mla=mla).backend
    b = engine(sg, mtp, "mtp-model", node.socket, mla=mla).backend
    assert a.batch_set_v1(["m0", "m1"], slots(0, 16)) == [True, True]
    assert b.batch_set_v1(["m0", "m1"], slots(0, 16)) == [True, True]
    assert b.batch_exists(["m0", "m1"]) == 2
    assert b.batch_get_v1(["m0", "m1"], slots(32, 48)) == [True, True]
    assert torch.equal(flat(mtp, 32), flat(mtp, 0)) and torch.equal(flat(mtp, 48), flat(mtp, 16))
    assert a.batch_get_v1(["m0", "m1"], slots(32, 48)) == [True, True]
    assert torch.equal(flat(plain, 32), flat(plain, 0)) and torch.equal(flat(plain, 48), flat(plain, 16))
    a.close()
    b.close()


class _Float8:
    """A torch float8 dtype where torch has none (torch 1.13): what ``str()`` of it reads."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


def fp8_pool(sg, mla: bool, kv_dtype: str, fill_seed: int):
    """A host pool of an fp8 KV cache as SGLang builds it (memory_pool.py KVCache.__init__:
    float8_e4m3fn and float8_e5m2 are stored as torch.uint8, ``store_dtype``;
    pool_host/base.py HostKVCache.__init__, sglang 0047d999: ``self.device_pool = device_pool``,
    ``self.dtype = device_pool.store_dtype``): uint8 buffers, the KV dtype on the device pool."""
    pool = make_pool(sg, mla, "page_first", torch.uint8)
    g = torch.Generator().manual_seed(fill_seed)
    pool.kv_buffer.copy_(torch.randint(0, 256, pool.kv_buffer.shape, generator=g, dtype=torch.uint8))
    pool.device_pool = SimpleNamespace(dtype=getattr(torch, kv_dtype, None) or _Float8(kv_dtype), store_dtype=torch.uint8)
    return pool


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_fp8_formats_never_read_each_others_pages(sg, node, mla):
    """--kv-cache-dtype fp8_e4m3 and fp8_e5m2 both give a uint8 host pool; their bytes mean
    different numbers, so one must never load the other's pages as its own."""
    e4m3, e5m2 = fp8_pool(sg, mla, "float8_e4m3fn", 11), fp8_pool(sg, mla, "float8_e5m2", 12)
    a = engine(sg, e4m3, "fp8-model", node.socket, mla=mla).backend
    b = engine(sg, e5m2, "fp8-model", node.socket, mla=mla).backend
    assert a.batch_set_v1(["f0", "f1"], slots(0, 16)) == [True, True]
    assert b.batch_exists(["f0", "f1"]) == 0
    assert b.batch_get_v1(["f0", "f1"], slots(32, 48)) == [False, False]
    assert b.batch_set_v1(["f0", "f1"], slots(0, 16)) == [True, True]
    assert b.batch_get_v1(["f0", "f1"], slots(32, 48)) == [True, True]
    assert torch.equal(flat(e5m2, 32), flat(e5m2, 0)) and torch.equal(flat(e5m2, 48), flat(e5m2, 16))
    assert a.batch_get_v1(["f0"], slots(32)) == [True] and torch.equal(flat(e4m3, 32), flat(e4m3, 0))
    a.close()
    b.close()


def test_timeout_s_reaches_the_store(sg, node, monkeypatch):
    options: list = []
    orig = kv.PageStore.__init__

    def spy(self, *a, **kw):
        options.append(kw)
        orig(self, *a, **kw)

    monkeypatch.setattr(kv.PageStore, "__init__", spy)
    for more, want in [({"timeout_s": "2.5"}, 2.5), ({}, None)]:
        pool = make_pool(sg, False, "page_first", torch.float32, fill_seed=10)
        b = engine(sg, pool, "timeout-model", node.socket, **more).backend
        assert options[-1].get("timeout") == want and ("timeout" in options[-1]) == (want is not None)
        assert b.batch_set_v1(["t0"], slots(0)) == [True]
        b.close()


def test_misuse_raises(sg, node):
    pool = make_pool(sg, False, "page_first", torch.float32)
    b = engine(sg, pool, "misuse", node.socket).backend
    with pytest.raises(ValueError, match="host indices"):
        b.batch_get_v1(["a", "b"], slots(0))
    with pytest.raises(ValueError, match="does not start a page"):
        b.batch_set_v1(["a"], torch.arange(8, 8 + PAGE))
    with pytest.raises(ValueError, match="flat page"):
        b.set("a", torch.zeros(3))
    with pytest.raises(ValueError, match="values"):
        b.batch_set(["a"])
    b.register_mem_host_pool_v2(pool, "kv")  # the KV pool it already has
    with pytest.raises(ValueError, match="hybrid"):
        b.register_mem_host_pool_v2(pool, "mamba")
    b.close()
    config = sg.storage.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m", extra_config=extra_config(node.socket))
    early = sg.backend.FluxkvHiCacheStorage(config, {})
    with pytest.raises(RuntimeError, match="register_mem_pool_host"):
        early.batch_exists(["a"])
    with pytest.raises(ValueError, match="MLA host pool"):
        mla_config = sg.storage.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, True, False, True, "m", extra_config=extra_config(node.socket))
        sg.backend.FluxkvHiCacheStorage(mla_config, {}).register_mem_pool_host(pool)

    class Skewed(sg.pools.MHATokenToKVPoolHost):
        def get_page_buffer_meta(self, indices):
            ptrs, sizes = super().get_page_buffer_meta(indices)
            return [p + 4 for p in ptrs], sizes

    with pytest.raises(ValueError, match="pages fluxkv expects"):
        skewed = Skewed(4 * PAGE, PAGE, layer_num=3, head_num=2, head_dim=8, dtype=torch.float32, layout="page_first")
        sg.backend.FluxkvHiCacheStorage(config, {}).register_mem_pool_host(skewed)
    nameless = sg.storage.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, None, extra_config=extra_config(node.socket))
    with pytest.raises(ValueError, match="model name"):
        sg.backend.FluxkvHiCacheStorage(nameless, {})


def test_page_axis_layouts_name_their_namespace(sg, node):
    for mla, layout, shape in [(False, "page_first_direct", "3x16x2x8"), (False, "page_head", "2x16x3x8"), (True, "page_first_direct", "3x16x1x24")]:
        b = engine(sg, make_pool(sg, mla, layout, torch.float32), "axis", node.socket, mla=mla).backend
        assert b.namespace == f"kv1/axis/{'tp*' if mla else 'tp0of1'}/pp0of1/float32/{'mla' if mla else 'mha'}-{tag_of(layout)}/{shape}"
        b.close()


def asymmetric_pool(sg, layout: str, dtype=torch.bfloat16, pages: int = 8, fill_seed: int | None = None):
    """A pool of a model whose V head is narrower than its K head (K 12, V 8 wide)."""
    pool = sg.pools.AsymmetricMHATokenToKVPoolHost(pages * PAGE, PAGE, layer_num=3, head_num=2, head_dim=12, v_head_dim=8, dtype=dtype, layout=layout)
    if fill_seed is not None:
        g = torch.Generator().manual_seed(fill_seed)
        for buf in pool.kv_buffer:
            buf.copy_(torch.randn(buf.shape, generator=g).to(dtype))
    return pool


def page_parts(pool, start: int) -> list:
    """K's and V's page at start, in the pool's own order (upstream's page ranges)."""
    ptrs, sizes = pool.get_page_buffer_meta(torch.arange(start, start + PAGE))
    base = [b.data_ptr() for b in pool.kv_buffer]
    out = []
    for buf, ptr, size in zip(pool.kv_buffer, ptrs, sizes):
        flat_buf = buf.view(-1)
        first = (ptr - buf.data_ptr()) // buf.element_size()
        out.append(flat_buf[first : first + size // buf.element_size()])
        assert buf.data_ptr() in base
    return out


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_asymmetric_kv_pools_round_trip_zero_copy(sg, node, layout, monkeypatch):
    """K and V in two host buffers of different widths: stored and loaded through the v1
    calls, each page's K and V copied straight between the pool and shared memory."""
    src, dst = asymmetric_pool(sg, layout, fill_seed=12), asymmetric_pool(sg, layout)
    a = engine(sg, src, f"asym-{layout}", node.socket).backend
    b = engine(sg, dst, f"asym-{layout}", node.socket).backend
    shapes = "16x3x2x12+16x3x2x8" if layout == "page_first" else "3x16x2x12+3x16x2x8"
    assert a.namespace == b.namespace and a.namespace.endswith(f"/bfloat16/mha-{tag_of(layout)}/{shapes}")
    targets: list = []
    orig = kv.PageStore.get_pages_into

    def spy(self, names, tensors, *args, **kw):
        targets.extend(t.data_ptr() for t in tensors)
        return orig(self, names, tensors, *args, **kw)

    monkeypatch.setattr(kv.PageStore, "get_pages_into", spy)
    keys, at, back = ["a0", "a1", "a2"], (48, 0, 96), (16, 112, 64)
    assert a.batch_set_v1(keys, slots(*at)) == [True] * 3
    assert b.batch_exists(keys + ["none"]) == 3
    assert b.batch_get_v1(keys + ["none"], slots(*back, 32)) == [True, True, True, False]
    for s, d in zip(at, back):
        for want, got in zip(page_parts(src, s), page_parts(dst, d)):
            assert torch.equal(want, got)
    assert not any(buf.narrow(0, 32 // PAGE if layout == "page_first_direct" else 32, 1).any() for buf in dst.kv_buffer)
    # zero-copy: every load target is a page range of the pool itself, K's and V's
    want = [p for d in back for p in dst.get_page_buffer_meta(torch.arange(d, d + PAGE))[0]]
    assert targets[: len(want)] == want
    with fluxkv.connect(node.socket) as c:  # K and V pages of their own shapes
        k, v = (kv.PageHeader.unpack(c.get(f"{a.namespace}/a0{s}").read(0, kv.PAGE_HEADER_BYTES)) for s in (".k", ".v"))
    width = {"page_first": lambda d: (PAGE, 3, 2, d), "page_first_direct": lambda d: (3, PAGE, 2, d)}[layout]
    assert (k.shape, v.shape) == (width(12), width(8))
    a.close()
    b.close()


def test_asymmetric_kv_pool_on_the_generic_path_is_refused(sg, node):
    with pytest.raises(ValueError, match=r"AsymmetricMHATokenToKVPoolHost has no flat data pages.*\"interface_v1\": 1"):
        engine(sg, asymmetric_pool(sg, "page_first"), "asym-generic", node.socket, interface_v1=False)


def test_mxfp8_and_undescribed_pools_are_refused_by_name(sg, node):
    mxfp8 = sg.pools.MHATokenToKVPoolMXFP8Host(8 * PAGE, PAGE, layer_num=3, head_num=2, head_dim=8, sf_page_bytes=4)
    with pytest.raises(ValueError, match=r"host pool MHATokenToKVPoolMXFP8Host: .*scales live outside kv_buffer \(k_scale_host, v_scale_host\)"):
        engine(sg, mxfp8, "mxfp8", node.socket)

    class Int8Pool(sg.pools.MHATokenToKVPoolHost):  # upstream's INT8 pool: no page buffers
        def get_page_buffer_meta(self, indices):
            raise NotImplementedError("INT8 host pool")

    int8 = Int8Pool(8 * PAGE, PAGE, layer_num=3, head_num=2, head_dim=8, dtype=torch.uint8, layout="layer_first")
    with pytest.raises(ValueError, match=r"host pool Int8Pool: .*describes no page buffers for it \(INT8 host pool\)"):
        engine(sg, int8, "int8", node.socket)
    with pytest.raises(ValueError, match=r"MLA pools"):
        engine(sg, make_pool(sg, False, "page_head", torch.float32), "mla-head", node.socket, mla=True)


def test_imports_without_sglang():
    code = (
        "import fluxkv.integrations.sglang as m, sys\n"
        "assert 'sglang' not in sys.modules\n"
        "assert m.HiCacheStorage.__module__ == 'fluxkv.integrations.sglang'\n"
        "assert issubclass(m.FluxkvHiCacheStorage, m.HiCacheStorage)\n"
        "assert m.stats_type().__mro__[1] is m._LocalStorageMetrics\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# -- the model test (issue point 5): a prefill whose prefix pages come through this backend --


def pool_views(pool, start: int) -> list:
    """The K and V of the page at start, each as (layers, tokens, heads, head_dim) views."""
    def view(buf):
        if pool.layout == "layer_first":
            return buf[:, start : start + PAGE]
        if pool.layout == "page_first":
            return buf[start : start + PAGE].transpose(0, 1)
        if pool.layout == "page_first_direct":  # (pages, layers, page_size, heads, dim)
            return buf[start // PAGE]
        return buf[start // PAGE].permute(2, 1, 0, 3)  # page_head: (pages, heads, page_size, layers, dim)

    return [view(pool.k_buffer), view(pool.v_buffer)]


def to_pool(pool, start: int, page: torch.Tensor) -> None:
    """TinyLM's page (layers, 2, heads, tokens, head_dim) into the pool's slots."""
    for i, view in enumerate(pool_views(pool, start)):
        view.copy_(page[:, i].transpose(1, 2))


def from_pool(pool, start: int) -> torch.Tensor:
    return torch.stack([v.transpose(1, 2) for v in pool_views(pool, start)], dim=1).contiguous()


@pytest.mark.parametrize("interface_v1", [True, False], ids=["v1", "generic"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_prefill_from_fluxkv_matches_recompute(sg, node, dtype, layout, interface_v1):
    m = TinyLM(dtype=dtype, seed=0)
    tokens = m.prompt(6 * m.page_tokens + 5, seed=11)
    hashes = chain_hashes(tokens)
    full_logits, pages = m.prefill(tokens)
    model = f"tinylm-{dtype}-{layout}-{interface_v1}"

    def host(pool_pages: int):
        return sg.pools.MHATokenToKVPoolHost(pool_pages * PAGE, PAGE, m.n_layers, m.n_kv_heads, m.head_dim, dtype, layout)

    # engine A computed the prompt and backs its pages up (from scattered host slots)
    pool_a = host(8)
    at = [16 * s for s in (7, 2, 5, 0, 3, 6)]
    for s, page in zip(at, pages):
        to_pool(pool_a, s, page)
    a = engine(sg, pool_a, model, node.socket, interface_v1=interface_v1)
    assert a.backup(hashes, slots(*at)) == len(hashes)

    # engine B sees the same prompt: the prefix from fluxkv into its own host pool
    pool_b = host(10)
    b = engine(sg, pool_b, model, node.socket, interface_v1=interface_v1)
    assert b.hit_pages(hashes) == len(hashes)
    back = [16 * s for s in (9, 1, 4, 8, 0, 6)]
    assert b.load(hashes, slots(*back)) == len(hashes)
    prefix = [from_pool(pool_b, s) for s in back]
    assert all(torch.equal(p, q) for p, q in zip(prefix, pages))  # bit-identical

    logits, _ = m.prefill(tokens, prefix)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert torch.allclose(logits, full_logits[len(prefix) * m.page_tokens :], rtol=tol, atol=tol)
    assert m.generate(tokens, 64, prefix) == m.generate(tokens, 64)
    a.backend.close()
    b.backend.close()


def test_backups_chain_to_the_pages_before_them(sg, node, monkeypatch):
    """SGLang backs a radix node's pages up in batches, each with the hashes of the pages
    before it (``prefix_keys``: the node's ancestors', extended by every batch backed up):
    each batch is put as one chain under the last page before it, so eviction keeps a
    prompt's pages from its front across batches and nodes; a node under the root, whose
    prefix_keys is None, starts a chain of its own."""
    n = sg.storage.STORAGE_BATCH_SIZE + 3
    pool = make_pool(sg, False, "layer_first", torch.float32, pages=n, fill_seed=5)
    c = engine(sg, pool, "prefix-chain", node.socket)
    parents: list = []
    put_pages = kv.PageStore.put_pages

    def spy(self, hashes, tensors, *, parent=None, chain=True):
        parents.append((hashes[0], parent))
        return put_pages(self, hashes, tensors, parent=parent, chain=chain)

    monkeypatch.setattr(kv.PageStore, "put_pages", spy)
    hashes = [f"pc{i}" for i in range(n)]
    assert c.backup(hashes[:1], slots(0)) == 1  # the node under the root
    assert c.backup(hashes[1:], slots(*range(PAGE, n * PAGE, PAGE)), prefix_keys=hashes[:1]) == n - 1
    # an MHA page is K then V: a batch's first K follows the page before's V
    assert parents == [("pc0.k", None), ("pc1.k", "pc0.v"), (f"pc{n - 2}.k", f"pc{n - 3}.v")]
    assert c.hit_pages(hashes) == n


def test_sglang_get_stats_does_not_wait_for_an_attach(tmp_path):
    """get_stats() runs on SGLang's scheduler thread and "never waits on fluxkv". But it reads
    PageStore.counters(), which takes the store's lock, and PageStore._connected() holds
    that lock while it attaches (up to attach_timeout) to an owner that accepts and does not
    answer: the scheduler thread waits as long."""
    import socket
    import time

    path = str(tmp_path / "fluxkv.sock")
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(path)
    hung.listen(16)  # accepts (in the backlog), never answers the attach hello
    try:
        with engine_standin("sglang"):
            from sglang.srt.managers.cache_controller import StorageController
            from sglang.srt.mem_cache import hicache_storage, pool_host

            import fluxkv.integrations.sglang as backend

            sg = SimpleNamespace(storage=hicache_storage, pools=pool_host, Controller=StorageController, backend=backend)
            pool = make_pool(sg, False, "page_first", torch.float32)
            b = engine(sg, pool, "hung-owner", path, timeout_s=3).backend
            t = threading.Thread(target=b.batch_exists, args=(["p0"],), daemon=True)
            t.start()
            time.sleep(0.3)  # the prefetch thread is attaching now
            t0 = time.monotonic()
            b.get_stats()
            waited = time.monotonic() - t0
            t.join(10)
            b.close()
        assert waited < 0.5, f"get_stats() waited {waited:.2f} s for another thread's attach"
    finally:
        hung.close()

