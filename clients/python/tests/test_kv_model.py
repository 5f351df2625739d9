"""A real model's KV pages through fluxkv.kv (issue 27 point 5), against real daemons.

tinylm.TinyLM (4 layers, grouped-query attention, pages of 16 tokens) in float32 and
bfloat16: a prompt's pages are stored, a second prompt sharing its leading pages loads them
(into the model's buffers, or as zero-copy tensors) and prefills only the rest, and its
logits match a full recompute and 64 greedy tokens are identical. Pages pushed out of DRAM
to the SSD tier come back bit-identical; two models' namespaces never meet although their
prompts hash alike; a read into another dtype, shape or layout tag is refused; and a client
killed between its prefix lookup (with pins) and the load leaves no holder, pin or byte
behind.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import fluxkv
from fluxkv import kv
from fluxkv._gen.external.constants import MAX_PIN_MS

from conftest import Cluster, Proc, child_env, local_member, used_bytes, wait_until

torch = pytest.importorskip("torch")

from tinylm import TinyLM, chain_hashes  # noqa: E402  (needs torch)

PROMPT_PAGES = 10
LAYOUT = "L2HTD"  # TinyLM.page_shape: layers, K/V, KV heads, tokens, head dim
# assert_close tolerances of logits against a full recompute.
TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=1.6e-2, atol=5e-2)}
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def model_store(client, m: TinyLM) -> kv.PageStore:
    """The page store of m's KV pages (namespace of model "tinylm", m's dtype, LAYOUT)."""
    return kv.PageStore(client, kv.namespace("tinylm", dtype=dtype_name(m.dtype), layout=LAYOUT), layout=LAYOUT)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical: same dtype and shape, same raw bytes (NaN-safe, bf16 included)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def first_prompt(m: TinyLM) -> torch.Tensor:
    """PROMPT_PAGES full pages and a partial one."""
    return m.prompt(PROMPT_PAGES * m.page_tokens + 5, seed=1)


def shared_prompt(m: TinyLM) -> torch.Tensor:
    """A prompt whose leading PROMPT_PAGES pages are first_prompt's, then other tokens."""
    return torch.cat([first_prompt(m)[: PROMPT_PAGES * m.page_tokens], m.prompt(37, seed=2)])


def empty_pages(m: TinyLM, n: int) -> list[torch.Tensor]:
    return [torch.empty(m.page_shape, dtype=m.dtype) for _ in range(n)]


def up_with_ssd(cluster: Cluster, dram: str, ssd_limit: str, *extra: str) -> Proc:
    """A single node (``fluxkv up``) with an SSD tier, under the cluster's directory and
    stopped with it."""
    ssd = cluster.root / "ssd"
    ssd.mkdir()
    return cluster.up(dram, "ssd-node", "--ssd-path", str(ssd), "--ssd-limit", ssd_limit, *extra)


# -- the model itself (no daemon) --------------------------------------------------------------


