"""The replay's side-by-side ratios for the goals of issue 41 (docs/benchmarks.md), printed
under the table: for each capacity, from the rows of one run only (ratios of rows measured
in different runs would compare the machine's load, not the backends).

1. one fluxkv node, SSD off: its GiB/s over memcached's (goal 3x) and Redis's (4x), and its
   hit rate against every other backend's;
2. N fluxkv owners against one node, same DRAM: hit rate (at least one node's) and GiB/s (2x),
   with a client on every owner (a run with fewer client processes than owners says so), and
   how the processes shared the CPUs (``--host-cpus``: emulated hosts, tracebench/hosts.py);
3. SSD on: fluxkv's hit rate against memcached with extstore, and one node's as a part of
   the infinite cache's (0.95);
5. fluxkv against Mooncake Store where its rows ran: GiB/s (2x) and hit rate.

A goal whose rows did not run (or failed) is left out."""

from __future__ import annotations

from pressure.backends.base import PAGE_CACHED_FLASH

from .report import trouble

__all__ = ["lines"]


def _ok(rows: list, backend: str, owners=None, ssd=None) -> dict | None:
    for r in rows:
        if (r["backend"] == backend and r["status"] == "ok" and (owners is None or r["owners"] == owners)
                and (ssd is None or r["ssd"] == ssd)):
            return r
    return None


def _mark(ok: bool) -> str:
    return "met" if ok else "not met"


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _caveats(mine: dict, other: dict, name: str) -> str:
    """How the two rows' calls differ (a byte store's access mode) and what went wrong in
    either (report.trouble), as a bracket after the line; "" when nothing is to say."""
    notes = []
    if other.get("access") and other["access"] != "batch":
        notes.append(f"{name} {other['access']}")
    if name == "mooncake":
        # (backends.MOONCAKE_VARIANT: the cluster benchmark runs it per process instead; a review)
        notes.append("mooncake as one dedicated store: its every hit crosses TCP loopback, fluxkv's local hits are shared-memory copies")
    for who, r in (("fluxkv", mine), (name, other)):
        if t := trouble(r):
            notes.append(f"{who}: {t}")
    return f" [{'; '.join(notes)}]" if notes else ""


def _speed(goal: str, what: str, mine: dict, other: dict, name: str, want: float) -> str | None:
    ratio = _ratio(mine["gib_per_s"], other["gib_per_s"])
    if ratio is None:
        return None
    return (f"goal {goal}  {what}: fluxkv {mine['gib_per_s']:.2f} GiB/s = {ratio:.2f}x {name}'s {other['gib_per_s']:.2f}"
            f" (goal >= {want:g}x: {_mark(ratio >= want)})" + _caveats(mine, other, name))


def _cpu(goal: str, what: str, mine: dict, other: dict, name: str) -> str | None:
    """CPU per GiB moved, clients and servers together (no goal of its own: where the cores
    do not bind, GiB/s follows its inverse)."""
    a, b = mine.get("cpu_s_per_gib"), other.get("cpu_s_per_gib")
    if not a or not b:
        return None
    return (f"goal {goal}  {what}: fluxkv {a:.2f} CPU-s per GiB (clients {mine['client_cpu_s']:.1f} s, servers "
            f"{mine['server_cpu_s']:.1f} s), {name} {b:.2f}: {b / a:.2f}x fluxkv's (information)")


def _hosts(many: dict, one: dict) -> str:
    """How the rows' processes shared the CPUs (tracebench/hosts.py)."""
    a, b = many.get("cpus_per_host"), one.get("cpus_per_host")
    if a and a == b:
        return f" [hosts emulated: {a:g} CPUs each]"
    if a or b:
        return " [rows of different --host-cpus: not comparable]"
    return " [every process on this machine's cores: --host-cpus emulates hosts]"


def _hits(goal: str, what: str, mine: dict, other: dict, name: str) -> str:
    a, b = mine["hit_rate"], other["hit_rate"]
    return (f"goal {goal}  {what}: fluxkv hit {100 * a:.1f} % against {name}'s {100 * b:.1f} % (goal >=: {_mark(a >= b)})"
            + _caveats(mine, {k: v for k, v in other.items() if k != "access"}, name))


