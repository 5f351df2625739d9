"""The client against a real `fluxkv up` daemon: values, views, numpy/DLPack, releases,
threads, batch calls and every error class."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest

import fluxkv
from conftest import local_member, used_bytes, wait_until
from fluxkv import _dlpack

MiB = 1 << 20

SIZES = [1, 2, 7, 511, 512, 513, 4095, 4096, 4097, 65535, 65536, 65537, MiB - 1, MiB, MiB + 1, 4 * MiB + 3, 16 * MiB, 16 * MiB + 1]


def payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed + n).integers(0, 256, n, dtype=np.uint8).tobytes()


def maps_entry(addr: int) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line
    raise AssertionError(f"{addr:#x} is not mapped")


# -- values of every size, byte exact ------------------------------------------------------------


@pytest.fixture(scope="module")
def big_client(big_daemon):
    c = fluxkv.connect(big_daemon.socket)
    yield c
    c.close()


@pytest.mark.parametrize("n", SIZES, ids=[str(n) for n in SIZES])
def test_sizes_byte_exact(big_client, n):
    c = big_client
    base = used_bytes(c)
    data = payload(n)
    key = f"size/{n}"
    c.put(key, data)
    with c.get(key) as h:
        assert len(h) == n
        assert h.source == "memory"
        assert h.bytes() == data
        mv = h.memoryview()
        assert mv.readonly and mv.nbytes == n and mv == data
        del mv
        buf = bytearray(n + 5)
        assert c.get_into(key, buf) == n
        assert bytes(buf[:n]) == data
    assert c.delete(key) is True
    assert wait_until(lambda: used_bytes(c) == base, 2.0), "used bytes did not return to the baseline"
    assert c.release_errors == 0


def test_overwrite_is_visible_and_old_holder_keeps_bytes(client):
    client.put("ow", b"first version")
    h1 = client.get("ow")
    client.put("ow", b"second, longer version")
    with client.get("ow") as h2:
        assert h2.bytes() == b"second, longer version"
        assert h2.put_id > h1.put_id
    assert h1.bytes() == b"first version"  # an old version's holder keeps its bytes
    h1.release()


# -- views: where they point, numpy, DLPack -------------------------------------------------------


def test_views_inside_readonly_mapping_and_shared_address(client):
    s = client._s
    client.put("view", payload(100_000))
    h1 = client.get("view")
    h2 = client.get("view")
    try:
        assert h1.holder_id != h2.holder_id
        assert h1.address == h2.address  # the owner reuses the same replica
        seg = s.segment
        assert seg.ro_base <= h1.address and h1.address + len(h1) <= seg.ro_base + seg.size
        line = maps_entry(h1.address)
        perms = line.split()[1]
        assert perms == "r--s", line  # read-only, shared
        assert "memfd:" in line, line
        a = h1.numpy()
        assert a.ctypes.data == h1.address  # zero copy
        assert maps_entry(h1.address + len(h1) - 1).split()[1] == "r--s"
        del a
    finally:
        h1.release()
        h2.release()


def test_numpy_roundtrip(client):
    x = np.arange(12 * 34, dtype=np.float32).reshape(12, 34) * 0.5
    client.put("np/f32", x)
    with client.get("np/f32") as h:
        assert len(h) == x.nbytes
        y = h.numpy(np.float32, x.shape)
        assert y.shape == x.shape and np.array_equal(x, y)
        assert y.ctypes.data == h.address
        assert not y.flags.writeable
        with pytest.raises(ValueError):
            y[0, 0] = 1.0
        del y
    # complex values and 0-d arrays go in through the buffer protocol as well
    z = np.array([1 + 2j, 3 - 4j], dtype=np.complex128)
    client.put("np/c128", z)
    with client.get("np/c128") as h:
        assert np.array_equal(h.numpy(np.complex128), z)
    client.put("np/scalar", np.array(7, dtype=np.int64))
    with client.get("np/scalar") as h:
        assert h.numpy(np.int64).tolist() == [7]


def test_dlpack_roundtrip(client):
    data = payload(3 * MiB)
    client.put("dl", data)
    h = client.get("dl")
    assert h.__dlpack_device__() == (1, 0)
    before = _dlpack.live_exports()
    a = np.from_dlpack(h)
    assert a.dtype == np.uint8 and a.shape == (len(data),)
    assert a.ctypes.data == h.address  # zero copy over the read-only mapping
    assert a.tobytes() == data
    assert h.exports == 1
    h.release()  # the array still reads the bytes: the ack waits for it
    assert client.stat()["client_holders"] == 1
    assert a[:16].tobytes() == data[:16]
    del a
    gc.collect()
    assert _dlpack.live_exports() == before
    assert client.stat()["client_holders"] == 0
    with pytest.raises(fluxkv.Error):
        np.from_dlpack(h)


def test_dlpack_torch(client):
    torch = pytest.importorskip("torch")
    client.put("torch", np.arange(256, dtype=np.uint8))
    with client.get("torch") as h:
        t = torch.from_dlpack(h)
        assert t.data_ptr() == h.address  # zero copy
        assert t.dtype == torch.uint8 and t.tolist() == list(range(256))
        f = t.view(torch.float32)  # reinterpret, still over the same bytes
    # released while the tensors live: the owner keeps the bytes until torch frees them
    assert client.stat()["client_holders"] == 1
    assert f.numel() == 64 and t[255].item() == 255
    del t, f
    gc.collect()
    assert client.stat()["client_holders"] == 0


_EXIT_CHILD = r"""
import json, sys
import numpy as np
import fluxkv
c = fluxkv.connect(sys.argv[1])
# Kept by a module imported before fluxkv: at exit its dict is cleared after fluxkv's, so
# numpy calls the tensor's deleter once fluxkv's module state is gone.
json._kept = np.from_dlpack(c.get(sys.argv[2]))
if sys.argv[3] == "torch":
    import torch
    json._kept_torch = torch.utils.dlpack.from_dlpack(c.get(sys.argv[2]))
