"""fluxkv.kv, the page API, against a real owner: round trips of torch tensors (fp32, bf16)
and numpy arrays, pages already cached are not rewritten, zero-copy views keep their bytes
and hand them back when they go, the header refuses a read of another layout, a CRC catches
a payload that does not match, Gather values stream through a small put area under client
isolation, and a store that fails open answers "not cached" while the owner is away."""

from __future__ import annotations

import gc
import logging
import os
import signal
import time

import numpy as np
import pytest

import fluxkv
from fluxkv import kv
from fluxkv.kv.header import PAGE_HEADER_BYTES, PageHeader

from conftest import wait_until
from test_isolation import iso_client  # noqa: F401  (fixture)

torch = pytest.importorskip("torch")


def pages(n: int, shape=(4, 2, 2, 16, 8), dtype=None, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype or torch.float32) for _ in range(n)]


def store_key_in(store, h, err) -> bool:
    return store.key(h) in str(err)


def raw(t) -> bytes:
    """A tensor's bytes (bf16 has no numpy type: view it as int16)."""
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.uint8 else t.numpy().tobytes()


@pytest.fixture
def store(client):
    return kv.PageStore(client, kv.namespace("test-model", dtype="float32"), layout="LHD")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_into(store, dtype):
    ps = pages(6, dtype=dtype)
    hashes = [f"h{i}" for i in range(6)]
    assert store.put_pages(hashes, ps) == [True] * 6
    assert store.contains_prefix(hashes + ["absent"]) == 6
    dest = [torch.empty_like(p) for p in ps]
    assert store.get_pages_into(hashes, dest) == [True] * 6
    for a, b in zip(ps, dest):
        assert raw(a) == raw(b)


def test_numpy_round_trip(store):
    arrs = [np.arange(256, dtype=np.int32).reshape(16, 16) * i for i in range(3)]
    assert store.put_pages([1, 2, 3], arrs) == [True] * 3
    out = [np.zeros((16, 16), dtype=np.int32) for _ in range(3)]
    assert store.get_pages_into([1, 2, 3], out) == [True] * 3
    assert all((a == b).all() for a, b in zip(arrs, out))
    views = store.get_pages([1, 2, 3], numpy=True)
    assert all((a == v).all() and not v.flags.writeable for a, v in zip(arrs, views))


def test_a_read_only_view_is_refused_as_a_load_target(store):
    """A page of get_pages (a torch tensor over the read-only mapping) passed back as a load
    target is refused: torch has no read-only flag, and the copy into it killed the process
    with SIGSEGV (a review)."""
    assert store.put_pages(["ro-a", "ro-b"], pages(2)) == [True, True]
    view = store.get_pages(["ro-a"])[0]
    with pytest.raises(fluxkv.InvalidArgument, match="read-only view"):
        store.get_pages_into(["ro-b"], [view])
    dest = torch.empty_like(view)
    assert store.get_pages_into(["ro-b"], [dest]) == [True]


def test_a_page_of_more_dimensions_than_a_header_holds_is_invalid():
    """A 7-D tensor is InvalidArgument, as every other tensor no page can hold (the header's
    ValueError escaped fail_open and LMCache's unstorable count; a review)."""
    from fluxkv.kv.tensors import describe

    with pytest.raises(fluxkv.InvalidArgument, match="at most 6 dimensions"):
        describe(torch.ones([1] * 7), writable=False, what="page")


