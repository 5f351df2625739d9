"""Prefix-aware eviction against a real node: pages put as chains (``PageStore.put_pages``
passes each page's parent) are evicted from the deep end of the oldest chains first, so the
pages of a chain that survive are always a prefix (what a request can use); a chain whose
head was deleted loses its tail before any other chain's page; plain keys on the same node
still work and still evict oldest first; a bad parent is refused. The engine backends put
their pages as the chains their interfaces make certain (SGLang: K, V, next page; the page
before a batch from ``prefix_keys``; LMCache: a batched put's chunk keys in order).

Each node has 8 MiB of DRAM and pages of 64 KiB (127 fit), so a few MiB of puts fill it.
Everything is counted (pages present), nothing is timed."""

from __future__ import annotations

import pytest

import fluxkv
from fluxkv import kv

from test_lmcache_backend import chunk, key, lmc, open_connector, run  # noqa: F401  (lmc: fixture)
from test_sglang_backend import engine, make_pool, sg, slots  # noqa: F401  (sg: fixture)

torch = pytest.importorskip("torch")

PAGE = torch.zeros(16 * 1024)  # 64 KiB of float32: the page store adds its 64-byte header
CHAIN = 6


@pytest.fixture
def node(cluster):
    return cluster.up("8MiB", "chain")


@pytest.fixture
def store(node):
    c = fluxkv.connect(node.socket)
    yield kv.PageStore(c, kv.namespace("chain-model", dtype="float32"))
    c.close()


def chains(prefix: str, n: int, length: int = CHAIN) -> list:
    return [[f"{prefix}{i}p{j}" for j in range(length)] for i in range(n)]


def put_chains(store: kv.PageStore, cs: list) -> None:
    for c in cs:
        assert store.put_pages(c, [PAGE] * len(c)) == [True] * len(c)


def survivors(store: kv.PageStore, chain: list) -> tuple:
    """(pages of chain present, leading pages present)."""
    return sum(store.contains(chain)), store.contains_prefix(chain, pin=False)


def test_chains_evict_from_the_deep_end(store):
    cs = chains("c", 40)  # 240 pages: nearly twice what fits
    put_chains(store, cs)
    counts = [survivors(store, c) for c in cs]
    assert all(present == lead for present, lead in counts), counts  # what is left of a chain is a prefix
    assert sum(present for present, _ in counts) < 40 * CHAIN  # and eviction did happen
    # The oldest chains went first: no chain lost a page while an older one kept one.
    present = [p for p, _ in counts]
    assert present == sorted(present), present


def test_plain_keys_in_put_order_would_keep_the_tails(store):
    """The same puts with chain=False (plain keys, the S3-FIFO): the oldest pages of each
    chain go first, and what survives of a partly evicted chain is of no use to a request."""
    cs = chains("f", 40)
    for c in cs:
        assert store.put_pages(c, [PAGE] * len(c), chain=False) == [True] * len(c)
    counts = [survivors(store, c) for c in cs]
    if not any(0 < present < CHAIN for present, _ in counts):  # eviction ended on a chain's edge
        assert store.put_pages(["f-extra"], [PAGE], chain=False) == [True]
        counts = [survivors(store, c) for c in cs]
    assert any(present > lead for present, lead in counts), counts


def test_a_chain_without_its_head_goes_first(store):
    old = chains("o", 10)  # 60 pages: they all fit
    put_chains(store, old)
    assert [survivors(store, c) for c in old] == [(CHAIN, CHAIN)] * 10
    assert store.delete_pages(old[5][:1]) == [True]
    tail = old[5][1:]
    # One page at a time, continuing one new chain, until the headless tail is gone.
    new, puts = [], 0
    while sum(store.contains(tail)) > 0:
        h = f"n{puts}"
        assert store.put_pages([h], [PAGE], parent=new[-1] if new else None) == [True]
        new.append(h)
        puts += 1
        assert puts < 200, "the orphaned tail was never evicted"
    assert puts > 50  # the node had to fill first
    # Only the tail went: every other old chain is whole, and so is the new one.
    assert [survivors(store, c) for i, c in enumerate(old) if i != 5] == [(CHAIN, CHAIN)] * 9
    assert survivors(store, new) == (len(new), len(new))


def test_plain_keys_beside_chains(store, node):
    """A mixed node, chains and plain keys put in turns: both are evicted, oldest first; the
    plain keys that survive are the newest of them (as on a node of plain keys only), the
    pages that survive are prefixes of their chains, and plain values read back whole."""
    cs = chains("m", 20)
    keys = [f"plain/{i}" for i in range(20 * CHAIN)]  # with the pages: nearly twice what fits
    c = fluxkv.connect(node.socket)
    try:
        for i, ch in enumerate(cs):
            put_chains(store, [ch])
            for j in range(i * CHAIN, (i + 1) * CHAIN):
                c.put(keys[j], bytes([j]) * PAGE.numel() * PAGE.element_size())
        present = c.batch_exists(keys)
        first = present.index(True)
        assert first > 0 and all(present[first:]), present  # the oldest plain keys went, the rest stayed
        with c.get(keys[-1]) as h:
            assert len(h) == PAGE.numel() * PAGE.element_size() and h.read(0, 4) == bytes([len(keys) - 1]) * 4
    finally:
        c.close()
    counts = [survivors(store, ch) for ch in cs]
    assert all(p == lead for p, lead in counts), counts
    assert counts[0] == (0, 0) and counts[-1] == (CHAIN, CHAIN)


