"""The wire contract of protocol/external.thrift, followed by the client: limits from the
generated constants, the retry rules (a lost PutEnd reply, an owner restart mid-put),
batch puts in waves, releases chunked. Faults are injected on the client side: the RPC
connection's ``call`` reads the reply, throws it away and closes the connection, so the
owner acted on the request and the client never learns its answer."""

from __future__ import annotations

import hashlib
import select
import threading
import time

import pytest
from thrift.transport.TTransport import TTransportException

import fluxkv
import fluxkv.client as fc
from fluxkv import _wire
from fluxkv._gen.external import constants as C


def pattern(key: str, put_id: int, n: int) -> bytes:
    """The bytes of version ``put_id`` of ``key``: every value is checkable."""
    seed = hashlib.blake2b(f"{key}\0{put_id}".encode(), digest_size=32).digest()
    return (seed * (n // len(seed) + 1))[:n]


def fill_for(key: str, calls: list | None = None):
    def fill(put_id: int, view: memoryview) -> None:
        if calls is not None:
            calls.append(put_id)
        view[:] = pattern(key, put_id, len(view))

    return fill


def check_value(c: fluxkv.Client, key: str, n: int) -> int:
    with c.get(key) as h:
        assert len(h) == n
        assert h.bytes() == pattern(key, h.put_id, n), f"{key}: bytes differ from version {h.put_id}"
        return h.put_id


def drop_reply(monkeypatch, method: str, times: int = 1, before=None, skip: int = 0) -> list:
    """Lose the reply of the next ``times`` calls to ``method`` (after ``skip`` answered ones) as a
    timed-out call loses it (the owner acted on the call, the connection is closed with its answer
    unread); returns the list of drops."""
    orig = _wire.RPCConnection.call
    orig_read = _wire.RPCConnection._read_frame
    dropped: list = []

    def unread(self, sock, deadline=None):
        select.select([sock], [], [], 10)  # the answer arrived...
        return b""

    passed = [0]

    def call(self, name, session, rest):
        if name == method and passed[0] < skip:
            passed[0] += 1
        elif name == method and len(dropped) < times:
            dropped.append(method)
            monkeypatch.setattr(_wire.RPCConnection, "_read_frame", unread)
            try:
                orig(self, name, session, rest)
            finally:
                monkeypatch.setattr(_wire.RPCConnection, "_read_frame", orig_read)
            self.close()  # ...and is never read
            if before is not None:
                before()
            raise TTransportException(TTransportException.END_OF_FILE, "reply dropped by the test")
        return orig(self, name, session, rest)

    monkeypatch.setattr(_wire.RPCConnection, "call", call)
    return dropped


def eventually(cond, limit: float = 10.0) -> bool:
    """Whether cond() holds within limit seconds (polled)."""
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_limits_come_from_the_idl():
    assert fc.BATCH_CHUNK == C.MAX_BATCH
    assert fc.RELEASE_CHUNK == C.MAX_RELEASES_PER_CALL
    assert _wire.MAX_ATTACH_FRAME == C.MAX_ATTACH_FRAME_BYTES
    assert not hasattr(_wire, "MAX_RESPONSE_FRAME")
    assert C.PUT_END_MEMORY == 8192 and C.PUT_WAVE_SEGMENT_DIVISOR == 2


def test_put_with_put_id(client):
    seen: list = []
    pid = client.put_with("k", 100_000, fill_for("k", seen))
    assert seen == [pid] and pid > 0
    assert check_value(client, "k", 100_000) == pid
    pid2 = client.put_with("k", 1000, fill_for("k"))
    assert pid2 > pid
    check_value(client, "k", 1000)
    with pytest.raises(fluxkv.AlreadyExists):
        client.put_with("k", 10, fill_for("k"), reject_if_exists=True)

    def boom(put_id, view):
        raise ValueError("fill failed")

    with pytest.raises(ValueError):
        client.put_with("k2", 10, boom)
    assert not client.exists("k2")


@pytest.mark.parametrize("reject", [False, True])
def test_lost_put_end_reply_is_retried_on_the_session(client, monkeypatch, reject):
    """PutEnd is sent again on the same session, never the whole put; the owner answers the
    repeat with the first outcome, so reject_if_exists never turns the client's own put
    into ALREADY_EXISTS."""
    dropped = drop_reply(monkeypatch, "PutEnd")
    try:
        pid = client.put_with("lost", 50_000, fill_for("lost"), reject_if_exists=reject)
    except fluxkv.AlreadyExists as e:
        pytest.fail(f"ALREADY_EXISTS reported for the client's own put: {e}")
    assert dropped == ["PutEnd"]
    assert client._stats["put_end_retries"] == 1
    assert client._stats["put_redos"] == 0, "the whole put was redone instead of PutEnd"
    assert check_value(client, "lost", 50_000) == pid


def test_lost_batch_put_end_reply_is_retried_on_the_session(client, monkeypatch):
    dropped = drop_reply(monkeypatch, "BatchPutEnd")
    items = [(f"lb/{i}", pattern(f"lb/{i}", 0, 4096)) for i in range(10)]
    try:
        client.batch_put(items, reject_if_exists=True)
    except fluxkv.AlreadyExists as e:
        pytest.fail(f"ALREADY_EXISTS reported for the client's own puts: {e.errors}")
    assert dropped == ["BatchPutEnd"]
    assert client._stats["put_end_retries"] == 1 and client._stats["put_redos"] == 0
    for k, v in items:
        with client.get(k) as h:
            assert h.bytes() == v


@pytest.mark.parametrize("reject", [False, True])
def test_owner_restart_before_put_end_reply(cluster, monkeypatch, reject):
    """The session is gone with the PutEnd reply: the outcome is unknown. Without
    reject_if_exists the put is redone on the new session; with it: Unavailable."""
    node = cluster.up("64MiB", name="restart")
    c = fluxkv.connect(node.socket)
    try:
        def crash():
            node.kill()
            cluster.up("64MiB", name="restart")

        dropped = drop_reply(monkeypatch, "PutEnd", before=crash)
        fills: list = []
        if reject:
            with pytest.raises(fluxkv.Unavailable, match="outcome is unknown"):
                c.put_with("gone", 20_000, fill_for("gone", fills), reject_if_exists=True)
            assert len(fills) == 1
        else:
            pid = c.put_with("gone", 20_000, fill_for("gone", fills))
            assert len(fills) == 2 and fills[-1] == pid and c._stats["put_redos"] == 1
            assert check_value(c, "gone", 20_000) == pid
        assert dropped == ["PutEnd"]
    finally:
        c.close()


@pytest.mark.parametrize("batch", [False, True])
def test_streamed_put_whose_owner_restarted_on_a_put_write_is_redone(cluster, monkeypatch, batch):
    """Under client isolation, the owner restarts on a PutWrite of a value larger than the
    put area: the put was never ended (nothing published), so it is redone on the new
    session, with reject_if_exists too (it was reported Unavailable, outcome unknown)."""
    node = cluster.up("64MiB", "stream-restart", "--client-isolation", "--put-area", "64KiB")
    c = fluxkv.connect(node.socket)
    try:

        def crash():
            node.kill()
            cluster.up("64MiB", "stream-restart", "--client-isolation", "--put-area", "64KiB")

        dropped = drop_reply(monkeypatch, "PutWrite", before=crash)
        v = pattern("streamed", 0, 200_000)
        if batch:
            c.batch_put([("streamed", v)], reject_if_exists=True)
        else:
            c.put("streamed", v, reject_if_exists=True)
        assert dropped == ["PutWrite"] and c._stats["put_redos"] == 1
        with c.get("streamed") as h:
            assert h.bytes() == v
    finally:
        c.close()


def test_lost_put_start_reply_is_not_retried(client, monkeypatch):
    dropped = drop_reply(monkeypatch, "PutStart")
    with pytest.raises(fluxkv.Unavailable):
        client.put("ps", b"value")
    assert dropped == ["PutStart"] and client._stats["retries"] == 0
    assert not client.exists("ps")


def test_lost_get_reply_is_retried(client, monkeypatch):
    client.put("g", b"value")
    drop_reply(monkeypatch, "Get")
    with client.get("g") as h:
        assert h.bytes() == b"value"
        # The retry's holder only: the owner released the one the lost reply named.
        assert eventually(lambda: client.stat()["client_holders"] == 1)
    assert client._stats["retries"] == 1


def test_lost_batch_delete_reply_retries_its_call_only(client, monkeypatch):
    """A batch delete of several calls whose second reply was lost sends that call again,
    not the whole batch: the keys the first call deleted answer True (retried from the
    first call, the whole batch answered absent)."""
    monkeypatch.setattr(fc, "BATCH_CHUNK", 2)
    keys = [f"bd/{i}" for i in range(4)]
    for k in keys:
        client.put(k, b"v")
    dropped = drop_reply(monkeypatch, "BatchDelete", skip=1)
    got = client.batch_delete(keys)
    assert dropped == ["BatchDelete"] and client._stats["retries"] == 1
    assert got[:2] == [True, True], got  # the retry may answer its own keys absent
    assert client.batch_exists(keys) == [False] * 4


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("reject", [False, True])
def test_put_whose_session_was_replaced_before_its_write_is_redone(client, monkeypatch, batch, reject):
    """Another thread replaced the session (the owner restarted, it saw STALE_GENERATION)
    between a put's start and its write: the owner revoked the put with the session, so
    nothing was stored; the put is redone on the new session, with reject_if_exists too
    (it was answered a bare Error)."""
    orig = fc._settle_area
    replaced: list = []

    def settle(s):
        if not replaced:
            replaced.append(s)
            client._renew(s)
        return orig(s)

    monkeypatch.setattr(fc, "_settle_area", settle)
    v = pattern("sr", 0, 10_000)
    if batch:
        client.batch_put([("sr", v), ("sr2", v)], reject_if_exists=reject)
    else:
        client.put("sr", v, reject_if_exists=reject)
    assert len(replaced) == 1 and replaced[0] is not client._s
    assert client._stats["put_redos"] == (2 if batch else 1)
    with client.get("sr") as h:
        assert h.bytes() == v


def test_batch_put_larger_than_segment_goes_in_waves(cluster):
    """40 × 8 MiB on a 256 MiB node: waves of at most half the segment store every item."""
    node = cluster.up("256MiB", name="waves")
    with fluxkv.connect(node.socket) as c:
        n, count = 8 << 20, 40
        items = [(f"w/{i}", pattern(f"w/{i}", 0, n)) for i in range(count)]
        for k, v in items:  # fault the segment's pages in before timing either
            c.put(k, v)
        t0 = time.monotonic()
        c.batch_put(items)  # raises if any item failed
        batch_s = time.monotonic() - t0
        assert batch_s < 60, f"the batch took {batch_s:.1f} s"
        half = c.segment_size // C.PUT_WAVE_SEGMENT_DIVISOR
        assert 0 < c._stats["max_wave_bytes"] <= half
        assert c._stats["waves"] >= count * n // half
        t0 = time.monotonic()
        for k, v in items:
            c.put(k, v)
        single_s = time.monotonic() - t0
        with c.get(items[-1][0]) as h:
            assert h.bytes() == items[-1][1]
        print(f"\n40 x 8 MiB on 256 MiB: batch_put {batch_s:.3f} s in {c._stats['waves']} waves, one by one {single_s:.3f} s")


def test_batch_put_oversize_item_starts_nothing(client, monkeypatch):
    starts: list = []
    orig = _wire.RPCConnection.call
    monkeypatch.setattr(
        _wire.RPCConnection,
        "call",
        lambda self, name, *a: (starts.append(name) if name == "BatchPutStart" else None, orig(self, name, *a))[1],
    )
    with pytest.raises(fluxkv.InvalidArgument):
        client.batch_put([("small", b"x"), ("huge", bytes(client.segment_size + 1))])
    assert starts == []
    assert not client.exists("small")


def test_releases_are_chunked(client, monkeypatch):
    """More releases than one call may carry go out over several calls of at most
    MAX_RELEASES_PER_CALL ids (piggybacked or in Release), and every holder is released."""
    carried: list = []
    orig = fc._Session.drain

    def drain(self, *a):
        ids = orig(self, *a)  # what one call carries: piggybacked, or in Release
        if ids:
            carried.append(len(ids))
        return ids

    monkeypatch.setattr(fc._Session, "drain", drain)
    client.put("r", b"value")
    total = C.MAX_RELEASES_PER_CALL + 1000
    holders = client.batch_get(["r"] * (total // 2)) + client.batch_get(["r"] * (total - total // 2))
    for h in holders:
        h.release()
    del holders
    st = client.stat()  # flushes the queue first
    assert len(carried) >= 2 and max(carried) <= C.MAX_RELEASES_PER_CALL, carried
    assert sum(carried) == total
    assert st["client_holders"] == 0
    assert client.release_errors == 0


def test_batch_put_redo_that_succeeds_is_not_reported_failed(cluster, monkeypatch):
    """The owner restarts with the BatchPutEnd reply: the outcome is unknown, and without
    reject_if_exists the wave is redone on the new session. The redo stores every item, so
    batch_put must return normally (errors from the first try must not survive)."""
    node = cluster.up("64MiB", name="bredo")
    c = fluxkv.connect(node.socket)
    try:
        def crash():
            node.kill()
            cluster.up("64MiB", name="bredo")

        dropped = drop_reply(monkeypatch, "BatchPutEnd", before=crash)
        items = [(f"br/{i}", pattern(f"br/{i}", 0, 4096)) for i in range(4)]
        c.batch_put(items)  # raises the stale _OutcomeUnknown of the first try
        assert dropped == ["BatchPutEnd"] and c._stats["put_redos"] == 4
        for k, v in items:
            with c.get(k) as h:
                assert h.bytes() == v
    finally:
        c.close()


def test_batch_put_lost_reply_of_a_large_wave_is_answered_again(client, monkeypatch):
    """A lost BatchPutEnd reply for more items than the owner once remembered (64; now
    PUT_END_MEMORY, two full batches): the resend answers every item's first outcome, and
    none is redone (they were: the oldest items answered INVALID_ARGUMENT)."""
    dropped = drop_reply(monkeypatch, "BatchPutEnd")
    items = [(f"mem/{i}", pattern(f"mem/{i}", 0, 1024)) for i in range(100)]
    client.batch_put(items)
    assert dropped == ["BatchPutEnd"] and client._stats["put_redos"] == 0
    for k, v in items:
        with client.get(k) as h:
            assert h.bytes() == v


def test_failed_release_call_keeps_its_ids_queued(client, monkeypatch):
    """external.thrift, NEVER RETRIED (Release): "the ids of a failed Release stay queued and
    ride on later calls". Here the flush's Release call breaks before it reaches the owner
    (the connection could not be used): its holder ids must stay queued, so the owner
    hears of the release later; instead they are dropped and the owner keeps the holder
    (and its bytes, unevictable) until the session ends."""
    client.put("rel-fail", b"z" * 4096)
    h = client.get("rel-fail")
    orig = _wire.RPCConnection.call
    failed: list = []

    def call(self, name, session, rest):
        if name == "Release" and not failed:
            failed.append(name)
            self.close()
            raise OSError(104, "connection reset (by the test) before the request was sent")
        return orig(self, name, session, rest)

    monkeypatch.setattr(_wire.RPCConnection, "call", call)
    # Released once the patch is in: the release thread's own Release (2 ms later) may
    # be the one that fails (a review of flaky tests: it went out unpatched first).
    h.release()
    client.flush()  # the Release call fails; the owner is alive
    assert failed == ["Release"]
    client.exists("rel-fail")  # a later call carries what is still queued
    assert client.stat()["client_holders"] == 0, "the holder's release was lost with the failed Release call"


def test_flush_sends_releases_a_failed_call_gave_back(daemon, monkeypatch):
    """A call of another thread carrying releases fails (and its retry too) while flush()
    waits for it: its releases go back to the queue, and flush sends them instead of
    returning with them queued (a review: the Go client's defect of the same kind)."""
    client = fluxkv.connect(daemon.socket, release_delay=3600)
    client.put("flush-gave-back", b"g" * 100)
    h = client.get("flush-gave-back")
    orig = _wire.RPCConnection.call
    sending = threading.Event()

    def call(self, name, session, rest):
        if name == "Exists":
            sending.set()
            time.sleep(0.2)
            raise OSError("the connection broke")
        return orig(self, name, session, rest)

    monkeypatch.setattr(_wire.RPCConnection, "call", call)
    h.release()

    def exists():
        with pytest.raises(fluxkv.Error):
            client.exists("flush-gave-back")

    t = threading.Thread(target=exists)
    t.start()
    assert sending.wait(10)
    try:
        try:
            client.flush()
            # Returned: nothing of it is queued or riding on a call (the retry may have
            # taken the ids back and failed too: then flush raises instead).
            assert not client._s.pending and not client._s.releases_in_flight, "flush returned with releases undelivered"
        except fluxkv.Unavailable:
            assert client._s.pending, "flush raised with nothing queued"
        t.join(10)
        monkeypatch.undo()
        assert client.stat()["client_holders"] == 0
    finally:
        monkeypatch.undo()
        t.join(10)
        client.close()


def test_flush_waits_for_releases_another_thread_carries(daemon, monkeypatch):
    """flush() with nothing queued still waits for the releases another thread's call is
    carrying (as stat() does): a call after it finds the owner has them. It returned at
    once (a review: the Go client's defect of the same kind)."""
    client = fluxkv.connect(daemon.socket, release_delay=3600)  # the release rides on the Exists
    client.put("flush-rides", b"r" * 100)
    h = client.get("flush-rides")
    orig = _wire.RPCConnection.call
    sending = threading.Event()

    def call(self, name, session, rest):
        if name == "Exists" and not sending.is_set():
            sending.set()
            time.sleep(0.5)  # the release rides on this call, slow to go out
        return orig(self, name, session, rest)

    monkeypatch.setattr(_wire.RPCConnection, "call", call)
    h.release()
    t = threading.Thread(target=client.exists, args=("flush-rides",))
    t.start()
    assert sending.wait(10)
    t0 = time.monotonic()
    client.flush()
    took = time.monotonic() - t0
    t.join(10)
    monkeypatch.undo()
    try:
        assert took >= 0.3, f"flush returned after {took:.3f} s, while the Exists carrying the release was held 0.5 s"
        assert client.stat()["client_holders"] == 0
    finally:
        client.close()