def test_a_page_numpy_cannot_type_misses_alone(client):
    """get_pages(numpy=True) failing open: a bfloat16 page (no numpy type) is a miss alone and
    the rest of its batch is viewed (the whole batch missed; a review); not failing open,
    it raises."""
    ns = kv.namespace("test-model", dtype="mixed")
    lenient = kv.PageStore(client, ns, fail_open=True)
    f32, bf16 = torch.ones(4), torch.ones(4, dtype=torch.bfloat16)
    assert lenient.put_pages(["np-f32", "np-bf16"], [f32, bf16], chain=False) == [True, True]
    got = lenient.get_pages(["np-f32", "np-bf16"], numpy=True)
    assert isinstance(got[0], np.ndarray) and (got[0] == 1).all()
    assert got[1] is None
    assert lenient.counters()["errors"] == 1
    del got
    with pytest.raises(fluxkv.InvalidArgument, match="numpy has no type"):
        kv.PageStore(client, ns).get_pages(["np-f32", "np-bf16"], numpy=True)


def test_present_pages_are_not_rewritten(store, client):
    ps = pages(4)
    assert store.put_pages(["a", "b"], ps[:2]) == [True, True]
    first = client.get(store.key("a"))
    pid = first.put_id
    first.release()
    # a and b are cached: their new tensors are not written; c and d are; all four are cached now
    assert store.put_pages(["a", "b", "c", "d"], [ps[3], ps[3], ps[2], ps[3]]) == [True] * 4
    with client.get(store.key("a")) as h:
        assert h.put_id == pid
    dest = [torch.empty_like(ps[0]) for _ in range(2)]
    store.get_pages_into(["a", "c"], dest)
    assert raw(dest[0]) == raw(ps[0]) and raw(dest[1]) == raw(ps[2])
    st = store.counters()
    assert (st["stored"], st["skipped"]) == (4, 2)


def test_misses_leave_buffers_alone(store):
    ps = pages(2)
    store.put_pages(["x"], ps[:1])
    dest = [torch.full_like(ps[0], 7.0) for _ in range(3)]
    assert store.get_pages_into(["x", "nope", "x"], dest) == [True, False, True]
    assert torch.equal(dest[1], torch.full_like(ps[0], 7.0))
    st = store.counters()
    assert (st["hits"], st["misses"]) == (2, 1)


def test_zero_copy_views_live_with_their_tensors(store, client):
    ps = pages(3, dtype=torch.bfloat16)
    store.put_pages(["v0", "v1", "v2"], ps)
    views = store.get_pages(["v0", "missing", "v2"])
    assert views[1] is None
    assert views[0].dtype == torch.bfloat16 and tuple(views[0].shape) == tuple(ps[0].shape)
    assert torch.equal(views[0], ps[0]) and torch.equal(views[2], ps[2])
    # the holders stay with the tensors; a view derived from a view keeps them too
    held = client.stat()["client_holders"]
    assert held >= 2
    part = views[0][1:3]
    del views
    gc.collect()
    client.flush()
    assert client.stat()["client_holders"] == held - 1  # v2's view went; part still holds v0
    assert torch.equal(part, ps[0][1:3])
    del part
    gc.collect()
    client.flush()
    assert wait_until(lambda: client.stat()["client_holders"] == held - 2, 10)


@pytest.mark.parametrize(
    "wrong",
    [
        dict(dtype=torch.float16),  # other dtype
        dict(shape=(4, 2, 2, 8, 16)),  # same bytes, other shape
        dict(layout="HLD"),  # other layout tag
    ],
    ids=["dtype", "shape", "layout"],
)
def test_wrong_layout_is_refused(client, wrong):
    ns = kv.namespace("m", dtype="float32")
    src = kv.PageStore(client, ns, layout="LHD")
    p = pages(1)[0]
    src.put_pages(["p"], [p])
    reader = kv.PageStore(client, ns, layout=wrong.get("layout", "LHD"))
    dest = torch.zeros(wrong.get("shape", p.shape), dtype=wrong.get("dtype", p.dtype))
    before = raw(dest)
    with pytest.raises(kv.PageLayoutMismatch) as e:
        reader.get_pages_into(["p"], [dest])
    assert isinstance(e.value, ValueError) and store_key_in(reader, "p", e.value)
    assert raw(dest) == before  # nothing copied
    if "layout" in wrong:
        with pytest.raises(kv.PageLayoutMismatch):
            reader.get_pages(["p"])


