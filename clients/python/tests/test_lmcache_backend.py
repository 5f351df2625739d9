"""fluxkv.integrations.lmcache against real daemons, loaded the way LMCache loads a remote
storage plugin: from the issue's config, through the stand-in of LMCache's interfaces in
tests/engines/lmcache (on sys.path for this module only). Ends with the model test: a prompt's
KV stored as LMCache chunks, its leading chunks loaded back into a prefill."""

from __future__ import annotations

import asyncio
import collections
import importlib
import logging
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import child_env, engine_standin, wait_until
import fluxkv
from fluxkv import kv
from tinylm import TinyLM, chain_hashes

CHUNK_TOKENS = 32  # LMCache chunk: two tinylm pages
LAYERS, HIDDEN = 4, 32  # a test chunk: KV_2LTD [2, LAYERS, tokens, HIDDEN]

# The configuration of issue 27 (LMCache's YAML), with a real socket.
ISSUE_CONFIG = """\
chunk_size: {chunk}
local_cpu: false
max_local_cpu_size: 5
remote_serde: naive
remote_storage_plugins: ["fluxkv"]
extra_config:
  remote_storage_plugin.fluxkv.module_path: fluxkv.integrations.lmcache
  remote_storage_plugin.fluxkv.class_name: FluxKVConnectorAdapter
  remote_storage_plugin.fluxkv.url: fluxkv://{socket}
"""


@pytest.fixture(scope="module")
def lmc():
    """The stand-in LMCache modules, and the backend imported against them; both are gone
    from sys.modules (and the stand-in from sys.path) after this module."""
    with engine_standin("lmcache"):
        yield standin_modules()


def standin_modules() -> SimpleNamespace:
    """The stand-in's modules the tests use, and the backend imported on top of them."""
    return SimpleNamespace(
        utils=importlib.import_module("lmcache.utils"),
        config=importlib.import_module("lmcache.v1.config"),
        metadata=importlib.import_module("lmcache.v1.metadata"),
        mm=importlib.import_module("lmcache.v1.memory_management"),
        cpu=importlib.import_module("lmcache.v1.storage_backend.local_cpu_backend"),
        storage=importlib.import_module("lmcache.v1.storage_backend"),
        connector=importlib.import_module("lmcache.v1.storage_backend.connector"),
        base=importlib.import_module("lmcache.v1.storage_backend.connector.base_connector"),
        backend=importlib.import_module("fluxkv.integrations.lmcache"),
    )


def open_connector(lmc, socket: str, tmp_path: Path, *, dtype=torch.float32, use_mla=False, capacity=64 << 20,
                   config_text: str = ISSUE_CONFIG, backend: str = "RemoteBackend-fluxkv", layer_pages=False,
                   kv_shape=(LAYERS, 2, CHUNK_TOKENS, 2, 16), **metadata):
    """(connector, local CPU backend) as LMCache builds them from a config file (the issue's
    by default); ``metadata`` adds to the engine metadata (KV groups)."""
    cfg = tmp_path / f"lmcache-{len(list(tmp_path.glob('lmcache-*')))}.yaml"
    cfg.write_text(config_text.format(chunk=CHUNK_TOKENS, socket=socket))
    config = lmc.config.LMCacheEngineConfig.from_file(str(cfg))
    md = lmc.metadata.LMCacheMetadata("tiny", 1, 0, dtype, kv_shape, use_mla, CHUNK_TOKENS, **metadata)
    cpu = lmc.cpu.LocalCPUBackend(capacity, layer_pages=layer_pages)
    connectors = lmc.storage.CreateRemoteConnectors(config, md, None, cpu)
    assert list(connectors) == [backend]
    return connectors[backend], cpu


@pytest.fixture
def conn(lmc, daemon, tmp_path):
    """A connector on the test daemon; at the end every MemoryObj a test got is released."""
    c, cpu = open_connector(lmc, daemon.socket, tmp_path)
    yield c, cpu
    asyncio.run(c.close())
    assert cpu.live == 0, f"{cpu.live} MemoryObjs were not released"


@pytest.fixture
def calls(monkeypatch) -> collections.Counter:
    """How many times each PageStore call ran (each is one batch call to the owner)."""
    counts: collections.Counter = collections.Counter()
    for name in ("contains_prefix", "contains", "get_pages", "get_pages_into", "put_pages", "delete_pages"):
        def spy(self, *a, _orig=getattr(kv.PageStore, name), _name=name, **kw):
            counts[_name] += 1
            if _name == "contains_prefix":
                counts["pinned"] += kw.get("pin", True)
            return _orig(self, *a, **kw)

        monkeypatch.setattr(kv.PageStore, name, spy)
    return counts


def key(lmc, h: int, *, model="tiny", world=1, worker=0, dtype=torch.float32, tags=None):
    return lmc.utils.CacheEngineKey(model, world, worker, h, dtype, tags)


def chunk(lmc, cpu, seed: int, *, tokens=CHUNK_TOKENS, dtype=torch.float32, fmt=None, shape=None):
    """A MemoryObj of random KV, allocated as LMCache does (ref count 1)."""
    fmt = fmt or lmc.mm.MemoryFormat.KV_2LTD
    shape = shape or (2, LAYERS, tokens, HIDDEN)
    obj = cpu.allocate(torch.Size(shape), dtype, fmt)
    obj.tensor.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype))
    return obj


def run(coro):
    return asyncio.run(coro)


