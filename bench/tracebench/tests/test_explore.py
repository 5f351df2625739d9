"""The offline policy experiment (tracebench.explore) on traces small enough to work out by
hand: the master's page order, the oracle hit-density ranking and the hits-by-uses split."""

from __future__ import annotations

import json

import pytest

from tracebench import explore, sim
from tracebench.trace import Request, Trace


def trace_of(*requests) -> Trace:
    return Trace("synthetic", tuple(Request(float(i), 512 * len(ids), 1, tuple(ids)) for i, ids in enumerate(requests)))


def served(policy, *requests) -> explore.Result:
    return explore.replay(trace_of(*requests), policy, "p", 2)


def test_page_order_evicts_a_chain_from_its_deep_end():
    # [1, 2] is a chain: 3 needs room, and 2 (under 1) goes, not 1, so [1, 2] hits 1.
    reqs = ([1, 2], [3], [1, 2])
    assert served(explore.PageOrder(2), *reqs).hits == 1
    assert served(explore._Plain(sim.LRU(2)), *reqs).hits == 0


def test_page_order_ghost_keeps_an_evicted_blocks_use():
    # 1 is evicted by 3, asked for again (a use: the ghost), and then outlasts 4 and 5,
    # which LRU keeps instead.
    reqs = ([1], [2], [3], [1], [4], [5], [1])
    assert served(explore.PageOrder(2), *reqs).hits == 1
    assert served(explore.PageOrder(2, ghost_factor=0), *reqs).hits == 0
    assert served(explore._Plain(sim.LRU(2)), *reqs).hits == 0


def test_hits_are_split_by_the_blocks_uses_before():
    r = served(explore._Plain(sim.Infinite()), [1, 2], [1, 2], [1], [1], [1])
    assert (r.accesses, r.hits, r.by_uses) == (7, 5, [2, 1, 1, 1])
    assert r.hit_rate == pytest.approx(5 / 7)


def test_lhd_table_is_hits_to_come_per_block_tick():
    # ticks 1, 2: block 1 is used again at age 1 (bucket 0), then never; block 2 never.
    t = explore.lhd_table(trace_of([1], [1], [2]), bucket=64, buckets=4, classes=2, horizon=4)
    assert t[0][0] == pytest.approx(1 / (1 + 1 * 4))  # one hit after one tick; 2 dies holding 4 buckets
    assert t[1] == [0.0] * 4  # used twice: never used again


def test_oracle_lhd_evicts_the_lowest_density():
    # Blocks used twice are worth keeping, blocks used once are not: 2 goes, not 1.
    table = [[0.0] * 4, [1.0] * 4]
    reqs = ([1], [1], [2], [3], [1])
    assert served(explore.OracleLHD(2, table), *reqs).hits == 2
    assert served(explore._Plain(sim.LRU(2)), *reqs).hits == 1


def test_split_finds_a_block_on_any_owner_and_stores_misses_on_its_own():
    split = explore.Split(lambda c: explore._Plain(sim.LRU(c)), 4, 2, [0, 1, 1])
    # owner 1 finds 1 and 2 on owner 0 and stores only 3; then its [3, 4] hits 3 and stores 4 with it
    r = explore.replay(trace_of([1, 2], [1, 2, 3], [3, 4]), split, "p", 4)
    assert r.hits == 3
    assert (sorted(split.parts[0].policy.order), sorted(split.parts[1].policy.order)) == ([1, 2], [3, 4])


def test_split_shares_of_a_capacity_add_up():
    split = explore.Split(lambda c: sim.LRU(c), 7, 3, [])
    assert [p.capacity for p in split.parts] == [3, 2, 2]
    with pytest.raises(ValueError):
        explore.Split(lambda c: sim.LRU(c), 2, 3, [])


def test_split_page_order_owners_share_the_pool_clock_and_ghost():
    pool = explore.Pool(4)
    split = explore.Split(lambda c: explore.PageOrder(c, pool=pool), 4, 2, [0, 1, 0, 0, 0])
    # 1 is evicted from owner 0 (two more blocks there), and put again later keeps its use
    explore.replay(trace_of([1], [9], [2], [3], [1]), split, "p", 4)
    assert pool.clock == 5
    assert split.parts[0].freq[1] == 2 and 1 not in pool.ghost


def test_main_prints_every_policy_and_capacity(tmp_path, capsys):
    f = tmp_path / "t.jsonl"
    rows = [[1, 2], [1, 2, 3], [4], [1, 2, 3, 5]]
    f.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(h), "output_length": 1, "hash_ids": h}) + "\n"
                         for i, h in enumerate(rows)))
    assert explore.main(["--trace", str(f), "--capacities", "0.5,3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("4 requests, 10 block accesses, 5 distinct blocks")
    table = [line.split() for line in out[2:]]
    assert [(r[0], r[1]) for r in table] == [(p, c) for c in ("2", "3") for p in explore.POLICIES]
    with pytest.raises(SystemExit):
        explore.main(["--trace", str(f), "--policies", "lru,mru"])
    assert explore.main(["--trace", str(f), "--capacities", "4", "--policies", "lru,page-order", "--owners", "1,2"]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in table] == ["lru", "page-order", "lru/2", "page-order/2"]
