"""The backend interface. A backend is one module in this package with two halves:

* ``Server`` (coordinator side): says whether a case can run here, starts whatever the case
  needs (servers, resident stores) inside a process ``Group`` and a temp dir, describes the
  server after bootstrap, samples server-side SSD counters, waits for background writes to settle.
  It returns an *endpoint*: a JSON-able dict that is all a worker process needs to connect.
* ``WorkerSide`` (in each benchmark process): connects from the endpoint, hands each thread a
  ``ThreadClient`` (``get`` → ``Got`` or ``None`` on a miss, ``put``), and may sample
  process-local SSD counters (a backend whose benchmark processes are also storage).

Hits get their source one of three ways (``Server.source_method``): ``"per-get"`` (every ``Got``
says ``memory`` or ``ssd``), ``"counter"`` (a monotonic SSD-read counter sampled at the window's
start and end, server side and/or in each worker), or ``"dram-only"`` (no flash tier in the case).

Adding a backend (e.g. Mooncake): write ``backends/<name>.py`` with ``Server`` and ``WorkerSide``
subclasses, optionally ``add_arguments(group)`` for its own flags (they land on the options object
every ``Server`` receives), and add its name to ``backends.NAMES``; nothing else changes.
``procs.free_port()`` gives loopback ports for servers that listen on TCP.
"""

from __future__ import annotations

import abc
import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CaseSpec:
    """What a backend needs to know about the case (a subset of the harness's Case)."""

    backend: str
    variant: str | None  # e.g. a Mooncake topology; None for single-shape backends
    ssd: bool
    mode: str  # holder | bytes | cuda
    payload_bytes: int
    keys: int
    dram_bytes: int
    ssd_bytes: int
    procs: int
    threads: int


class Got(abc.ABC):
    """One hit. ``source`` is ``"memory"``, ``"ssd"`` or ``None`` (attributed by counter);
    ``remote`` is True when its bytes were pulled from another owner, False when they were this
    owner's, None when the backend does not say (a cluster benchmark splits hits on it).
    ``native`` is the backend's own reference (MemHolder, bytes, BufferHandle): holder mode keeps
    it alive until the op is counted and then calls ``release()``."""

    __slots__ = ()
    source: str | None = None
    remote: bool | None = None

    @abc.abstractmethod
    def __len__(self) -> int:
        ...

    @abc.abstractmethod
    def materialize(self) -> bytes:
        """The full payload as Python ``bytes`` (bytes mode)."""
        ...

    @abc.abstractmethod
    def host_pointer(self) -> int:
        """Address of the payload in this process's memory, valid until ``release()`` (cuda mode)."""
        ...

    def release(self) -> None:
        pass


class BytesGot(Got):
    """A hit whose native reference already is a Python ``bytes`` (memcached, Redis clients)."""

    __slots__ = ("data", "source")

    def __init__(self, data: bytes, source: str | None):
        self.data = data
        self.source = source

    def __len__(self) -> int:
        return len(self.data)

    def materialize(self) -> bytes:
        return self.data

    def host_pointer(self) -> int:
        import ctypes

        return ctypes.cast(ctypes.c_char_p(self.data), ctypes.c_void_p).value

    def release(self) -> None:
        self.data = b""


class ThreadClient(abc.ABC):
    @abc.abstractmethod
    def get(self, key: str) -> Got | None:
        """The value of ``key`` as a ``Got``, or None on a miss (a result, not an error)."""

    @abc.abstractmethod
    def put(self, key: str, value: memoryview) -> None:
        """Store ``value``; raise on failure (the worker counts it)."""

    def get_many(self, keys: list) -> list:
        """Each key's ``Got`` or None, in one call where the store has one (the default
        gets them one by one)."""
        return [self.get(k) for k in keys]

    def put_many(self, items: list) -> list:
        """Store each (key, value); the keys the store refused, in one call where it has
        one (the default puts them one by one). Raises when the call as a whole failed."""
        refused = []
        for k, v in items:
            try:
                self.put(k, v)
            except Exception:  # noqa: BLE001 - a refused put is reported, as the batched calls do
                refused.append(k)
        return refused

    def close(self) -> None:
        pass


