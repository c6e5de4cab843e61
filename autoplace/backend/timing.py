"""Timing callables against each other: when to stop timing a contender that is far behind, the
rule every race of callables in turn applies (a model's contenders,
:func:`autoplace.run.overhead.blocks_s`; an ORT segment's graph optimization levels,
:func:`autoplace.backend.ort_profiling.fastest_variant`); and rounds whose figures are compared
within each (:func:`walls_in_rounds`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

#: Rounds done -> how many times slower than the fastest contender's slowest sample every sample
#: of another must be, from then on, for it to be timed no more. After two rounds, far beyond
#: the margins a choice turns on, so that only samples that each met a slow phase the fastest's
#: all missed could drop one that would have been chosen; after three, beyond the widest margin
#: a model's contenders are chosen by (``1 / autoplace.pytorch.contenders.EAGER_MARGIN``): three
#: samples each slower than all three of the fastest's, by more than a margin, in rounds that
#: met the machine's phases alike.
BEHIND = {2: 1.5, 3: 1.05}


def far_behind(samples: Sequence[Sequence[float]], rounds: int,
               drop_above: Mapping[int, float] | None) -> set[int]:
    """Of the contenders whose seconds are ``samples`` (per contender, one per round timed;
    ``rounds`` done), those each of whose samples took more than the factor of ``drop_above``
    (rounds -> factor; the factor of the most rounds reached applies, none before the fewest)
    times the slowest sample of the fastest contender (by median). Empty where no factor
    applies yet, or one contender has no sample."""
    reached = [n for n in (drop_above or {}) if n <= rounds]
    if not reached or any(not s for s in samples):
        return set()
    factor = drop_above[max(reached)]
    lead = min(range(len(samples)), key=lambda j: statistics.median(samples[j]))
    return {j for j, s in enumerate(samples) if min(s) > factor * max(samples[lead])}


def walls_in_rounds(fns: Sequence[Callable[[], object]], *, least: int, most: int,
                    budget_s: float) -> np.ndarray:
    """Seconds of each of ``fns`` (callables of no argument), called in turn, round after round:
    one row per round, a column per callable; at least ``least`` rounds, at most ``most``, none
    begun once ``budget_s`` has passed. The figures of one round met the machine in the same
    moment: a cost found as the difference of two callables' times is found per round (the
    machine drifts less within one), then its median taken."""
    rounds: list[list[float]] = []
    start = time.perf_counter()
    while len(rounds) < most and (len(rounds) < least or time.perf_counter() - start < budget_s):
        walls = []
        for fn in fns:
            t0 = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t0)
        rounds.append(walls)
    return np.asarray(rounds, dtype=float).reshape(len(rounds), len(fns))
