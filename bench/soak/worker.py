#!/usr/bin/python3
"""One Python client process of the fluxkv soak (bench/soak, see README.md there).

It attaches to an owner and loops over random operations on a key space shared with every
other worker (Go and Python): put, overwrite, delete, batch_put, batch_get, batch_delete
and get, with value sizes log-uniform between --min-size and --max-size. Every value is a
pure function of (key, put_id, len) (the counter-based splitmix64 stream of value.go,
computed here with numpy), so every holder it reads is verified byte for byte against its
own put_id and length. Holders are released at once, held for a while, or never released
(until the driver kills the process), within --hold-cap bytes.

Counters go to stdout as one JSON line every --report-every seconds (and at once after a
wrong byte), so the driver keeps totals across kill -9. SIGTERM ends the loop, closes the
client and writes a final line.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import time

# SIGTERM asks for a clean stop: catch it before the slow imports below. The loop stops
# after the operation in progress (_OP: its name and start), which the log then names;
# SIGUSR1 writes every thread's stack to the log (the driver sends it before a kill).
_STOP = [False]
_OP: list = [None, 0.0]


def _on_stop(*_) -> None:
    _STOP[0] = True
    if _OP[0] is not None:
        sys.stderr.write(f"stop asked during {_OP[0]}, {time.monotonic() - _OP[1]:.1f} s into it\n")
        sys.stderr.flush()


signal.signal(signal.SIGTERM, _on_stop)
signal.signal(signal.SIGINT, _on_stop)
faulthandler.register(signal.SIGUSR1, all_threads=True)

import argparse
import inspect
import json
import math
import random

import numpy as np

import fluxkv
from fluxkv.errors import Error, code_name

GOLDEN = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix_int(z: int) -> int:
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def value_seed(key: str, put_id: int, n: int) -> int:
    """FNV-1a of the key mixed with put_id and len (value.go's valueSeed)."""
    h = 14695981039346656037
    for b in key.encode():
        h = ((h ^ b) * 1099511628211) & M64
    return _mix_int(_mix_int(h ^ (put_id & M64)) ^ (n & M64))


def value_bytes(key: str, put_id: int, n: int) -> np.ndarray:
    """The n bytes of (key, put_id, n) as a uint8 array (value.go's fillValue)."""
    words = (n + 7) // 8
    seed = value_seed(key, put_id, n)
    with np.errstate(over="ignore"):
        z = np.arange(1, words + 1, dtype=np.uint64)
        z *= np.uint64(GOLDEN)
        z += np.uint64(seed)
        z ^= z >> _S30
        z *= _C1
        z ^= z >> _S27
        z *= _C2
        z ^= z >> _S31
    return z.astype("<u8", copy=False).view(np.uint8)[:n]


_CLASSES = [
    (fluxkv.KeyNotFound, "KEY_NOT_FOUND"), (fluxkv.AlreadyExists, "ALREADY_EXISTS"), (fluxkv.NoSpace, "NO_SPACE"),
    (fluxkv.InvalidArgument, "INVALID_ARGUMENT"), (fluxkv.Unavailable, "UNAVAILABLE"),
]


def error_name(e: Error) -> str:
    """The wire code an error stands for: its code, else its class (the client raises
    Unavailable without a code for a dead owner); CLIENT for neither."""
    if e.code is not None:
        return code_name(e.code)
    for cls, name in _CLASSES:
        if isinstance(e, cls):
            return name
    return "CLIENT"


class Counters:
    """What the worker did; the driver sums the last line of every incarnation."""

    def __init__(self, name: str, out):
        self.name = name
        self.out = out
        self.c = {
            "puts": 0, "gets": 0, "deletes": 0, "batch_puts": 0, "batch_gets": 0, "batch_deletes": 0,
            "batch_items": 0, "hits": 0, "ssd_hits": 0, "misses": 0, "bytes_written": 0,
            "bytes_verified": 0, "wrong_bytes": 0, "bad_holders": 0, "never_released": 0,
        }
        self.errors: dict[str, int] = {}
        self.samples: dict[str, str] = {}  # the first message of each code
        self.failures: list[str] = []
        self.slowest_op, self.slowest_ms = "", 0.0

    def add(self, k: str, n: int = 1) -> None:
        self.c[k] += n

    def error(self, e: BaseException, name: str | None = None) -> None:
        if name is not None:
            pass
        elif isinstance(e, Error):
            name = error_name(e)
        else:
            name = "EXCEPTION"
            self.fail(f"{type(e).__name__}: {e}")
        self.errors[name] = self.errors.get(name, 0) + 1
        self.samples.setdefault(name, f"{type(e).__name__}: {e}"[:400])

    def slowest(self, op: str, seconds: float) -> None:
        ms = seconds * 1000
        if ms > self.slowest_ms:
            self.slowest_op, self.slowest_ms = op, ms

    def fail(self, msg: str) -> None:
        if len(self.failures) < 8:
            self.failures.append(msg[:400])

    def emit(self, final: bool = False) -> None:
        line = dict(self.c, worker=self.name, lang="python", errors=self.errors, error_samples=self.samples, failures=self.failures, slowest_op=self.slowest_op, slowest_ms=round(self.slowest_ms, 3), final=final)
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()


class Worker:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.rng = random.Random(a.seed)
        self.keys = [f"{a.key_prefix}{i:06d}" for i in range(a.keys)]
        self.n = Counters(a.name, sys.stdout)
        self.held: list[tuple[float, int, object]] = []  # (release deadline, bytes, holder)
        self.held_bytes = 0
        self.kept: list[object] = []  # never released: the kill ends them
        self.floor: dict[str, int] = {}
        self.c = None

    # -- sizes, keys, values ---------------------------------------------------------------------

    def size(self) -> int:
        lo, hi = math.log(self.a.min_size), math.log(self.a.max_size + 1)
        return max(self.a.min_size, min(self.a.max_size, int(math.exp(self.rng.uniform(lo, hi)))))

    def key(self) -> str:
        return self.rng.choice(self.keys)

    def fill(self, key: str, n: int, ids: dict | None = None):
        def f(put_id: int, dst) -> None:
            if ids is not None:
                ids[key] = put_id  # (a redo fills again, under its own put_id)
            np.frombuffer(dst, dtype=np.uint8)[:] = value_bytes(key, put_id, n)
        return f

    # The lowest put_id a get may answer, per key: this worker's last answered put of it,
    # or one more once it deleted the key since (an older version is dead, and a holder of
    # one is stale: its bytes are its own version's, which the byte check alone passes).
    def acked(self, key: str, put_id: int) -> None:
        self.floor[key] = max(self.floor.get(key, 0), put_id)

    def deleted(self, key: str) -> None:
        if key in self.floor:
            self.floor[key] += 1

    # -- holders ----------------------------------------------------------------------------------

    def verify(self, key: str, h, floor: int = 0) -> None:
        n = len(h)
        if h.put_id <= 0 or n <= 0 or h.put_id < floor:
            self.n.add("bad_holders")
            self.n.fail(f"holder of {key!r}: put_id={h.put_id} len={n} (this worker's last answered write of it: "
                        f"put_id {floor}, or a delete after it)")
            self.n.emit()
            return
        got = h.numpy()
        bad = int(np.count_nonzero(got != value_bytes(key, h.put_id, n)))
        del got
        self.n.add("hits")
        if h.source == "ssd":
            self.n.add("ssd_hits")
        self.n.add("bytes_verified", n)
        if bad:
            self.n.add("wrong_bytes", bad)
            self.n.fail(f"{bad} wrong bytes in {key!r} put_id={h.put_id} len={n} source={h.source}")
            self.n.emit()

    def keep_or_release(self, key: str, h) -> None:
        """Release at once, hold for a while, or never release, within the hold cap."""
        n = len(h)
        r = self.rng.random()
        if r < 0.5 or self.held_bytes + n > self.a.hold_cap:
            h.release()
        elif r < 0.9:
            self.held.append((time.monotonic() + self.rng.uniform(0.05, 2.0), n, key, h))
            self.held_bytes += n
        else:
            self.kept.append((key, h))
            self.held_bytes += n
            self.n.add("never_released")

    def check_holders(self, session: int) -> None:
        """Before the client closes (which frees everything): the owner's count of this
        session's holders against those never released, so a release lost on its way shows.
        Skipped when the client attached again meanwhile (an owner restart)."""
        try:
            if self.c.client_id != session:
                return
            n = self.c.stat()["client_holders"]  # (carries the queued releases first)
            if self.c.client_id != session:
                return
        except Error as e:
            self.n.error(e)
            return
        if n != len(self.kept):
            self.n.fail(f"the owner counts {n} holders of this session at its end, {len(self.kept)} never released: releases lost")

    def recheck(self, key: str, h) -> None:
        """Read a held holder's bytes again before it goes: a holder keeps its value's bytes
        however long it is held, through overwrites, deletes and evictions of the key. They
        were checked once, right after the get."""
        try:
            got = h.numpy()
            bad = int(np.count_nonzero(got != value_bytes(key, h.put_id, len(h))))
            del got
        except Error as e:  # the owner restarted meanwhile: the holder is void
            self.n.error(e, "HOLDER_VOID" if e.code is None else None)
            return
        if bad:
            self.n.add("wrong_bytes", bad)
            self.n.fail(f"{bad} wrong bytes in a held holder of {key!r} put_id={h.put_id} len={len(h)}")
            self.n.emit()

    def expire(self) -> None:
        now = time.monotonic()
        keep = []
        for t, n, key, h in self.held:
            if t <= now:
                self.recheck(key, h)
                h.release()
                self.held_bytes -= n
            else:
                keep.append((t, n, key, h))
        self.held = keep

    def got(self, key: str, h, floor: int = 0) -> None:
        try:
            self.verify(key, h, floor)
        except Error as e:  # the owner restarted between the get and the read: the holder is void
            self.n.error(e, "HOLDER_VOID" if e.code is None else None)
            h.release()
            return
        self.keep_or_release(key, h)

    # -- operations -------------------------------------------------------------------------------

    def op_put(self) -> None:
        k, n = self.key(), self.size()
        rie = self.rng.random() < 0.1
        self.acked(k, self.c.put_with(k, n, self.fill(k, n), reject_if_exists=rie))
        self.n.add("puts")
        self.n.add("bytes_written", n)

    def op_get(self) -> None:
        k = self.key()
        self.n.add("gets")
        floor = self.floor.get(k, 0)
        try:
            h = self.c.get(k)
        except fluxkv.KeyNotFound:
            self.n.add("misses")
            return
        self.got(k, h, floor)

    def op_delete(self) -> None:
        k = self.key()
        self.c.delete(k)
        self.deleted(k)
        self.n.add("deletes")

    def op_batch_put(self) -> None:
        items, total, ids = [], 0, {}
        for _ in range(self.rng.randint(2, 6)):
            k, n = self.key(), self.size()
            if total + n > self.a.batch_max_bytes or any(k == i[0] for i in items):
                continue
            items.append((k, n, self.fill(k, n, ids)))
            total += n
        if not items:
            return
        self.n.add("batch_puts")
        self.n.add("batch_items", len(items))
        try:
            errors = self.c.batch_put_with(items)
        except Error as e:  # a batch_put-style client raises the first failure with .errors
            errors = getattr(e, "errors", None)
            if errors is None:
                raise
        for (k, n, _), e in zip(items, errors):
            if e is None:
                self.n.add("bytes_written", n)
                self.acked(k, ids[k])
            else:
                self.n.error(e)

    def op_batch_get(self) -> None:
        ks = self.rng.sample(self.keys, min(len(self.keys), self.rng.randint(2, 8)))
        self.n.add("batch_gets")
        self.n.add("batch_items", len(ks))
        floors = [self.floor.get(k, 0) for k in ks]
        hs = self.c.batch_get(ks)
        for k, h, floor in zip(ks, hs, floors):
            if h is None:
                self.n.add("misses")
            else:
                self.got(k, h, floor)

    def op_batch_delete(self) -> None:
        ks = self.rng.sample(self.keys, min(len(self.keys), self.rng.randint(2, 5)))
        self.n.add("batch_deletes")
        self.n.add("batch_items", len(ks))
        self.c.batch_delete(ks)
        for k in ks:
            self.deleted(k)

    @property
    def stop(self) -> bool:
        return _STOP[0]

    # -- loop -------------------------------------------------------------------------------------

    def connect(self) -> bool:
        deadline = time.monotonic() + self.a.connect_timeout
        while not self.stop:
            try:
                self.c = fluxkv.connect(self.a.socket, name=self.a.name, timeout=30.0, attach_timeout=5.0)
                return True
            except Error as e:
                if time.monotonic() > deadline:
                    self.n.fail(f"cannot attach to {self.a.socket}: {e}")
                    return False
                time.sleep(0.1)
        return False

    def run(self) -> int:
        _OP[0], _OP[1] = "attach", time.monotonic()
        if not self.connect():
            self.n.emit(final=True)
            return 0 if self.stop else 1
        _OP[0] = None
        session = self.c.client_id
        self.n.emit()  # running: the driver waits for this line before a SIGTERM
        ops = [
            (0.22, self.op_put), (0.30, self.op_get), (0.10, self.op_delete), (0.12, self.op_batch_put),
            (0.18, self.op_batch_get), (0.08, self.op_batch_delete),
        ]
        total = sum(w for w, _ in ops)
        last = time.monotonic()
        while not self.stop:
            r = self.rng.uniform(0, total)
            for w, fn in ops:
                r -= w
                if r <= 0:
                    break
            _OP[0], _OP[1] = fn.__name__[3:], time.monotonic()
            try:
                fn()
            except Error as e:
                self.n.error(e)
                if error_name(e) in ("UNAVAILABLE", "STALE_GENERATION", "CLIENT"):
                    time.sleep(0.05)  # the owner is restarting: do not spin
            now = time.monotonic()
            self.n.slowest(_OP[0], now - _OP[1])
            _OP[0] = None
            self.expire()
            if now - last >= self.a.report_every:
                last = now
                self.n.emit()
        _OP[0], _OP[1] = "close", time.monotonic()
        for _, _, key, h in self.held:
            self.recheck(key, h)
            h.release()
        self.held.clear()
        for key, h in self.kept:  # (never released: their bytes stay until the process ends)
            self.recheck(key, h)
        self.check_holders(session)
        try:
            self.c.close()
        except Error as e:
            self.n.error(e)
        self.n.emit(final=True)
        return 0


def _install_compat(cls) -> None:
    """batch_put_with(items of (key, size, fill)) -> [None | error] on a client without it
    (the Python client has put_with but its batch_put takes ready buffers): one wave of
    BatchPutStart, fill(put_id, view) for each started item, BatchPutEnd, through the
    client's session (Client._run), as Client.batch_put does with buffers."""
    from fluxkv._gen.common.ttypes import ErrorCode
    from fluxkv._gen.external.ttypes import (
        BatchPutEndRequest, BatchPutStartRequest, PutEndItem, PutOptions, PutStartItem,
    )
    from fluxkv.client import _abort, _check_count
    from fluxkv.errors import error_for, raise_for

    def write(s, off, n, put_id, fill):
        if not s.segment.contains(off, n):
            raise Error(f"offset {off} len {n} outside the segment", ErrorCode.INTERNAL)
        rw = getattr(s.segment, "rw", None)
        if rw is None:  # an older client: fill a buffer, copy it in
            buf = bytearray(n)
            fill(put_id, memoryview(buf))
            s.segment.write(off, buf, n)
            return
        base = memoryview(rw)
        view = base[off : off + n]
        try:
            fill(put_id, view)
        finally:
            view.release()
            base.release()

    if not hasattr(cls, "batch_put_with"):
        def batch_put_with(self, items, reject_if_exists=False):
            opts = PutOptions(bool(reject_if_exists))

            def op(s):
                errors = [None] * len(items)
                r = s.call(lambda c, ss: c.BatchPutStart(BatchPutStartRequest(
                    ss, [PutStartItem(k, n, opts) for k, n, _ in items])))
                raise_for(r.code, r.message)
                started = []
                for i, res in enumerate(_check_count("BatchPutStart", r.results, len(items))):
                    if res.code == ErrorCode.OK:
                        started.append((i, res.put_id, res.offset))
                    else:
                        errors[i] = error_for(res.code, res.message or "")
                try:
                    for i, put_id, off in started:
                        write(s, off, items[i][1], put_id, items[i][2])
                except BaseException:
                    _abort(s, [(items[i][0], pid) for i, pid, _ in started])
                    raise
                if started:
                    e = s.call(lambda c, ss: c.BatchPutEnd(BatchPutEndRequest(
                        ss, [PutEndItem(items[i][0], pid) for i, pid, _ in started])))
                    raise_for(e.code, e.message)
                    for (i, _, _), res in zip(started, _check_count("BatchPutEnd", e.results, len(started))):
                        if res.code != ErrorCode.OK:
                            errors[i] = error_for(res.code, res.message or "")
                return errors

            if "lost_reply" in run_params:
                return self._run(op, lost_reply=False)  # a lost reply is not redone blindly
            return self._run(op)

        run_params = inspect.signature(cls._run).parameters
        cls.batch_put_with = batch_put_with


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", required=True)
    p.add_argument("--name", default="py")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keys", type=int, default=256)
    p.add_argument("--key-prefix", default="soak/")
    p.add_argument("--min-size", type=int, default=1)
    p.add_argument("--max-size", type=int, default=16 << 20)
    p.add_argument("--hold-cap", type=int, default=4 << 20, help="bytes of holders kept at once")
    p.add_argument("--batch-max-bytes", type=int, default=16 << 20)
    p.add_argument("--report-every", type=float, default=0.5)
    p.add_argument("--connect-timeout", type=float, default=30.0)
    a = p.parse_args()
    _install_compat(fluxkv.Client)
    return Worker(a).run()


if __name__ == "__main__":
    sys.exit(main())
