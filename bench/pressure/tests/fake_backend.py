"""TEST FAKE, not a benchmark backend: an in-process LRU "cache" so the harness (worker
processes, protocol, bootstrap, window, attribution, summary, chart) can be tested end to end
without servers. Storage lives in the benchmark process itself, so it only works with one
process (procs = 1), where the bootstrap and the window threads share it.

SSD off: the LRU holds ``dram_bytes // payload`` values and drops the rest. SSD on: evicted
values move to an unbounded "ssd" dict; a get from there reports source "ssd" and promotes it.
With ``FAKE_SOURCE_COUNTER=1`` the fake hides per-get sources and exposes a process-local SSD
counter instead (the path a Mooncake per-process topology takes).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from pressure.backends.base import BytesGot, CaseSpec, Server as _Server, ThreadClient, WorkerSide as _WorkerSide


class Server(_Server):
    name = "fake"

    def __init__(self, opts):
        super().__init__(opts)
        self.source_method = "counter" if os.environ.get("FAKE_SOURCE_COUNTER") == "1" else "per-get"

    def unavailable(self, case: CaseSpec):
        if case.procs != 1:
            return "the test fake keeps its data in one benchmark process"
        return None

    def start(self, case, workdir, group):
        return {"capacity": max(1, case.dram_bytes // case.payload_bytes), "ssd": case.ssd}

    def describe(self):
        return {"fake": True}


class _Store:
    def __init__(self, capacity: int, ssd: bool):
        self.mu = threading.Lock()
        self.mem: OrderedDict = OrderedDict()
        self.ssd = {} if ssd else None
        self.capacity = capacity
        self.ssd_reads = 0

    def put(self, key, value: bytes):
        with self.mu:
            self._insert(key, value)

    def _insert(self, key, value):
        self.mem[key] = value
        self.mem.move_to_end(key)
        while len(self.mem) > self.capacity:
            k, v = self.mem.popitem(last=False)
            if self.ssd is not None:
                self.ssd[k] = v

    def get(self, key):
        with self.mu:
            v = self.mem.get(key)
            if v is not None:
                self.mem.move_to_end(key)
                return v, "memory"
            if self.ssd is not None and key in self.ssd:
                v = self.ssd.pop(key)
                self.ssd_reads += 1
                self._insert(key, v)
                return v, "ssd"
            return None, None


class _Thread(ThreadClient):
    def __init__(self, store: _Store, hide_source: bool):
        self.store = store
        self.hide = hide_source

    def get(self, key):
        v, src = self.store.get(key)
        if v is None:
            return None
        return BytesGot(v, None if self.hide else src)

    def put(self, key, value):
        self.store.put(key, bytes(value))


class WorkerSide(_WorkerSide):
    native_type = "bytes (test fake)"

    def __init__(self, endpoint, case, proc_index):
        super().__init__(endpoint, case, proc_index)
        self.store = _Store(endpoint["capacity"], endpoint["ssd"])
        self.counter = os.environ.get("FAKE_SOURCE_COUNTER") == "1" and case.ssd

    def thread_client(self, thread_index):
        return _Thread(self.store, self.counter)

    def ssd_counter(self):
        return self.store.ssd_reads if self.counter else None