print(int(json._kept[0]), flush=True)
"""


@pytest.mark.parametrize("how", ["numpy", "torch"])
def test_dlpack_tensor_alive_at_exit(client, daemon, how):
    """A DLPack tensor a module keeps until the interpreter exits is freed after the
    client's module was cleared: its deleter must still be there (it crashed)."""
    import subprocess
    import sys

    from conftest import child_env

    if how == "torch":
        pytest.importorskip("torch")
    client.put("atexit", bytes([7]) * 4096)
    for _ in range(3):
        r = subprocess.run(
            [sys.executable, "-c", _EXIT_CHILD, daemon.socket, "atexit", how],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and r.stdout.strip() == "7", (r.returncode, r.stdout, r.stderr)
        assert "Exception ignored" not in r.stderr, r.stderr


_FAULT_CHILD = r"""
import ctypes, sys
import numpy as np
import fluxkv
c = fluxkv.connect(sys.argv[1])
h = c.get(sys.argv[2])
how = sys.argv[3]
if how == "dlpack":
    a = np.from_dlpack(h)                      # numpy marks it read-only; the memory is PROT_READ too
    view = (ctypes.c_ubyte * len(h)).from_address(a.ctypes.data)
elif how == "torch":
    import torch
    view = torch.from_dlpack(h)                # torch imports it writable
elif how == "memoryview":
    view = h.memoryview().obj                  # the exporting ctypes array, bypassing readonly
else:
    raise SystemExit("unknown mode")
print("writing", flush=True)
view[0] = 0xAB
print("wrote without a fault", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("how", ["dlpack", "memoryview", "torch"])
def test_write_through_view_faults(client, daemon, how):
    import signal
    import subprocess
    import sys

    from conftest import child_env

    if how == "torch":
        pytest.importorskip("torch")
    data = payload(8192)
    client.put("ro", data)
    base_clients = client.stat()["clients"]
    r = subprocess.run(
        [sys.executable, "-c", _FAULT_CHILD, daemon.socket, "ro", how],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode in (-signal.SIGSEGV, -signal.SIGBUS), (r.returncode, r.stdout, r.stderr)
    assert "writing" in r.stdout and "wrote" not in r.stdout
    with client.get("ro") as h:
        assert h.bytes() == data  # the stored value is intact
    # the dead child's session ended: its holder is gone
    assert wait_until(lambda: client.stat()["clients"] == base_clients, 2.0)


# -- release ----------------------------------------------------------------------------------------


def test_release_frees_memory(client):
    base = used_bytes(client)
    base_holders = client.stat()["client_holders"]
    client.put("rel", payload(2 * MiB))
    h = client.get("rel")
    assert client.delete("rel") is True
    st = client.stat()
    assert local_member(st)["memory_segment"]["used_bytes"] >= base + 2 * MiB  # the holder keeps the bytes
    assert st["client_holders"] == base_holders + 1
    assert h.bytes() == payload(2 * MiB)
    h.release()
    st = client.stat()  # flushes the queued release first
    assert st["client_holders"] == base_holders
    assert local_member(st)["memory_segment"]["used_bytes"] == base
    assert client.release_errors == 0


def test_release_while_view_alive_keeps_bytes(client):
    base = used_bytes(client)
    data = payload(MiB, seed=1)
    client.put("keep", data)
    h = client.get("keep")
    mv = h.memoryview()
    h.release()
    assert client.delete("keep")
    # reuse the freed space as hard as we can: the held range must not be handed out
    for i in range(20):
        client.put(f"filler/{i}", payload(MiB, seed=100 + i))
    assert mv == data
    assert client.stat()["client_holders"] == 1
    with pytest.raises(fluxkv.Error):
        h.memoryview()
    mv.release()
    gc.collect()
    assert client.stat()["client_holders"] == 0
    client.batch_delete([f"filler/{i}" for i in range(20)])
    assert used_bytes(client) == base


def test_release_on_gc(client):
    client.put("gc", b"x" * 1000)
    base_holders = client.stat()["client_holders"]
    hs = [client.get("gc") for _ in range(10)]
    assert client.stat()["client_holders"] == base_holders + 10
    del hs
    gc.collect()
    assert client.stat()["client_holders"] == base_holders
    assert client.release_errors == 0


def test_release_acks_ride_on_next_call_and_timer(client):
    client.put("pb", b"y" * 100)
    h = client.get("pb")
    h.release()
    # no explicit flush: the flusher thread sends it within its delay, or the next call does
    assert wait_until(lambda: not client._s.pending, 2.0)
    assert client.stat()["client_holders"] == 0
    for _ in range(100):
        client.get("pb").release()
    assert client.stat()["client_holders"] == 0
    assert client.release_errors == 0


def test_released_holder_raises(client):
    client.put("r", b"abc")
    h = client.get("r")
    h.release()
    assert h.released
    for use in (h.bytes, h.memoryview, h.numpy, h.__dlpack__, lambda: h.copy_into(bytearray(3))):
        with pytest.raises(fluxkv.Error):
            use()
    assert len(h) == 3  # metadata stays readable
    h.release()  # idempotent


def test_holder_after_client_close_raises(daemon):
    c = fluxkv.connect(daemon.socket)
    c.put("cl", b"abc")
    h = c.get("cl")
    c.close()
    with pytest.raises(fluxkv.Error, match="closed"):
        h.bytes()
    with pytest.raises(fluxkv.Error, match="closed"):
        c.get("cl")
    c.close()


def test_close_keeps_session_while_views_live(daemon):
    c = fluxkv.connect(daemon.socket)
    data = payload(4096, seed=9)
    c.put("cv", data)
    h = c.get("cv")
    mv = h.memoryview()
    with fluxkv.connect(daemon.socket) as other:
        base_clients = other.stat()["clients"]
        c.close()
        assert other.delete("cv")
        assert other.stat()["clients"] == base_clients  # still attached for the live view
        assert mv == data
        del mv
        gc.collect()
        assert wait_until(lambda: other.stat()["clients"] == base_clients - 1, 2.0)


# -- threads ----------------------------------------------------------------------------------------


def test_many_threads_one_client(client):
    base = used_bytes(client)
    n_threads, rounds = 8, 60
    shared = payload(64 * 1024, seed=5)
    client.put("shared", shared)
    errors: list = []

    def work(t: int):
        try:
            for i in range(rounds):
                key = f"t{t}/{i % 7}"
                val = payload(1000 + 37 * i + t, seed=t)
                client.put(key, val)
                with client.get(key) as h:
                    assert h.bytes() == val, key
                with client.get("shared") as h:
                    assert h.memoryview()[:100] == shared[:100]
                buf = bytearray(len(shared))
                assert client.get_into("shared", buf) == len(shared) and buf == shared
                assert client.exists(key)
                if i % 5 == 4:
                    assert client.batch_exists([key, "nope"]) == [True, False]
            client.batch_delete([f"t{t}/{j}" for j in range(7)])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    client.delete("shared")
    st = client.stat()
    assert st["client_holders"] == 0
    assert local_member(st)["memory_segment"]["used_bytes"] == base
    assert client.release_errors == 0


# -- batch calls -----------------------------------------------------------------------------------


def test_batch_calls(client):
    items = {f"b/{i}": payload(100 + i, seed=i) for i in range(50)}
    client.batch_put(items)
    keys = list(items) + ["b/missing"]
    hs = client.batch_get(keys)
    assert hs[-1] is None
    for k, h in zip(keys[:-1], hs[:-1]):
        assert h.bytes() == items[k]
        h.release()
    assert client.batch_exists(["b/0", "b/missing", "b/49"]) == [True, False, True]
    client.batch_put([("b/0", b"new"), ("b/x", bytearray(b"xx"))])
    with client.get("b/0") as h:
        assert h.bytes() == b"new"
    with pytest.raises(fluxkv.AlreadyExists) as ei:
        client.batch_put([("b/1", b"a"), ("b/fresh", b"b"), ("b/2", b"c")], reject_if_exists=True)
    errs = ei.value.errors
    assert isinstance(errs[0], fluxkv.AlreadyExists) and errs[1] is None and isinstance(errs[2], fluxkv.AlreadyExists)
    with client.get("b/fresh") as h:
        assert h.bytes() == b"b"
    with client.get("b/1") as h:
        assert h.bytes() == items["b/1"]
    assert client.batch_delete(["b/0", "b/0", "b/missing"]) == [True, False, False]
    assert client.batch_get([]) == [] and client.batch_exists([]) == [] and client.batch_delete([]) == []
    client.batch_put({})
    # more keys than one request carries
    many = [f"m/{i}" for i in range(2500)]
    client.batch_put((k, k.encode()) for k in many)
    hs = client.batch_get(many)
    assert [h.bytes() for h in hs] == [k.encode() for k in many]
    for h in hs:
        h.release()
    assert all(client.batch_delete(many))
    assert client.stat()["client_holders"] == 0


def test_batch_put_longest_keys_and_parents(client):
    """A batch of MAX_BATCH pages, each with a key and a parent of the longest length
    (MAX_KEY_BYTES), is a valid batch: every item is stored and reads back, however many
    requests it takes (all of them at once would exceed MAX_FRAME_BYTES)."""
    from fluxkv._gen.external.constants import MAX_BATCH, MAX_KEY_BYTES

    def long(i):
        s = f"long/{i}/"
        return s + "k" * (MAX_KEY_BYTES - len(s))

    keys = [long(i) for i in range(MAX_BATCH)]
    parents = [long(i + MAX_BATCH) for i in range(MAX_BATCH)]  # never put: orphan pages, still valid
    client.batch_put([(k, bytes([i % 256])) for i, k in enumerate(keys)], parents=parents)
    hs = client.batch_get(keys)
    assert [h.bytes() for h in hs] == [bytes([i % 256]) for i in range(MAX_BATCH)]
    for h in hs:
        h.release()
    assert all(client.batch_delete(keys))


def test_stat(client):
    st = client.stat()
    assert st["node_id"] and st["clients"] >= 1
    m = local_member(st)
    assert m["alive"] is True
    assert m["memory_segment"]["capacity_bytes"] == 64 * MiB == client.segment_size
    keys0 = st["keys"]
    client.put("st", b"1")
    assert client.stat()["keys"] == keys0 + 1


def test_stat_keep_hot_set(client):
    # A status poll with keep_hot_set leaves the owner's cached holding of a released get
    # (it is counted among the holders); a plain stat lets it go first (exact counts).
    client.put("hot-stat", b"x" * 4096)
    with client.get("hot-stat") as h:
        assert h.bytes() == b"x" * 4096
    held = local_member(client.stat(keep_hot_set=True))["holders"]
    assert held >= 1
    assert local_member(client.stat(keep_hot_set=True))["holders"] == held
    assert local_member(client.stat())["holders"] <= held - 1


def test_default_socket_from_env(daemon, monkeypatch):
    monkeypatch.setenv("FLUXKV_SOCKET", daemon.socket)
    with fluxkv.connect() as c:
        c.put("env", b"ok")
        with c.get("env") as h:
            assert h.bytes() == b"ok"
    with fluxkv.connect(os.path.dirname(daemon.socket)) as c:  # the directory works too
        assert c.exists("env")


# -- errors ---------------------------------------------------------------------------------------


def test_error_classes(client):
    with pytest.raises(fluxkv.KeyNotFound):
        client.get("missing")
    with pytest.raises(fluxkv.KeyNotFound):
        client.get_into("missing", bytearray(10))
    assert client.exists("missing") is False
    assert client.delete("missing") is False

    client.put("dup", b"1")
    with pytest.raises(fluxkv.AlreadyExists):
        client.put("dup", b"2", reject_if_exists=True)
    with client.get("dup") as h:
        assert h.bytes() == b"1"

    # A value larger than the segment is INVALID_ARGUMENT (docs/architecture.md §9: len > segment).
    too_big = np.zeros(client.segment_size + 1, dtype=np.uint8)
    with pytest.raises(fluxkv.InvalidArgument):
        client.put("too-big", too_big)
    with pytest.raises(fluxkv.InvalidArgument):
        client.put("empty-value", b"")
    # A length beyond the wire's i64 (C's SIZE_MAX) is refused as given, not as -1 or an OverflowError.
    for n in (2**64 - 1, 2**63, -1):
        with pytest.raises(fluxkv.InvalidArgument, match=f"value length {n} must be 1 byte"):
            client.put_with("huge", n, lambda put_id, view: None)
    assert not client.exists("huge")
    for bad in ("", "k" * 5000, "k" * 4097):
        with pytest.raises(fluxkv.InvalidArgument):
            client.put(bad, b"v")
        with pytest.raises(fluxkv.InvalidArgument):
            client.get(bad)
        with pytest.raises(fluxkv.InvalidArgument):
            client.exists(bad)
        with pytest.raises(fluxkv.InvalidArgument):
            client.delete(bad)
    with pytest.raises(fluxkv.InvalidArgument):
        client.batch_get(["ok", ""])
    longest = "k" * 4096
    client.put(longest, b"v")
    with client.get(longest) as h:
        assert h.bytes() == b"v"
    with pytest.raises(fluxkv.InvalidArgument):
        client.put(b"\xff\xfe", b"v")
    with pytest.raises(TypeError):
        client.put(123, b"v")
    with pytest.raises(TypeError):
        client.put("k", "a str value")
    with pytest.raises(fluxkv.InvalidArgument):
        client.put("k", np.zeros((8, 8))[:, 0])
    client.put("small", b"0123456789")
    with pytest.raises(fluxkv.InvalidArgument):
        client.get_into("small", bytearray(4))
    assert client.stat()["client_holders"] == 0  # failed calls leak no holder


def test_no_space(daemon):
    # Values that fit the segment one at a time but not all at once, every one held:
    # nothing can be evicted, so the put fails with NO_SPACE after the bounded wait.
    with fluxkv.connect(daemon.socket) as c:
        held = []
        try:
            with pytest.raises(fluxkv.NoSpace):
                for i in range(10):
                    c.put(f"ns/{i}", np.full(12 * MiB, i, dtype=np.uint8))
                    held.append(c.get(f"ns/{i}"))
        finally:
            for h in held:
                h.release()
        assert len(held) >= 4
        c.put("ns/after", b"fits again")


def test_unavailable_when_daemon_gone(cluster):
    p = cluster.up("64MiB", name="gone")
    c = fluxkv.connect(p.socket)
    c.put("k", b"v")
    h = c.get("k")
    assert p.stop() == 0
    assert not os.path.exists(p.socket) and not os.path.exists(p.socket + ".rpc")
    with pytest.raises(fluxkv.Unavailable):
        c.get("k")
    with pytest.raises(fluxkv.Unavailable):
        c.put("k", b"v")
    with pytest.raises(fluxkv.Error):
        h.bytes()  # its session ended with the owner
    with pytest.raises(fluxkv.Unavailable):
        fluxkv.connect(p.socket)
    c.close()


def test_release_rpc_results(client):
    """The plain Release call answers per id: OK, then INVALID_ARGUMENT for a double or an
    unknown release (what the client's release_errors counter watches)."""
    from fluxkv._gen.common.ttypes import ErrorCode
    from fluxkv._gen.external.ttypes import ReleaseRequest

    client.put("rr", b"x")
    h = client.get("rr")
    hid = h.holder_id
    h._ack.clear()  # this test sends the holder's release itself
    s = client._s
    r = s.call(lambda c, ss: c.Release(ReleaseRequest(ss, [hid, hid, 1 << 60])), piggyback=False)
    assert r.results == [ErrorCode.OK, ErrorCode.INVALID_ARGUMENT, ErrorCode.INVALID_ARGUMENT]
    assert r.code == ErrorCode.INVALID_ARGUMENT
    h.release()
    assert client.stat()["client_holders"] == 0
    assert client.release_errors == 0


def test_batch_put_attempts_every_wave_after_a_failed_one(client, monkeypatch):
    """A wave that fails as a whole (here its put area is still owed to an unanswered call:
    injected) fails its items; the later waves are still put, and the first failure is
    raised with every item's outcome. It left batch_put at once, without ``errors``."""
    import fluxkv.client as fc

    real, waves = fc._settle_area, []

    def settle(s):
        waves.append(s)
        if len(waves) == 2:
            raise fluxkv.Unavailable("injected: the put area waits for an earlier put")
        return real(s)

    monkeypatch.setattr(fc, "_settle_area", settle)
    n = client.segment_size // 2 - 4096  # a wave each
    items = [(f"waves/{i}", bytes([i + 1]) * n) for i in range(3)]
    with pytest.raises(fluxkv.Unavailable) as e:
        client.batch_put(items)
    assert len(waves) == 3
    assert [x is not None for x in e.value.errors] == [False, True, False]
    for i in (0, 2):
        with client.get(items[i][0]) as h:
            assert h.bytes() == items[i][1]
    client.batch_delete([k for k, _ in items])


def test_batch_put_one_value_failing_to_write_leaves_the_others(client, monkeypatch):
    """A value whose write into the segment fails (it changed size since it was checked:
    here injected) fails alone, InvalidArgument: its put is aborted, the others are stored."""
    from fluxkv._segment import Segment

    real = Segment.write

    def write(self, offset, src, length):
        if length == 777:
            raise ValueError("injected: the buffer changed size")
        return real(self, offset, src, length)

    monkeypatch.setattr(Segment, "write", write)
    items = [("w/ok0", b"a" * 100), ("w/bad", b"b" * 777), ("w/ok1", b"c" * 200)]
    with pytest.raises(fluxkv.InvalidArgument) as e:
        client.batch_put(items)
    assert [x is not None for x in e.value.errors] == [False, True, False]
    assert not client.exists("w/bad")
    for k, v in (items[0], items[2]):
        with client.get(k) as h:
            assert h.bytes() == v
