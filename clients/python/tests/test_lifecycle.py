"""Process lifecycles against real daemons: a holder-holding child killed with SIGKILL,
fork(), and an owner restart under a separate master."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fluxkv
from conftest import child_env, local_member, used_bytes, wait_until

MiB = 1 << 20

_HOLDING_CHILD = r"""
import sys, time
import fluxkv
c = fluxkv.connect(sys.argv[1])
keys = sys.argv[2:]
holders = [c.get(k) for k in keys]
views = [h.memoryview() for h in holders[:2]]   # exported views too
c.put("child/inflight-done", b"x")
print("holding", len(holders), flush=True)
time.sleep(120)
"""


def test_sigkill_child_frees_holders_within_2s(client, daemon):
    base = used_bytes(client)
    st0 = client.stat()
    keys = [f"kill/{i}" for i in range(4)]
    for i, k in enumerate(keys):
        client.put(k, np.full(MiB, i, dtype=np.uint8))
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDING_CHILD, daemon.socket, *keys],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line.startswith("holding 4"), line
        client.delete("child/inflight-done")
        assert client.batch_delete(keys) == [True] * 4
        st = client.stat()
        # only the child's holders keep those 4 MiB now
        assert local_member(st)["memory_segment"]["used_bytes"] >= base + 4 * MiB
        assert st["clients"] == st0["clients"] + 1
        t0 = time.monotonic()
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        freed = wait_until(lambda: used_bytes(client) == base, 2.0, interval=0.01)
        took = time.monotonic() - t0
        assert freed, f"used bytes {used_bytes(client)} did not return to {base} within 2 s"
        assert took < 2.0
        assert client.stat()["clients"] == st0["clients"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


def test_fork_child_reattaches(client):
    client.put("fork/a", b"from parent")
    parent_id = client.client_id
    h = client.get("fork/a")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report through the pipe, never return into pytest
        code = 1
        try:
            os.close(r)
            msgs = []
            try:
                h.bytes()
                msgs.append("parent holder usable in child")
            except fluxkv.Error:
                pass
            with client.get("fork/a") as hc:
                if hc.bytes() != b"from parent":
                    msgs.append("wrong bytes in child")
            if client.client_id == parent_id:
                msgs.append("child reused the parent's session")
            client.put("fork/b", b"from child")
            client.close()
            os.write(w, ("|".join(msgs) or "ok").encode())
            code = 0
        except BaseException as e:  # noqa: BLE001
            os.write(w, f"child error: {e!r}".encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert report == "ok"
    assert os.waitstatus_to_exitcode(status) == 0
    # the parent is untouched: same session, its holder still valid
    assert client.client_id == parent_id
    assert h.bytes() == b"from parent"
    h.release()
    with client.get("fork/b") as hb:
        assert hb.bytes() == b"from child"
    st = client.stat()
    assert st["client_holders"] == 0
    assert client.release_errors == 0


def test_fork_child_closes_connections_of_calls_in_flight(client):
    """A connection a call of the parent is using at fork() (on another thread) is closed in
    the child, as idle ones are: else the child's copy kept the socket open after the parent
    closed it (a call that timed out), and the owner, never seeing the close, kept what the
    lost reply handed out while the child lived. The parent's connection stays open."""
    from fluxkv._gen.external.ttypes import StatRequest

    client.put("fork/busy", b"x")
    s = client._s
    seen = []

    def calling(method, session):  # a call in flight while the test forks
        conn = next(iter(s.busy))
        seen.append(conn)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                os.write(w, b"ok" if conn.sock is None else b"the busy connection stayed open in the child")
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            seen.append(f.read().decode())
        os.waitpid(pid, 0)
        seen.append(conn.sock is not None)
        return method(session)

    s.call(lambda c, sess: calling(lambda x: c.Stat(StatRequest(x, False)), sess), piggyback=False)
    assert seen[1:] == ["ok", True]
    assert seen[0] not in s.busy


def test_a_connection_returned_as_its_session_retires_is_closed(client):
    """A call's connection goes back to the idle pool unless its session retired. A retire
    on another thread (the client replaced the session, or closed) between that check and
    the append dropped the pool before the connection was in it: it stayed open for the
    client's life, a connection the owner kept."""
    import collections

    from fluxkv._gen.external.ttypes import StatRequest

    client.put("retire/k", b"x")
    s = client._s
    used = []

    class RetiredFirst(collections.deque):
        def append(self, conn):  # the call checked the session's state; another thread retires it now
            s.retire("replaced")
            super().append(conn)

    s.idle = RetiredFirst(s.idle)

    def stat(c, sess):
        used.append(next(iter(s.busy)))
        return c.Stat(StatRequest(sess, False))

    s.call(stat, piggyback=False)
    assert s.state == "replaced" and not s.idle
    assert used[0].sock is None, "the connection returned to a retired session's pool stayed open"
    with client.get("retire/k") as h:  # the client goes on with a new session
        assert h.read(0, 1) == b"x"


