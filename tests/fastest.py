"""A yardstick measured in the test that uses it, so that bounds on timed figures scale with the
host's speed: the least time of a call, which load can lengthen only where every call is
interrupted."""

import time


def fastest_call_s(fn, calls: int = 200) -> float:
    """The least seconds of ``calls`` calls of ``fn``."""
    best = float("inf")
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best
