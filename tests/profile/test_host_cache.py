"""The last-level cache a process gets: Linux's figure checked by read rates (the rule on given
rates; the real reads; kept per host)."""

import math

import pytest

from autoplace.profile import host_cache

MB = 1 << 20
LISTED = 300 * MB  # a VM listing its socket's whole cache


def rates(fast_up_to: int, sizes, fast=24e9, slow=10e9) -> dict[int, float]:
    return {s: fast if s <= fast_up_to else slow for s in sizes}


SIZES = host_cache._sizes(LISTED, 2 * MB)


def test_a_step_well_below_the_listed_size_is_the_cache():
    knee = max(s for s in SIZES if s <= 64 * MB)
    assert host_cache.cache_from_rates(rates(64 * MB, SIZES), LISTED) == knee


def test_no_step_or_one_past_half_the_listed_size_keeps_linuxs_figure():
    assert host_cache.cache_from_rates(rates(0, SIZES, slow=24e9), LISTED) == LISTED
    # A step smaller than STEP is no step: the machine's phases move rates that much.
    assert host_cache.cache_from_rates(rates(64 * MB, SIZES, slow=20e9), LISTED) == LISTED
    assert host_cache.cache_from_rates(rates(200 * MB, SIZES), LISTED) == LISTED


def test_a_slow_reading_below_the_step_does_not_cut_the_cache_short():
    got = rates(64 * MB, SIZES)
    got[SIZES[1]] = 9e9  # one slow phase at a small size
    assert host_cache.cache_from_rates(got, LISTED) == max(s for s in SIZES if s <= 64 * MB)


def test_sizes_start_past_the_next_cache_and_stop_below_the_listed_one():
    for listed, below in [(LISTED, 2 * MB), (32 * MB, 1 * MB), (8 * MB, 2 * MB),
                          (64 << 30, 2 * MB)]:
        sizes = host_cache._sizes(listed, below)
        assert sizes == sorted(set(sizes)) and len(sizes) >= 2
        assert sizes[-1] <= min(listed * 3 // 4, host_cache.LARGEST)
        assert sizes[0] >= min(4 * below, sizes[-1] // 2)
        assert all(b / a < 1.5 for a, b in zip(sizes, sizes[1:]))


def test_real_reads_give_a_rate_per_size():
    got = host_cache.read_rates([MB, 4 * MB], rounds=2, per_round=8 * MB)
    assert set(got) == {MB, 4 * MB}
    assert all(math.isfinite(r) and r > 0 for r in got.values())


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    host_cache.cpu_cache_bytes.cache_clear()
    yield
    host_cache.cpu_cache_bytes.cache_clear()


def test_the_cache_is_measured_once_per_host_and_kept(fresh, monkeypatch):
    monkeypatch.setattr(host_cache, "listed_caches", lambda: [48 << 10, 2 * MB, LISTED])
    calls = []

    def fake(sizes, **kw):
        calls.append(sizes)
        return rates(64 * MB, sizes)

    monkeypatch.setattr(host_cache, "read_rates", fake)
    first = host_cache.cpu_cache_bytes()
    assert calls == [SIZES] and first == max(s for s in SIZES if s <= 64 * MB)
    host_cache.cpu_cache_bytes.cache_clear()  # another process on the same host
    assert host_cache.cpu_cache_bytes() == first and len(calls) == 1


def test_where_linux_lists_no_cache_nothing_is_read(fresh, monkeypatch):
    monkeypatch.setattr(host_cache, "listed_caches", lambda: [])
    monkeypatch.setattr(host_cache, "read_rates", lambda *a, **k: pytest.fail("read"))
    assert host_cache.cpu_cache_bytes() == host_cache.UNLISTED
