"""``pressure.png`` in the seed's style: one panel per payload (columns) and per output mode /
window kind (rows); in each panel, groups by concurrency (c2 … c16) and within a group one bar per
backend × SSD state. A bar is the hit payload GiB/s over the window, split into the memory share
(light shade) and the SSD share (dark shade) of the backend's colour; a red dot on the right axis
is the case's hit rate. Each panel has its own left axis. Cases that did not run are marked n/a.

    python3 -m pressure chart OUT/summary.jsonl [-o OUT/pressure.png]
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from . import backends
from .sizes import approx_size, format_size, label_size

COLORS = {"fluxkv": "#1f6fb4", "memcached": "#e8710a", "redis": "#129c8f", "mooncake": "#7b4fb0"}
FALLBACK = ("#8c564b", "#bcbd22", "#e377c2", "#7f7f7f")
MODE_ORDER = {"holder": 0, "bytes": 1, "cuda": 2}
ORDER_ORDER = {"random": 0, "hot-first": 1, "cold-first": 2}


def load(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _mix(hex_color: str, with_white: float) -> tuple:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(hex_color)
    if with_white >= 0:
        return (r + (1 - r) * with_white, g + (1 - g) * with_white, b + (1 - b) * with_white)
    k = 1 + with_white
    return (r * k, g * k, b * k)


def shades(backend: str, i: int = 0) -> tuple:
    """(memory, ssd) colours: light and dark of the backend's colour."""
    base = COLORS.get(backend, FALLBACK[i % len(FALLBACK)])
    return _mix(base, 0.55), _mix(base, -0.25)


def series_key(r: dict) -> tuple:
    names = list(backends.names()) + ["mooncake"]
    bi = names.index(r["backend"]) if r["backend"] in names else len(names)
    return (bi, r["backend"], r.get("variant") or "", bool(r["ssd"]))


def row_key(r: dict) -> tuple:
    return (MODE_ORDER.get(r["mode"], 9), r["mode"], 0 if r["on_miss"] == "none" else 1, r["on_miss"], ORDER_ORDER.get(r["order"], 9), r["order"])


def row_title(k: tuple) -> str:
    _, mode, _, on_miss, _, order = k
    kind = "get-only" if on_miss == "none" else "read-through (a miss re-puts)"
    t = f"{mode} · {kind}"
    if order != "random":
        t += f" · bootstrap {order}"
    return t


# Long variant names under a bar, abbreviated (explained under the chart); anything else long is wrapped.
SHORT_VARIANTS = {"dedicated_owner": "ded. owner", "per_process": "per-proc", "mooncake-default-offload": "default offload"}
LABEL_WIDTH = 10  # characters per line of a bar's name (few bars, horizontal labels)


def series_label(s: tuple, short: bool = False) -> str:
    """A bar's name: the backend, its variant (abbreviated, wrapped at LABEL_WIDTH) and the SSD state,
    one per line; ``short`` (many bars, labels turned 90°): one line."""
    _, backend, variant, ssd = s
    v = SHORT_VARIANTS.get(variant, variant) if variant else ""
    state = f"SSD {'on' if ssd else 'off'}"
    if short:
        return f"{backend}{'/' + v if v else ''} {'on' if ssd else 'off'}"
    lines = textwrap.wrap(backend, LABEL_WIDTH, break_on_hyphens=True)
    if v:
        lines += textwrap.wrap(v, LABEL_WIDTH, break_on_hyphens=True)
    return "\n".join(lines + [state])


def abbreviation_note(records: list[dict]) -> str | None:
    used = sorted({r["variant"] for r in records if r.get("variant") in SHORT_VARIANTS})
    if not used:
        return None
    return "names: " + "; ".join(f"{SHORT_VARIANTS[v]} = {v}" for v in used)


def conc_key(r: dict) -> tuple:
    return (r["procs"] * r["threads"], r["procs"])