def test_chain_hashes():
    t = torch.arange(50)
    hs = chain_hashes(t)
    assert len(hs) == 3 and all(len(h) == 64 for h in hs)  # the partial page has no hash
    assert chain_hashes(t[:48]) == hs and chain_hashes(t[:16]) == hs[:1]
    changed = t.clone()
    changed[3] += 1  # a token of the first page changes every hash after it
    assert all(a != b for a, b in zip(chain_hashes(changed), hs))
    changed = t.clone()
    changed[20] += 1
    hc = chain_hashes(changed)
    assert hc[0] == hs[0] and hc[1] != hs[1] and hc[2] != hs[2]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_model_uses_its_prefix_pages(dtype):
    """Without fluxkv: the prefix pages of an earlier prefill reproduce a full recompute, and
    the pages of another prompt do not (the model does read them)."""
    m = TinyLM(dtype=dtype, seed=0)
    _, pages = m.prefill(first_prompt(m))
    assert len(pages) == PROMPT_PAGES and all(tuple(p.shape) == m.page_shape and p.dtype == dtype for p in pages)
    prompt = shared_prompt(m)
    full, full_pages = m.prefill(prompt)
    start = PROMPT_PAGES * m.page_tokens
    logits, out_pages = m.prefill(prompt, prefix_pages=pages)
    assert logits.shape == (len(prompt) - start, m.vocab)
    torch.testing.assert_close(logits, full[start:], **TOLERANCE[dtype])
    assert all(a is b for a, b in zip(out_pages, pages))  # prefix pages are handed back as they are
    assert len(out_pages) == len(full_pages) == len(prompt) // m.page_tokens
    _, other = m.prefill(m.prompt(PROMPT_PAGES * m.page_tokens, seed=99))
    wrong, _ = m.prefill(prompt, prefix_pages=other)
    assert not torch.allclose(wrong, full[start:], **TOLERANCE[dtype])
    with pytest.raises(ValueError, match="prefix page 0"):
        m.prefill(prompt, prefix_pages=[p.float() if dtype == torch.bfloat16 else p.bfloat16() for p in pages])


# -- through fluxkv ----------------------------------------------------------------------------------