def test_a_mismatch_names_its_page_across_batches(client):
    """PageLayoutMismatch.index: the position of the first page that did not match among
    the call's hashes (across the store's batches), so a caller can load those before it."""
    ns = kv.namespace("m", dtype="float32")
    src = kv.PageStore(client, ns, layout="LHD", batch=2)
    ps = pages(4)
    src.put_pages(["a", "b", "c"], ps[:3])
    kv.PageStore(client, ns, layout="other").put_pages(["odd"], [ps[3]])
    for load in (lambda: src.get_pages(["a", "b", "c", "odd", "a"]),
                 lambda: src.get_pages_into(["a", "b", "c", "odd", "a"], [torch.zeros_like(ps[0]) for _ in range(5)])):
        with pytest.raises(kv.PageLayoutMismatch) as e:
            load()
        assert e.value.index == 3
    # A call that raised counts nothing: the caller loads the pages before the mismatch
    # again, and each is counted once (the batch before it was counted twice; a review).
    assert src.counters()["hits"] == 0
    assert src.get_pages_into(["a", "b", "c"], [torch.zeros_like(ps[0]) for _ in range(3)]) == [True] * 3
    assert src.counters()["hits"] == 3


def test_not_a_page_is_refused(store, client):
    client.put(store.key("plain"), b"x" * 100)
    with pytest.raises(kv.PageLayoutMismatch, match="not a fluxkv page"):
        store.get_pages_into(["plain"], [torch.zeros(9)])
    # a mismatch is a configuration error: failing open does not hide it
    lenient = kv.PageStore(client, store.namespace, layout=store.layout, fail_open=True)
    with pytest.raises(kv.PageLayoutMismatch):
        lenient.get_pages(["plain"])


@pytest.mark.parametrize("fail_open", [False, True])
def test_a_page_failing_alone_leaves_the_others_loaded(client, monkeypatch, fail_open):
    """A page of a batch get that failed alone (the owner answered it NO_SPACE: its target
    did not fit the pool) is a miss when failing open, and the pages served are loaded
    (the whole batch answered as missed); without failing open, the load raises it."""
    st = kv.PageStore(client, kv.namespace("test-model", dtype="float32"), layout="LHD", fail_open=fail_open)
    ps = pages(3)
    hashes = ["fa0", "fa1", "fa2"]
    assert st.put_pages(hashes, ps) == [True] * 3
    orig = client.batch_get

    def last_fails(keys, errors=None):
        hs = orig(keys, errors=errors)
        hs[-1].release()
        hs[-1] = None
        if errors is None:
            raise AssertionError("the page store asked for a batch get that fails every key with one")
        errors.append((len(keys) - 1, fluxkv.NoSpace(f"key {keys[-1]!r}: does not fit")))
        return hs

    monkeypatch.setattr(client, "batch_get", last_fails)
    dest = [torch.zeros_like(p) for p in ps]
    if not fail_open:
        with pytest.raises(fluxkv.NoSpace, match="fa2"):
            st.get_pages_into(hashes, dest)
        return
    assert st.get_pages_into(hashes, dest) == [True, True, False]
    assert raw(dest[0]) == raw(ps[0]) and raw(dest[1]) == raw(ps[1]) and not dest[2].any()
    views = st.get_pages(hashes)
    assert [v is not None for v in views] == [True, True, False]
    assert st.stats()["errors"] == 2


