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


def aligned(table: list[list[str]], footer: str) -> str:
    """``table`` (a header row, then rows of strings) right-aligned in columns, then ``footer``."""
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    return "\n".join(["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table]
                     + [footer])
