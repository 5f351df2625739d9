"""The simulations: the figures of bench/traces/README.md from the shipped trace, and small
traces whose answers are worked out by hand for each policy and for prefix semantics."""

from __future__ import annotations

import json

import pytest

from tracebench import sim
from tracebench.trace import DEFAULT_TRACE, Request, Trace, load


def trace_of(*requests, lengths=None) -> Trace:
    """A trace of the given id lists (full 512-token blocks unless ``lengths`` says otherwise)."""
    lengths = lengths or [512 * len(ids) for ids in requests]
    return Trace("synthetic", tuple(Request(float(i), n, 1, tuple(ids)) for i, (ids, n) in enumerate(zip(requests, lengths))))


def hits(policy, *requests) -> list:
    t = trace_of(*requests)
    if policy == "belady":
        policy = sim.Belady(2, sim.next_uses(t))
    return sim.simulate(t, policy).per_request


def test_readme_figures_of_the_conversation_trace():
    t = load(DEFAULT_TRACE)
    assert (len(t.requests), t.accesses, t.distinct, round(t.duration_s)) == (12031, 288500, 182790, 3537)
    cap10 = int(0.10 * t.distinct)
    assert cap10 == 18279
    got = {(r.policy, r.capacity_blocks): round(100 * r.hit_rate, 1) for r in sim.run_sims(t, [cap10, 4000])}
    assert got == {
        ("sim-lru", 18279): 27.8, ("sim-s3fifo", 18279): 24.4, ("sim-belady", 18279): 36.6, ("ideal", 18279): 36.6,
        ("sim-lru", 4000): 8.6, ("sim-s3fifo", 4000): 12.6, ("sim-belady", 4000): 32.2, ("ideal", 4000): 36.6,
    }


def test_prefix_semantics_stop_at_the_first_miss():
    # [3, 2]: 2 is cached but comes after the miss of 3, so it is no hit.
    assert hits(sim.Infinite(), [1, 2], [1, 2, 5], [3, 2], [1, 9]) == [0, 2, 0, 1]


def test_driver_calls_hit_until_the_first_miss_then_insert_with_access_indices():
    calls = []

    class Recording(sim.Infinite):
        def hit(self, block, now):
            calls.append(("hit", block, now))
            return super().hit(block, now)

        def insert(self, block, now):
            calls.append(("insert", block, now))
            super().insert(block, now)

    sim.simulate(trace_of([1, 2, 3], [1, 9, 3]), Recording())
    assert calls == [("hit", 1, 0), ("insert", 1, 0), ("insert", 2, 1), ("insert", 3, 2),
                     ("hit", 1, 3), ("hit", 9, 4), ("insert", 9, 4), ("insert", 3, 5)]


def test_lru_keeps_the_recently_used():
    # 1 is used again before 3 arrives, so 2 is the one evicted.
    assert hits(sim.LRU(2), [1], [2], [1], [3], [1], [2]) == [0, 0, 1, 0, 1, 0]


def test_s3fifo_promotes_a_block_hit_in_the_small_queue_and_outlasts_a_scan():
    # capacity 2: small queue 1, main 1. 1 is hit while in the small queue, so when room is
    # needed it moves to main; the one-time blocks 2, 3, 4 pass through the small queue.
    assert hits(sim.S3FIFO(2), [1], [1], [2], [3], [4], [1]) == [0, 1, 0, 0, 0, 1]
    assert hits(sim.LRU(2), [1], [1], [2], [3], [4], [1]) == [0, 1, 0, 0, 0, 0]


def test_s3fifo_ghost_hit_goes_to_main():
    p = sim.S3FIFO(2)
    assert hits(p, [1], [2], [3], [1], [1]) == [0, 0, 0, 0, 1]
    assert 1 in p.main and 1 not in p.ghost


def test_belady_evicts_the_block_used_furthest_ahead():
    # at 3: 1 is next used at the end, 2 and 3 sooner: 1 goes.
    assert hits("belady", [1], [2], [3], [2], [3], [1]) == [0, 0, 0, 1, 1, 0]


def test_belady_bypasses_blocks_never_used_again_or_used_last():
    assert hits("belady", [1], [2], [3], [1], [2]) == [0, 0, 0, 1, 1]  # 3 is never used again
    assert hits("belady", [1], [2], [3], [1], [2], [3]) == [0, 0, 0, 1, 1, 0]  # 3 is used after 1 and 2


def test_next_uses():
    assert sim.next_uses(trace_of([1, 2], [1, 3], [2])) == [2, 4, sim.NEVER, sim.NEVER, sim.NEVER]


def test_token_hits_count_the_partial_last_block():
    t = trace_of([1, 2, 3], [1, 2, 3], lengths=[1100, 1100])  # blocks of 512, 512 and 76 tokens
    r = sim.simulate(t, sim.Infinite())
    assert (r.tokens, r.token_hits) == (2200, 1100)


def test_run_sims_takes_a_caller_policy_name_list_and_rejects_unknown_ones():
    t = trace_of([1], [1])
    assert [r.policy for r in sim.run_sims(t, [2], ["sim-lru", "ideal"])] == ["sim-lru", "ideal"]
    with pytest.raises(ValueError, match="unknown policy"):
        sim.make("sim-fifo", 2, [])


def test_trace_loader_names_the_bad_line(tmp_path):
    f = tmp_path / "t.jsonl"
    good = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
    f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "hash_ids": ["x"]}) + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:2: hash_ids holds 'x'"):
        load(f)
    f.write_text(json.dumps({**good, "timestamp": 5}) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match="before the previous"):
        load(f)