def test_malformed_headers_are_refused(store, client):
    """A header is never trusted for sizes: one whose payload length disagrees with its dtype x
    shape (written by a bad writer: any process of the node may put any key) is refused
    before a byte is copied, and a value shorter than a header is not a page."""
    big = torch.zeros(8)
    dest = big[:4]  # a view: the 4 floats after it belong to someone else
    liar = PageHeader("float32", (4,), store.layout, 16).pack()
    liar = liar[:8] + (64).to_bytes(8, "little") + liar[16:]  # claims 64 payload bytes for 4 floats
    client.put(store.key("liar"), liar + b"\x01" * 64)
    with pytest.raises(kv.PageLayoutMismatch, match="malformed"):
        store.get_pages_into(["liar"], [dest])
    with pytest.raises(kv.PageLayoutMismatch, match="malformed"):
        store.get_pages(["liar"])
    assert torch.equal(big, torch.zeros(8))
    client.put(store.key("short"), b"FKVP")
    lenient = kv.PageStore(client, store.namespace, layout=store.layout, fail_open=True)
    for s in (store, lenient):
        with pytest.raises(kv.PageLayoutMismatch, match="too short"):
            s.get_pages_into(["short"], [torch.zeros(1)])
    assert lenient.counters()["errors"] == 0


def test_checksum_catches_a_wrong_payload(client):
    store = kv.PageStore(client, "ns/crc", checksum=True)
    p = pages(1)[0]
    assert store.put_pages(["ok"], [p]) == [True]
    assert store.get_pages_into(["ok"], [torch.empty_like(p)]) == [True]
    # a page whose bytes differ from what its header's CRC says
    hdr = PageHeader("float32", tuple(p.shape), "", p.numel() * 4, crc32=12345).pack()
    client.put(store.key("bad"), hdr + raw(p))
    with pytest.raises(kv.PageCorrupt):
        store.get_pages_into(["bad"], [torch.empty_like(p)])
    assert not client.exists(store.key("bad")), "a corrupt page outlived its load"
    client.put(store.key("bad"), hdr + raw(p))
    with pytest.raises(kv.PageCorrupt):
        store.get_pages(["bad"])
    assert not client.exists(store.key("bad"))


def test_a_corrupt_page_misses_alone_and_is_replaced(client):
    """Failing open, a page whose payload fails its CRC is a miss, the pages before and after
    it in its batch load, and it is deleted: the next put stores it again and a load finds
    it (its batch missed whole, and, never deleted, every later load of it too: lookups
    counted it and puts skipped it; a review)."""
    store = kv.PageStore(client, "ns/crc-open", checksum=True, fail_open=True)
    ps = pages(3)
    assert store.put_pages(["a", "c"], [ps[0], ps[2]]) == [True, True]
    hdr = PageHeader("float32", tuple(ps[1].shape), "", ps[1].numel() * 4, crc32=12345).pack()
    client.put(store.key("b"), hdr + raw(ps[1]))
    dest = [torch.empty_like(p) for p in ps]
    assert store.get_pages_into(["a", "b", "c"], dest) == [True, False, True]
    assert raw(dest[0]) == raw(ps[0]) and raw(dest[2]) == raw(ps[2])
    assert store.counters()["errors"] == 1
    assert store.contains_prefix(["a", "b", "c"]) == 1
    assert store.put_pages(["a", "b", "c"], ps) == [True, True, True]
    assert store.get_pages_into(["a", "b", "c"], dest) == [True, True, True]
    assert raw(dest[1]) == raw(ps[1])
    client.put(store.key("b"), hdr + raw(ps[1]))
    views = store.get_pages(["a", "b", "c"])
    assert [v is not None for v in views] == [True, False, True]


