"""Which process serves each request: round robin, and prefix routing (the process that served
the longest prefix of a request's blocks, unless it is overloaded)."""

from __future__ import annotations

import pytest

from tracebench.route import assign


def test_round_robin_is_request_index_mod_procs():
    assert assign([[1], [2], [3], [4], [5]], 2) == [0, 1, 0, 1, 0]
    assert assign([[1], [1, 2]], 3, "rr") == [0, 1]


def test_prefix_sends_a_follow_up_where_its_prefix_was_served():
    # Conversations a (blocks 1..), b (10..), c (20..); turn t extends turn t - 1.
    reqs = [[1], [10], [20], [1, 2], [10, 11], [20, 21], [1, 2, 3], [20, 21, 22]]
    got = assign(reqs, 2, "prefix")
    # New prefixes go to the least-loaded process (ties: the lower index): a, b, then c on 0 again.
    assert got[:3] == [0, 1, 0]
    assert got[3:] == [0, 1, 0, 0, 0]


def test_prefix_follows_the_deepest_block_matched_not_the_first():
    # [7, 6] is moved to process 1 by the balance (process 0 has 2 blocks, 1 none), so the
    # shared block 7 was last served by 1; [7, 5, 4] matches [7, 5], whose 5 was served by 0.
    got = assign([[7, 5], [7, 6], [7, 5, 4]], 2, "prefix", balance_abs=1, balance_rel=1.0)
    assert got == [0, 1, 0]


def test_prefix_moves_off_an_overloaded_process():
    # One conversation of growing turns (turn t has t + 1 blocks) follows its prefix until its
    # process has more than balance_abs blocks beyond the other and balance_rel times its
    # blocks (6 against 0 at turn 3), then goes on where it moved; a new prefix goes to the
    # least-loaded process.
    reqs = [list(range(1, t + 2)) for t in range(6)] + [[100]]
    assert assign(reqs, 2, "prefix", balance_abs=4, balance_rel=1.5) == [0, 0, 0, 1, 1, 1, 0]
    # Without the balance (a threshold no load reaches) it all stays on process 0.
    assert assign(reqs, 2, "prefix", balance_abs=1000) == [0] * 6 + [1]


def test_unknown_route_and_no_processes_are_refused():
    with pytest.raises(ValueError, match="unknown route"):
        assign([[1]], 2, "hash")
    with pytest.raises(ValueError, match="procs"):
        assign([[1]], 0)
