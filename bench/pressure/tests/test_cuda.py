"""The cuda mode's pipeline logic, on a TEST FAKE of the CUDA runtime (this machine may have no
GPU): slot rotation, overlap, completion counting, stage timings, cleanup. The real runtime is
only exercised by test_cuda_probe_says_why_when_there_is_no_gpu (and on a GPU machine)."""

import ctypes
import json
import subprocess
import sys

import pytest

from pressure import cuda
from pressure.cuda import H2DPipeline, plain_h2d_gib_s


class FakeRuntime:
    """TEST FAKE of pressure.cuda.Runtime: host "pinned" buffers are real ctypes buffers (so the
    host stage really copies), the device is a dict of bytearrays, a copy lands when its end
    event is completed by the test (``finish``) or waited on (``event_sync``)."""

    def __init__(self):
        self.calls = []
        self.host = {}
        self.dev = {}
        self.freed = []
        self._next = 1000
        self.pending = {}  # end event -> (dst, src, n)
        self.recorded = {}  # event -> stream
        self.copies = []  # (dst, n) in submission order
        self.done_events = set()
        self.device = None

    def _id(self):
        self._next += 1
        return self._next

    def set_device(self, d):
        self.device = d

    def malloc_host(self, n):
        buf = ctypes.create_string_buffer(n)
        addr = ctypes.addressof(buf)
        self.host[addr] = buf
        return addr

    def malloc(self, n):
        i = self._id()
        self.dev[i] = bytearray(n)
        return i

    def stream_create(self):
        return self._id()

    def event_create(self):
        return self._id()

    def event_record(self, e, s):
        self.calls.append(("record", e, s))
        self.recorded[e] = s
        self.done_events.discard(e)
        if self._last_copy is not None and self._last_copy[0] == s:
            self.pending[e] = self._last_copy[1]
            self._last_copy = None

    _last_copy = None

    def memcpy_h2d_async(self, dst, src, n, s):
        self.calls.append(("memcpy", dst, src, n, s))
        self.copies.append((dst, n))
        self._last_copy = (s, (dst, src, n))

    def _land(self, e):
        if e in self.pending:
            dst, src, n = self.pending.pop(e)
            self.dev[dst][:n] = ctypes.string_at(src, n)
        self.done_events.add(e)

    def finish(self, e):
        self._land(e)

    def event_done(self, e):
        return e in self.done_events

    def event_sync(self, e):
        self.calls.append(("sync", e))
        self._land(e)

    def elapsed_ms(self, a, b):
        return 0.25

    def free_host(self, p):
        self.freed.append(("host", p))

    def free(self, p):
        self.freed.append(("dev", p))

    def stream_destroy(self, s):
        self.freed.append(("stream", s))

    def event_destroy(self, e):
        self.freed.append(("event", e))


def src_buffer(payload: bytes):
    b = ctypes.create_string_buffer(payload, len(payload))
    return b, ctypes.addressof(b)


def test_two_slots_overlap_then_the_third_waits_for_the_oldest():
    rt = FakeRuntime()
    p = H2DPipeline(rt, 64)
    assert rt.device == 0 and len(p.slots) == 2
    bufs = [src_buffer(bytes([i]) * 64) for i in range(3)]
    assert p.submit(bufs[0][1], 64, "op0") == []  # slot 0, no wait
    assert p.submit(bufs[1][1], 64, "op1") == []  # slot 1, no wait: overlaps op0
    assert p.in_flight() == 2 and not any(c[0] == "sync" for c in rt.calls)
    done = p.submit(bufs[2][1], 64, "op2")  # both busy: waits for the oldest (op0), reuses its slot
    assert [d.token for d in done] == ["op0"]
    assert [c for c in rt.calls if c[0] == "sync"] == [("sync", p.slots[0].ev_end)]
    assert p.slots[0].token == "op2" and p.slots[1].token == "op1"
    # op0's bytes reached its device buffer before the slot was reused
    assert bytes(rt.dev[p.slots[0].dev][:1]) == b"\x02" or rt.copies[0][0] == p.slots[0].dev
    rest = p.drain()
    assert [d.token for d in rest] == ["op1", "op2"]  # oldest first
    assert bytes(rt.dev[p.slots[1].dev]) == bytes([1]) * 64
    assert bytes(rt.dev[p.slots[0].dev]) == bytes([2]) * 64
    assert p.in_flight() == 0


def test_poll_counts_only_completed_copies_without_blocking():
    rt = FakeRuntime()
    p = H2DPipeline(rt, 16)
    a, b = src_buffer(b"a" * 16), src_buffer(b"b" * 16)
    p.submit(a[1], 16, "A")
    p.submit(b[1], 16, "B")
    assert p.poll() == []
    rt.finish(p.slots[1].ev_end)  # the newer copy finished first (its own stream)
    assert [d.token for d in p.poll()] == ["B"]
    assert p.in_flight() == 1
    rt.finish(p.slots[0].ev_end)
    assert [d.token for d in p.poll()] == ["A"]
    assert not any(c[0] == "sync" for c in rt.calls)