def test_a_checksum_store_replaces_pages_without_a_crc(client):
    """A page put by a store without checksum (another deployment sharing the namespace)
    carries no CRC: a checksum store loads it as a miss, copies nothing, and deletes it, so
    its next put stores the page with a CRC. Before, lookups counted it cached, puts skipped
    it, and every load failed for as long as it stayed."""
    store = kv.PageStore(client, "ns/crc", checksum=True)
    plain = kv.PageStore(client, "ns/crc")
    p, q = pages(2)
    assert plain.put_pages(["plain", "plain2"], [p, q]) == [True, True]
    assert store.contains_prefix(["plain"], pin=False) == 1
    dst = torch.full_like(p, 7.0)
    assert store.get_pages_into(["plain"], [dst]) == [False]
    assert bool((dst == 7.0).all())
    assert store.contains(["plain"]) == [False]  # gone: the next put rewrites it
    assert store.get_pages(["plain2"]) == [None]
    assert store.contains(["plain2"]) == [False]
    assert store.counters()["errors"] == 0
    assert store.put_pages(["plain"], [p]) == [True]
    assert store.counters()["stored"] == 1
    assert store.get_pages_into(["plain"], [dst]) == [True] and torch.equal(dst, p)
    assert plain.get_pages_into(["plain"], [dst]) == [True]  # the CRC is checked there too


def test_a_put_error_carries_every_pages_outcome(client):
    """Not failing open, put_pages raises the first real failure with ``errors`` (each
    page's outcome), also when an AlreadyExists came before it in the batch."""
    store = kv.PageStore(client, "ns/errors")
    p = pages(1)[0]
    assert store.put_pages(["a"], [p]) == [True]
    # the third page's parent is its own key (the second page's): the owner refuses it alone
    with pytest.raises(fluxkv.InvalidArgument) as e:
        store.put_pages(["a", "b", "b"], [p, p, p])
    outcomes = e.value.errors
    assert len(outcomes) == 3 and isinstance(outcomes[0], fluxkv.AlreadyExists)
    assert outcomes[1] is None and outcomes[2] is e.value
    assert store.contains(["a", "b"]) == [True, True]


def test_pin_ms_out_of_range_is_refused_at_once(client):
    # (failing open, a lookup refused for it would answer 0 for the process's life)
    from fluxkv._gen.external.constants import MAX_PIN_MS

    for pin_ms in (-1, MAX_PIN_MS + 1, 10_000):
        with pytest.raises(ValueError, match="pin_ms"):
            kv.PageStore(client, "ns/pins", pin_ms=pin_ms, fail_open=True)
    assert kv.PageStore(client, "ns/pins", pin_ms=MAX_PIN_MS).contains_prefix([1]) == 0


def test_header_layout_on_the_wire(store, client):
    p = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    store.put_pages([0xABC], [p])
    assert store.key(0xABC).endswith("/abc") and store.key(-5).endswith("/-5")
    with client.get(store.key(0xABC)) as h:
        assert len(h) == PAGE_HEADER_BYTES + 96
        hdr = PageHeader.unpack(h.bytes()[:PAGE_HEADER_BYTES])
    assert (hdr.dtype, hdr.shape, hdr.layout, hdr.nbytes, hdr.crc32) == ("int64", (3, 4), "LHD", 96, None)


def test_pages_stream_through_a_small_put_area(iso_client):
    # the put area is 64 KiB: a 256 KiB page (plus header) goes through it in parts
    store = kv.PageStore(iso_client, "iso/pages")
    ps = pages(3, shape=(64, 1024))
    assert store.put_pages(["a", "b", "c"], ps) == [True] * 3
    dest = [torch.empty_like(p) for p in ps]
    assert store.get_pages_into(["a", "b", "c"], dest) == [True] * 3
    assert all(torch.equal(a, b) for a, b in zip(ps, dest))


def test_fail_open_while_the_owner_is_away(cluster, caplog):
    sock = str(cluster.root / "late" / "fluxkv.sock")  # where cluster.up(name="late") listens
    store = kv.PageStore(sock, "away/ns", fail_open=True, retry_s=0.0)
    p = pages(1)[0]
    with caplog.at_level(logging.WARNING, logger="fluxkv.kv"):
        assert store.contains_prefix(["a", "b"]) == 0
        assert store.put_pages(["a"], [p]) == [False]
        assert store.get_pages_into(["a"], [torch.empty_like(p)]) == [False]
        assert store.get_pages(["a"]) == [None]
        assert store.stats()["pages"] is None
    assert store.counters()["errors"] >= 5
    assert sum("answered as not cached" in r.getMessage() for r in caplog.records) == 1  # rate-limited
    strict = kv.PageStore(sock, "away/ns")
    with pytest.raises(fluxkv.Unavailable):
        strict.contains(["a"])
    # the owner comes up: the same store attaches and works
    proc = cluster.up("64MiB", "late")
    assert store.put_pages(["a"], [p]) == [True]
    assert store.contains_prefix(["a", "b"]) == 1
    # and goes away again mid-use: misses, no exception
    proc.stop()
    assert store.get_pages_into(["a"], [torch.empty_like(p)]) == [False]
    store.close()
    strict.close()


