"""Helpers shared by the solvers: scoring a plan into a Solution, trivial bounds."""

from __future__ import annotations

import time

import networkx as nx
import numpy as np

from .problem import Problem, Solution
from .simulate import (allowed_devices, check_feasible, simulate_latency, simulate_throughput,
                       stages_of)


def graph(problem: Problem) -> nx.DiGraph:
    """The node DAG as a networkx graph."""
    g = nx.DiGraph()
    g.add_nodes_from(range(problem.num_nodes))
    g.add_edges_from(problem.edges.tolist())
    return g


#: Weight updates :func:`load_relaxation` makes.
RELAXATION_STEPS = 100


def load_relaxation(cost: np.ndarray, steps: int = RELAXATION_STEPS
                    ) -> tuple[float, np.ndarray]:
    """A lower bound on the busiest device's load over assignments of items to devices, and the
    device weights that give it.

    ``cost`` is (items, d), ``np.inf`` where an item may not go. For weights ``lam >= 0`` summing
    to 1 and any assignment ``a``, ``max_k load_k >= sum_k lam_k load_k = sum_i lam[a_i]
    cost[i, a_i] >= sum_i min_k lam_k cost[i, k]``: every ``lam`` gives a bound (uniform weights
    give the total cheapest work over ``d``). The weights are moved ``steps`` times towards the
    devices that the bound's own assignment loads most (multiplicative weights) and the best
    bound seen is returned; the linear relaxation of the min-max assignment is its maximum.
    Each item on its device of least weighted cost is then a well balanced assignment.

    Examples
    --------
    Three nodes of 2 s on device 0 or 4 s on device 1: the best plan loads each device 4 s.
    Equal weights give 3 * 2 / 2 = 3 s; weights (2/3, 1/3) give 3 * 4/3 = 4 s.

    >>> bound, weights = load_relaxation(np.tile([2.0, 4.0], (3, 1)))
    >>> 3.9 < bound <= 4.0
    True
    """
    m, d = cost.shape
    allowed = np.isfinite(cost)
    lam = np.full(d, 1.0 / d)
    best, best_lam = 0.0, lam
    for step in range(steps):
        weighted = np.where(allowed, cost * lam, np.inf)
        k = weighted.argmin(axis=1)
        value = float(weighted[np.arange(m), k].sum())
        if value > best:
            best, best_lam = value, lam
        loads = np.bincount(k, weights=cost[np.arange(m), k], minlength=d)
        if loads.sum() <= 0:
            break
        lam = lam * np.exp(0.5 / np.sqrt(step + 1) * (loads / loads.mean() - 1))
        lam /= lam.sum()
    return best, best_lam


def trivial_bound(problem: Problem, objective: str) -> float:
    """A cheap valid lower bound on any feasible plan's value, the largest of:

    * the busiest device's load under the weighted relaxation of :func:`load_relaxation`
      (each colocation group one item), at least the total work, each node at its cheapest
      allowed device, over the number of devices;
    * work that must share one device: the nodes allowed only on device ``k``, and each
      colocation group at its cheapest common device (this covers the costliest node);
    * (latency) the critical path with every node at its cheapest allowed device and free copies;
      for a ``serial`` problem, the sum of every node at its cheapest allowed device.

    Both objectives are at least the busiest device's load: a makespan covers every device's
    work, and a period is at least each device's summed compute. "Allowed" honours support,
    pins and groups (:func:`simulate.allowed_devices`).
    """
    n, d = problem.cost.shape
    if n == 0:
        return 0.0
    allowed = allowed_devices(problem)
    cost = np.where(allowed, problem.cost, np.inf)
    best = cost.min(axis=1)
    lb = float(best.sum()) / d
    only = allowed.sum(axis=1) == 1
    forced = np.bincount(allowed[only].argmax(axis=1), weights=best[only], minlength=d)
    lb = max(lb, float(forced.max()), float(best.max()))
    grouped = problem.groups >= 0
    items = [cost[~grouped]]
    for g in np.unique(problem.groups[grouped]):
        items.append(cost[problem.groups == g].sum(axis=0, keepdims=True))
        lb = max(lb, float(items[-1].min()))
    if d > 1:
        lb = max(lb, load_relaxation(np.concatenate(items))[0])
    if objective == "latency" and problem.serial:  # one thread runs every node
        lb = max(lb, float(best.sum()))
    if objective == "latency":
        path = best.copy()
        edges = problem.edges[np.argsort(problem.edges[:, 1], kind="stable")]
        for u, v in edges.tolist():
            path[v] = max(path[v], path[u] + best[v])
        lb = max(lb, float(path.max()))
    return lb


def make_solution(problem: Problem, objective: str, assignment, solver: str, *,
                  status: str = "HEURISTIC", bound: float | None = None, order=None,
                  transfer_order=None, stages=None, started: float | None = None) -> Solution:
    """Check ``assignment`` and score it with the simulator into a :class:`Solution`.

    Throughput plans run as ``stages`` (default :func:`stages_of`). The bound is the larger of
    ``bound`` (a solver's claim) and :func:`trivial_bound`, capped at the simulated value.
    """
    a = np.asarray(assignment, dtype=np.int64)
    if objective == "throughput":
        stages = stages_of(problem, a) if stages is None else np.asarray(stages, dtype=np.int64)
    check_feasible(problem, a, stages)
    lb = trivial_bound(problem, objective)
    if bound is not None:
        lb = max(lb, float(bound))
    wall = 0.0 if started is None else time.perf_counter() - started
    if objective == "latency":
        s = simulate_latency(problem, a, order, transfer_order)
        value = s.makespan
        lb = min(lb, value)
        return Solution(assignment=a, objective=objective, value=value, bound=lb, status=status,
                        solver=solver, start=s.start, wall_s=wall, order=s.order,
                        transfer_order=tuple((t.node, t.dst) for t in s.transfers))
    value = simulate_throughput(problem, a, stages)
    lb = min(lb, value)
    return Solution(assignment=a, objective=objective, value=value, bound=lb, status=status,
                    solver=solver, stages=stages, wall_s=wall)