def fill_abcd(_put_id: int, view: memoryview) -> None:
    view[:] = b"abcd"


def test_parent_validation(store, node):
    c = fluxkv.connect(node.socket)
    try:
        with pytest.raises(fluxkv.InvalidArgument, match="own parent"):
            c.put("k", b"v", parent="k")
        with pytest.raises(fluxkv.InvalidArgument):
            c.put("k", b"v", parent="p" * 5000)  # longer than a key may be
        with pytest.raises(fluxkv.InvalidArgument, match="own parent"):
            c.put_with("k", 4, fill_abcd, parent="k")
        with pytest.raises(TypeError):
            c.put("k", b"v", parent=7)
        with pytest.raises(fluxkv.InvalidArgument, match="2 parents for 3 items"):
            c.batch_put([("a", b"1"), ("b", b"2"), ("c", b"3")], parents=["", "a"])
        assert c.batch_exists(["a", "b", "c"]) == [False] * 3  # nothing was started
        with pytest.raises(fluxkv.InvalidArgument) as e:
            c.batch_put([("a", b"1"), ("b", b"2")], parents=["", "b"])
        assert e.value.errors[0] is None and isinstance(e.value.errors[1], fluxkv.InvalidArgument)
        assert c.batch_exists(["a", "b"]) == [True, False]
        c.put("first", b"v", parent="")  # a chain's first page
        c.put("second", b"v", parent="first")
        assert c.exists("second")
    finally:
        c.close()
    with pytest.raises(ValueError, match="chain=True"):
        store.put_pages(["x"], [PAGE], parent="w", chain=False)


@pytest.fixture
def put_calls(monkeypatch) -> list:
    """(hashes, parent, chain) of every PageStore.put_pages call."""
    seen: list = []
    orig = kv.PageStore.put_pages

    def spy(self, hashes, tensors, *, parent=None, chain=True):
        seen.append((list(hashes), parent, chain))
        return orig(self, hashes, tensors, parent=parent, chain=chain)

    monkeypatch.setattr(kv.PageStore, "put_pages", spy)
    return seen


@pytest.mark.parametrize("mla", [False, True])
def test_sglang_backups_are_chains(sg, node, put_calls, mla):
    pool = make_pool(sg, mla=mla, layout="page_first", dtype=torch.float32, fill_seed=1)
    b = engine(sg, pool, f"chain-{mla}", node.socket, mla=mla).backend
    info = sg.storage.HiCacheStorageExtraInfo
    hs = ["h0", "h1", "h2", "h3"]
    assert b.batch_set_v1(hs[:2], slots(0, 16), info()) == [True, True]
    assert b.batch_set_v1(hs[2:], slots(32, 48), info(prefix_keys=hs[:2])) == [True, True]
    assert b.batch_set_v1(["h4"], slots(64), info(prefix_keys=(None,))) == [True]
    assert b.batch_set(["h5"], [pool.get_data_page(80).clone()])
    names = (lambda h: [h]) if mla else (lambda h: [f"{h}.k", f"{h}.v"])
    last = (lambda h: h) if mla else (lambda h: f"{h}.v")
    assert put_calls == [
        (names("h0") + names("h1"), None, True),  # no prefix_keys: the chain starts at the root
        (names("h2") + names("h3"), last("h1"), True),  # after the last page of prefix_keys
        (names("h4"), None, True),
        (names("h5"), None, True),  # the generic call carries no extra_info
    ]
    assert b.batch_exists(hs) == 4


def test_lmcache_puts_are_chains(lmc, daemon, tmp_path, put_calls):
    c, cpu = open_connector(lmc, daemon.socket, tmp_path)

    def put(keys: list, objs: list) -> None:
        run(c.batched_put(keys, objs))
        for o in objs:  # the caller's references, as LMCache's wrapper drops them
            o.ref_count_down()

    try:
        ks = [key(lmc, h) for h in (0x10, 0x11, 0x12)]
        put(ks, [chunk(lmc, cpu, i) for i in range(3)])
        layers = [lmc.utils.LayerCacheEngineKey("tiny", 1, 0, 0x20, torch.float32, None, layer_id=i) for i in range(2)]
        put(layers, [chunk(lmc, cpu, 10 + i) for i in range(2)])
        odd = chunk(lmc, cpu, 20, fmt=lmc.mm.MemoryFormat.KV_MLA_FMT)
        put([key(lmc, 0x30), key(lmc, 0x31)], [odd, chunk(lmc, cpu, 21)])
        assert put_calls == [
            (["10", "11", "12"], None, True),  # one request's chunks, in order
            (["20.0", "20.1"], None, False),  # layer keys: no order assumed
            (["31"], None, False),  # a chunk left out (another format): no chain over the gap
        ]
        assert c.batched_contains(ks) == 3
    finally:
        run(c.close())
    assert cpu.live == 0
