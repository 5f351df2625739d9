"""A benchmark process: ``threads`` worker threads against one backend, driven by the harness
over JSON lines (harness → stdin, replies → stdout; anything else the process prints goes to
stderr).

    harness                          worker
    {"config": ...}              →
                                 ←   {"event": "ready"}
    {"cmd": "bootstrap"}         →   (process 0 only: serial paced puts, progress on stderr)
                                 ←   {"event": "bootstrapped", ...}
    {"cmd": "fill", "count": n,  →   (cluster remote-SSD path) n unpaced puts of filler keys
     "size": bytes}
                                 ←   {"event": "filled", ...}
    {"cmd": "go", "t_start",     →   threads run warmup then window on the shared monotonic clock
     "window_start", "window_end"}   (may come again: another window on the same servers)
                                 ←   {"event": "result", "tally": ..., "counter_samples": ...}
    {"cmd": "exit"} or EOF       →   close and exit

An op is counted when it completes inside [window_start, window_end): a hit when its output
mode's completion point is reached (holder: native reference returned and checked; bytes: full
payload materialised and its stamps checked; cuda: its H2D event completed), a miss when the
backend says the key is absent, an error otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback

from . import backends
from .backends.base import CaseSpec
from .progress import Progress
from .stats import Tally
from .workload import ValueMaker, ZipfSequence, bootstrap_order, check_at, check_value, filler_key_name, key_name, pause_after_put_s, value_body, zipf_cdf

clock = time.monotonic  # CLOCK_MONOTONIC: one clock for every process on the machine


class Proto:
    def __init__(self):
        # Keep the real stdout for the protocol; send stray prints to stderr.
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, obj: dict) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()


def sleep_until(t: float) -> None:
    while True:
        d = t - clock()
        if d <= 0:
            return
        time.sleep(min(d, 0.05))


def put_all(side, keys, index_of, payload: int, pause: float, body: bytes, label: str) -> dict:
    """Serial puts of ``keys`` (value of key k: the stamped value of ``index_of(k)``) through the
    side's bootstrap client, ``pause`` s after each; a progress bar on stderr."""
    n = len(keys)
    vm = ValueMaker(body)
    tc = side.thread_client(-1)
    bar = Progress(n, label, unit_bytes=payload)
    ok = failed = 0
    errors: list[str] = []
    t0 = clock()
    try:
        for i, key in enumerate(keys):
            try:
                tc.put(key, vm.value(index_of(i)))
                ok += 1
            except Exception as e:  # a refused put is a result of the bootstrap, counted
                failed += 1
                if len(errors) < 5:
                    errors.append(f"{key}: {type(e).__name__}: {e}"[:300])
            bar.update(i + 1)
            if pause:
                time.sleep(pause)
        bar.finish(n)
    finally:
        tc.close()
    return {"puts": ok, "failed": failed, "seconds": clock() - t0, "pause_s": pause, "errors": errors}


def bootstrap(side, cfg: dict) -> dict:
    """Serial puts of every key, in the case's order, paced as the seed."""
    case = cfg["case"]
    n, payload = case["keys"], case["payload_bytes"]
    order = bootstrap_order(n, cfg["order"], cfg["seed"])
    pause = pause_after_put_s(payload, cfg["pace_scale"])
    return put_all(side, [key_name(idx) for idx in order], lambda i: order[i], payload, pause,
                   value_body(payload, cfg["seed"]), f"  bootstrap {cfg['label']}")


def fill(side, cfg: dict, count: int, size: int) -> dict:
    """Unpaced puts of ``count`` keys of ``size`` bytes outside the dataset (``filler-…``, never
    read): memory pressure that pushes the dataset's memory replicas out (a cluster's remote-SSD path)."""
    keys = [filler_key_name(i) for i in range(count)]
    out = put_all(side, keys, lambda i: i, size, 0.0, value_body(size, cfg["seed"]), f"  filler {cfg['label']}")
    return {**out, "size": size}


# Holder mode reads every this many hits' bytes in place (check_at: the words at every 4 KiB):
# a zero-copy get's measure is the holder, and reading all of them would time the reader's
# page walks of every value instead.
HOLDER_CHECK_EVERY = 8


