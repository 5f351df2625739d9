"""Prefix lookups (issue 26 point 3): ``batch_exists(keys, prefix=True, pin_ms=0)`` returns the
count of leading keys present, evaluated by the owner in one call per MAX_BATCH keys (a later
chunk only when the whole previous one was present); ``pin_ms`` pins what was found so the
load that follows finds it. Without ``prefix`` it still returns one bool per key."""

from __future__ import annotations

import pytest

import fluxkv
from fluxkv import _wire
from fluxkv._gen.external import constants as C


def put_pages(c: fluxkv.Client, keys, value: bytes = b"page") -> None:
    c.batch_put([(k, value) for k in keys])


def count_calls(monkeypatch, method: str) -> list:
    """Record each ``method`` call the client sends (how many keys its request carried is not
    visible here: the count of calls is)."""
    calls: list = []
    orig = _wire.RPCConnection.call

    def call(self, name, session, rest):
        if name == method:
            calls.append(name)
        return orig(self, name, session, rest)

    monkeypatch.setattr(_wire.RPCConnection, "call", call)
    return calls


def test_prefix_count_stops_at_a_gap(client):
    keys = [f"pg/{i}" for i in range(10)]
    put_pages(client, keys[:5] + keys[6:])  # pg/5 is missing
    assert client.batch_exists(keys, prefix=True) == 5
    # without prefix: one bool per key, as before
    assert client.batch_exists(keys) == [True] * 5 + [False] + [True] * 4


def test_prefix_all_present(client):
    keys = [f"pa/{i}" for i in range(64)]
    put_pages(client, keys)
    n = client.batch_exists(keys, prefix=True)
    assert n == 64 and type(n) is int


def test_prefix_first_absent(client):
    keys = [f"pf/{i}" for i in range(8)]
    put_pages(client, keys[1:])
    assert client.batch_exists(keys, prefix=True) == 0
    assert client.batch_exists([], prefix=True) == 0
    assert client.batch_exists(["pf/nothing"], prefix=True) == 0


def test_prefix_over_max_batch_is_chunked(client, monkeypatch):
    n = C.MAX_BATCH + 100
    keys = [f"pc/{i}" for i in range(n)]
    put_pages(client, keys, b"x")
    calls = count_calls(monkeypatch, "BatchExists")
    assert client.batch_exists(keys, prefix=True) == n
    assert len(calls) == 2, "MAX_BATCH keys per call"

    # a gap in the first chunk: the second chunk is never sent
    client.delete(keys[100])
    calls.clear()
    assert client.batch_exists(keys, prefix=True) == 100
    assert len(calls) == 1, "a chunk that was not wholly present ends the lookup"

    # a gap in the second chunk
    client.put(keys[100], b"x")
    client.delete(keys[C.MAX_BATCH + 50])
    calls.clear()
    assert client.batch_exists(keys, prefix=True) == C.MAX_BATCH + 50
    assert len(calls) == 2


def test_pin_ms_validation(client):
    keys = ["pv/0", "pv/1"]
    put_pages(client, keys)
    for bad in (-1, C.MAX_PIN_MS + 1, 1 << 40):
        with pytest.raises(fluxkv.InvalidArgument, match="pin_ms"):
            client.batch_exists(keys, prefix=True, pin_ms=bad)
    with pytest.raises(fluxkv.InvalidArgument, match="prefix"):
        client.batch_exists(keys, pin_ms=100)  # pins are for prefix lookups only
    with pytest.raises(TypeError, match="pin_ms"):
        client.batch_exists(keys, prefix=True, pin_ms="100")
    with pytest.raises(TypeError, match="pin_ms"):
        client.batch_exists(keys, prefix=True, pin_ms=1.5)
    assert C.MAX_PIN_MS == 5000
    assert client.batch_exists(keys, prefix=True, pin_ms=C.MAX_PIN_MS) == 2
    assert client.batch_exists(keys, prefix=True, pin_ms=0) == 2
    assert client.batch_exists(keys, pin_ms=0) == [True, True]


def test_pinned_prefix_then_batch_get(client):
    keys = [f"pp/{i}" for i in range(32)]
    values = {k: f"value of {k}".encode() * 64 for k in keys}
    client.batch_put(values)
    assert client.batch_exists(keys, prefix=True, pin_ms=2000) == len(keys)
    holders = client.batch_get(keys)
    try:
        assert all(h is not None for h in holders)
        for k, h in zip(keys, holders):
            assert h.bytes() == values[k]
            assert h.source == "memory"
    finally:
        for h in holders:
            if h is not None:
                h.release()
    assert client.release_errors == 0


def test_pinned_prefix_stops_at_a_gap(client):
    keys = [f"pq/{i}" for i in range(6)]
    put_pages(client, keys[:3] + keys[4:])
    assert client.batch_exists(keys, prefix=True, pin_ms=1000) == 3
    holders = client.batch_get(keys[:3])
    try:
        assert all(h is not None and h.bytes() == b"page" for h in holders)
    finally:
        for h in holders:
            h.release()
