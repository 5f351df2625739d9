"""The cuda output mode: host → GPU copies of each hit through a double-buffered pinned pipeline,
on libcudart through ctypes (no torch, no pycuda).

Per worker thread: two slots, each a pinned host buffer, a device buffer, a non-blocking stream
and two timing events. A hit's bytes are copied from the backend's host reference into a free
slot (host stage), ``cudaMemcpyAsync`` sends them to the device (submit), and the op is counted
when the slot's end event has completed. The thread does not wait after a submit: its next get
overlaps the copy in flight; it blocks only when both slots are busy (on the oldest).

libcudart is looked for in ``$FLUXKV_CUDART``, the loader's path, ``$CUDA_HOME``/``$CUDA_PATH``,
``/usr/local/cuda*``, and the ``nvidia/cuda_runtime/lib`` (and ``torch/lib``) folders of the
Python packages on ``sys.path``. Without a library or a device, ``probe()`` says why and the
harness skips the cuda cases.

    python3 -m pressure.cuda probe                      # JSON: available, reason, library, device
    python3 -m pressure.cuda baseline --bytes 4194176   # JSON: plain pinned H2D GiB/s, same pipeline
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import json
import os
import sys
import time
from dataclasses import dataclass

cudaSuccess = 0
cudaErrorNotReady = 600
cudaMemcpyHostToDevice = 1
cudaStreamNonBlocking = 1


class CudaUnavailable(Exception):
    pass


class CudaError(Exception):
    pass


def candidate_libraries() -> list[str]:
    """Paths (or loader names) of libcudart to try, best first."""
    out: list[str] = []
    env = os.environ.get("FLUXKV_CUDART")
    if env:
        out.append(env)
    name = ctypes.util.find_library("cudart")
    if name:
        out.append(name)
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for r in roots:
        if r:
            for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
                out += sorted(glob.glob(os.path.join(r, sub, "libcudart.so*")), reverse=True)
    for p in sys.path:
        if p and os.path.isdir(p):
            out += sorted(glob.glob(os.path.join(p, "nvidia", "cuda_runtime", "lib", "libcudart.so*")), reverse=True)
            out += sorted(glob.glob(os.path.join(p, "torch", "lib", "libcudart*.so*")), reverse=True)
    out += ["libcudart.so", "libcudart.so.12", "libcudart.so.11.0"]
    seen, uniq = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


class Runtime:
    """The handful of CUDA runtime calls the pipeline needs. Every call checks its status."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib = lib
        self.path = path
        L = lib
        vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        pvp = ctypes.POINTER(ctypes.c_void_p)
        sig = {
            "cudaGetDeviceCount": [ctypes.POINTER(ci)],
            "cudaSetDevice": [ci],
            "cudaMallocHost": [pvp, sz],
            "cudaFreeHost": [vp],
            "cudaMalloc": [pvp, sz],
            "cudaFree": [vp],
            "cudaStreamCreateWithFlags": [pvp, ctypes.c_uint],
            "cudaStreamDestroy": [vp],
            "cudaEventCreate": [pvp],
            "cudaEventDestroy": [vp],
            "cudaEventRecord": [vp, vp],
            "cudaEventQuery": [vp],
            "cudaEventSynchronize": [vp],
            "cudaEventElapsedTime": [ctypes.POINTER(ctypes.c_float), vp, vp],
            "cudaMemcpyAsync": [vp, vp, sz, ci, vp],
            "cudaRuntimeGetVersion": [ctypes.POINTER(ci)],
            "cudaDriverGetVersion": [ctypes.POINTER(ci)],
        }
        for name, args in sig.items():
            f = getattr(L, name)
            f.argtypes = args
            f.restype = ci
        L.cudaGetErrorString.argtypes = [ci]
        L.cudaGetErrorString.restype = ctypes.c_char_p

    def _check(self, rc: int, what: str) -> None:
        if rc != cudaSuccess:
            msg = self.lib.cudaGetErrorString(rc)
            raise CudaError(f"{what}: error {rc} ({msg.decode() if msg else '?'})")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self._check(self.lib.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        return n.value

    def versions(self) -> dict:
        r, d = ctypes.c_int(0), ctypes.c_int(0)
        self.lib.cudaRuntimeGetVersion(ctypes.byref(r))
        self.lib.cudaDriverGetVersion(ctypes.byref(d))
        return {"runtime_version": r.value, "driver_version": d.value}

    def set_device(self, dev: int) -> None:
        self._check(self.lib.cudaSetDevice(dev), "cudaSetDevice")

    def malloc_host(self, n: int) -> int:
        p = ctypes.c_void_p()
        self._check(self.lib.cudaMallocHost(ctypes.byref(p), n), f"cudaMallocHost({n})")
        return p.value

    def free_host(self, p: int) -> None:
        self._check(self.lib.cudaFreeHost(p), "cudaFreeHost")

    def malloc(self, n: int) -> int:
        p = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(p), n), f"cudaMalloc({n})")
        return p.value

    def free(self, p: int) -> None:
        self._check(self.lib.cudaFree(p), "cudaFree")

    def stream_create(self) -> int:
        s = ctypes.c_void_p()
        self._check(self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        return s.value

    def stream_destroy(self, s: int) -> None:
        self._check(self.lib.cudaStreamDestroy(s), "cudaStreamDestroy")

    def event_create(self) -> int:
        e = ctypes.c_void_p()
        self._check(self.lib.cudaEventCreate(ctypes.byref(e)), "cudaEventCreate")
        return e.value

    def event_destroy(self, e: int) -> None:
        self._check(self.lib.cudaEventDestroy(e), "cudaEventDestroy")

    def event_record(self, e: int, s: int) -> None:
        self._check(self.lib.cudaEventRecord(e, s), "cudaEventRecord")

    def event_done(self, e: int) -> bool:
        rc = self.lib.cudaEventQuery(e)
        if rc == cudaErrorNotReady:
            return False
        self._check(rc, "cudaEventQuery")
        return True

    def event_sync(self, e: int) -> None:
        self._check(self.lib.cudaEventSynchronize(e), "cudaEventSynchronize")

    def elapsed_ms(self, start: int, end: int) -> float:
        ms = ctypes.c_float(0.0)
        self._check(self.lib.cudaEventElapsedTime(ctypes.byref(ms), start, end), "cudaEventElapsedTime")
        return ms.value

    def memcpy_h2d_async(self, dst: int, src: int, n: int, s: int) -> None:
        self._check(self.lib.cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync")


def load_runtime() -> Runtime:
    """The first libcudart that loads, or CudaUnavailable saying what was tried."""
    tried = []
    for c in candidate_libraries():
        try:
            lib = ctypes.CDLL(c)
        except OSError:
            tried.append(c)
            continue
        return Runtime(lib, c)
    raise CudaUnavailable(f"no GPU runtime: libcudart not found (tried {', '.join(tried[-6:])}); "
                          "install the CUDA runtime or an nvidia-cuda-runtime wheel, or set FLUXKV_CUDART")


def probe() -> dict:
    """Whether the cuda mode can run here, and on what."""
    try:
        rt = load_runtime()
    except CudaUnavailable as e:
        return {"available": False, "reason": str(e)}
    try:
        n = rt.device_count()
    except CudaError as e:
        return {"available": False, "reason": f"{rt.path} loaded but no usable GPU: {e}", "library": rt.path}
    if n < 1:
        return {"available": False, "reason": "no CUDA device", "library": rt.path}
    out = {"available": True, "reason": "", "library": rt.path, "devices": n}
    out.update(rt.versions())
    out["device_name"] = _device_name()
    return out


def _device_name() -> str:
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        if cu.cuInit(0) != 0:
            return ""
        dev = ctypes.c_int(0)
        if cu.cuDeviceGet(ctypes.byref(dev), 0) != 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        if cu.cuDeviceGetName(buf, 256, dev) != 0:
            return ""
        return buf.value.decode(errors="replace")
    except OSError:
        return ""


# -- the double-slot pipeline ----------------------------------------------------------------------


@dataclass
class Done:
    """One completed H2D copy: the caller's token and where the time went."""

    token: object
    t_done: float  # clock() when the end event was seen complete
    host_stage_s: float  # pageable source → pinned slot
    submit_s: float  # cudaMemcpyAsync + event records
    h2d_s: float  # between the slot's start and end events (GPU clock)
    residence_s: float  # slot taken → completion seen (overlaps the next get)


class _Slot:
    __slots__ = ("index", "host", "dev", "stream", "ev_start", "ev_end", "busy", "seq", "token", "t_taken", "host_stage_s", "submit_s")

    def __init__(self, index: int):
        self.index = index
        self.busy = False
        self.seq = 0
        self.token = None


class H2DPipeline:
    """Two (``slots``) pinned slots of one worker thread. Not thread-safe: one per thread.

    ``submit`` takes a free slot (waiting for the oldest busy one if none is free), stages the
    bytes, queues the copy and returns at once, with any copies that completed meanwhile.
    ``poll`` returns the copies completed so far without blocking; ``drain`` waits for all.
    """

    def __init__(self, rt, capacity: int, slots: int = 2, *, device: int = 0, clock=time.monotonic, memmove=ctypes.memmove):
        self.rt = rt
        self.capacity = capacity
        self.clock = clock
        self.memmove = memmove
        self._seq = 0
        self.slots: list[_Slot] = []
        rt.set_device(device)
        try:
            for i in range(slots):
                s = _Slot(i)
                s.host = rt.malloc_host(capacity)
                s.dev = rt.malloc(capacity)
                s.stream = rt.stream_create()
                s.ev_start = rt.event_create()
                s.ev_end = rt.event_create()
                self.slots.append(s)
        except BaseException:
            self.close()
            raise

    def in_flight(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    def _oldest_busy(self) -> _Slot | None:
        busy = [s for s in self.slots if s.busy]
        return min(busy, key=lambda s: s.seq) if busy else None

    def _complete(self, s: _Slot) -> Done:
        t = self.clock()
        d = Done(s.token, t, s.host_stage_s, s.submit_s, self.rt.elapsed_ms(s.ev_start, s.ev_end) / 1e3, t - s.t_taken)
        s.busy = False
        s.token = None
        return d

    def submit(self, src: int | None, n: int, token) -> list[Done]:
        """Copy ``n`` bytes at host address ``src`` to the device through a free slot
        (``src=None``: the slot's pinned bytes as they are, the plain-H2D baseline)."""
        if n > self.capacity:
            raise ValueError(f"{n} bytes exceed the {self.capacity}-byte slots")
        done: list[Done] = []
        slot = next((s for s in self.slots if not s.busy), None)
        if slot is None:
            slot = self._oldest_busy()
            self.rt.event_sync(slot.ev_end)
            done.append(self._complete(slot))
        t0 = self.clock()
        if src is not None:
            self.memmove(slot.host, src, n)
        t1 = self.clock()
        self.rt.event_record(slot.ev_start, slot.stream)
        self.rt.memcpy_h2d_async(slot.dev, slot.host, n, slot.stream)
        self.rt.event_record(slot.ev_end, slot.stream)
        t2 = self.clock()
        self._seq += 1
        slot.seq = self._seq
        slot.busy = True
        slot.token = token
        slot.t_taken = t0
        slot.host_stage_s = t1 - t0
        slot.submit_s = t2 - t1
        return done

    def poll(self) -> list[Done]:
        out = []
        for s in sorted((s for s in self.slots if s.busy), key=lambda s: s.seq):
            if self.rt.event_done(s.ev_end):
                out.append(self._complete(s))
        return out

    def drain(self) -> list[Done]:
        out = []
        while True:
            s = self._oldest_busy()
            if s is None:
                return out
            self.rt.event_sync(s.ev_end)
            out.append(self._complete(s))

    def close(self) -> None:
        for s in self.slots:
            for attr, free in (("ev_start", self.rt.event_destroy), ("ev_end", self.rt.event_destroy), ("stream", self.rt.stream_destroy),
                               ("dev", self.rt.free), ("host", self.rt.free_host)):
                v = getattr(s, attr, None)
                if v:
                    try:
                        free(v)
                    except CudaError:
                        pass
                    setattr(s, attr, None)
        self.slots = []


def plain_h2d_gib_s(rt, n: int, seconds: float = 1.0, slots: int = 2) -> dict:
    """The baseline: the same pipeline with nothing to stage, pinned slot → device, for
    ``seconds``; GiB/s of completed copies."""
    p = H2DPipeline(rt, n, slots)
    try:
        for _ in range(4):  # warm the streams
            p.submit(None, n, None)
        p.drain()
        t0 = time.monotonic()
        copies = 0
        while time.monotonic() - t0 < seconds:
            copies += len(p.submit(None, n, None))
        copies += len(p.drain())
        dt = time.monotonic() - t0
        return {"bytes": n, "copies": copies, "seconds": dt, "gib_s": copies * n / dt / (1 << 30)}
    finally:
        p.close()


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python3 -m pressure.cuda")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("probe")
    b = sub.add_parser("baseline")
    b.add_argument("--bytes", type=int, required=True)
    b.add_argument("--seconds", type=float, default=1.0)
    a = ap.parse_args(argv)
    if a.cmd == "probe":
        print(json.dumps(probe()))
        return 0
    info = probe()
    if not info["available"]:
        print(json.dumps({"error": info["reason"]}))
        return 1
    rt = load_runtime()
    print(json.dumps(plain_h2d_gib_s(rt, a.bytes, a.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
