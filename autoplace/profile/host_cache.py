"""The last-level cache a process on this host gets: Linux's figure, checked by reading.

Linux lists the sizes of CPU 0's caches (``/sys/devices/system/cpu/cpu0/cache``). A virtual
machine often lists its host's whole shared last-level cache, hundreds of MB on a many-core
socket, of which its few vCPUs get a share. :func:`cpu_cache_bytes` checks the listed size:
it times one core's sequential reads of buffers of growing size (:func:`read_rates`), and where
reads slow down to memory's rate well before the listed size (:func:`cache_from_rates`), it
takes the largest size still read at the cache's rate. The figure is kept per host in the
calibration cache (:func:`~autoplace.profile.calibration_cache.kept_figure`).
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import numpy as np

#: Linux's listed size is kept unless reads slow down before this fraction of it.
BELOW_LISTED = 0.5
#: Reads count as slowed down once below the geometric mean of the fastest and the slowest
#: rate, and only where the fastest is at least this many times the slowest (a clear step).
STEP = 1.5
#: Where Linux lists no cache.
UNLISTED = 32 << 20
#: No buffer read is larger than this, whatever Linux lists.
LARGEST = 1 << 30
_FORMAT = 1


def listed_caches() -> list[int]:
    """The sizes of the caches Linux lists for CPU 0, in bytes, smallest first."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return sorted(sizes)


def listed_cache_bytes() -> int:
    """The largest cache Linux lists for CPU 0, in bytes (:data:`UNLISTED` where it lists
    none)."""
    return max(listed_caches(), default=UNLISTED)


@functools.cache
def cpu_cache_bytes() -> int:
    """The last-level cache a process on this host gets, in bytes: Linux's listed size
    (:func:`listed_cache_bytes`), or less where reading buffers of growing size slowed down to
    memory's rate well before it (:func:`cache_from_rates`). Measured once per host, then read
    from the calibration cache; once per process."""
    from autoplace.profile.calibration_cache import kept_figure

    caches = listed_caches()
    if not caches:  # nothing to check
        return UNLISTED
    listed, below = caches[-1], max(caches[:-1], default=0)

    def measure():
        return float(cache_from_rates(read_rates(_sizes(listed, below)), listed)), True

    return int(kept_figure(f"llc-v{_FORMAT}-listed{listed}", measure, key="bytes"))


def _sizes(listed: int, below: int) -> list[int]:
    """Buffer sizes from a sixteenth of ``listed`` (at least four times ``below``, the next
    cache's size, so that none fits there) up to three quarters of it (at most
    :data:`LARGEST`), each about 1.4x the one before: a cache that ends before half the listed
    size shows as a step in the rates at these sizes, and memory's rate beyond it."""
    top = min(listed * 3 // 4, LARGEST)
    low = min(max(listed // 16, 4 * below, 1 << 20), top // 2)
    steps = max(1, round(math.log(top / low, math.sqrt(2))))
    return sorted({int(low * (top / low) ** (k / steps)) // 4096 * 4096
                   for k in range(steps + 1)})


def read_rates(sizes: list[int], rounds: int = 3, per_round: int = 64 << 20) -> dict[int, float]:
    """Bytes per second at which one core sums a float64 buffer of each of ``sizes`` bytes,
    read again and again (at least ``per_round`` bytes a round): the fastest of ``rounds``
    rounds. The buffers are the leading parts of one buffer, written once."""
    whole = np.ones(max(sizes) // 8)
    rates = {}
    for size in sizes:
        part = whole[:size // 8]
        part.sum()  # its first read brings it into the cache as far as it fits
        reps = max(1, -(-per_round // size))
        best = math.inf
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(reps):
                part.sum()
            best = min(best, (time.perf_counter() - start) / reps)
        rates[size] = size / best
    return rates


def cache_from_rates(rates: dict[int, float], listed: int) -> int:
    """The cache's size from read ``rates`` (bytes per second, by buffer size): the largest
    size read at the geometric mean of the fastest and the slowest rates or faster, every
    larger one read slower, where the fastest is at least :data:`STEP` times the slowest and
    that size is below :data:`BELOW_LISTED` of ``listed``; else ``listed``."""
    fast, slow = max(rates.values()), min(rates.values())
    if fast < STEP * slow:
        return listed
    cut = math.sqrt(fast * slow)
    sizes = sorted(rates)
    last_fast = max(k for k, size in enumerate(sizes) if rates[size] >= cut)
    size = sizes[last_fast]
    return size if size < BELOW_LISTED * listed else listed


def describe_cpu_cache() -> str:
    """``'the 77.6 MB last-level cache (by read rates; Linux lists 300 MB)'``, or ``'the
    32 MB last-level cache'`` where the figure is Linux's."""
    got, listed = cpu_cache_bytes(), listed_cache_bytes()
    words = f"the {got / 2**20:.3g} MB last-level cache"
    if got == listed:
        return words
    return f"{words} (by read rates; Linux lists {listed / 2**20:.3g} MB)"
