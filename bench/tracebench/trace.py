"""Request traces in the Mooncake FAST'25 format: one JSON object per line with ``timestamp``
(arrival, ms from the start), ``input_length`` and ``output_length`` (tokens) and ``hash_ids``,
the request's prefix KV blocks of :data:`BLOCK_TOKENS` tokens as integer ids (equal ids = the
same reusable block). Any file of this format loads; bench/traces/README.md describes the one
that ships with the benchmark."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BLOCK_TOKENS", "Request", "Trace", "load", "DEFAULT_TRACE"]

BLOCK_TOKENS = 512
DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "traces" / "conversation_trace.jsonl"


@dataclass(frozen=True)
class Request:
    """One request of a trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple

    def block_tokens(self, i: int) -> int:
        """Tokens of block ``i``: BLOCK_TOKENS, except the last block, which holds what is left
        of ``input_length`` (a partial block)."""
        if i < len(self.hash_ids) - 1:
            return BLOCK_TOKENS
        return max(1, min(BLOCK_TOKENS, self.input_length - BLOCK_TOKENS * (len(self.hash_ids) - 1)))

    def prefix_tokens(self, n: int) -> int:
        """Tokens of the first ``n`` blocks."""
        if n <= 0:
            return 0
        if n < len(self.hash_ids):
            return n * BLOCK_TOKENS
        return BLOCK_TOKENS * (len(self.hash_ids) - 1) + self.block_tokens(len(self.hash_ids) - 1)


@dataclass(frozen=True)
class Trace:
    """The requests of a trace file, in file order (which is arrival order)."""

    path: str
    requests: tuple

    @property
    def accesses(self) -> int:
        """Block accesses: the sum of every request's block count."""
        return sum(len(r.hash_ids) for r in self.requests)

    @property
    def tokens(self) -> int:
        return sum(r.prefix_tokens(len(r.hash_ids)) for r in self.requests)

    @property
    def distinct(self) -> int:
        """Distinct block ids."""
        return len({h for r in self.requests for h in r.hash_ids})

    @property
    def duration_s(self) -> float:
        if not self.requests:
            return 0.0
        return (self.requests[-1].timestamp_ms - self.requests[0].timestamp_ms) / 1000.0

    def head(self, n: int | None) -> "Trace":
        """The first ``n`` requests (None: all)."""
        if n is None or n >= len(self.requests):
            return self
        return Trace(self.path, self.requests[:n])


def _field(obj: dict, name: str, where: str):
    if name not in obj:
        raise ValueError(f"{where}: no {name!r} field")
    return obj[name]


def _count(v, name: str, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{where}: {name} must be a non-negative integer, not {v!r}")
    return v


def parse_request(obj, where: str) -> Request:
    """One request from its decoded JSON line; ValueError naming ``where`` if it is malformed."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a request is a JSON object, not {type(obj).__name__}")
    ts = _field(obj, "timestamp", where)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
        raise ValueError(f"{where}: timestamp must be a non-negative number of ms, not {ts!r}")
    ids = _field(obj, "hash_ids", where)
    if not isinstance(ids, list):
        raise ValueError(f"{where}: hash_ids must be a list of integers")
    for h in ids:
        if isinstance(h, bool) or not isinstance(h, int):
            raise ValueError(f"{where}: hash_ids holds {h!r}, not an integer")
    return Request(
        timestamp_ms=ts,
        input_length=_count(_field(obj, "input_length", where), "input_length", where),
        output_length=_count(obj.get("output_length", 0), "output_length", where),
        hash_ids=tuple(ids),
    )


def load(path: str | Path, limit: int | None = None) -> Trace:
    """The trace at ``path`` (its first ``limit`` requests); blank lines are skipped. Raises
    ValueError naming the line of the first malformed request, or when timestamps go backwards."""
    reqs: list = []
    last = 0.0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(reqs) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            r = parse_request(obj, where)
            if r.timestamp_ms < last:
                raise ValueError(f"{where}: timestamp {r.timestamp_ms} is before the previous request's {last}")
            last = r.timestamp_ms
            reqs.append(r)
    if not reqs:
        raise ValueError(f"{path}: no requests")
    return Trace(str(path), tuple(reqs))