class WorkerSide(abc.ABC):
    #: what the backend's native get returns, for the summary ("MemHolder", "bytes", ...)
    native_type = "bytes"

    def __init__(self, endpoint: dict, case: CaseSpec, proc_index: int):
        self.endpoint = endpoint
        self.case = case
        self.proc_index = proc_index

    @abc.abstractmethod
    def thread_client(self, thread_index: int) -> ThreadClient:
        """A client for worker thread ``thread_index`` of this process."""

    def ssd_counter(self) -> float | None:
        """Process-local monotonic SSD-read counter, or None if this process stores nothing."""
        return None

    def describe(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class Server(abc.ABC):
    name = "?"
    #: "per-get" | "counter"; "dram-only" is implied when the case has SSD off
    source_method = "per-get"
    #: variants the backend runs in every case (e.g. Mooncake topologies); [None] = one shape
    variants: tuple = (None,)
    #: extra entries for the workers' sys.path (a client package outside the standard paths)
    pythonpath: tuple = ()
    #: the main server's command line, set by ``start`` (recorded in the summary's ``server.cmd``)
    cmdline: list | None = None

    def __init__(self, opts):
        self.opts = opts  # the harness's parsed options (binary paths, work dir, ...)

    # -- availability --------------------------------------------------------------------------

    def unavailable(self, case: CaseSpec) -> str | None:
        """Why this case cannot run on this machine (missing binary or module, no flash tier), or
        None. Called before anything is started."""
        return None

    # -- lifecycle -----------------------------------------------------------------------------

    @abc.abstractmethod
    def start(self, case: CaseSpec, workdir: Path, group) -> dict:
        """Start the servers in ``group`` (stopped by the harness); return the endpoint."""

    def settle(self, timeout: float) -> None:
        """Return once background work after the bootstrap (SSD persistence) has drained."""

    def describe(self) -> dict:
        """Server-side state after the bootstrap: used bytes, item counts (goes into the summary)."""
        return {}

    def ssd_counter(self) -> float | None:
        """Server-side monotonic count of hits served from flash, for ``source_method = counter``."""
        return None

    def notes(self, described: dict) -> list[str]:
        """Lines for the case's ``notes`` after the bootstrap (``described`` = ``describe()``)."""
        return []

    def stop(self) -> None:
        """Anything to do before the group's processes are stopped."""


# -- helpers for availability checks ---------------------------------------------------------------


def which(binary: str) -> str | None:
    p = Path(binary)
    if p.parent != Path(".") or "/" in binary:
        return str(p) if p.exists() else None
    return shutil.which(binary)


def module_available(name: str, extra_paths=()) -> bool:
    import sys

    old = list(sys.path)
    try:
        sys.path[:0] = [str(x) for x in extra_paths]
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
    finally:
        sys.path[:] = old


def settle_by_polling(sample, timeout: float, interval: float = 0.25, stable_for: int = 3) -> bool:
    """Poll ``sample()`` until it returns the same value ``stable_for`` times in a row."""
    import time

    deadline = time.monotonic() + timeout
    last, same = object(), 0
    while time.monotonic() < deadline:
        v = sample()
        if v == last:
            same += 1
            if same >= stable_for - 1:
                return True
        else:
            last, same = v, 0
        time.sleep(interval)
    return False


# The backends whose flash reads go through the kernel's page cache (the harnesses bound no
# page cache): extstore opens its file without O_DIRECT, and Mooncake's storage backend reads
# with O_DIRECT only with use_uring, off by default. fluxkv reads its own with O_DIRECT.
PAGE_CACHED_FLASH = {
    "memcached": "memcached's extstore reads its flash file",
    "mooncake": "Mooncake (use_uring off) reads its SSD files",
}
