"""Placement solvers over the array-only :class:`Problem`; all share one signature and one scorer.

>>> sol = solve(problem, "latency", "heft")          # doctest: +SKIP
>>> sol.value, sol.bound, sol.status                 # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from . import baselines
from .problem import OBJECTIVES, InfeasibleError, Problem, Solution, check_time_limit
from .simulate import (check_feasible, precheck, simulate_latency, simulate_replicas,
                       simulate_throughput)

__all__ = ["Problem", "Solution", "InfeasibleError", "solve", "SOLVERS", "simulate_latency",
           "simulate_replicas", "simulate_throughput", "check_feasible"]

log = logging.getLogger(__name__)


def _single(problem, objective, time_limit, **options):
    return baselines.single(problem, objective, options.get("device"), options.get("stay"))


def _replicas(problem, objective, time_limit, **options):
    return baselines.replicas(problem, objective)


def _priority(problem, objective, time_limit, **options):
    return baselines.priority(problem, objective)


def _greedy(problem, objective, time_limit, **options):
    return baselines.greedy(problem, objective)


def _heft(problem, objective, time_limit, **options):
    return baselines.heft(problem, objective)


def best_baseline(problem: Problem, objective: str) -> Solution:
    """The best of the baselines that succeed; raises the first cause when none does."""
    return baselines.best(problem, objective)


def _brute(problem, objective, time_limit, **options):
    from .bruteforce import brute_force
    return brute_force(problem, objective, time_limit=time_limit,
                       contiguous=options.get("contiguous", False))


def _cpsat(problem, objective, time_limit, **options):
    from .cpsat import solve_cpsat
    return solve_cpsat(problem, objective, time_limit=time_limit, **options)


def _coarse(problem, objective, time_limit, **options):
    from .multilevel import solve_coarse
    return solve_coarse(problem, objective, time_limit=time_limit, **options)


def _auto(problem, objective, time_limit, **options):
    if problem.num_nodes > AUTO_CPSAT_MAX_NODES:
        return _coarse(problem, objective, time_limit, **options)
    return _cpsat(problem, objective, time_limit, **options)


def _or_direct(problem: Problem, sol: Solution) -> Solution:
    """``sol``, or the best single device when calling the model there directly (one stage, no
    pipeline overhead) is predicted faster: solvers that model every stage's overhead may miss
    it. The bound becomes the lesser of the two."""
    if not problem.stage_overhead_s.any():
        return sol
    try:
        direct = baselines.single(problem, "throughput")
    except InfeasibleError:
        return sol
    if direct.value >= sol.value:
        return sol
    return replace(direct, bound=min(sol.bound, direct.value), status=sol.status,
                   solver=f"{sol.solver}+direct", wall_s=sol.wall_s + direct.wall_s)


def _or_replicas(problem: Problem, sol: Solution) -> Solution:
    """``sol``, or data-parallel replicas of the whole model when they are predicted faster (the
    bound becomes the lesser of the two: no pipeline beats ``sol.bound``)."""
    try:
        rep = baselines.replicas(problem)
    except InfeasibleError:
        return sol
    if rep.value >= sol.value:
        return sol
    return replace(rep, bound=min(sol.bound, rep.value), status=sol.status,
                   solver=f"{sol.solver}+replicas", wall_s=sol.wall_s + rep.wall_s)


#: Above this many nodes ``"auto"`` coarsens, solves and refines (``"coarse"``) instead of
#: running CP-SAT on every node. On the 1000-node DAG of ``benchmarks/solve_scale.py`` CP-SAT
#: found no plan in 10 s (returning HEFT's, 0.0925 s) where ``"coarse"`` found 0.0832 s.
AUTO_CPSAT_MAX_NODES = 500

#: Solver name -> ``f(problem, objective, time_limit, **options) -> Solution``.
#: ``"single:<k>"`` (everything on device ``k``) is also accepted by :func:`solve`.
SOLVERS: dict[str, Callable[..., Solution]] = {
    "auto": _auto,
    "single": _single,
    "replicas": _replicas,
    "priority": _priority,
    "greedy": _greedy,
    "heft": _heft,
    "brute": _brute,
    "cpsat": _cpsat,
    "coarse": _coarse,
}


def solve(problem: Problem, objective: str = "latency", solver: str = "auto", *,
          time_limit: float = 10.0, replicate: bool = False, **options) -> Solution:
    """Place ``problem``'s nodes on devices, minimizing ``objective``.

    Parameters
    ----------
    problem : Problem
    objective : {"latency", "throughput"}
        Single-input makespan, or time per input of the pipeline.
    solver : str
        A key of :data:`SOLVERS`, or ``"single:<k>"``.
    time_limit : float
        Seconds the solver may use (heuristics ignore it).
    replicate : bool
        Throughput only: return data-parallel replicas of the whole model
        (:func:`baselines.replicas`, ``solution.replicas``) where they are predicted faster than
        the solver's pipeline. Stages are not replicated one by one.
    **options
        Passed to the solver.

    Returns
    -------
    Solution
        ``value`` re-scored by the simulator.

    Raises
    ------
    InfeasibleError
        No placement exists (the message names the cause), or the solver's rule found none.
    ValueError
        Unknown objective or solver, or ``time_limit`` not positive.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
    if solver.startswith("single:"):
        options = {**options, "device": int(solver.split(":", 1)[1])}
        solver = "single"
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)} "
                         "or 'single:<k>'")
    check_time_limit(time_limit)
    precheck(problem)
    t0 = time.perf_counter()
    sol = SOLVERS[solver](problem, objective, time_limit, **options)
    if objective == "throughput" and solver not in ("single", "replicas"):
        sol = _or_direct(problem, sol)
        if replicate:
            sol = _or_replicas(problem, sol)
    if (problem.machines is not None and sol.status == "OPTIMAL"
            and sol.value > sol.bound * (1 + 1e-9)):
        # A solver's own model may leave out the cores that hosts on one machine share.
        sol = replace(sol, status="FEASIBLE")
    log.info("%s/%s: value %.6g bound %.6g status %s in %.2fs", solver, objective, sol.value,
             sol.bound, sol.status, time.perf_counter() - t0)
    return sol
