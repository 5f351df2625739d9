"""The chart on synthetic records: the full matrix shape, incomplete and unavailable cases."""

import itertools

from pressure.chart import LABEL_WIDTH, abbreviation_note, figure, render, series_key, series_label
from pressure.harness import SCHEMA
from pressure.sizes import parse_size


def rec(backend, ssd, mode, payload, procs, threads, **kw):
    r = {k: None for k in SCHEMA}
    r.update(backend=backend, variant=None, ssd=ssd, mode=mode, on_miss="none", order="random", payload_bytes=payload, procs=procs,
             threads=threads, concurrency=f"c{procs * threads}", status="ok", complete=True, hits=1000, misses=100, errors=0,
             hit_rate=1000 / 1100, memory_hits=700 if ssd else 1000, ssd_hits=300 if ssd else 0, unknown_hits=0,
             hit_gib_s=2.0, memory_gib_s=1.4 if ssd else 2.0, ssd_gib_s=0.6 if ssd else 0.0, keys=2560,
             dataset_bytes=2560 * payload, dram_bytes=2 << 30, ssd_bytes=(16 << 30) if ssd else 0, warmup_s=5, window_s=30, zipf_theta=0.99)
    r.update(kw)
    return r


def test_full_matrix_chart(tmp_path):
    payloads = [parse_size(p) for p in ("1MiB-128", "4MiB-128", "8MiB-128", "16MiB-128")]
    records = []
    for p, (procs, threads), mode, b, ssd in itertools.product(payloads, [(1, 2), (1, 4), (2, 4), (4, 4)], ["holder", "bytes"],
                                                               ["fluxkv", "memcached", "redis"], [False, True]):
        if b == "redis" and ssd:
            records.append(rec(b, ssd, mode, p, procs, threads, status="unavailable", complete=False, hits=None, hit_rate=None,
                               hit_gib_s=None, reason="redis has no flash tier"))
        elif b == "memcached" and ssd and mode == "holder" and procs == 4:
            records.append(rec(b, ssd, mode, p, procs, threads, complete=False, status="incomplete", memory_hits=0, ssd_hits=0, unknown_hits=1000))
        else:
            records.append(rec(b, ssd, mode, p, procs, threads))
    out = render(records, tmp_path / "full.png", "synthetic")
    assert out.stat().st_size > 20000


def test_single_panel_chart_and_bar_order(tmp_path):
    p = parse_size("1MiB-128")
    records = [rec("redis", False, "bytes", p, 1, 2), rec("fluxkv", True, "bytes", p, 1, 2), rec("fluxkv", False, "bytes", p, 1, 2),
               rec("memcached", True, "bytes", p, 1, 2, status="failed", complete=False, reason="boom")]
    order = [series_key(r)[1:] for r in sorted(records, key=series_key)]
    assert order == [("fluxkv", "", False), ("fluxkv", "", True), ("memcached", "", True), ("redis", "", False)]
    assert render(records, tmp_path / "one.png").stat().st_size > 5000


def _overlaps(a, b, pad=0.5) -> bool:
    return a.x0 < b.x1 - pad and b.x0 < a.x1 - pad and a.y0 < b.y1 - pad and b.y0 < a.y1 - pad


def _label_boxes(fig):
    """Per panel: the bar names' boxes (left to right) and the concurrency groups' boxes, in pixels."""
    import matplotlib.pyplot as plt

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        if not ax.xaxis.get_visible():
            continue  # the hit-rate twin
        ticks = [t.get_window_extent(r) for t in ax.get_xticklabels() if t.get_text()]
        groups = [t.get_window_extent(r) for t in ax.texts if t.get_text().startswith("c") and "(" in t.get_text()]
        out.append((sorted(ticks, key=lambda b: b.x0), groups))
    plt.close(fig)
    return out


def quick_with_mooncake(p):
    recs = []
    for b, v, ssd in [("fluxkv", None, False), ("fluxkv", None, True), ("memcached", None, False), ("memcached", None, True),
                      ("redis", None, False), ("mooncake", "dedicated_owner", False), ("mooncake", "dedicated_owner", True),
                      ("mooncake", "per_process", False), ("mooncake", "per_process", True), ("mooncake", "mooncake-default-offload", True)]:
        recs.append(rec(b, ssd, "bytes", p, 1, 2, variant=v))
    recs += [rec("fluxkv", False, "holder", p, 1, 2), rec("fluxkv", True, "holder", p, 1, 2)]
    return recs


def test_long_backend_names_do_not_overlap(tmp_path):
    """issue 14 item 5: ``mooncake/dedicated_owner`` under a bar ran into its neighbours. Names are
    abbreviated and wrapped, the group label sits below them, and the abbreviations are explained."""
    p = parse_size("1MiB-128")
    records = quick_with_mooncake(p)
    for r in records:  # the unabbreviated names never reach a bar
        lab = series_label(series_key(r))
        assert all(len(line) <= LABEL_WIDTH for line in lab.splitlines()), lab
    assert series_label((0, "mooncake", "dedicated_owner", True)) == "mooncake\nded. owner\nSSD on"
    assert series_label((0, "mooncake", "mooncake-default-offload", True)) == "mooncake\ndefault\noffload\nSSD on"
    assert series_label((0, "mooncake", "per_process", False), short=True) == "mooncake/per-proc off"
    note = abbreviation_note(records)
    assert "ded. owner = dedicated_owner" in note and "default offload = mooncake-default-offload" in note
    panels = _label_boxes(figure(records, "quick"))
    assert len(panels) == 2
    for ticks, groups in panels:
        assert len(groups) == 1
        for a, b in zip(ticks, ticks[1:]):
            assert a.x1 <= b.x0, (a, b)  # neighbours side by side, not on top of each other
        for t in ticks:
            assert not any(_overlaps(t, g) for g in groups)
    assert render(records, tmp_path / "quick.png").stat().st_size > 5000


def test_many_bars_turned_labels_leave_room_for_the_groups():
    p = parse_size("1MiB-128")
    records = []
    for procs, threads in [(1, 2), (1, 4), (2, 4), (4, 4)]:
        for r in quick_with_mooncake(p):
            records.append({**r, "procs": procs, "threads": threads, "concurrency": f"c{procs * threads}"})
    for ticks, groups in _label_boxes(figure(records)):
        assert len(groups) == 4
        for t in ticks:
            assert not any(_overlaps(t, g) for g in groups), t