def _pressure_name(r: dict) -> str:
    return r["backend"] + (f"/{r['variant']}" if r.get("variant") else "") + f" SSD {'on' if r['ssd'] else 'off'} {r['mode']}"


def not_run_notes(records: list[dict], name=_pressure_name) -> list[str]:
    """One line per reason: which series did not run (``name(record)``), and why."""
    by_reason: dict[str, list] = {}
    for r in records:
        if r["status"] == "unavailable":
            by_reason.setdefault(r.get("reason") or "unavailable", []).append(name(r))
    out = []
    for reason, names in by_reason.items():
        uniq = sorted(set(names))
        n = len(names)
        what = ", ".join(uniq[:6]) + (f" and {len(uniq) - 6} more" if len(uniq) > 6 else "")
        reason = reason if len(reason) <= 240 else reason[:237] + "..."
        out.append(f"not run ({n} case{'s' if n > 1 else ''}): {what} - {reason}")
    return out


def render(records: list[dict], out_path, title: str | None = None) -> Path:
    return save(figure(records, title), out_path)


def save(fig, out_path) -> Path:
    """Writes fig as a PNG at out_path and frees it."""
    import matplotlib.pyplot as plt

    out_path = Path(out_path)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def figure(records: list[dict], title: str | None = None):
    """The chart as a matplotlib Figure (``render`` saves it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import patheffects
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if not records:
        raise ValueError("no records to chart")
    all_records = records
    # Cases that could not run here leave no empty slot: they are listed under the chart.
    skipped = not_run_notes(records)
    records = [r for r in records if r["status"] != "unavailable"] or records[:1]
    rows = sorted({row_key(r) for r in records})
    payloads = sorted({r["payload_bytes"] for r in records})
    row_series = {rk: sorted({series_key(r) for r in records if row_key(r) == rk}) for rk in rows}
    concs = sorted({conc_key(r) for r in records})
    by_cell: dict[tuple, dict] = {}
    for r in records:  # a later record of the same case replaces an earlier one
        by_cell[(row_key(r), r["payload_bytes"], conc_key(r), series_key(r))] = r

    nslots = max(len(s) for s in row_series.values())
    max_bars = nslots * len(concs)
    annotate = max_bars <= 12  # few bars: numbers on the bars, names under them
    panel_w = max(4.2, (0.7 if annotate else 0.24) * max_bars + 1.4)
    # One payload (the quick preset): its panels side by side instead of stacked.
    side_by_side = len(payloads) == 1 and len(rows) > 1
    grid = (1, len(rows)) if side_by_side else (len(rows), len(payloads))
    fig_w = min(40.0, max(8.0, panel_w * grid[1] + 1.0))
    abbrev = abbreviation_note(records)
    skipped = ([abbrev] if abbrev else []) + skipped
    skipped = [w for line in skipped for w in textwrap.wrap(line, int(fig_w * 14), subsequent_indent="    ")]
    fig_h = 3.9 * grid[0] + 2.4 + 0.18 * len(skipped)
    fig, axes = plt.subplots(grid[0], grid[1], figsize=(fig_w, fig_h), squeeze=False)
    backend_index = {}
    width = 0.8 / nslots

    for ri, rk in enumerate(rows):
        series = row_series[rk]
        nb = len(series)
        for ci, payload in enumerate(payloads):
            ax = axes[0][ri] if side_by_side else axes[ri][ci]
            first = side_by_side or ci == 0
            last = ri == len(rows) - 1 if side_by_side else ci == len(payloads) - 1
            ax2 = ax.twinx()
            bars = []  # (x, record)
            ticks, ticklabels = [], []
            for gi, ck in enumerate(concs):
                for si, s in enumerate(series):
                    x = gi + (si - (nb - 1) / 2) * width
                    ticks.append(x)
                    ticklabels.append(series_label(s, short=not annotate))
                    backend_index.setdefault(s[1], len(backend_index))
                    r = by_cell.get((rk, payload, ck, s))
                    if r is not None:
                        bars.append((x, s, r))
            ymax = max([r["hit_gib_s"] or 0.0 for _, _, r in bars if r["status"] not in ("unavailable", "failed")] + [0.0])
            top = ymax * 1.15 if ymax > 0 else 1.0
            ax.set_ylim(0, top)
            dots_x, dots_y = [], []
            for x, s, r in bars:
                mem_c, ssd_c = shades(s[1], backend_index[s[1]])
                if r["status"] in ("unavailable", "failed"):
                    ax.text(x, top * 0.02, "n/a" if r["status"] == "unavailable" else "failed", rotation=90, ha="center", va="bottom",
                            fontsize=8, color="#888888" if r["status"] == "unavailable" else "#c00000")
                    continue
                total = r["hit_gib_s"] or 0.0
                if r["complete"]:
                    mem, ssd = r["memory_gib_s"] or 0.0, r["ssd_gib_s"] or 0.0
                    ax.bar(x, mem, width * 0.9, color=mem_c, edgecolor="white", linewidth=0.5)
                    ax.bar(x, ssd, width * 0.9, bottom=mem, color=ssd_c, edgecolor="white", linewidth=0.5)
                else:  # sources unknown: the whole bar grey, hatched
                    ax.bar(x, total, width * 0.9, color="#d0d0d0", hatch="xx", edgecolor="#808080", linewidth=0.5)
                if annotate:
                    inside = total >= 0.3 * top
                    ax.text(x, top * 0.02 if inside else total + top * 0.01, f"{total:.2f} GiB/s", rotation=90, ha="center", va="bottom",
                            fontsize=7, color="#111111", path_effects=[patheffects.withStroke(linewidth=2.2, foreground="white")])
                if r["hit_rate"] is not None:
                    dots_x.append(x)
                    dots_y.append(r["hit_rate"] * 100)
            ax2.set_ylim(0, 115)
            ax2.scatter(dots_x, dots_y, color="#d62728", s=24, zorder=5, edgecolors="white", linewidths=0.6)
            if annotate:
                for x, y in zip(dots_x, dots_y):
                    ax2.annotate(f"{y:.1f}%", (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7, color="#b01010",
                                 bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.75))
            ax2.set_yticks([0, 25, 50, 75, 100])
            ax2.tick_params(axis="y", labelsize=7, colors="#d62728")
            if last:
                ax2.set_ylabel("hit rate %", color="#d62728", fontsize=8)
            ax.set_xticks(ticks)
            ax.set_xticklabels(ticklabels, fontsize=7, rotation=0 if annotate else 90)
            # the group's name below the longest bar name (lines of 7 pt text, or characters when turned)
            if annotate:
                below = 8 + 8.6 * max(t.count("\n") + 1 for t in ticklabels)
            else:
                below = 8 + 4.4 * max(len(t) for t in ticklabels)
            for gi, ck in enumerate(concs):
                ax.annotate(f"c{ck[0]} ({ck[1]}x{ck[0] // ck[1]})", (gi, 0), xycoords=ax.get_xaxis_transform(), xytext=(0, -below),
                            textcoords="offset points", ha="center", va="top", fontsize=8, fontweight="bold")
            ax.set_xlim(-0.5, len(concs) - 0.5)
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(axis="y", alpha=0.25)
            ax.set_axisbelow(True)
            if side_by_side:
                ax.set_ylabel("hit GiB/s", fontsize=8)
                ax.set_title(f"{row_title(rk)}\npayload {label_size(payload)}", fontsize=9)
            else:
                if first:
                    ax.set_ylabel(f"{row_title(rk)}\nhit GiB/s", fontsize=8)
                ax.set_title(f"payload {label_size(payload)}", fontsize=9)

    handles = []
    for b, i in sorted(backend_index.items(), key=lambda kv: kv[1]):
        m, s = shades(b, i)
        handles.append(Patch(color=m, label=f"{b}: memory hits"))
        if any(r["backend"] == b and r["ssd"] for r in records if r["status"] not in ("unavailable", "failed")):
            handles.append(Patch(color=s, label=f"{b}: SSD hits"))
    handles.append(Patch(facecolor="#d0d0d0", hatch="xx", edgecolor="#808080", label="sources incomplete"))
    handles.append(Line2D([], [], marker="o", color="#d62728", linestyle="", label="hit rate (right axis)"))
    ncol = min(len(handles), max(2, int(fig_w / 2.6)))
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, (0.1 + 0.18 * len(skipped)) / fig_h))
    legend_rows = -(-len(handles) // ncol)
    foot = 0.15
    for i, line in enumerate(reversed(skipped)):
        fig.text(0.01, (0.08 + 0.18 * i) / fig_h, line, fontsize=7, color="#555555", ha="left", va="bottom")
        foot += 0.18
    r0 = records[0]
    ssd_max = max(r["ssd_bytes"] or 0 for r in all_records)
    sub = (
        f"every backend: DRAM {format_size(r0['dram_bytes'])}, SSD {format_size(ssd_max) if ssd_max else '-'} when on · dataset {approx_size(r0['dataset_bytes'])} "
        f"({r0['dataset_bytes'] / r0['dram_bytes']:.2f}x DRAM) · Zipf θ {r0['zipf_theta']} · warmup {r0['warmup_s']:g} s, window {r0['window_s']:g} s\n"
        f"bars: hit payload GiB/s over the window (light = memory hits, dark = SSD hits) · red dots: hit rate = hits / (hits + misses + errors)"
    )
    fig.suptitle((title or "fluxkv pressure benchmark") + "\n" + sub, fontsize=9)
    fig.tight_layout(rect=(0, (foot + 0.15 + 0.22 * legend_rows) / fig_h, 1, 1 - 0.6 / fig_h))
    return fig


# -- cluster.png (python3 -m pressure cluster) -----------------------------------------------------

# Bars of a cluster panel, left to right; anything else (another variant) follows in name order.
CLUSTER_SERIES = tuple(
    [("tcp-raw", None, False, "none", "raw")]
    + [(b, "mixed", ssd, om, mode) for b in ("fluxkv", "mooncake") for mode in ("holder", "bytes") for om in ("none", "put") for ssd in (False, True)]
    + [(b, path, None, "none", mode) for b in ("fluxkv", "mooncake") for path in ("remote-memory", "remote-ssd", "local-ssd") for mode in ("holder", "bytes")]
)
# Shades of a backend's colour for the four places of a hit, light (memory here) to dark (SSD elsewhere).
PLACE_SHADES = (("memory_local", 0.65), ("memory_remote", 0.3), ("ssd_local", -0.1), ("ssd_remote", -0.4))
PLACE_LABELS = {"memory_local": "memory, this owner", "memory_remote": "memory, pulled from another owner",
                "ssd_local": "SSD, this owner", "ssd_remote": "SSD, another owner's"}


def cluster_series(r: dict) -> tuple:
    if r["backend"] == "tcp-raw":
        return CLUSTER_SERIES[0]
    ssd = bool(r["ssd"]) if r.get("path") == "mixed" else None
    return (r["backend"], r.get("path"), ssd, r.get("on_miss") or "none", r.get("mode"))


def _series_order(s: tuple) -> tuple:
    return (CLUSTER_SERIES.index(s), "") if s in CLUSTER_SERIES else (len(CLUSTER_SERIES), repr(s))


def cluster_label(s: tuple) -> str:
    """A bar's name, one item a line: backend, path, SSD state (mixed), read-through, output mode."""
    backend, path, ssd, on_miss, mode = s
    if backend == "tcp-raw":
        return "tcp-raw\n(limit, 2 procs)"
    lines = [backend, path or "?"]
    if ssd is not None:
        lines.append(f"SSD {'on' if ssd else 'off'}")
    if on_miss == "put":
        lines.append("read-thr")
    return "\n".join(lines + [str(mode)])