def test_stage_timings_and_order_of_calls():
    rt = FakeRuntime()
    ticks = iter(range(100))
    p = H2DPipeline(rt, 8, clock=lambda: float(next(ticks)))
    s = src_buffer(b"x" * 8)
    p.submit(s[1], 8, "t")
    kinds = [c[0] for c in rt.calls]
    assert kinds == ["record", "memcpy", "record"]  # start event, copy, end event on one stream
    streams = {c[-1] for c in rt.calls if c[0] == "memcpy"} | {c[2] for c in rt.calls if c[0] == "record"}
    assert len(streams) == 1
    (d,) = p.drain()
    assert d.host_stage_s == 1.0 and d.submit_s == 1.0 and d.h2d_s == pytest.approx(0.00025)
    assert d.residence_s == d.t_done - 0.0


def test_capacity_is_enforced_and_close_frees_everything():
    rt = FakeRuntime()
    p = H2DPipeline(rt, 8)
    with pytest.raises(ValueError):
        p.submit(0, 9, "too big")
    p.close()
    kinds = sorted(k for k, _ in rt.freed)
    assert kinds == sorted(["host"] * 2 + ["dev"] * 2 + ["stream"] * 2 + ["event"] * 4)
    p.close()  # idempotent


def test_plain_baseline_uses_the_same_pipeline():
    class AutoFinish(FakeRuntime):  # TEST FAKE: copies complete at once
        def event_done(self, e):
            self._land(e)
            return True

    rt = AutoFinish()
    r = plain_h2d_gib_s(rt, 1024, seconds=0.05)
    assert r["copies"] > 0 and r["gib_s"] > 0 and r["bytes"] == 1024
    assert len([f for f in rt.freed if f[0] == "host"]) == 2


def test_library_candidates_include_the_wheel_layout(tmp_path, monkeypatch):
    lib = tmp_path / "nvidia" / "cuda_runtime" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.12").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)
    monkeypatch.setenv("FLUXKV_CUDART", "/opt/x/libcudart.so")
    c = cuda.candidate_libraries()
    assert c[0] == "/opt/x/libcudart.so"
    assert str(lib / "libcudart.so.12") in c


def test_cuda_probe_says_why_when_there_is_no_gpu():
    out = subprocess.run([sys.executable, "-m", "pressure.cuda", "probe"], capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "PYTHONPATH": str(__import__("pathlib").Path(cuda.__file__).parents[1])})
    info = json.loads(out.stdout)
    if info["available"]:
        pytest.skip("this machine has a GPU")
    assert info["reason"]


def test_worker_thread_cuda_path_counts_at_event_completion():
    """The window loop of a worker thread in cuda mode, in process, on the test fake backend and
    the test fake runtime: hits are counted when their copy completes, stages are timed, and
    every hit's reference is released."""
    import time

    from pressure import worker
    from pressure.backends.base import CaseSpec
    from pressure.tests import fake_backend
    from pressure.workload import ValueMaker, key_name, value_body, zipf_cdf

    class AutoFinish(FakeRuntime):  # TEST FAKE: a copy completes on the first query after submit
        def event_done(self, e):
            self._land(e)
            return True

    payload, keys = 256, 8
    spec = CaseSpec("fake", None, False, "cuda", payload, keys, payload * 6, 0, 1, 1)
    side = fake_backend.WorkerSide({"capacity": 6, "ssd": False}, spec, 0)
    vm = ValueMaker(value_body(payload, 1))
    tc = side.thread_client(0)
    for i in range(keys):
        tc.put(key_name(i), vm.value(i))
    cfg = {"case": dict(spec.__dict__), "seed": 1, "theta": 0.99, "on_miss": "none"}
    rts = []

    def factory():
        rts.append(AutoFinish())
        return H2DPipeline(rts[-1], payload)

    released = []
    real_release = fake_backend.BytesGot.release

    def spy(self):
        released.append(1)
        real_release(self)

    fake_backend.BytesGot.release = spy
    try:
        wt = worker.WindowThread(side, cfg, 0, 0, zipf_cdf(keys), [key_name(i) for i in range(keys)], b"", factory)
        now = time.monotonic()
        wt.run(now, now + 0.05, now + 0.3)
    finally:
        fake_backend.BytesGot.release = real_release
    t = wt.tally
    assert wt.crash is None
    assert t.hits > 0 and t.misses > 0 and t.errors == 0  # 6 of 8 keys fit
    assert t.by_source == {"memory": t.hits}
    assert set(t.stages) == {"host_stage", "submit", "h2d_event", "residence"} and t.stages["h2d_event"].n == t.hits
    memcpys = [c for c in rts[0].calls if c[0] == "memcpy"]
    assert len(memcpys) >= t.hits and len(released) == len(memcpys)  # every hit released, in window or not