def test_fork_during_the_first_attach_leaves_the_child_a_working_store(daemon):
    """A fork while another thread of the parent attaches the store (it holds the store's
    connect lock for up to the attach timeout): the child's calls attach on their own and
    answer, instead of waiting for good on a lock no thread of the child will release."""
    store = kv.PageStore(daemon.socket, "fork/ns")
    p = pages(1)[0]
    store._connect_lock.acquire()  # as an attach in progress on another thread holds it
    store._next_try = time.monotonic() + 60  # which set the next try ahead before connecting
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if its calls answer, 3 if they hang
            signal.alarm(20)
            try:
                ok = store.put_pages(["c"], [p]) == [True] and store.contains_prefix(["c"]) == 1
                os._exit(0 if ok else 1)
            except BaseException:
                os._exit(2)
    finally:
        store._next_try = 0.0  # (the parent's attach would have ended)
        store._connect_lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the child's store: exit {os.waitstatus_to_exitcode(status)}"
    assert store.contains_prefix(["c"]) == 1  # the parent's store attaches too and sees the child's page
    store.close()


def test_bad_inputs(store):
    with pytest.raises(ValueError, match="2 hashes but 1"):
        store.put_pages(["a", "b"], pages(1))
    with pytest.raises(fluxkv.InvalidArgument, match="contiguous"):
        store.put_pages(["a"], [pages(1)[0].transpose(0, 1)])
    with pytest.raises(TypeError):
        store.put_pages(["a"], [b"bytes are not a page"])
    with pytest.raises(ValueError, match="no '/'"):
        store.key("a/b")
    with pytest.raises(ValueError):
        kv.PageStore(store._client, "ns/", layout="")
    with pytest.raises(ValueError, match="layout tag"):
        kv.PageStore(store._client, "ns", layout="x" * 21)
    ro = np.zeros(4, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(fluxkv.InvalidArgument, match="read-only"):
        store.get_pages_into(["a"], [ro])
    swapped = np.zeros(4, dtype=np.dtype(np.float32).newbyteorder())  # its name is float32 too
    with pytest.raises(fluxkv.InvalidArgument, match="byte order"):
        store.put_pages(["a"], [swapped])
    with pytest.raises(fluxkv.InvalidArgument, match="byte order"):
        store.get_pages_into(["a"], [swapped])


def test_namespaces(client):
    ns = kv.namespace("org/model-7b", tp_rank=1, tp_size=4, dtype="bfloat16", layout="page_first")
    assert ns == "kv1/org/model-7b/tp1of4/pp0of1/bfloat16/page_first"
    assert kv.namespace("m", tp_rank=None) == "kv1/m/tp*/pp0of1/-/-"
    a = kv.PageStore(client, kv.namespace("m", tp_rank=0, tp_size=2))
    b = kv.PageStore(client, kv.namespace("m", tp_rank=1, tp_size=2))
    p, q = pages(2)
    a.put_pages(["same"], [p])
    assert b.contains_prefix(["same"]) == 0
    b.put_pages(["same"], [q])
    da, db = torch.empty_like(p), torch.empty_like(q)
    a.get_pages_into(["same"], [da])
    b.get_pages_into(["same"], [db])
    assert torch.equal(da, p) and torch.equal(db, q)