def render_cluster(records: list[dict], out_path, title: str | None = None) -> Path:
    return save(cluster_figure(records, title), out_path)


def cluster_figure(records: list[dict], title: str | None = None):
    """One panel per payload (columns) and concurrency (rows); in each, one bar per series
    (``CLUSTER_SERIES``): hit GiB/s stacked by where the hits came from, its ratio to tcp-raw
    (the dashed line) under the number, hit rate as a red dot on the right axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import patheffects
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if not records:
        raise ValueError("no records to chart")
    skipped = not_run_notes(records, name=lambda r: " ".join(cluster_label(cluster_series(r)).split("\n")))
    ran = [r for r in records if r["status"] != "unavailable"] or records[:1]
    payloads = sorted({r["payload_bytes"] for r in ran})
    concs = sorted({_threads(r) for r in ran})
    series = sorted({cluster_series(r) for r in ran}, key=_series_order)
    cell = {(r["payload_bytes"], _threads(r), cluster_series(r)): r for r in ran}
    fig_w = min(40.0, max(11.0, len(payloads) * (0.75 * len(series) + 1.6) + 1.0))
    skipped = [w for line in skipped for w in textwrap.wrap(line, int(fig_w * 14), subsequent_indent="    ")]
    fig_h = 4.6 * len(concs) + 2.4 + 0.18 * len(skipped)
    fig, axes = plt.subplots(len(concs), len(payloads), figsize=(fig_w, fig_h), squeeze=False)
    width = 0.8
    for ri, ck in enumerate(concs):
        for ci, payload in enumerate(payloads):
            ax = axes[ri][ci]
            ax2 = ax.twinx()
            rows = [(i, cell.get((payload, ck, s))) for i, s in enumerate(series)]
            vals = [r["hit_gib_s"] or 0.0 for _, r in rows if r is not None and r["status"] not in ("unavailable", "failed")]
            top = max(vals + [0.0]) * 1.2 or 1.0
            ax.set_ylim(0, top)
            tcp = next((r for _, r in rows if r is not None and r["backend"] == "tcp-raw" and r["status"] == "ok"), None)
            if tcp is not None:
                ax.axhline(tcp["hit_gib_s"], color="#555555", linestyle="--", linewidth=0.8, zorder=1)
                ax.axhline(0.7 * tcp["hit_gib_s"], color="#999999", linestyle=":", linewidth=0.8, zorder=1)
            dots = []
            for x, r in rows:
                if r is None:
                    continue
                if r["status"] in ("unavailable", "failed"):
                    ax.text(x, top * 0.02, "n/a" if r["status"] == "unavailable" else "failed", rotation=90, ha="center", va="bottom",
                            fontsize=8, color="#888888" if r["status"] == "unavailable" else "#c00000")
                    continue
                total = r["hit_gib_s"] or 0.0
                if r["backend"] == "tcp-raw":
                    ax.bar(x, total, width * 0.9, color="#b0b0b0", edgecolor="white", linewidth=0.5)
                elif r.get("memory_local_hits") is not None and r["hits"]:
                    bottom = 0.0
                    for place, shade in PLACE_SHADES:
                        h = total * (r[f"{place}_hits"] or 0) / r["hits"]
                        if h:
                            ax.bar(x, h, width * 0.9, bottom=bottom, color=_mix(COLORS.get(r["backend"], FALLBACK[0]), shade), edgecolor="white", linewidth=0.5)
                        bottom += h
                else:  # places unknown
                    ax.bar(x, total, width * 0.9, color="#d0d0d0", hatch="xx", edgecolor="#808080", linewidth=0.5)
                text = f"{total:.2f} GiB/s"
                if r.get("x_tcp_raw") is not None:
                    text += f"\n{r['x_tcp_raw']:.2f}x tcp"
                if r.get("x_local_ssd") is not None:
                    text += f"\n{r['x_local_ssd']:.2f}x local SSD"
                inside = total >= 0.45 * top
                ax.text(x, top * 0.02 if inside else total + top * 0.01, text, rotation=90, ha="center", va="bottom", fontsize=7, color="#111111",
                        path_effects=[patheffects.withStroke(linewidth=2.2, foreground="white")])
                if r.get("hit_rate") is not None and r["backend"] != "tcp-raw":
                    dots.append((x, r["hit_rate"] * 100))
            ax2.set_ylim(0, 115)
            ax2.scatter([d[0] for d in dots], [d[1] for d in dots], color="#d62728", s=24, zorder=5, edgecolors="white", linewidths=0.6)
            ax2.set_yticks([0, 25, 50, 75, 100])
            ax2.tick_params(axis="y", labelsize=7, colors="#d62728")
            if ci == len(payloads) - 1:
                ax2.set_ylabel("hit rate %", color="#d62728", fontsize=8)
            ax.set_xticks(range(len(series)))
            ax.set_xticklabels([cluster_label(s) for s in series], fontsize=7)
            ax.set_xlim(-0.6, len(series) - 0.4)
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(axis="y", alpha=0.25)
            ax.set_axisbelow(True)
            ax.set_ylabel("hit GiB/s", fontsize=8)
            layouts = sorted({f"{r['procs']}x{r['threads']}" for _, r in rows if r is not None and r["backend"] != "tcp-raw"})
            ax.set_title(f"payload {label_size(payload)} · c{ck} ({', '.join(layouts) or ck} processes x threads; tcp-raw: {ck} connections between two processes)", fontsize=9)
    handles = [Patch(color="#b0b0b0", label="tcp-raw: Go TCP pair, two processes, same bytes (limit)"),
               Line2D([], [], color="#555555", linestyle="--", label="tcp-raw level"), Line2D([], [], color="#999999", linestyle=":", label="0.7x tcp-raw")]
    for b in [b for b in ("fluxkv", "mooncake") if any(r["backend"] == b for r in ran)]:
        for place, shade in PLACE_SHADES:
            handles.append(Patch(color=_mix(COLORS[b], shade), label=f"{b}: {PLACE_LABELS[place]}"))
    handles.append(Patch(facecolor="#d0d0d0", hatch="xx", edgecolor="#808080", label="places incomplete"))
    handles.append(Line2D([], [], marker="o", color="#d62728", linestyle="", label="hit rate (right axis)"))
    ncol = min(len(handles), max(2, int(fig_w / 3.2)))
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=7, frameon=False, bbox_to_anchor=(0.5, (0.1 + 0.18 * len(skipped)) / fig_h))
    legend_rows = -(-len(handles) // ncol)
    for i, line in enumerate(reversed(skipped)):
        fig.text(0.01, (0.08 + 0.18 * i) / fig_h, line, fontsize=7, color="#555555", ha="left", va="bottom")
    foot = 0.15 + 0.18 * len(skipped)
    r0 = next((r for r in ran if r["backend"] == "fluxkv" and r.get("owners")), ran[0])
    ssd_max = max([r.get("ssd_bytes") or 0 for r in ran if r["backend"] == "fluxkv"] + [0])
    sub = (f"fluxkv: {r0.get('owners') or '?'} owners x {format_size(r0.get('owner_dram_bytes') or 0)} DRAM, SSD {format_size(ssd_max) if ssd_max else '-'} "
           f"when on · Zipf θ {r0.get('zipf_theta')} · warmup {r0.get('warmup_s')} s, window {r0.get('window_s')} s · mooncake: dedicated_owner\n"
           "bars: hit payload GiB/s, stacked by where each hit came from (per response) · dashed: tcp-raw, dotted: 0.7x tcp-raw · red dots: hit rate")
    fig.suptitle((title or "fluxkv cluster benchmark") + "\n" + sub, fontsize=9)
    fig.tight_layout(rect=(0, (foot + 0.15 + 0.2 * legend_rows) / fig_h, 1, 1 - 0.6 / fig_h))
    return fig


def _threads(r: dict) -> int:
    return r["procs"] * r["threads"]
