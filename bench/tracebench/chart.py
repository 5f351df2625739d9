"""``trace.png``: one panel per capacity; in each, one horizontal bar per backend (hit rate in
% of block accesses, the memory share light and the SSD share dark in the backend's colour of
the pressure charts) above the simulated policies (grey) on the same requests, and a dashed
line at the infinite cache (the ideal). A case that failed is marked n/a in its place; cases
unavailable on this machine are listed under the chart with the reason.

    PYTHONPATH=bench python3 -m tracebench chart OUT/summary.jsonl [-o OUT/trace.png]
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from pressure.chart import COLORS, FALLBACK, save, shades

__all__ = ["render", "load"]

SIM_LABELS = {"sim-lru": "LRU (sim)", "sim-s3fifo": "S3-FIFO (sim)", "sim-belady": "Belady (sim)", "ideal": "infinite (ideal)"}
SIM_ORDER = ("sim-lru", "sim-s3fifo", "sim-belady")
_SIM_GREY = "#9a9a9a"


def load(path) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _label(r: dict) -> str:
    shape = f" · {r['owners']} owners" if (r.get("owners") or 1) > 1 else ""
    return f"{r['backend']}{shape} · SSD {'on' if r['ssd'] else 'off'}"


def _split(r: dict) -> tuple:
    """(memory share, SSD share) of the hit rate; all memory when sources are unknown."""
    hr = r["hit_rate"] or 0.0
    s = r.get("hits_by_source") or {}
    if not r.get("sources_complete") or not r.get("hits"):
        return hr, 0.0
    ssd = (s.get("ssd_local") or 0) + (s.get("ssd_remote") or 0)
    return hr * (1 - ssd / r["hits"]), hr * ssd / r["hits"]


def default_title(rows: list) -> str:
    """What was replayed, from the rows' context fields."""
    from .presets import describe_block

    r = rows[0]
    pace = f"timestamps at {r['speed']:g}x" if r["speed"] else "as fast as possible"
    return (f"{Path(r['trace_file']).name}: {r['requests']:,} requests · {describe_block(r['block_bytes'])} · "
            f"{r['procs']} processes, {pace}")


def figure(rows: list, title: str | None = None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    skipped: dict = {}  # reason -> labels of the cases it kept from running
    for r in rows:
        if r["status"] == "unavailable":
            skipped.setdefault(r.get("reason", ""), set()).add(_label(r))
    title = title or default_title(rows)
    rows = [r for r in rows if r["status"] != "unavailable"]
    if not rows:
        raise ValueError("no case ran: nothing to chart")
    caps = sorted({r["capacity_blocks"] for r in rows})
    measured = [r for r in rows if r["owners"] is not None]
    series = sorted({(_label(r), r["backend"], r.get("owners") or 1, bool(r["ssd"])) for r in measured},
                    key=lambda s: (list(COLORS).index(s[1]) if s[1] in COLORS else 99, s[2], s[3]))
    sims = {r["backend"] for r in rows if r["owners"] is None}
    labels = [s[0] for s in series] + [SIM_LABELS[n] for n in SIM_ORDER if n in sims]
    top = max([r["hit_rate"] or 0 for r in rows] + [0.01]) * 100
    notes = ["bars: memory share light, SSD share dark; grey: offline simulations on the same requests"]
    notes += [textwrap.shorten(f"not run ({', '.join(sorted(labs))}): {why}", 160) for why, labs in sorted(skipped.items())]
    width = 5.2 * len(caps) + 1.8
    fig, axes = plt.subplots(1, len(caps), figsize=(width, 0.42 * len(labels) + 1.9 + 0.16 * len(notes)), sharey=True, squeeze=False)
    for ax, cap in zip(axes[0], caps):
        here = [r for r in rows if r["capacity_blocks"] == cap]
        by_label = {(_label(r) if r["owners"] is not None else SIM_LABELS.get(r["backend"], r["backend"])): r for r in here}
        ys = range(len(labels))[::-1]
        for y, lab in zip(ys, labels):
            r = by_label.get(lab)
            if r is None:
                continue
            if r["status"] != "ok" or r["hit_rate"] is None:
                ax.text(0.5, y, f"n/a: {r['status']}", va="center", fontsize=8, color="#888888")
                continue
            if r["owners"] is None:
                ax.barh(y, 100 * r["hit_rate"], color=_SIM_GREY, height=0.7)
            else:
                i = [s[0] for s in series].index(lab)
                mem_c, ssd_c = shades(r["backend"], i) if r["backend"] in COLORS else (FALLBACK[i % 4], FALLBACK[i % 4])
                m, s = _split(r)
                ax.barh(y, 100 * m, color=mem_c, height=0.7)
                if s:
                    ax.barh(y, 100 * s, left=100 * m, color=ssd_c, height=0.7)
            held = f"  (holds {r['held_blocks']:,})" if r.get("held_blocks") is not None else ""
            ax.text(100 * r["hit_rate"] + top * 0.01, y, f"{100 * r['hit_rate']:.1f}{held}", va="center", fontsize=8)
        ideal = next((r for r in here if r["backend"] == "ideal"), None)
        if ideal is not None:
            ax.axvline(100 * ideal["hit_rate"], color="black", linestyle="--", linewidth=1)
            ax.text(100 * ideal["hit_rate"], len(labels) - 0.75, f" ideal {100 * ideal['hit_rate']:.1f}", fontsize=8, va="center",
                    bbox=dict(facecolor="white", edgecolor="none", pad=1))
        frac = here[0]["capacity_fraction"]
        ax.set_title(f"{cap:,} blocks ({100 * frac:.1f} % of distinct)", fontsize=10)
        ax.set_xlim(0, top * 1.3)
        ax.set_ylim(-0.6, len(labels) - 0.4)
        ax.set_xlabel("prefix hit rate, % of block accesses")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(list(range(len(labels))[::-1]))
    axes[0][0].set_yticklabels(labels, fontsize=9)
    fig.suptitle(textwrap.fill(title, int(width * 13)), fontsize=10)
    fig.text(0.01, 0.01, "\n".join(notes), fontsize=7, color="#555555", va="bottom")
    fig.tight_layout(rect=(0, 0.02 + 0.025 * len(notes), 1, 1))
    return fig


def render(rows: list, out_path, title: str | None = None) -> Path:
    return save(figure(rows, title), out_path)