class WindowThread:
    def __init__(self, side, cfg: dict, thread_index: int, global_index: int, cdf, keys, body, pipeline_factory):
        c = cfg["case"]
        self.tc = side.thread_client(thread_index)
        self.seq = ZipfSequence(c["keys"], cfg["seed"], global_index, cfg["theta"], cdf)
        self.keys = keys
        self.mode = c["mode"]
        self.on_miss = cfg["on_miss"]
        self.payload = c["payload_bytes"]
        self.vm = ValueMaker(body) if self.on_miss == "put" else None
        self.pipeline_factory = pipeline_factory
        self.tally = Tally()
        self.crash: str | None = None

    def run(self, t_start: float, ws: float, we: float) -> None:
        try:
            self._run(t_start, ws, we)
        except BaseException:
            self.crash = traceback.format_exc()[-2000:]
        finally:
            try:
                self.tc.close()
            except Exception:
                pass

    def _finish(self, d, ws: float, we: float) -> None:
        t0, got, idx = d.token
        t = self.tally
        if ws <= d.t_done < we:
            t.hit(got.source, d.t_done - t0, got.remote)
            t.stage("host_stage", d.host_stage_s)
            t.stage("submit", d.submit_s)
            t.stage("h2d_event", d.h2d_s)
            t.stage("residence", d.residence_s)
        got.release()

    def _run(self, t_start: float, ws: float, we: float) -> None:
        pipeline = self.pipeline_factory() if self.mode == "cuda" else None
        t, tc, keys, seq, payload, mode = self.tally, self.tc, self.keys, self.seq, self.payload, self.mode
        read_through = self.on_miss == "put"
        checks = 0  # holder mode's hits, every HOLDER_CHECK_EVERY-th read in place
        sleep_until(t_start)
        try:
            while True:
                if clock() >= we:
                    break
                if pipeline is not None and pipeline.in_flight():
                    for d in pipeline.poll():
                        self._finish(d, ws, we)
                idx = seq.next()
                key = keys[idx]
                t.ops_total += 1
                t0 = clock()
                try:
                    got = tc.get(key)
                except Exception as e:
                    t1 = clock()
                    if ws <= t1 < we:
                        t.error(f"get {key}: {type(e).__name__}: {e}")
                    time.sleep(0.001)  # a failing backend must not turn into a busy loop
                    continue
                if got is None:
                    t1 = clock()
                    if ws <= t1 < we:
                        t.misses += 1
                    if read_through:
                        try:
                            tc.put(key, self.vm.value(idx))
                            ok = True
                        except Exception as e:
                            ok = False
                            if ws <= clock() < we and len(t.error_samples) < 5:
                                t.error_samples.append(f"read-through put {key}: {type(e).__name__}: {e}"[:300])
                        if ws <= clock() < we:
                            if ok:
                                t.put_ok += 1
                            else:
                                t.put_failed += 1
                    continue
                if mode == "cuda":
                    n = len(got)
                    if n != payload:
                        got.release()
                        if ws <= clock() < we:
                            t.error(f"get {key}: {n} bytes, want {payload}")
                        continue
                    for d in pipeline.submit(got.host_pointer(), payload, (t0, got, idx)):
                        self._finish(d, ws, we)
                    continue
                if mode == "holder":
                    ok = len(got) == payload
                    t1 = clock()
                    checks += 1
                    if ok and checks % HOLDER_CHECK_EVERY == 0:  # read in place, after the latency's end
                        ok = check_at(got.host_pointer(), idx, payload)
                else:  # bytes
                    data = got.materialize()
                    ok = check_value(data, idx, payload)
                    t1 = clock()
                    del data
                source, remote = got.source, got.remote
                got.release()
                if ws <= t1 < we:
                    if ok:
                        t.hit(source, t1 - t0, remote)
                    else:
                        t.error(f"get {key}: value of wrong length or with a foreign stamp")
        finally:
            if pipeline is not None:
                for d in pipeline.drain():
                    self._finish(d, ws, we)
                pipeline.close()


def run_window(side, cfg: dict, msg: dict) -> dict:
    c = cfg["case"]
    n = c["keys"]
    cdf = zipf_cdf(n, cfg["theta"])
    keys = [key_name(i) for i in range(n)]
    body = value_body(c["payload_bytes"], cfg["seed"]) if cfg["on_miss"] == "put" else b""
    pipeline_factory = None
    if c["mode"] == "cuda":
        from . import cuda

        rt = cuda.load_runtime()
        pipeline_factory = lambda: cuda.H2DPipeline(rt, c["payload_bytes"], 2)  # noqa: E731
    threads = c["threads"]
    base = cfg["proc_index"] * threads
    wts = [WindowThread(side, cfg, i, base + i, cdf, keys, body, pipeline_factory) for i in range(threads)]
    t_start, ws, we = msg["t_start"], msg["window_start"], msg["window_end"]

    samples: list = []
    sampler = None
    if side.ssd_counter() is not None:
        def sample():
            sleep_until(ws)
            a = side.ssd_counter()
            sleep_until(we)
            samples.append([a, side.ssd_counter()])

        sampler = threading.Thread(target=sample, name="counter-sampler", daemon=True)
        sampler.start()

    ths = [threading.Thread(target=w.run, args=(t_start, ws, we), name=f"worker-{i}") for i, w in enumerate(wts)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    if sampler is not None:
        sampler.join()
    total = Tally()
    crashes = []
    for w in wts:
        total.merge(w.tally)
        if w.crash:
            crashes.append(w.crash)
    return {"event": "result", "tally": total.to_json(), "counter_samples": samples, "crashes": crashes}


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness decides when we stop
    proto = Proto()
    line = sys.stdin.readline()
    if not line:
        return 0
    cfg = json.loads(line)["config"]
    for p in reversed(cfg.get("pythonpath", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        mod = backends.load(cfg["case"]["backend"])
        spec = CaseSpec(**{k: cfg["case"][k] for k in CaseSpec.__dataclass_fields__})
        side = mod.WorkerSide(cfg["endpoint"], spec, cfg["proc_index"])
    except Exception as e:
        proto.send({"event": "failed", "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})
        return 1
    proto.send({"event": "ready", "pid": os.getpid(), "native_type": side.native_type, "describe": side.describe()})
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            cmd = msg.get("cmd")
            try:
                if cmd == "bootstrap":
                    proto.send({"event": "bootstrapped", **bootstrap(side, cfg)})
                elif cmd == "fill":
                    proto.send({"event": "filled", **fill(side, cfg, int(msg["count"]), int(msg.get("size") or cfg["case"]["payload_bytes"]))})
                elif cmd == "go":
                    proto.send(run_window(side, cfg, msg))
                elif cmd == "exit":
                    break
            except Exception as e:
                proto.send({"event": "failed", "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})
    finally:
        try:
            side.close()
        except Exception:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