class Gate:
    """Holds every call of one PageStore method (on the connector's worker thread) until the
    test opens it; ``waits`` records whether each call was let through (False: timed out)."""

    def __init__(self, monkeypatch, name: str):
        self.entered, self.opened, self.waits = threading.Event(), threading.Event(), []
        orig = getattr(kv.PageStore, name)

        def held(store, *a, **kw):
            self.entered.set()
            self.waits.append(self.opened.wait(60))
            return orig(store, *a, **kw)

        monkeypatch.setattr(kv.PageStore, name, held)

    async def cancel(self, coro) -> None:
        """Start coro, cancel it once its worker is held here (as LMCache's timeout does)."""
        task = asyncio.ensure_future(coro)
        assert await asyncio.to_thread(self.entered.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def settled(pred) -> bool:
    """pred() became true within a minute (polled off the event loop)."""
    return await asyncio.to_thread(wait_until, pred, 60)


def release(*objs) -> None:
    for o in objs:
        if o is not None:
            o.ref_count_down()


# -- loading ----------------------------------------------------------------------------------


def test_loads_as_a_remote_storage_plugin(lmc, conn):
    c, _ = conn
    assert isinstance(c, lmc.backend.FluxKVConnector) and isinstance(c, lmc.base.RemoteConnector)
    assert lmc.backend.lmcache_interface() == {"lmcache": None, "remote_connector_init": True, "batched_contains": "count"}
    switches = {n: getattr(c, n)() for n in dir(c) if n.startswith("support_")}
    assert switches == {
        "support_batched_async_contains": True,
        "support_batched_contains": True,
        "support_batched_get": True,
        "support_batched_get_non_blocking": True,
        "support_batched_put": True,
        "support_ping": False,
    }
    adapter = lmc.backend.FluxKVConnectorAdapter()
    assert isinstance(adapter, lmc.connector.ConnectorAdapter)
    for url, ok in [
        ("fluxkv:///run/fluxkv/fluxkv.sock", True),
        ("plugin://fluxkv", True),
        ("plugin://fluxkv.primary", True),
        ("plugin://fs", False),
        ("plugin://fluxkvx", False),
        ("redis://localhost:6379", False),
    ]:
        assert adapter.can_parse(url) is ok, url


def test_url_settings(lmc, daemon, tmp_path):
    adapter = lmc.backend.FluxKVConnectorAdapter()
    c, cpu = open_connector(lmc, daemon.socket, tmp_path)

    def context(url, extra=None, plugin_name=None):
        cfg = lmc.config.LMCacheEngineConfig(remote_storage_plugins=["fluxkv"], extra_config=extra)
        md = lmc.metadata.LMCacheMetadata("tiny", 1, 0, torch.float32, (LAYERS, 2, CHUNK_TOKENS, 2, 16))
        return lmc.connector.ConnectorContext(url, None, cpu, cfg, md, plugin_name)

    # The legacy remote_url form carries the socket itself.
    direct = adapter.create_connector(context(f"fluxkv://{daemon.socket}"))
    assert direct.socket_path == daemon.socket == c.socket_path
    # A named instance reads its own url setting.
    settings = {"remote_storage_plugin.fluxkv.a.url": f"fluxkv://{daemon.socket}"}
    named = adapter.create_connector(context("plugin://fluxkv.a", settings, "fluxkv.a"))
    assert named.socket_path == daemon.socket
    with pytest.raises(ValueError, match=r"remote_storage_plugin\.fluxkv\.url"):
        adapter.create_connector(context("plugin://fluxkv", {}, "fluxkv"))
    for bad in ["fluxkv://host/x.sock", "fluxkv://relative.sock", "fluxkv:///x.sock?pin=1", "redis:///x"]:
        with pytest.raises(ValueError, match="fluxkv:///path/to/fluxkv.sock"):
            lmc.backend.socket_path_of(bad)
    for x in (c, direct, named):
        run(x.close())


def test_timeout_setting_reaches_the_store(lmc, daemon, tmp_path, monkeypatch):
    options: list = []
    orig = kv.PageStore.__init__

    def spy(self, *a, **kw):
        options.append(kw)
        orig(self, *a, **kw)

    monkeypatch.setattr(kv.PageStore, "__init__", spy)
    cpu = lmc.cpu.LocalCPUBackend(1 << 20)
    md = lmc.metadata.LMCacheMetadata("tiny", 1, 0, torch.float32, (LAYERS, 2, CHUNK_TOKENS, 2, 16))
    adapter = lmc.backend.FluxKVConnectorAdapter()
    url = f"fluxkv://{daemon.socket}"
    for name, extra, want in [
        ("fluxkv", {"remote_storage_plugin.fluxkv.url": url, "remote_storage_plugin.fluxkv.timeout_s": "2.5"}, 2.5),
        ("fluxkv.b", {"remote_storage_plugin.fluxkv.b.url": url, "remote_storage_plugin.fluxkv.b.timeout_s": 7}, 7.0),
        ("fluxkv", {"remote_storage_plugin.fluxkv.url": url}, None),
    ]:
        cfg = lmc.config.LMCacheEngineConfig(remote_storage_plugins=[name], extra_config=extra)
        c = adapter.create_connector(lmc.connector.ConnectorContext(f"plugin://{name}", None, cpu, cfg, md, name))
        assert not c.exists_sync(key(lmc, 0x7117))
        assert options[-1].get("timeout") == want and ("timeout" in options[-1]) == (want is not None)
        assert c.stats()["errors"] == 0
        run(c.close())


def test_imports_without_lmcache(tmp_path):
    code = (
        "import fluxkv.integrations.lmcache as m\n"
        "assert m.FluxKVConnectorAdapter().can_parse('fluxkv:///x.sock')\n"
        "try:\n"
        "    m.FluxKVConnector('/x.sock', None, None, None)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "LMCache is not installed" in r.stdout


# -- one chunk --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_put_get_round_trip(lmc, daemon, tmp_path, dtype):
    c, cpu = open_connector(lmc, daemon.socket, tmp_path, dtype=dtype)
    k = key(lmc, 0xABC, dtype=dtype)
    obj = chunk(lmc, cpu, 1, dtype=dtype)
    assert not run(c.exists(k)) and not c.exists_sync(k) and run(c.get(k)) is None
    run(c.put(k, obj))
    assert obj.get_ref_count() == 1, "the caller (LMCache's wrapper) drops its own reference"
    assert run(c.exists(k)) and c.exists_sync(k)
    got = run(c.get(k))
    assert got is not obj and got.get_ref_count() == 1
    meta = (got.get_shape(), got.get_dtype(), got.get_memory_format())
    assert meta == (obj.get_shape(), dtype, lmc.mm.MemoryFormat.KV_2LTD)
    assert torch.equal(got.tensor, obj.tensor)

    # The last chunk of a prompt holds fewer tokens: its shape comes back from the page.
    k7, short = key(lmc, 0xABD, dtype=dtype), chunk(lmc, cpu, 2, tokens=7, dtype=dtype)
    run(c.put(k7, short))
    got7 = run(c.get(k7))
    assert got7.get_shape() == torch.Size([2, LAYERS, 7, HIDDEN]) and torch.equal(got7.tensor, short.tensor)

    # A chunk already stored is not rewritten.
    other = chunk(lmc, cpu, 3, dtype=dtype)
    run(c.put(k, other))
    again = run(c.get(k))
    assert torch.equal(again.tensor, obj.tensor)
    st = c.stats()
    assert (st["stored"], st["skipped"], st["errors"], st["alloc_failures"]) == (2, 1, 0, 0)
    release(obj, short, other, got, got7, again)
    run(c.close())
    assert cpu.live == 0


def test_mla_chunks_keep_their_format(lmc, daemon, tmp_path):
    mla, cpu = open_connector(lmc, daemon.socket, tmp_path, use_mla=True)
    plain, _ = open_connector(lmc, daemon.socket, tmp_path)
    k = key(lmc, 7)
    obj = chunk(lmc, cpu, 4, fmt=lmc.mm.MemoryFormat.KV_MLA_FMT, shape=(1, LAYERS, CHUNK_TOKENS, 48))
    run(mla.put(k, obj))
    got = run(mla.get(k))
    assert got.get_memory_format() == lmc.mm.MemoryFormat.KV_MLA_FMT
    assert got.get_shape() == obj.get_shape() and torch.equal(got.tensor, obj.tensor)
    # The same key in the KV_2LTD format is another page: never read as one.
    assert not plain.exists_sync(k) and run(plain.get(k)) is None
    release(obj, got)
    run(mla.close())
    run(plain.close())
    assert cpu.live == 0


def test_a_chunk_of_another_format_is_not_stored(lmc, conn, client, caplog):
    c, cpu = conn  # a KV_2LTD model: every path reads KV_2LTD pages
    ks = [key(lmc, 0xF10), key(lmc, 0xF11)]
    odd = chunk(lmc, cpu, 90, fmt=lmc.mm.MemoryFormat.KV_MLA_FMT, shape=(1, LAYERS, CHUNK_TOKENS, 48))
    ok = chunk(lmc, cpu, 91)
    with caplog.at_level(logging.WARNING, logger="fluxkv.integrations.lmcache"):
        run(c.batched_put(ks, [odd, ok]))
        run(c.put(ks[0], odd))
    assert [c.exists_sync(k) for k in ks] == [False, True]
    assert not client.exists(f"kv1/tiny/tp0of1/pp0of1/float32/KV_MLA_FMT/lmcache/2x4x32/{0xF10:x}")
    assert run(c.get(ks[0])) is None
    st = c.stats()
    assert (st["wrong_format"], st["stored"]) == (2, 1)
    assert odd.get_ref_count() == ok.get_ref_count() == 1
    logged = [r for r in caplog.records if "KV_MLA_FMT chunk" in r.getMessage()]
    assert len(logged) == 1, "the second is held back (at most one line every 10 s)"
    release(odd, ok)


@pytest.mark.parametrize("blending", [False, True], ids=["layerwise", "layerwise-blending"])
def test_layerwise_chunks_round_trip(lmc, daemon, tmp_path, blending):
    """With use_layerwise LMCache's engine keeps KV in KV_T2D (KV_2TD with enable_blending):
    LMCacheEngine.__init__ sets ``self.fmt`` so for a non-MLA model, and store_layer
    (lmcache/v1/cache_engine.py, LMCache 000620e3) puts one object per layer of that format,
    ``gpu_connector.get_shape(tokens)`` ([tokens, 2, hidden] / [2, tokens, hidden]), under
    LayerCacheEngineKeys. Those chunks are this connector's to store and load."""
    fmt = lmc.mm.MemoryFormat.KV_2TD if blending else lmc.mm.MemoryFormat.KV_T2D
    config = ISSUE_CONFIG + f"use_layerwise: true\nenable_blending: {str(blending).lower()}\n"
    c, cpu = open_connector(lmc, daemon.socket, tmp_path, config_text=config)
    shape = (2, CHUNK_TOKENS, HIDDEN) if blending else (CHUNK_TOKENS, 2, HIDDEN)
    keys = [lmc.utils.LayerCacheEngineKey("tiny", 1, 0, 0x1A7, torch.float32, None, layer_id=i) for i in range(LAYERS)]
    objs = [chunk(lmc, cpu, 30 + i, fmt=fmt, shape=shape) for i in range(LAYERS)]
    run(c.batched_put(keys, objs))
    assert c.stats()["wrong_format"] == 0
    assert c.batched_contains(keys) == LAYERS
    got = run(c.batched_get(keys))
    assert all(g is not None for g in got)
    for g, o in zip(got, objs):
        assert g.get_memory_format() == fmt and torch.equal(g.tensor, o.tensor)
    release(*objs, *got)
    run(c.close())
    assert cpu.live == 0


def test_chunks_of_another_model_geometry_are_not_found(lmc, daemon, tmp_path):
    """LMCache's key (model, world size, worker id, hash, dtype) does not tell a chunk's
    geometry: e.g. worker 0 of 2 under tensor parallelism (every layer, half the heads) and
    under pipeline parallelism (half the layers, every head) share keys, and their chunks
    even hold as many elements. One's chunk must not be found, nor loaded, by the other (the
    engine would take it as its own KV: LMCache checks no shape on the way to the GPU)."""
    tp, tp_cpu = open_connector(lmc, daemon.socket, tmp_path, kv_shape=(LAYERS, 2, CHUNK_TOKENS, 1, 16))
    pp, pp_cpu = open_connector(lmc, daemon.socket, tmp_path, kv_shape=(LAYERS // 2, 2, CHUNK_TOKENS, 2, 16))
    k = key(lmc, 0x6E0, world=2)
    mine = chunk(lmc, tp_cpu, 97, shape=(2, LAYERS, CHUNK_TOKENS, 16))
    run(tp.put(k, mine))
    assert pp.batched_contains([k]) == 0 and not pp.exists_sync(k)
    assert run(pp.batched_get([k])) == [None]
    theirs = chunk(lmc, pp_cpu, 98, shape=(2, LAYERS // 2, CHUNK_TOKENS, 32))
    run(pp.put(k, theirs))  # stored beside the other's
    got = [run(tp.get(k)), run(pp.get(k))]
    assert torch.equal(got[0].tensor, mine.tensor) and torch.equal(got[1].tensor, theirs.tensor)
    release(mine, theirs, *got)
    run(tp.close())
    run(pp.close())


def test_a_page_of_another_layout_is_a_miss(lmc, conn, daemon, caplog):
    c, cpu = conn
    k_odd, k_ok = key(lmc, 0xB10), key(lmc, 0xB11)
    ok = chunk(lmc, cpu, 92)
    run(c.put(k_ok, ok))
    ns = "kv1/tiny/tp0of1/pp0of1/float32/KV_2LTD/lmcache/2x4x32"
    with kv.PageStore(daemon.socket, ns, layout="not-lmcache") as foreign:
        assert foreign.put_pages([kv.hash_text(0xB10)], [torch.zeros(2, LAYERS, CHUNK_TOKENS, HIDDEN)]) == [True]
    assert c.exists_sync(k_odd)  # there, but not a page this connector can read
    with caplog.at_level(logging.ERROR, logger="fluxkv.integrations.lmcache"):
        assert run(c.get(k_odd)) is None
        got = run(c.batched_get([k_ok, k_odd, k_ok]))  # the chunk before the odd page loads
        assert got[1:] == [None, None] and torch.equal(got[0].tensor, ok.tensor)
        release(got[0])
        assert run(c.batched_get([k_odd, k_ok])) == [None, None]
        assert run(c.batched_get_non_blocking("req", [k_odd])) == []
    assert c.stats()["layout_mismatches"] == 4
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and "another layout" in r.getMessage()]
    assert len(logged) == 1
    got = run(c.get(k_ok))
    assert torch.equal(got.tensor, ok.tensor)
    # The chunks after the odd page miss, those of another namespace (model) too: the
    # loop over namespaces went on and loaded them (a review).
    k_other = key(lmc, 0xB12, model="other")
    other = chunk(lmc, cpu, 93)
    run(c.put(k_other, other))
    assert run(c.batched_get([k_odd, k_other])) == [None, None]
    release(ok, got, other)


# -- cancelled calls (LMCache's RemoteBackend cancels a call that passes its timeout) --------


@pytest.mark.parametrize("call", ["get", "batched_get", "batched_get_non_blocking"])
def test_a_cancelled_load_releases_what_it_loads(lmc, conn, monkeypatch, call):
    c, cpu = conn
    ks = [key(lmc, 0xC00 + i) for i in range(2)]
    objs = [chunk(lmc, cpu, 70 + i) for i in range(2)]
    run(c.batched_put(ks, objs))
    release(*objs)
    allocated: list = []
    orig_allocate = cpu.allocate

    def counting(*a, **kw):
        obj = orig_allocate(*a, **kw)
        allocated.append(obj is not None)
        return obj

    monkeypatch.setattr(cpu, "allocate", counting)
    gate = Gate(monkeypatch, "get_pages")
    load = {"get": lambda: c.get(ks[0]), "batched_get": lambda: c.batched_get(ks),
            "batched_get_non_blocking": lambda: c.batched_get_non_blocking("req", ks)}[call]
    want = 1 if call == "get" else 2

    async def scenario():
        await gate.cancel(load())
        assert cpu.live == 0 and allocated == []
        gate.opened.set()  # the worker goes on: it loads and allocates after the cancel
        assert await settled(lambda: len(allocated) == want and cpu.live == 0), (allocated, cpu.live)

    run(scenario())
    assert gate.waits == [True] and all(allocated)


def test_a_cancelled_put_stores_the_chunk_it_was_given(lmc, conn, monkeypatch):
    c, cpu = conn
    k = key(lmc, 0xC10)
    obj = chunk(lmc, cpu, 80)
    want = obj.tensor.clone()
    gate = Gate(monkeypatch, "put_pages")

    async def scenario():
        await gate.cancel(c.put(k, obj))
        release(obj)  # LMCache's wrapper drops its reference once the call ends, cancelled or not
        assert cpu.live == 1, "the worker holds its own reference until it has copied the chunk"
        gate.opened.set()
        assert await settled(lambda: cpu.live == 0)

    run(scenario())
    assert gate.waits == [True] and c.stats()["stored"] == 1
    got = run(c.get(k))
    assert torch.equal(got.tensor, want), "stored bytes of memory freed (and reused) under the worker"
    release(got)


# -- batches ---------------------------------------------------------------------------------


def test_batched_forms_are_one_call_each(lmc, conn, calls):
    c, cpu = conn
    ks = [key(lmc, 0x100 + i) for i in range(4)]
    objs = [chunk(lmc, cpu, 10 + i) for i in (0, 1, 3)]
    run(c.batched_put([ks[0], ks[1], ks[3]], objs))
    assert calls["put_pages"] == 1

    got = run(c.batched_get(ks))
    assert calls["get_pages"] == 1
    assert got[2] is None
    for g, o in zip([got[0], got[1], got[3]], objs):
        assert torch.equal(g.tensor, o.tensor)

    assert c.batched_contains(ks) == 2
    # Older LMCache passes stop_after_first_not_exits: accepted, the answer is the same.
    assert c.batched_contains(ks, stop_after_first_not_exits=False) == 2 and c.batched_contains(ks, True) == 2
    assert run(c.batched_async_contains("req-1", ks, pin=False)) == 2
    assert (calls["contains_prefix"], calls["pinned"]) == (4, 0)
    assert run(c.batched_async_contains("req-1", ks, pin=True)) == 2
    assert (calls["contains_prefix"], calls["pinned"]) == (5, 1)
    assert run(c.batched_async_contains("req-2", ks[:2], pin=True)) == 2
    assert c.batched_contains(ks[2:]) == 0

    live = cpu.live
    leading = run(c.batched_get_non_blocking("req-1", ks))
    assert len(leading) == 2 and torch.equal(leading[1].tensor, objs[1].tensor)
    assert cpu.live == live + 2, "the object loaded after the miss was released"
    assert calls["get_pages"] == 2

    assert c.batched_contains([]) == 0 and run(c.batched_get([])) == [] and run(c.batched_put([], [])) is None
    release(*objs, *got, *leading)


def test_key_layout_and_namespaces(lmc, conn, client, calls):
    c, cpu = conn
    h = 0x5EED
    base = key(lmc, h)
    obj = chunk(lmc, cpu, 20)
    run(c.put(base, obj))
    assert client.exists(f"kv1/tiny/tp0of1/pp0of1/float32/KV_2LTD/lmcache/2x4x32/{h:x}")
    # Whatever else the key says is another page.
    others = [
        key(lmc, h, model="other"),
        key(lmc, h, worker=1, world=2),
        key(lmc, h, world=2),
        key(lmc, h, dtype=torch.bfloat16),
        key(lmc, h, tags={"lmcache.tag.user": "a/b"}),
        lmc.utils.LayerCacheEngineKey("tiny", 1, 0, h, torch.float32, None, layer_id=0),
    ]
    assert len({o.to_string() for o in others} | {base.to_string()}) == len(others) + 1
    for o in others:
        assert not c.exists_sync(o), o.to_string()
    tagged, layer = others[4], others[5]
    t_obj, l_obj = chunk(lmc, cpu, 21), chunk(lmc, cpu, 22)
    run(c.batched_put([tagged, layer], [t_obj, l_obj]))
    assert client.exists(f"kv1/tiny/tp0of1/pp0of1/float32/KV_2LTD/lmcache/2x4x32/{h:x}.0")
    got = run(c.batched_get([base, tagged, layer]))
    for g, o in zip(got, [obj, t_obj, l_obj]):
        assert torch.equal(g.tensor, o.tensor)
    # Tag sets LMCache tells apart are other pages, whatever their text holds.
    joined = key(lmc, h, tags={"lmcache.tag.user": "a@team%x"})  # (the tags drop "lmcache.tag.")
    split = key(lmc, h, tags={"lmcache.tag.user": "a", "lmcache.tag.team": "x"})
    assert joined != split
    j_obj = chunk(lmc, cpu, 24)
    run(c.put(joined, j_obj))
    assert c.exists_sync(joined) and not c.exists_sync(split)
    release(j_obj)

    # Keys of two namespaces in one batch: one call per run of each, the prefix across both.
    b0, b1 = key(lmc, 1, model="other"), key(lmc, 2, model="other")
    b_obj = chunk(lmc, cpu, 23)
    run(c.put(b0, b_obj))
    before = calls["contains_prefix"]
    assert c.batched_contains([base, b0, b1]) == 2
    assert calls["contains_prefix"] - before == 2
    release(obj, t_obj, l_obj, b_obj, *got)


def test_remove_list_close(lmc, conn):
    c, cpu = conn
    k = key(lmc, 0xDE1)
    obj = chunk(lmc, cpu, 30)
    run(c.put(k, obj))
    assert c.remove_sync(k) is True
    assert c.remove_sync(k) is False and not c.exists_sync(k)
    with pytest.raises(NotImplementedError, match="cannot list"):
        run(c.list())
    release(obj)


def test_calls_after_close_miss(lmc, conn):
    """Every call after close() ends as a miss (a put stores nothing), as the module says:
    they raised RuntimeError, the worker threads taking no more work (a review)."""
    c, cpu = conn
    k = key(lmc, 0xC10)
    obj = chunk(lmc, cpu, 31)
    run(c.put(k, obj))
    run(c.close())
    assert run(c.batched_get([k])) == [None]
    assert run(c.get(k)) is None
    assert run(c.exists(k)) is False
    run(c.batched_put([k], [obj]))  # stores nothing, raises nothing
    release(obj)


def test_close_leaves_no_session_behind(lmc, daemon, client, tmp_path, monkeypatch):
    """A put still running when close() is called (LMCache does not wait for its puts:
    StorageManager.batched_put submits them, RemoteBackend.close closes the connector) ends as
    a miss, without reopening a page store (a session on the owner) that nothing closes."""
    c, cpu = open_connector(lmc, daemon.socket, tmp_path)
    base = client.stat()["clients"]
    entered, opened, done = threading.Event(), threading.Event(), threading.Event()
    storable = c._storable

    def held(obj, lay):  # the put's worker, before it looks up its page store
        entered.set()
        opened.wait(60)
        return storable(obj, lay)

    monkeypatch.setattr(c, "_storable", held)
    obj = chunk(lmc, cpu, 95)

    async def scenario():
        put = asyncio.ensure_future(c.put(key(lmc, 0xC1), obj))
        put.add_done_callback(lambda _: done.set())
        assert await asyncio.to_thread(entered.wait, 60)
        await c.close()
        opened.set()
        await put

    run(scenario())
    release(obj)
    assert done.is_set() and cpu.live == 0
    assert c.stats()["stored"] == 0
    assert wait_until(lambda: client.stat()["clients"] == base, 10), "a page store opened after close() holds a session"


def test_close_does_not_wait_behind_loads(lmc, conn, monkeypatch):
    """RemoteBackend.close waits for the connector's close with no timeout: close() must not
    queue behind loads that hold every worker thread (each may take the owner's timeout)."""
    c, cpu = conn
    k = key(lmc, 0xC2)
    obj = chunk(lmc, cpu, 96)
    run(c.put(k, obj))
    release(obj)
    gate = Gate(monkeypatch, "get_pages")

    async def scenario():
        loads = [asyncio.ensure_future(c.get(k)) for _ in range(c._workers._max_workers)]
        assert await asyncio.to_thread(gate.entered.wait, 60)
        closing = asyncio.ensure_future(c.close())
        closed = await asyncio.to_thread(lambda: wait_until(closing.done, 30))
        gate.opened.set()
        await closing
        return closed, await asyncio.gather(*loads)

    closed, got = run(scenario())
    assert closed, "close() waited for the loads holding the worker threads"
    assert got == [None] * len(got)  # their store was closed under them: misses


def test_a_load_larger_than_the_owners_memory(lmc, cluster, tmp_path, monkeypatch):
    """A batched_get of more bytes than the owner's memory (LMCache asks for every chunk of
    a long prompt at once) loads every chunk when its pages come back from SSD: the pages
    are copied out in bounded groups (here of 1 MiB, the owner being a small one), so no
    owner call has to hold all of them at once."""
    ssd = cluster.root / "ssd"
    ssd.mkdir()
    node = cluster.up("8MiB", "ssd-node", "--ssd-path", str(ssd), "--ssd-limit", "64MiB")
    monkeypatch.setattr(lmc.backend, "_LOAD_BYTES", 1 << 20, raising=False)
    c, cpu = open_connector(lmc, node.socket, tmp_path, capacity=64 << 20, kv_shape=(LAYERS, 2, CHUNK_TOKENS, 4, 128))
    shape = (2, LAYERS, CHUNK_TOKENS, 512)  # 512 KiB a chunk: 32 chunks are twice the DRAM
    ks = [key(lmc, 0x5000 + i) for i in range(32)]
    want = []
    for lo in range(0, len(ks), 4):
        objs = [chunk(lmc, cpu, 200 + i, shape=shape) for i in range(lo, lo + 4)]
        run(c.batched_put(ks[lo : lo + 4], objs))
        want += [o.tensor.clone() for o in objs]
        release(*objs)
    with fluxkv.connect(node.socket) as admin:
        def settled():
            (member,) = [m for m in admin.stat()["members"] if m["alive"]]
            return member["ssd_persists_pending"] == 0 and member
        member = wait_until(settled, 30.0)
        assert member and member["memory_replicas"] < len(ks), member
    assert c.batched_contains(ks) == len(ks)
    got = run(c.batched_get(ks))
    assert all(g is not None for g in got)
    assert all(torch.equal(g.tensor, w) for g, w in zip(got, want))
    release(*got)
    run(c.close())
    assert cpu.live == 0


def test_allocation_failure_is_a_miss(lmc, daemon, tmp_path):
    one = 2 * LAYERS * CHUNK_TOKENS * HIDDEN * 4
    c, cpu = open_connector(lmc, daemon.socket, tmp_path, capacity=one)
    producer = lmc.cpu.LocalCPUBackend(4 * one)
    ks = [key(lmc, 0xA10), key(lmc, 0xA11)]
    objs = [chunk(lmc, producer, 40), chunk(lmc, producer, 41)]
    run(c.batched_put(ks, objs))
    got = run(c.batched_get(ks))
    assert got[1] is None and torch.equal(got[0].tensor, objs[0].tensor)
    assert run(c.get(ks[1])) is None
    assert c.stats()["alloc_failures"] == 2 and cpu.failed == 2 and cpu.live == 1
    release(got[0])
    later = run(c.get(ks[1]))  # room again
    assert torch.equal(later.tensor, objs[1].tensor)
    release(later, *objs)
    run(c.close())
    assert cpu.live == 0


# -- fluxkv down ------------------------------------------------------------------------------


# -- what a chunk can be: several KV groups, serialized bytes, layer pages ------------------

# A model with two KV groups per chunk (as GLM-5's MLA: a uint8 rope part and a bf16 latent).
GROUPS = dict(
    group_shapes=[torch.Size([1, LAYERS, CHUNK_TOKENS, 8]), torch.Size([1, LAYERS, CHUNK_TOKENS, 24])],
    group_dtypes=[torch.uint8, torch.bfloat16],
)


def grouped_chunk(cpu, seed: int, tokens: int = CHUNK_TOKENS):
    g = torch.Generator().manual_seed(seed)
    shapes = [torch.Size([1, LAYERS, tokens, s[-1]]) for s in GROUPS["group_shapes"]]
    obj = cpu.allocate(shapes, GROUPS["group_dtypes"], None)
    obj.get_tensor(0).copy_(torch.randint(0, 256, tuple(shapes[0]), generator=g, dtype=torch.uint8))
    obj.get_tensor(1).copy_(torch.randn(tuple(shapes[1]), generator=g).to(torch.bfloat16))
    return obj


def test_chunks_of_several_kv_groups_round_trip(lmc, daemon, client, tmp_path):
    """Each KV group of a chunk is a page of its own dtype and shape; a chunk is present only
    with all of its groups, and comes back with every group bit-exact."""
    c, cpu = open_connector(lmc, daemon.socket, tmp_path, **GROUPS)
    ks = [key(lmc, 0x6A0 + i) for i in range(3)]
    objs = [grouped_chunk(cpu, 40), grouped_chunk(cpu, 41), grouped_chunk(cpu, 42, tokens=CHUNK_TOKENS // 2)]
    run(c.batched_put(ks, objs))
    assert c.batched_contains(ks) == 3 and run(c.batched_async_contains("r", ks)) == 3
    got = run(c.batched_get(ks))
    for want, have in zip(objs, got):
        assert have.get_shapes() == want.get_shapes() and have.get_dtypes() == want.get_dtypes()
        assert all(torch.equal(have.get_tensor(i), want.get_tensor(i)) for i in range(2))
    ns = "kv1/tiny/tp0of1/pp0of1/float32/KV_2LTD/lmcache/1x4x8+1x4x24"
    assert client.exists(f"{ns}/{0x6A1:x}") and client.exists(f"{ns}/{0x6A1:x}#1")
    assert client.delete(f"{ns}/{0x6A1:x}#1")  # chunk 1 loses a group: it is gone, the prefix ends there
    assert c.batched_contains(ks) == 1 and not c.exists_sync(ks[1])
    assert run(c.get(ks[1])) is None
    assert c.remove_sync(ks[0]) and not c.exists_sync(ks[0])
    release(*objs, *got)
    run(c.close())
    assert cpu.live == 0


def test_kv_groups_built_after_the_connector(lmc, daemon, client, tmp_path):
    """LMCache builds a model's KV groups (register_kv_caches) after it made the connectors: a
    connector made while the metadata said one group stores and loads every group once they
    are there, and before, a chunk of two groups is not stored as one (read once at
    construction, only group 0 of every chunk was stored, and loads gave the engine chunks
    without their second group: a review)."""
    cfg = tmp_path / "lmcache-late.yaml"
    cfg.write_text(ISSUE_CONFIG.format(chunk=CHUNK_TOKENS, socket=daemon.socket))
    config = lmc.config.LMCacheEngineConfig.from_file(str(cfg))
    md = lmc.metadata.LMCacheMetadata("tiny", 1, 0, torch.float32, (LAYERS, 2, CHUNK_TOKENS, 2, 16), False, CHUNK_TOKENS)
    cpu = lmc.cpu.LocalCPUBackend(64 << 20)
    c = lmc.storage.CreateRemoteConnectors(config, md, None, cpu)["RemoteBackend-fluxkv"]
    early = grouped_chunk(cpu, 50)
    run(c.batched_put([key(lmc, 0x7A0)], [early]))  # the model's groups are not known yet
    assert c.stats()["unstorable"] == 1 and c.batched_contains([key(lmc, 0x7A0)]) == 0
    md.group_shapes, md.group_dtypes = GROUPS["group_shapes"], GROUPS["group_dtypes"]  # register_kv_caches
    ks = [key(lmc, 0x7A1 + i) for i in range(2)]
    objs = [grouped_chunk(cpu, 51), grouped_chunk(cpu, 52)]
    run(c.batched_put(ks, objs))
    ns = "kv1/tiny/tp0of1/pp0of1/float32/KV_2LTD/lmcache/1x4x8+1x4x24"
    assert client.exists(f"{ns}/{0x7A1:x}") and client.exists(f"{ns}/{0x7A1:x}#1")
    assert c.batched_contains(ks) == 2
    got = run(c.batched_get(ks))
    for want, have in zip(objs, got):
        assert have.get_shapes() == want.get_shapes() and have.get_dtypes() == want.get_dtypes()
        assert all(torch.equal(have.get_tensor(i), want.get_tensor(i)) for i in range(2))
    release(early, *objs, *got)
    run(c.close())
    assert cpu.live == 0


SERDE_CONFIG = ISSUE_CONFIG.replace("remote_serde: naive", "remote_serde: cachegen")


def test_serialized_chunks_are_stored_as_their_bytes(lmc, daemon, client, tmp_path, caplog):
    """With a serde that encodes chunks (cachegen), LMCache hands the connector byte buffers:
    each is stored as its bytes and loaded back as a byte buffer of the same bytes, for the
    deserializer; a KV tensor chunk there is not stored (it is not what this config makes)."""
    c, cpu = open_connector(lmc, daemon.socket, tmp_path, config_text=SERDE_CONFIG)
    ks = [key(lmc, 0x5E0), key(lmc, 0x5E1)]
    blobs = [bytes(range(256)) * 3 + b"tail", b"\x00\x01short"]
    objs = []
    for blob in blobs:
        o = cpu.allocate(torch.Size([len(blob), 0, 0, 0]), None, lmc.mm.MemoryFormat.BINARY_BUFFER)
        o.byte_array[:] = blob
        objs.append(o)
    run(c.batched_put(ks, objs))
    assert c.batched_contains(ks) == 2
    got = run(c.batched_get(ks))
    assert [type(o).__name__ for o in got] == ["BytesBufferMemoryObj"] * 2
    assert [bytes(o.byte_array) for o in got] == blobs
    assert client.exists(f"kv1/tiny/tp0of1/pp0of1/float32/BINARY_BUFFER/lmcache/2x4x32/{0x5E0:x}")
    with caplog.at_level(logging.WARNING, logger="fluxkv.integrations.lmcache"):
        tensor_chunk = chunk(lmc, cpu, 43)
        run(c.put(key(lmc, 0x5E2), tensor_chunk))
    assert c.stats()["wrong_format"] == 1 and not c.exists_sync(key(lmc, 0x5E2))
    release(tensor_chunk)
    run(c.close())


def test_serialized_chunks_are_not_offered_to_the_non_blocking_path(lmc, daemon, tmp_path):
    """LMCache's RemoteBackend deserializes what batched_get(_blocking) loads, but hands the
    connector's batched_get_non_blocking results (async loading) to the engine as they are
    (lmcache/v1/storage_backend/remote_backend.py): under an encoding serde the connector must
    not offer that path, and must not answer it with byte buffers (the engine would take
    cachegen bytes for KV); a lookup for it finds nothing."""
    c, cpu = open_connector(lmc, daemon.socket, tmp_path, config_text=SERDE_CONFIG)
    k = key(lmc, 0x5F0)
    o = cpu.allocate(torch.Size([64, 0, 0, 0]), None, lmc.mm.MemoryFormat.BINARY_BUFFER)
    o.byte_array[:] = bytes(range(64))
    run(c.batched_put([k], [o]))
    release(o)
    assert c.batched_contains([k]) == 1  # the blocking path finds and loads it
    assert not c.support_batched_get_non_blocking()
    assert run(c.batched_async_contains("req", [k], pin=True)) == 0
    assert run(c.batched_get_non_blocking("req", [k])) == []
    assert cpu.live == 0
    run(c.close())


def test_layer_page_chunks_round_trip(lmc, daemon, tmp_path):
    """A chunk kept as one page per layer (its ``tensor`` raises) is stored from its bytes and
    loaded into a chunk of the same kind, every layer bit-exact."""
    c, cpu = open_connector(lmc, daemon.socket, tmp_path, layer_pages=True)
    ks = [key(lmc, 0x1A0), key(lmc, 0x1A1)]
    objs = [chunk_pages(lmc, cpu, 50), chunk_pages(lmc, cpu, 51, tokens=CHUNK_TOKENS // 4)]
    run(c.batched_put(ks, objs))
    assert c.batched_contains(ks) == 2 and c.stats()["unstorable"] == 0
    got = run(c.batched_get(ks))
    for want, have in zip(objs, got):
        assert type(have) is lmc.mm.LayerPageMemoryObj and have.get_shape() == want.get_shape()
        assert all(torch.equal(have.layer_tensor(i), want.layer_tensor(i)) for i in range(LAYERS))
    release(*objs, *got)
    run(c.close())
    assert cpu.live == 0


def chunk_pages(lmc, cpu, seed: int, tokens: int = CHUNK_TOKENS):
    obj = cpu.allocate(torch.Size((2, LAYERS, tokens, HIDDEN)), torch.float32, lmc.mm.MemoryFormat.KV_2LTD)
    g = torch.Generator().manual_seed(seed)
    for i in range(LAYERS):
        obj.layer_tensor(i).copy_(torch.randn(2, tokens, HIDDEN, generator=g))
    return obj


class _Wrapped:
    """A memory object passing everything to the one it wraps but what a subclass changes."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_chunk_whose_data_cannot_be_read_is_refused_aloud(lmc, conn, caplog):
    """A chunk whose tensor is not to be had and whose bytes are not its shape is not stored:
    counted and logged as an error, never silently dropped; the rest of the batch is stored."""
    c, cpu = conn
    odd, ok = chunk(lmc, cpu, 52), chunk(lmc, cpu, 53)

    class Opaque(_Wrapped):
        @property
        def tensor(self):
            raise RuntimeError("Layer page requires layer_tensor(layer_id)")

        @property
        def byte_array(self):
            return self.inner.byte_array[:100]

    ks = [key(lmc, 0xE70), key(lmc, 0xE71)]
    with caplog.at_level(logging.ERROR, logger="fluxkv.integrations.lmcache"):
        run(c.batched_put(ks, [Opaque(odd), ok]))
    assert [c.exists_sync(k) for k in ks] == [False, True]
    assert c.stats()["unstorable"] == 1
    assert any("cannot read, not stored" in r.getMessage() and "100 bytes" in r.getMessage() for r in caplog.records)
    release(odd, ok)


def test_a_chunk_of_a_dtype_without_page_format_is_refused_alone(lmc, conn):
    """A chunk whose tensor has a dtype pages do not record (complex64 here; ROCm's fp8
    variants) is counted unstorable and left out; the other chunks of the batch are stored
    (the error used to escape batched_put and leave the rest of the batch unstored)."""
    c, cpu = conn
    odd, ok = chunk(lmc, cpu, 54), chunk(lmc, cpu, 55)

    class Complex(_Wrapped):
        @property
        def tensor(self):
            return torch.zeros(8, dtype=torch.complex64)

    ks = [key(lmc, 0xE72), key(lmc, 0xE73)]
    before = c.stats()["unstorable"]
    run(c.batched_put(ks, [Complex(odd), ok]))
    assert [c.exists_sync(k) for k in ks] == [False, True]
    assert c.stats()["unstorable"] == before + 1
    release(odd, ok)


# -- remote_url ------------------------------------------------------------------------------

REMOTE_URL_ONLY = """\
chunk_size: {chunk}
remote_serde: naive
remote_url: fluxkv://{socket}
"""


def test_remote_url_needs_the_plugin_listed(lmc, daemon, tmp_path):
    """``remote_url: fluxkv://...`` alone: LMCache looks the URL up among the adapters of the
    plugins it was told about, so there is none (the docs say to list the plugin). Listed,
    with no url key of its own, the remote_url backend works and the plugin's own backend
    (0.4.4 on) is refused for want of its url: use one form, not both."""
    with pytest.raises(ValueError, match="No adapter found for URL: fluxkv://"):
        open_connector(lmc, daemon.socket, tmp_path, config_text=REMOTE_URL_ONLY, backend="RemoteBackend")
    both = REMOTE_URL_ONLY + (
        'remote_storage_plugins: ["fluxkv"]\nextra_config:\n'
        "  remote_storage_plugin.fluxkv.module_path: fluxkv.integrations.lmcache\n"
        "  remote_storage_plugin.fluxkv.class_name: FluxKVConnectorAdapter\n"
    )
    with pytest.raises(ValueError, match=r"set extra_config remote_storage_plugin\.fluxkv\.url"):
        open_connector(lmc, daemon.socket, tmp_path, config_text=both, backend="RemoteBackend")


def every_call_misses(lmc, c, cpu) -> None:
    """Run every connector method against an unreachable cache: each answers "not cached" or
    "not stored", none raises."""
    ks = [key(lmc, 0xD00 + i) for i in range(3)]
    obj = chunk(lmc, cpu, 50)
    assert run(c.exists(ks[0])) is False and c.exists_sync(ks[0]) is False
    assert run(c.get(ks[0])) is None
    assert run(c.put(ks[0], obj)) is None and run(c.batched_put(ks[1:2], [obj])) is None
    assert run(c.batched_get(ks)) == [None] * 3
    assert c.batched_contains(ks) == 0
    assert run(c.batched_async_contains("req", ks, pin=True)) == 0
    assert run(c.batched_get_non_blocking("req", ks)) == []
    assert c.remove_sync(ks[0]) is False
    release(obj)


def test_no_owner_at_the_socket(lmc, tmp_path):
    (tmp_path / "none").mkdir()
    c, cpu = open_connector(lmc, str(tmp_path / "none" / "fluxkv.sock"), tmp_path)
    every_call_misses(lmc, c, cpu)
    st = c.stats()
    assert st["errors"] >= 1 and st["hits"] == st["stored"] == 0
    run(c.close())
    assert cpu.live == 0


def test_owner_stopped_mid_test(lmc, cluster, tmp_path):
    node = cluster.up("64MiB", name="n1")
    c, cpu = open_connector(lmc, node.socket, tmp_path)
    k = key(lmc, 0xF00)
    obj = chunk(lmc, cpu, 60)
    run(c.put(k, obj))
    got = run(c.get(k))
    assert torch.equal(got.tensor, obj.tensor)
    release(got)

    node.stop()
    errors = c.stats()["errors"]
    every_call_misses(lmc, c, cpu)
    assert c.stats()["errors"] > errors

    # An owner back at the socket is used again (the store retries every few seconds).
    cluster.up("64MiB", name="n1")

    def stored_again() -> bool:
        run(c.put(k, obj))
        return c.exists_sync(k)

    assert wait_until(stored_again, timeout=60, interval=0.5)
    got = run(c.get(k))
    assert torch.equal(got.tensor, obj.tensor)
    release(got, obj)
    run(c.close())
    assert cpu.live == 0


# -- the model ----------------------------------------------------------------------------------


def pages_to_chunk(pages: list) -> torch.Tensor:
    """tinylm pages (layers, 2, kv_heads, 16, head_dim) as one KV_2LTD chunk
    [2, layers, tokens, kv_heads * head_dim]."""
    parts = []
    for p in pages:
        n_layers, _, heads, tokens, head_dim = p.shape
        parts.append(p.permute(1, 0, 3, 2, 4).reshape(2, n_layers, tokens, heads * head_dim))
    return torch.cat(parts, dim=2).contiguous()


def chunk_to_pages(t: torch.Tensor, m: TinyLM) -> list:
    pt = m.page_tokens
    shape = (2, m.n_layers, pt, m.n_kv_heads, m.head_dim)
    pages = [t[:, :, i * pt : (i + 1) * pt] for i in range(t.shape[2] // pt)]
    return [p.reshape(shape).permute(1, 0, 3, 2, 4).contiguous() for p in pages]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_tinylm_prefix_from_lmcache_chunks(lmc, daemon, tmp_path, dtype):
    m = TinyLM(dtype=dtype, seed=0)
    c, cpu = open_connector(lmc, daemon.socket, tmp_path, dtype=dtype)

    def keys_of(tokens):
        return [key(lmc, int(h, 16), model="tinylm", dtype=dtype) for h in chain_hashes(tokens, CHUNK_TOKENS)]

    # Request A stores its KV as LMCache chunks (what LMCache does after a prefill).
    a = m.prompt(100, seed=1)
    _, pages_a = m.prefill(a)
    per = CHUNK_TOKENS // m.page_tokens
    objs = []
    for i in range(len(pages_a) // per):
        t = pages_to_chunk(pages_a[i * per : (i + 1) * per])
        obj = cpu.allocate(t.shape, dtype, lmc.mm.MemoryFormat.KV_2LTD)
        obj.tensor.copy_(t)
        objs.append(obj)
    run(c.batched_put(keys_of(a)[: len(objs)], objs))
    release(*objs)

    # Request B shares A's first 64 tokens: its first two chunks are found and loaded.
    b = torch.cat([a[:64], m.prompt(40, seed=2)])
    keys_b = keys_of(b)
    n = run(c.batched_async_contains("req-b", keys_b, pin=True))
    assert n == 2
    loaded = run(c.batched_get(keys_b[:n]))
    prefix = [p for obj in loaded for p in chunk_to_pages(obj.tensor, m)]
    release(*loaded)
    assert len(prefix) == 4

    logits_full, _ = m.prefill(b)
    logits, _ = m.prefill(b, prefix_pages=prefix)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 5e-2}
    assert logits.shape == logits_full[64:].shape
    assert torch.allclose(logits, logits_full[64:], **tol), (logits - logits_full[64:]).abs().max()
    assert m.generate(b, 64, prefix_pages=prefix) == m.generate(b, 64)
    run(c.close())
    assert cpu.live == 0
