"""Timing helpers shared by the benchmarks."""

import time

import numpy as np


def median_call_s(run, inputs, repeat: int) -> float:
    """Median wall time of ``run(*inputs)`` over ``repeat`` calls, after one warm-up call."""
    run(*inputs)
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        run(*inputs)
        samples.append(time.perf_counter() - t)
    return float(np.median(samples))