def _for_capacity(rows: list) -> list:
    out = []
    one_off = _ok(rows, "fluxkv", 1, False)
    if one_off:
        for name, want in (("memcached", 3.0), ("redis", 4.0)):
            other = _ok(rows, name, ssd=False)
            if other and (line := _speed("1", "one node, SSD off", one_off, other, name, want)):
                out.append(line)
        for name in ("memcached", "redis", "mooncake"):
            if other := _ok(rows, name, ssd=False):
                out.append(_hits("1", "one node, SSD off", one_off, other, name))
        for name in ("memcached", "redis"):
            other = _ok(rows, name, ssd=False)
            if other and (line := _cpu("1", "one node, SSD off", one_off, other, name)):
                out.append(line)
    owners = sorted({r["owners"] for r in rows if r["backend"] == "fluxkv" and r["status"] == "ok" and (r["owners"] or 0) > 1})
    for n in owners:
        for ssd in (False, True):
            many, one = _ok(rows, "fluxkv", n, ssd), _ok(rows, "fluxkv", 1, ssd)
            if many and one:
                state = "on" if ssd else "off"
                procs = many.get("procs")
                note = "" if procs is None or procs >= n else f" [clients on {procs} of {n} owners: the goal wants --procs >= {n}]"
                out.append(_hits("2", f"{n} owners, SSD {state}", many, one, "one node") + note)
                if line := _speed("2", f"{n} owners, SSD {state}", many, one, "one node", 2.0):
                    out.append(line + note + _hosts(many, one))
    extstore = _ok(rows, "memcached", ssd=True)
    for r in sorted((r for r in rows if r["backend"] == "fluxkv" and r["status"] == "ok" and r["ssd"]), key=lambda r: r["owners"] or 0):
        if extstore:
            out.append(_hits("3", f"{r['owners']} owner(s), SSD on", r, extstore, "memcached extstore"))
    one_on, ideal = _ok(rows, "fluxkv", 1, True), _ok(rows, "ideal")
    if one_on and ideal and ideal["hit_rate"]:
        part = one_on["hit_rate"] / ideal["hit_rate"]
        out.append(f"goal 3  one node, SSD on: fluxkv hit {100 * one_on['hit_rate']:.1f} % = {part:.4f} of the infinite cache's "
                   f"{100 * ideal['hit_rate']:.1f} % (goal >= 0.95: {_mark(part >= 0.95)})")
    for r in rows:
        if r["backend"] != "mooncake" or r["status"] != "ok":
            continue
        mine = _ok(rows, "fluxkv", r["owners"], r["ssd"])
        if mine:
            what = f"{r['owners']} owner(s), SSD {'on' if r['ssd'] else 'off'}"
            if line := _speed("5", what, mine, r, "mooncake", 2.0):
                out.append(line)
            out.append(_hits("5", what, mine, r, "mooncake"))
    return out


# The kernel's shared-memory huge page policies that give an owner's segment huge pages.
HUGE_POLICIES = ("always", "within_size", "advise", "force")


def lines(rows: list) -> list:
    """The goal lines of rows, each capacity under a heading of its own, and a note when
    fluxkv's segments had no huge pages to have (docs/running.md, Huge pages)."""
    out = []
    for cap in sorted({r["capacity_blocks"] for r in rows}):
        got = _for_capacity([r for r in rows if r["capacity_blocks"] == cap])
        if got:
            out.append(f"issue 41 goals at {cap:,} blocks (this run's rows):")
            out += ["  " + g for g in got]
    small = sorted({r["shmem_thp"] or "unknown" for r in rows
                    if r["backend"] == "fluxkv" and "shmem_thp" in r and r["shmem_thp"] not in HUGE_POLICIES})
    if small:
        out.append(f"note: fluxkv's segments were on 4 KiB pages (shmem_enabled {', '.join(small)}): "
                   "docs/running.md, Huge pages")
    cached = sorted({r["backend"] for r in rows if r.get("ssd") and r.get("status") == "ok" and r["backend"] in PAGE_CACHED_FLASH})
    if cached:
        out.append(f"note: {' and '.join(PAGE_CACHED_FLASH[b] for b in cached)} through the page cache, fluxkv reads "
                   "its own with O_DIRECT from the device: the SSD-on GiB/s and latencies of "
                   f"{', '.join(cached)} are those of memory the machine had spare, not of its flash (hit rates are not affected)")
    return out

