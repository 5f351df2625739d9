"""Cases and the matrices that list them: the full cross product (``make bench``) and the quick
preset (``make bench-quick``)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from . import backends
from .sizes import format_size

MODES = ("holder", "bytes", "cuda")
ON_MISS = ("none", "put")
# The seed's worker layouts: cN = N threads in all, over processes of at most 4 threads.
WORKERS = {"c2": (1, 2), "c4": (1, 4), "c8": (2, 4), "c16": (4, 4)}
SEED_PAYLOADS = ("1MiB-128", "4MiB-128", "8MiB-128", "16MiB-128")


def parse_workers(text: str) -> tuple[int, int]:
    """``c8`` → (2, 4); ``3x2`` → (3, 2)."""
    t = text.strip().lower()
    if t in WORKERS:
        return WORKERS[t]
    m = re.fullmatch(r"(\d+)x(\d+)", t)
    if m and int(m.group(1)) > 0 and int(m.group(2)) > 0:
        return int(m.group(1)), int(m.group(2))
    raise ValueError(f"workers {text!r}: want c2, c4, c8, c16 or PROCSxTHREADS")


def workers_label(procs: int, threads: int) -> str:
    return f"c{procs * threads}"


@dataclass(frozen=True)
class Case:
    backend: str
    ssd: bool
    mode: str
    on_miss: str
    order: str
    payload_bytes: int
    procs: int
    threads: int
    variant: str | None = None

    @property
    def concurrency(self) -> str:
        return workers_label(self.procs, self.threads)

    def label(self) -> str:
        b = self.backend + (f"/{self.variant}" if self.variant else "")
        rt = "get-only" if self.on_miss == "none" else "read-through"
        return f"{b} ssd={'on' if self.ssd else 'off'} {self.mode} {rt} {format_size(self.payload_bytes)} {self.concurrency}({self.procs}x{self.threads}) order={self.order}"

    def to_json(self) -> dict:
        return asdict(self)


def _variants(backend: str):
    try:
        return backends.load(backend).Server.variants
    except ImportError:
        return (None,)


def _runs(backend: str, variant, ssd: bool) -> bool:
    """False for a variant that only differs from another with SSD on (the backend's
    ``Server.ssd_only_variants``, e.g. ``mooncake-default-offload``): its SSD-off case is not run."""
    if ssd or variant is None:
        return True
    try:
        return variant not in getattr(backends.load(backend).Server, "ssd_only_variants", ())
    except ImportError:
        return True


def cross(backend_names, ssd_states, modes, on_miss, orders, payloads, workers) -> list[Case]:
    """Every combination, ordered payload → workers → mode → on_miss → order → backend → SSD,
    so the cases of one chart panel run next to each other."""
    out = []
    for p in payloads:
        for procs, threads in workers:
            for mode in modes:
                for om in on_miss:
                    for order in orders:
                        for b in backend_names:
                            for v in _variants(b):
                                for ssd in ssd_states:
                                    if _runs(b, v, ssd):
                                        out.append(Case(b, ssd, mode, om, order, p, procs, threads, v))
    return out


def quick(backend_names, payload: int, workers: tuple[int, int], order: str) -> list[Case]:
    """The quick preset: get-only in bytes mode for every backend with SSD off and on, fluxkv in
    holder mode (SSD off and on), fluxkv SSD-off read-through in bytes mode."""
    procs, threads = workers
    out = []
    for b in backend_names:
        for v in _variants(b):
            for ssd in (False, True):
                if _runs(b, v, ssd):
                    out.append(Case(b, ssd, "bytes", "none", order, payload, procs, threads, v))
    if "fluxkv" in backend_names:
        for ssd in (False, True):
            out.append(Case("fluxkv", ssd, "holder", "none", order, payload, procs, threads))
        out.append(Case("fluxkv", False, "bytes", "put", order, payload, procs, threads))
    return out
