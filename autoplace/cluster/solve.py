"""Throughput plans over many hosts: the solver run over the fastest ``k`` hosts for a few ``k``.

A solver given every device of a large cluster may do worse than over a few of its hosts: the
search space grows with the devices, and a pipeline over many hosts pays many links. Solving over
the fastest 1, 2, 4, ... hosts and keeping the best plan (scored on the whole problem) is never
worse than the best of those solves, whatever the solver.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from autoplace.solve import InfeasibleError, Problem, Solution, simulate_throughput, solve


def host_order(problem: Problem, host_of: Sequence[int]) -> list[int]:
    """Hosts fastest first: by the sum, over the nodes, of the least cost on the host's devices
    (a node no device of the host runs counts as the host's slowest finite cost, times ten)."""
    host_of = np.asarray(host_of)
    keys = {}
    for h in np.unique(host_of):
        least = problem.cost[:, host_of == h].min(axis=1)
        finite = least[np.isfinite(least)]
        worst = 10 * finite.max() if finite.size else np.inf
        keys[int(h)] = float(np.where(np.isfinite(least), least, worst).sum())
    return sorted(keys, key=lambda h: (keys[h], h))


def restricted(problem: Problem, devices: Sequence[int]) -> Problem:
    """``problem`` over ``devices`` (indices) only; pins to other devices raise
    :class:`InfeasibleError`."""
    idx = np.asarray(devices, dtype=np.int64)
    pos = np.full(problem.num_devices, -1, dtype=np.int64)
    pos[idx] = np.arange(idx.size)
    pins = np.where(problem.pins >= 0, pos[np.maximum(problem.pins, 0)], -1)
    if ((problem.pins >= 0) & (pins < 0)).any():
        raise InfeasibleError("a node is pinned to a device outside the hosts tried")
    return Problem.build(
        problem.cost[:, idx], problem.edges, problem.out_bytes,
        alpha=problem.alpha[np.ix_(idx, idx)], beta=problem.beta[np.ix_(idx, idx)],
        node_mem=problem.node_mem, mem_cap=problem.mem_cap[idx], pins=pins,
        groups=problem.groups, stage_overhead_s=problem.stage_overhead_s[idx],
        call_s=problem.call_s[idx], max_stages=problem.max_stages,
        node_names=problem.node_names,
        device_names=[problem.device_names[k] for k in idx] if problem.device_names else (),
        machines=None if problem.machines is None else problem.machines.take(idx))


def solve_over_hosts(problem: Problem, host_of: Sequence[int], *, solver: str = "auto",
                     time_limit: float = 10.0, counts: Sequence[int] | None = None
                     ) -> tuple[Solution, dict[int, float]]:
    """The best throughput plan of ``solver`` over the fastest ``k`` hosts, for each ``k`` of
    ``counts`` (default 1, 2, 4, ... and every host), each scored on ``problem``.

    ``host_of[k]``: the host of device ``k``. Returns the best solution (device indices of
    ``problem``) and each ``k``'s time per input (``inf`` where no plan was found).

    Examples
    --------
    Two ops of 1 s on any of three one-device hosts, 1 s to copy between hosts: a pipeline over
    two hosts takes 1 s per input, but the copy adds a third busy resource of 1 s; one host
    takes 2 s. Both plans are tried and the pipeline kept:

    >>> p = Problem.build([[1.0, 1.0, 1.0]] * 2, [(0, 1)], [1.0], alpha=0.0, beta=1.0)
    >>> sol, tried = solve_over_hosts(p, [0, 1, 2], solver="brute")
    >>> sol.value, tried
    (1.0, {1: 2.0, 2: 1.0, 3: 1.0})
    """
    host_of = np.asarray(host_of)
    if host_of.shape != (problem.num_devices,):
        raise ValueError(f"host_of gives {host_of.size} hosts for {problem.num_devices} devices")
    order = host_order(problem, host_of)
    if counts is None:
        counts = sorted({*(2**j for j in range(len(order).bit_length()) if 2**j <= len(order)),
                         len(order)})
    t0, best, tried = time.perf_counter(), None, {}
    for k in counts:
        devices = np.flatnonzero(np.isin(host_of, order[:k]))
        try:
            sol = solve(restricted(problem, devices), "throughput", solver, time_limit=time_limit)
        except InfeasibleError:
            tried[k] = float("inf")
            continue
        assignment = devices[np.asarray(sol.assignment)]
        value = simulate_throughput(problem, assignment, sol.stages)
        tried[k] = value
        if best is None or value < best.value:
            best = dataclasses.replace(sol, assignment=assignment, value=value,
                                       bound=0.0,  # a bound over some hosts bounds no plan over all
                                       solver=f"{sol.solver} over {k} hosts")
    if best is None:
        raise InfeasibleError(f"no plan over {list(counts)} of the fastest hosts")
    return dataclasses.replace(best, wall_s=time.perf_counter() - t0), tried
