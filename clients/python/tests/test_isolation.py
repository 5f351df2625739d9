"""The Python client against an owner with client isolation (docs/architecture.md §11): the segment
is mapped read-only only, values go through the session's put area (streamed when larger)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import fluxkv
from conftest import used_bytes, wait_until

AREA = 64 << 10  # --put-area of these tests: small, so streamed values stay small too


@pytest.fixture
def iso_client(cluster):
    p = cluster.up("64MiB", "iso", "--client-isolation", "--put-area", "64KiB")
    c = fluxkv.connect(p.socket)
    yield c
    c.close()


def _value(seed: int, n: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


SIZES = [1, 4095, AREA - 1, AREA, AREA + 1, 3 * AREA + 17, (1 << 20) + 3]


def test_session_is_isolated(iso_client):
    s = iso_client._current()
    assert s.area is not None and s.area.size == AREA
    assert s.segment.rw is None  # the segment is never mapped writable


@pytest.mark.parametrize("n", SIZES)
def test_put_get_sizes(iso_client, n):
    v = _value(n, n)
    iso_client.put(f"k{n}", v)
    with iso_client.get(f"k{n}") as h:
        assert h.bytes() == v
    arr = np.frombuffer(_value(n + 1, n), dtype=np.uint8)
    iso_client.put(f"k{n}", arr)  # any C-contiguous buffer; an overwrite
    with iso_client.get(f"k{n}") as h:
        assert h.bytes() == arr.tobytes()
    assert iso_client.delete(f"k{n}")


@pytest.mark.parametrize("n", [100, AREA, 2 * AREA + 1])
def test_put_with(iso_client, n):
    calls = []

    def fill(put_id, view):
        calls.append(len(view))
        view[:] = _value(put_id, n)

    put_id = iso_client.put_with(f"w{n}", n, fill)
    assert calls == [n]
    with iso_client.get(f"w{n}") as h:
        assert h.put_id == put_id and h.bytes() == _value(put_id, n)
    iso_client.delete(f"w{n}")


def test_batch_put(iso_client):
    items = {f"b{i}": _value(i, 1000 + 997 * i) for i in range(40)}
    items["b-big"] = _value(99, 2 * AREA + 5)
    iso_client.batch_put(items)
    holders = iso_client.batch_get(list(items))
    for (k, v), h in zip(items.items(), holders):
        assert h is not None and h.bytes() == v, k
        h.release()
    assert iso_client._stats["waves"] >= 3  # bounded by the area: no wave holds more than it
    assert iso_client._stats["max_wave_bytes"] <= 2 * AREA + 5
    iso_client.batch_delete(list(items))
    wait_until(lambda: used_bytes(iso_client) == 0, 5)


def test_threads_share_the_area(iso_client):
    errors = []

    def worker(t):
        try:
            for i in range(10):
                n = [100, AREA, AREA + 100][i % 3]
                v = _value(t * 100 + i, n)
                iso_client.put(f"t{t}-{i}", v)
                with iso_client.get(f"t{t}-{i}") as h:
                    assert h.bytes() == v
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_batch_put_one_stream_failing_leaves_the_others(iso_client, monkeypatch):
    """An item streamed through the put area whose PutWrite is answered with an error (here
    injected: an expired put answers UNAVAILABLE) fails alone: its put is aborted, and the
    wave's other items and the later waves are stored; the error is raised with ``errors``."""
    real = fluxkv.Client._stream

    def stream(self, s, key, put_id, obj, keep_last):
        if key == "big-bad":
            raise fluxkv.Unavailable("injected: PutWrite answered UNAVAILABLE")
        return real(self, s, key, put_id, obj, keep_last)

    monkeypatch.setattr(fluxkv.Client, "_stream", stream)
    items = [("big-bad", _value(1, 2 * AREA)), ("big-ok", _value(2, 2 * AREA))] + [(f"small{i}", _value(10 + i, 100)) for i in range(5)]
    with pytest.raises(fluxkv.Unavailable) as e:
        iso_client.batch_put(items)
    assert [x is not None for x in e.value.errors] == [True] + [False] * 6
    assert not iso_client.exists("big-bad")
    for k, v in items[1:]:
        with iso_client.get(k) as h:
            assert h.bytes() == v


def test_the_area_waits_for_an_unanswered_put_end(cluster):
    """Under isolation, a put whose PutEnd went unanswered (the owner stalled past three call
    timeouts) leaves the put area to no other put until the owner answers it: the owner may
    still copy the area into the first put's range. Another put wrote the area at once, and
    the first key was published with its bytes (a review)."""
    p = cluster.up("64MiB", "stall", "--client-isolation")
    c = fluxkv.connect(p.socket, timeout=0.3)
    # A connection is up before the timed puts: a's PutStart, not retried once sent, must
    # not spend its 0.3 s on connecting (a review of flaky tests).
    c.put("warm", b"1")
    n = 64 << 10
    va, vb = b"A" * n, b"B" * n
    outcome = {}

    def put_b():
        try:
            c.put_with("b", n, lambda pid, view: view.__setitem__(slice(None), vb))
            outcome["b"] = None
        except fluxkv.Error as e:
            outcome["b"] = e

    tb = threading.Thread(target=put_b)
    stopped = False

    def fill_a(pid, view):
        nonlocal stopped
        view[:] = va
        tb.start()
        time.sleep(0.3)  # b's PutStart is answered; b waits for the area
        os.kill(p.pid, signal.SIGSTOP)  # the owner stalls before a's PutEnd
        stopped = True

    try:
        try:
            c.put_with("a", n, fill_a)
        except fluxkv.Error as e:
            outcome["a"] = e
        # (b is started by a's fill)
        assert tb.ident is not None, f"put a failed before its value was written, within its 0.3 s timeout: {outcome.get('a')}"
        tb.join(30)
    finally:
        if stopped:
            os.kill(p.pid, signal.SIGCONT)
    c2 = fluxkv.connect(p.socket)
    got = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the owner catches up with the calls queued meanwhile
        try:
            with c2.get("a") as h:
                got = h.bytes()
            break
        except fluxkv.KeyNotFound:
            time.sleep(0.05)
    assert got is None or got == va, f"a was published with other bytes ({got[:1]!r}...): {outcome}"
    c2.close()
    c.close()
