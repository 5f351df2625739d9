import random

import pytest

from pressure.backends.memcached import item_size_flag, parse_stats, server_args, ssd_hits_counter
from pressure.backends.base import CaseSpec
from pressure.sizes import MiB, parse_size
from pressure.stats import Histogram, Tally, attribute_counter, attribute_dram_only, attribute_per_get, gib_s


def test_histogram_percentiles_within_one_percent():
    rng = random.Random(1)
    xs = [rng.lognormvariate(6, 1) for _ in range(20000)]
    h = Histogram()
    for x in xs:
        h.add_us(x)
    xs.sort()
    for p in (50, 95, 99):
        exact = xs[int(p / 100 * len(xs)) - 1]
        assert h.percentile(p) == pytest.approx(exact, rel=0.011)
    assert Histogram().percentile(50) is None


def test_histogram_merge_and_json_roundtrip():
    a, b = Histogram(), Histogram()
    for x in range(1, 1000):
        (a if x % 2 else b).add_us(x)
    m = Histogram.from_json(a.to_json())
    m.merge(Histogram.from_json(b.to_json()))
    whole = Histogram()
    for x in range(1, 1000):
        whole.add_us(x)
    assert m.counts == whole.counts and m.n == 999
    assert m.percentile(50) == whole.percentile(50)


def test_per_get_attribution_complete_and_not():
    a = attribute_per_get(10, {"memory": 7, "ssd": 3})
    assert (a.memory, a.ssd, a.unknown, a.complete) == (7, 3, 0, True)
    b = attribute_per_get(10, {"memory": 7, "none": 3})  # a hit without a source
    assert (b.memory, b.ssd, b.unknown, b.complete) == (0, 0, 10, False)
    c = attribute_per_get(10, {"memory": 7, "ssd": 2})
    assert not c.complete and c.unknown == 10 and "do not add up" in c.note
    assert attribute_per_get(0, {}).complete


def test_counter_attribution():
    a = attribute_counter(100, [(10, 40)])
    assert (a.memory, a.ssd, a.unknown, a.complete, a.method) == (70, 30, 0, True, "counter")
    two = attribute_counter(100, [(0, 10), (5, 25)])  # one pair per storage process
    assert (two.memory, two.ssd) == (70, 30)
    for samples, why in (([(40, 10)], "backwards"), ([(0, 101)], "exceeds"), ([(None, 5)], "missing"), ([], "no counter")):
        r = attribute_counter(100, samples)
        assert not r.complete and r.unknown == 100 and r.memory == r.ssd == 0 and why in r.note
    d = attribute_dram_only(5)
    assert (d.memory, d.ssd, d.complete) == (5, 0, True)


def test_memcached_extstore_counter_and_args():
    raw = b"STAT pid 1\r\nSTAT get_extstore 50\r\nSTAT miss_from_extstore 4\r\nSTAT badcrc_from_extstore 1\r\nSTAT get_aborted_extstore 2\r\nEND\r\n"
    st = parse_stats(raw)
    assert st["pid"] == "1"
    assert ssd_hits_counter(st) == 44  # badcrc is a subset of miss_from_extstore
    assert ssd_hits_counter({"pid": "1"}) is None
    assert item_size_flag(parse_size("1MiB-128")) == []
    assert item_size_flag(parse_size("4MiB-128")) == ["-I", "4096k"]
    assert item_size_flag(parse_size("16MiB-128")) == ["-I", "16384k"]
    assert item_size_flag(16 * MiB) == ["-I", "16896k"]
    case = CaseSpec("memcached", None, True, "bytes", parse_size("1MiB-128"), 10, 256 * MiB, 2048 * MiB, 1, 2)
    args = server_args("memcached", "/x/s", case, "/x/ext", "root")
    assert args[:7] == ["memcached", "-s", "/x/s", "-a", "0600", "-m", "256"]
    assert "ext_path=/x/ext:2048M" in args and args[args.index("-u") + 1] == "root"
    big = CaseSpec("memcached", None, True, "bytes", parse_size("16MiB-128"), 10, 256 * MiB, 2048 * MiB, 1, 2)
    args = server_args("memcached", "/x/s", big, "/x/ext", None)
    assert args[args.index("-I") + 1] == "16384k" and "ext_path=/x/ext:2048M,ext_wbuf_size=16" in args and "-u" not in args


def test_tally_merge_and_json():
    t = Tally()
    t.hit("memory", 0.001)
    t.hit("ssd", 0.002)
    t.misses += 1
    t.error("boom")
    t.stage("h2d_event", 0.0005)
    u = Tally.from_json(t.to_json())
    u.merge(t)
    assert (u.hits, u.misses, u.errors) == (4, 2, 2)
    assert u.by_source == {"memory": 2, "ssd": 2}
    assert u.hist.n == 4 and u.stages["h2d_event"].n == 2
    assert gib_s(1024, 1 << 20, 2.0) == pytest.approx(0.5)
