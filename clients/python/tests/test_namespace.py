"""Namespaces (issue 27): ``delete_namespace(ns)`` deletes every key whose text before its last
'/' is ``ns`` and returns how many existed; ``namespace_stat(ns)`` is ``{"keys", "bytes"}`` of
those keys. Namespaces do not nest, and other namespaces and plain keys are untouched."""

from __future__ import annotations

import importlib

import pytest

import fluxkv
from fluxkv import kv
from fluxkv._gen.external import constants as C

NS = "kv1/tiny/tp0of1"


def test_delete_namespace_and_stat(client):
    pages = {f"{NS}/{i:04x}": bytes([i]) * (100 + i) for i in range(20)}
    kept = {
        f"{NS}/sub/0": b"nested",  # in namespace NS/sub, not in NS
        "kv1/tiny/tp1of1/0": b"sibling",
        "plain": b"no namespace",
    }
    client.batch_put({**pages, **kept})
    with client.get(f"{NS}/0003") as held:
        assert client.namespace_stat(NS) == {"keys": 20, "bytes": sum(len(v) for v in pages.values())}
        assert client.namespace_stat(f"{NS}/sub") == {"keys": 1, "bytes": 6}

        assert client.delete_namespace(NS) == 20
        assert held.bytes() == pages[f"{NS}/0003"]  # a holder keeps its bytes
    assert client.namespace_stat(NS) == {"keys": 0, "bytes": 0}
    assert client.batch_exists(list(pages)) == [False] * len(pages)
    with pytest.raises(fluxkv.KeyNotFound):
        client.get(f"{NS}/0000")
    for k, v in kept.items():
        with client.get(k) as h:
            assert h.bytes() == v
    assert client.delete_namespace(NS) == 0
    assert client.delete_namespace("absent/ns") == 0


@pytest.mark.parametrize("bad", ["", "n" * (C.MAX_KEY_BYTES + 1)])
def test_bad_namespace(client, bad):
    with pytest.raises(fluxkv.InvalidArgument):
        client.delete_namespace(bad)
    with pytest.raises(fluxkv.InvalidArgument):
        client.namespace_stat(bad)


def test_namespace_ending_in_separator(client):
    """A key such as "trail//x" is in namespace "trail/": it can be counted and deleted by it."""
    client.put("trail//x", b"v" * 10)
    assert client.namespace_stat("trail/") == {"keys": 1, "bytes": 10}
    assert client.delete_namespace("trail/") == 1
    assert not client.exists("trail//x")


def test_namespaces_of_other_configurations_differ():
    """dtype and layout are one part each, and no model name part reads as the TP part: two
    configurations made one namespace (a review)."""
    with pytest.raises(ValueError, match="dtype"):
        kv.namespace("m", dtype="a/b")
    with pytest.raises(ValueError, match="layout"):
        kv.namespace("m", dtype="a", layout="b/-")
    with pytest.raises(ValueError, match="tensor-parallel"):
        kv.namespace("m/tp0of1/pp0of1/x/y")
    assert kv.namespace("Qwen/Qwen3-8B", extra="lmcache/2x32") == "kv1/Qwen/Qwen3-8B/tp0of1/pp0of1/-/-/lmcache/2x32"


def test_a_namespace_at_the_limit_leaves_room_for_suffixed_hashes(client):
    """A namespace at its limit still takes SGLang's 66-byte page keys ("<64 hex>.k"): with
    room for 64 bytes only, the owner refused them and nothing was cached (a review)."""
    limit = importlib.import_module("fluxkv.kv.namespace").MAX_NAMESPACE_BYTES
    ns = kv.namespace("m" * (limit - len(kv.namespace("m")) + 1))
    assert len(ns.encode()) == limit
    with pytest.raises(ValueError):
        kv.namespace("m" * (limit - len(kv.namespace("m")) + 2))
    key = f"{ns}/{'ab' * 32}.k"
    client.put(key, b"page")
    with client.get(key) as h:
        assert h.read(0, len(h)) == b"page"