@pytest.mark.parametrize("load", ["into", "zero-copy"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_prefill_from_cached_pages_matches_recompute(client, dtype, load):
    m = TinyLM(dtype=dtype, seed=0)
    store = model_store(client, m)
    _, pages = m.prefill(first_prompt(m))
    assert store.put_pages(chain_hashes(first_prompt(m)), pages) == [True] * PROMPT_PAGES

    prompt = shared_prompt(m)
    hashes = chain_hashes(prompt)
    assert len(hashes) == PROMPT_PAGES + 2
    n = store.contains_prefix(hashes)
    assert n == PROMPT_PAGES
    if load == "into":
        cached = empty_pages(m, n)
        assert store.get_pages_into(hashes[:n], cached) == [True] * n
    else:
        cached = store.get_pages(hashes[:n])
        assert all(t is not None for t in cached)
    assert all(same_bytes(a, b) for a, b in zip(cached, pages))

    full, _ = m.prefill(prompt)
    logits, _ = m.prefill(prompt, prefix_pages=cached)
    torch.testing.assert_close(logits, full[n * m.page_tokens :], **TOLERANCE[dtype])
    assert m.generate(prompt, 64, prefix_pages=cached) == m.generate(prompt, 64)


def test_pages_refilled_from_ssd_are_bit_identical(cluster):
    """Both models' pages, then twice the DRAM of filler pages: the model pages leave memory
    for the SSD tier (--no-promotion keeps them there, so every read is an SSD refill) and
    read back bit-identical; a prefill from them matches the recompute."""
    node = up_with_ssd(cluster, "8MiB", "64MiB", "--no-promotion")
    with fluxkv.connect(node.socket) as c:
        stored = {}
        for dtype in DTYPES:
            m = TinyLM(dtype=dtype, seed=0)
            _, pages = m.prefill(first_prompt(m))
            hashes = chain_hashes(first_prompt(m))
            store = model_store(c, m)
            assert store.put_pages(hashes, pages) == [True] * PROMPT_PAGES
            stored[dtype] = (m, store, hashes, pages)
        filler = kv.PageStore(c, kv.namespace("filler"))
        g = torch.Generator().manual_seed(7)
        for i in range(64):  # 64 x 256 KiB: twice the DRAM
            filler.put_pages([f"f{i}"], [torch.randint(0, 255, (256 << 10,), generator=g, dtype=torch.uint8)])
        model_keys = sorted(st.key(h) for _, st, hs, _ in stored.values() for h in hs)

        def settled():
            member = local_member(c.stat())
            return member["ssd_persists_pending"] == 0 and member
        member = wait_until(settled, 30.0)
        assert member, f"SSD persists still pending: {local_member(c.stat())}"
        assert member["ssd_replicas"] >= len(model_keys)
        assert member["ssd_unwritten"] == 0, f"the write-back gave pages up: {member}"
        assert member["memory_replicas"] < len(model_keys) + 64, "nothing left memory"

        for dtype, (m, store, hashes, pages) in stored.items():
            assert store.contains_prefix(hashes) == PROMPT_PAGES
            back = empty_pages(m, PROMPT_PAGES)
            assert store.get_pages_into(hashes, back) == [True] * PROMPT_PAGES
            assert all(same_bytes(a, b) for a, b in zip(back, pages)), f"{dtype}: a page changed on its way through the SSD"
            prompt = shared_prompt(m)
            full, _ = m.prefill(prompt)
            logits, _ = m.prefill(prompt, prefix_pages=back)
            torch.testing.assert_close(logits, full[PROMPT_PAGES * m.page_tokens :], **TOLERANCE[dtype])

        sources = []
        for k in model_keys:
            with c.get(k) as h:
                sources.append(h.source)
        assert "ssd" in sources, f"no model page was read from SSD: {sources}"


def test_two_models_never_share_pages(client):
    """The float32 and bfloat16 models see the same prompt, so the same page hashes: in their
    own namespaces each finds, loads and deletes only its own pages."""
    models = {dtype: TinyLM(dtype=dtype, seed=0) for dtype in DTYPES}
    stores = {dtype: model_store(client, m) for dtype, m in models.items()}
    pages = {dtype: m.prefill(first_prompt(m))[1] for dtype, m in models.items()}
    hashes = chain_hashes(first_prompt(models[torch.float32]))
    assert chain_hashes(first_prompt(models[torch.bfloat16])) == hashes
    f32, b16 = stores[torch.float32], stores[torch.bfloat16]
    assert f32.put_pages(hashes, pages[torch.float32]) == [True] * PROMPT_PAGES
    assert b16.contains_prefix(hashes) == 0
    assert b16.get_pages(hashes) == [None] * PROMPT_PAGES
    assert b16.put_pages(hashes, pages[torch.bfloat16]) == [True] * PROMPT_PAGES  # stored, not "already present"
    other_rank = kv.PageStore(client, kv.namespace("tinylm", tp_rank=1, tp_size=2, dtype="float32", layout=LAYOUT), layout=LAYOUT)
    assert other_rank.contains_prefix(hashes) == 0

    for dtype, store in stores.items():
        back = empty_pages(models[dtype], PROMPT_PAGES)
        assert store.get_pages_into(hashes, back) == [True] * PROMPT_PAGES
        assert all(same_bytes(a, b) for a, b in zip(back, pages[dtype]))

    assert f32.delete_namespace() == PROMPT_PAGES
    assert f32.contains_prefix(hashes) == 0
    assert b16.contains_prefix(hashes) == PROMPT_PAGES


def _wrong_reader(m: TinyLM):
    """(buffer factory, reader layout tag) pairs that each differ from m's pages in one way."""
    tok_major = (m.n_layers, 2, m.page_tokens, m.n_kv_heads, m.head_dim)  # same bytes, other shape
    return {
        "dtype": (lambda: torch.zeros(m.page_shape, dtype=torch.bfloat16), LAYOUT),
        "shape": (lambda: torch.zeros(tok_major, dtype=m.dtype), LAYOUT),
        "layout": (lambda: torch.zeros(m.page_shape, dtype=m.dtype), "L2THD"),
    }


@pytest.mark.parametrize("wrong", ["dtype", "shape", "layout"])
def test_wrong_layout_read_is_refused(client, wrong):
    m = TinyLM(dtype=torch.float32, seed=0)
    store = model_store(client, m)
    _, pages = m.prefill(first_prompt(m))
    hashes = chain_hashes(first_prompt(m))
    store.put_pages(hashes, pages)
    make, layout = _wrong_reader(m)[wrong]
    reader = kv.PageStore(client, store.namespace, layout=layout)
    bufs = [make() for _ in hashes]
    with pytest.raises(kv.PageLayoutMismatch):
        reader.get_pages_into(hashes, bufs)
    assert all(not b.any() for b in bufs), "a refused read copied bytes"
    if wrong == "layout":  # a zero-copy read has no dtype or shape to disagree with, only the tag
        with pytest.raises(kv.PageLayoutMismatch):
            reader.get_pages(hashes)
    right = empty_pages(m, len(hashes))
    assert store.get_pages_into(hashes, right) == [True] * len(hashes)  # the pages are unharmed


_PINNING_CHILD = r"""
import sys, time
import fluxkv
from fluxkv import kv
store = kv.PageStore(fluxkv.connect(sys.argv[1]), sys.argv[2], layout=sys.argv[3], pin_ms=int(sys.argv[4]))
print("pinned", store.contains_prefix(sys.argv[5:]), flush=True)
time.sleep(120)  # killed here, before its load
"""
_CHILD_PIN_MS = MAX_PIN_MS  # the longest a pin may last


def holders(st: dict) -> int:
    """Holdings of the node's memory, every session's (a pin is one), as the master counts them."""
    return local_member(st)["holders"]


def test_client_killed_between_lookup_and_load_leaks_nothing(client, daemon):
    """A child's prefix lookup pins the 10 pages (holdings of its session), the parent deletes half of
    them (their pins end with them: a pin of a dead version keeps neither its bytes nor its
    budget), the child is killed with SIGKILL before it loads: its holdings of the other 5 go with
    its session, well before the pins would have run out, and used memory stays what the 5
    remaining pages take."""
    m = TinyLM(dtype=torch.float32, seed=0)
    store = model_store(client, m)
    _, pages = m.prefill(first_prompt(m))
    hashes = chain_hashes(first_prompt(m))
    half = PROMPT_PAGES // 2
    store.put_pages(hashes[:half], pages[:half])
    used_kept = used_bytes(client)
    store.put_pages(hashes[half:], pages[half:])
    used_all = used_bytes(client)
    assert used_all > used_kept
    st0 = client.stat()

    t0 = time.monotonic()  # the child pins after this: its pins cannot end before t0 + the pin time
    child = subprocess.Popen(
        [sys.executable, "-c", _PINNING_CHILD, daemon.socket, store.namespace, LAYOUT, str(_CHILD_PIN_MS), *hashes],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line.strip() == f"pinned {PROMPT_PAGES}", line
        st = client.stat()
        assert st["clients"] == st0["clients"] + 1
        assert holders(st) == holders(st0) + PROMPT_PAGES, "the lookup pinned nothing"
        assert store.delete_pages(hashes[half:]) == [True] * (PROMPT_PAGES - half)

        def deleted_unpinned():
            return holders(client.stat()) == holders(st0) + half and used_bytes(client) == used_kept

        assert wait_until(deleted_unpinned, 30), f"the deleted pages' pins kept them: {client.stat()}, used {used_bytes(client)}"
        child.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        child.wait(10)

        def clean():
            st = client.stat()
            return st["clients"] == st0["clients"] and holders(st) == holders(st0) and used_bytes(client) == used_kept

        assert wait_until(clean, 30), f"after the kill: {client.stat()}, used {used_bytes(client)}, want {used_kept}"
        cleaned_at = time.monotonic()
        pins_end = t0 + _CHILD_PIN_MS / 1000
        if killed_at < pins_end - 2.0:  # room enough to tell the session's end from the pins' time
            assert cleaned_at < pins_end, "released only when the pins ran out, not with the session"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    back = empty_pages(m, half)
    assert store.get_pages_into(hashes[:half], back) == [True] * half
    assert all(same_bytes(a, b) for a, b in zip(back, pages[:half]))
    assert store.contains_prefix(hashes) == half
