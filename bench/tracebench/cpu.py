"""CPU time of process trees, from /proc: what a replay's servers spent while it ran.

A server's CPU is read from ``/proc/PID/stat`` (utime + stime) for each process of its group
and every descendant of one (a wrapper's real binary, a master's helpers), so a backend that
forks is counted whole. Processes that exit in between are not counted: read it before and
after a replay that keeps its servers up."""

from __future__ import annotations

import os

__all__ = ["tree_cpu_s", "tree_pids"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    # The name (field 2) is in parentheses and may hold spaces: split after its last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return int(rest[1]), (int(rest[11]) + int(rest[12])) / _TICK
    except (IndexError, ValueError):
        return None


def _stats() -> dict:
    """pid -> (parent pid, CPU seconds) of every live process."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (s := _stat(int(name))) is not None:
            stats[int(name)] = s
    return stats


def _tree(pids, stats: dict) -> set:
    """The processes ``pids`` and all their descendants in ``stats``."""
    kids: dict = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    seen, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        todo += kids.get(pid, [])
    return seen


def tree_pids(pids) -> set:
    """The processes ``pids`` and all their descendants now alive (empty without /proc)."""
    return _tree(pids, _stats()) if os.path.isdir("/proc/self") else set()


def tree_cpu_s(pids) -> float | None:
    """User + system CPU seconds of the processes ``pids`` and all their descendants now
    alive; None where /proc cannot be read."""
    if not os.path.isdir("/proc/self"):
        return None
    stats = _stats()
    return sum(stats[p][1] for p in _tree(pids, stats))