@pytest.mark.parametrize("how", ["closed", "collected"])
def test_fork_child_closes_sessions_it_does_not_know(client, daemon, how):
    """A session no client names any more (closed by the user while a view of it lives, or
    left by a client collected while a holder lives) keeps its attach connection until its
    last view goes. A child forked meanwhile closes its copy at once: else the owner kept
    the session (and its holders' bytes) until the child exited, after the parent let go."""
    base = client.stat()["clients"]
    client.put("fork/unknown", b"v" * 4096)
    c = fluxkv.connect(daemon.socket)
    h = c.get("fork/unknown")
    view = h.memoryview()
    if how == "closed":
        c.close()
    else:
        del c
    import gc

    gc.collect()
    assert client.stat()["clients"] == base + 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: wait for the parent's word, never return into pytest
        try:
            os.close(w)
            os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)
    try:
        view.release()
        del view, h
        gc.collect()
        assert wait_until(lambda: client.stat()["clients"] == base, 5.0), client.stat()["clients"]
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def _fork_while_attaching(daemon, monkeypatch, module, name: str, probe) -> "fluxkv.Client":
    """Forks while another thread's fluxkv.connect() is held inside module.name (patched to
    wait); the child runs probe(the held call's arguments), which answers "ok" or what is
    wrong, and the parent asserts "ok". Returns the client once its attach went on."""
    held, go_on = threading.Event(), threading.Event()
    real = getattr(module, name)
    calls = []

    def blocking(*a, **kw):
        calls.append(a)
        held.set()
        go_on.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(module, name, blocking)
    made = []
    t = threading.Thread(target=lambda: made.append(fluxkv.connect(daemon.socket)))
    t.start()
    try:
        assert held.wait(30)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                os.write(w, probe(calls[0]).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            report = f.read().decode()
        os.waitpid(pid, 0)
        assert report == "ok"
    finally:
        go_on.set()
        t.join(30)
    monkeypatch.undo()
    assert made, "the client being attached did not attach"
    return made[0]


def test_fork_while_a_session_is_built(daemon, monkeypatch):
    """A fork while another thread builds a session (attached, the rest of its fields not
    set yet) closes the child's copy of its attach connection too (a review: the child's
    fork handler failed on the half-built session and kept it open)."""
    import fluxkv.client as fc

    def probe(_):
        still = [s for s in list(fc._SESSIONS) if s.attach_sock is not None]
        return "ok" if not still else f"{len(still)} attach connection(s) open"

    c = _fork_while_attaching(daemon, monkeypatch, fc._codec, "session_head", probe)
    c.put("fork/built", b"x")  # the parent's session is whole and serves
    c.close()


def test_fork_during_attach(daemon, monkeypatch):
    """A fork while another thread is inside attach() (connected, waiting for the owner's
    reply) closes the child's copy of that attach connection: the session is known to the
    fork handler from before the connection exists (its copy kept the owner's session, and
    its holders' bytes, until the child exited)."""
    import fluxkv._wire as fw
    import fluxkv.client as fc

    def probe(args):
        try:
            os.fstat(args[0].fileno())  # the socket recv_frame_with_fds was waiting on
        except OSError:
            return "ok"
        return "the attach connection being made stayed open in the child"

    c = _fork_while_attaching(daemon, monkeypatch, fw, "recv_frame_with_fds", probe)
    c.put("fork/attach", b"x")  # the parent's session serves
    c.close()
    assert not any(s.state is None and s.attach_sock is None for s in list(fc._SESSIONS))


def test_fork_with_multiprocessing(client):
    import multiprocessing as mp

    global _MP_CLIENT
    client.put("mp/key", b"shared value")
    _MP_CLIENT = client
    try:
        with mp.get_context("fork").Pool(2) as pool:
            out = pool.map(_mp_get, ["mp/key"] * 4)
    finally:
        _MP_CLIENT = None
    assert [v for v, _ in out] == [b"shared value"] * 4
    assert all(cid != client.client_id for _, cid in out)  # every worker attached itself
    with client.get("mp/key") as h:
        assert h.bytes() == b"shared value"


_MP_CLIENT = None


def _mp_get(key):
    # a forked worker uses the client it inherited: it must attach again, not reuse the parent's session
    with _MP_CLIENT.get(key) as h:
        return h.bytes(), _MP_CLIENT.client_id


def test_owner_restart_client_recovers(cluster):
    master, addr = cluster.master()
    owner = cluster.owner(addr, "64MiB")
    c = fluxkv.connect(owner.socket)
    try:
        c.put("before", b"old generation")
        h = c.get("before")
        gen0 = c.generation
        assert owner.stop() == 0
        owner2 = cluster.owner(addr, "64MiB")
        assert owner2.socket == owner.socket
        # the next call notices the old owner is gone, attaches again and gets an answer
        # from the new owner: the old owner's memory (and so the value) went with it
        with pytest.raises(fluxkv.KeyNotFound):
            c.get("before")
        assert c.generation != gen0
        with pytest.raises(fluxkv.Error, match="restarted"):
            h.bytes()
        h.release()  # harmless: nothing is sent to the new owner for it
        c.put("after", b"new generation")
        with c.get("after") as h3:
            assert h3.bytes() == b"new generation"
        st = c.stat()
        assert st["client_holders"] == 0
        assert c.release_errors == 0
    finally:
        c.close()


def test_owner_restart_stale_generation(cluster):
    """Kill the owner (SIGKILL), start a new one, and reach it on a fresh RPC connection with
    the old session: the owner answers STALE_GENERATION; the client re-attaches and retries."""
    from fluxkv._gen.common.ttypes import ErrorCode
    from fluxkv._gen.external.ttypes import GetRequest, Session
    from fluxkv._wire import RPCConnection

    master, addr = cluster.master()
    owner = cluster.owner(addr, "64MiB")
    c = fluxkv.connect(owner.socket)
    try:
        c.put("k", b"v")
        old = c._s
        owner.kill()
        owner2 = cluster.owner(addr, "64MiB")
        # the daemon side: an old-generation session is refused with STALE_GENERATION
        conn = RPCConnection(old.rpc_path, 10)
        try:
            r = conn.client.Get(GetRequest(Session(old.client_id, old.session_token, old.generation, []), "k"))
            assert r.code == ErrorCode.STALE_GENERATION, r
        finally:
            conn.close()
        # the client side: no idle connection left, so the next call opens a fresh one to the
        # new owner with the old session, gets STALE_GENERATION, re-attaches and retries.
        old.drop_idle()
        c.put("k2", b"v2")
        assert c._s is not old and c.generation != old.generation
        with c.get("k2") as h:
            assert h.bytes() == b"v2"
        assert owner2.pid != owner.pid
    finally:
        c.close()


def test_unavailable_during_restart_then_recovers(cluster):
    master, addr = cluster.master()
    owner = cluster.owner(addr, "64MiB")
    c = fluxkv.connect(owner.socket)
    try:
        c.put("k", b"v")
        owner.stop()
        with pytest.raises(fluxkv.Unavailable):
            c.get("k")
        with pytest.raises(fluxkv.Unavailable):
            c.exists("k")
        cluster.owner(addr, "64MiB")
        c.put("k", b"back")
        with c.get("k") as h:
            assert h.bytes() == b"back"
    finally:
        c.close()


def test_calls_wait_for_a_release_flush_in_flight(client):
    # A call made while a flush's Release is in flight waits for it: on another connection
    # it could reach the owner first and plan room (a get's target, a put) that those
    # releases were about to free, and a full owner would evict a value for it.
    client.put("k", b"value")
    client.get("k").release()  # queued
    s = client._s
    entered, gate = threading.Event(), threading.Event()
    plain = s.call

    def call(method, *args, **kwargs):
        if method == "Release" and not entered.is_set():
            entered.set()
            gate.wait(10)  # the flush's Release stays unsent until the gate opens
        return plain(method, *args, **kwargs)

    s.call = call  # this session only
    flusher = threading.Thread(target=client.flush)
    flusher.start()
    try:
        assert entered.wait(10)
        got = []
        def read():
            with client.get("k") as h:
                got.append(h.bytes())

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not got, "a get went out while a Release was in flight"
    finally:
        gate.set()
    flusher.join(10)
    reader.join(10)
    assert got == [b"value"]
    assert client.release_errors == 0


def test_close_while_a_put_writes_keeps_its_range_until_the_write_ends(daemon):
    """A user's close while another thread fills a started put (put_with): the attach
    connection stays until the fill is over, so the owner keeps the put's range meanwhile.
    Closed at once, the owner freed the range, another client's value was placed there, and
    the fill overwrote that value (a review: every byte of it read back as the fill's)."""
    a, b = fluxkv.connect(daemon.socket), fluxkv.connect(daemon.socket)
    n = 16 << 20
    filling, go_on = threading.Event(), threading.Event()
    outcome = []

    def fill(put_id, view):
        filling.set()
        go_on.wait(30)
        view[:] = b"\xaa" * n

    def put():
        try:
            a.put_with("mine", n, fill)
            outcome.append(None)
        except fluxkv.Error as e:
            outcome.append(e)

    t = threading.Thread(target=put)
    t.start()
    try:
        assert filling.wait(30)
        a.close()  # returns at once; the attach connection waits for the fill
        victims = [f"victim{i}" for i in range(2)]
        for k in victims:
            b.put(k, b"\x11" * n)
    finally:
        go_on.set()
        t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], fluxkv.Error), outcome  # PutEnd on a closed client
    for k in victims:
        with b.get(k) as h:
            assert h.bytes() == b"\x11" * n, f"{k} was overwritten by the closed client's fill"
    assert not b.exists("mine")
    b.close()


def test_a_request_over_a_frame_is_invalid_not_a_lost_connection(client):
    """A request larger than a frame (a 33 MiB key) is refused before it is sent:
    InvalidArgument, not a retried call on a "broken" connection reported Unavailable (a
    put's reply lost), and the client goes on."""
    huge = "k" * (33 << 20)
    with pytest.raises(fluxkv.InvalidArgument):
        client.get(huge)
    with pytest.raises(fluxkv.InvalidArgument):
        client.put(huge, b"v")
    client.put("k", b"v")
    with client.get("k") as h:
        assert h.bytes() == b"v"
