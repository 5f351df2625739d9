import collections

import pytest

from pressure.sizes import GiB, MiB, format_size, parse_size
from pressure.workload import (
    ValueMaker, ZipfSequence, bootstrap_order, check_at, check_value, expected_hit_rate, key_count, key_name, pause_after_put_s,
    stamp, value_body, zipf_cdf, zipf_pmf,
)


def test_zipf_sequence_is_deterministic_per_thread():
    a = ZipfSequence(2560, seed=7, thread_index=3).take(2000)
    b = ZipfSequence(2560, seed=7, thread_index=3).take(2000)
    assert a == b
    assert ZipfSequence(2560, seed=7, thread_index=4).take(2000) != a
    assert ZipfSequence(2560, seed=8, thread_index=3).take(2000) != a


def test_zipf_sequence_pinned_values():
    # Pinned so that a change of the generator (which would change every backend's workload
    # and break comparisons with earlier runs) is a conscious one.
    assert ZipfSequence(320, seed=1, thread_index=0).take(10) == [9, 1, 8, 27, 0, 76, 0, 0, 276, 39]


def test_zipf_sequence_shares_a_cdf_and_stays_in_range():
    cdf = zipf_cdf(100)
    s = ZipfSequence(100, seed=1, thread_index=0, cdf=cdf)
    draws = s.take(5000)
    assert min(draws) >= 0 and max(draws) <= 99
    with pytest.raises(ValueError):
        ZipfSequence(99, seed=1, thread_index=0, cdf=cdf)


def test_zipf_frequencies_follow_theta():
    n = 200
    draws = ZipfSequence(n, seed=3, thread_index=0).take(60000)
    freq = collections.Counter(draws)
    pmf = zipf_pmf(n)
    # rank 0 holds ~ 1/H(n, 0.99) of the mass; check the head within 5 % relative
    for r in (0, 1, 2, 10):
        assert abs(freq[r] / len(draws) - pmf[r]) < 0.05 * pmf[r] + 0.002
    assert zipf_cdf(n)[-1] == 1.0
    assert abs(sum(pmf) - 1.0) < 1e-12


def test_bootstrap_order_random_is_a_seeded_permutation_independent_of_rank():
    n = 2560
    a = bootstrap_order(n, "random", 1)
    assert sorted(a) == list(range(n))
    assert a == bootstrap_order(n, "random", 1)
    assert a != bootstrap_order(n, "random", 2)
    # independent of rank: the position of the hot keys is spread over the whole order
    pos = {k: i for i, k in enumerate(a)}
    hot_mean = sum(pos[k] for k in range(100)) / 100
    assert 0.3 * n < hot_mean < 0.7 * n
    # the order does not depend on anything but (n, seed): same for every backend
    assert bootstrap_order(n, "random", 1) is not a


def test_bootstrap_order_hot_and_cold_first():
    assert bootstrap_order(5, "hot-first", 1) == [0, 1, 2, 3, 4]
    assert bootstrap_order(5, "cold-first", 1) == [4, 3, 2, 1, 0]
    with pytest.raises(ValueError):
        bootstrap_order(5, "sideways", 1)


@pytest.mark.parametrize("payload,ms", [("1MiB-128", 6), ("4MiB-128", 25), ("8MiB-128", 50), ("16MiB-128", 100), ("1MiB", 6), ("16MiB", 100)])
def test_pacing_is_the_seeds(payload, ms):
    assert pause_after_put_s(parse_size(payload)) == pytest.approx(ms / 1000)


def test_pacing_interpolates_scales_and_extrapolates():
    assert pause_after_put_s(2 * MiB) == pytest.approx((6 + (25 - 6) / 3) / 1000)
    assert pause_after_put_s(512 * 1024) == pytest.approx(0.003)
    assert pause_after_put_s(32 * MiB) == pytest.approx(0.2)  # 16 MiB rate: 6.25 ms/MiB
    assert pause_after_put_s(parse_size("4MiB-128"), scale=0.5) == pytest.approx(0.0125)
    assert pause_after_put_s(parse_size("4MiB-128"), scale=0) == 0.0
    # the seed's cap: about 160 MiB/s of payload at most
    for p in ("1MiB-128", "4MiB-128", "8MiB-128", "16MiB-128"):
        b = parse_size(p)
        assert b / pause_after_put_s(b) / MiB <= 170


def test_key_count_matches_the_seed():
    ds = parse_size("2.5GiB")
    assert [key_count(ds, parse_size(p)) for p in ("1MiB-128", "4MiB-128", "8MiB-128", "16MiB-128")] == [2560, 640, 320, 160]


def test_values_carry_their_key_and_check():
    body = value_body(4096, seed=1)
    assert body == value_body(4096, seed=1) and body != value_body(4096, seed=2)
    vm = ValueMaker(body)
    v = bytes(vm.value(42))
    assert check_value(v, 42, 4096)
    assert not check_value(v, 43, 4096)
    assert not check_value(v[:-1], 42, 4096)
    assert v[:16] == stamp(42) and v[-16:] == stamp(42)
    assert bytes(vm.value(7))[:16] == stamp(7)  # the buffer is reused
    # The words at every 4 KiB name the key too: a middle of zeros or of another key's value fails.
    big = ValueMaker(value_body(MiB - 128, seed=1))
    a, b = bytes(big.value(5)), bytes(big.value(6))
    assert check_value(a, 5, MiB - 128) and check_value(b, 6, MiB - 128)
    zeroed = a[:16] + bytes(len(a) - 32) + a[-16:]
    torn = a[: 512 << 10] + b[512 << 10 : -16] + a[-16:]
    assert not check_value(zeroed, 5, MiB - 128) and not check_value(torn, 5, MiB - 128)
    import ctypes

    for v, want in ((a, True), (zeroed, False), (torn, False)):
        buf = ctypes.create_string_buffer(v, len(v))
        assert check_at(ctypes.addressof(buf), 5, MiB - 128) is want
    with pytest.raises(ValueError):
        value_body(16, seed=1)


def test_key_names_and_expected_hit_rate():
    assert key_name(3) == "pressure-0000003"
    assert expected_hit_rate(10, range(10)) == pytest.approx(1.0)
    assert expected_hit_rate(10, [0]) == pytest.approx(zipf_pmf(10)[0])


@pytest.mark.parametrize("text,n", [("1MiB-128", 1048448), ("1.5GiB", 3 * GiB // 2), ("4GB", 4 * GiB), ("512", 512), ("2KiB+1", 2049), ("1 MiB", MiB)])
def test_sizes_parse_and_format(text, n):
    assert parse_size(text) == n
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize("bad", ["", "MiB", "1XB", "1MiB-2MiB", "1.5", "-3", "1MiB--1"])
def test_sizes_reject(bad):
    with pytest.raises(ValueError):
        parse_size(bad)
