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


def trivial_bound(problem: Problem, objective: str) -> float:
    """A cheap valid lower bound on any feasible plan's value, the largest of:

    * the total work, each node at its cheapest allowed device, over the number of devices;
    * work that must share one device: the nodes allowed only on device ``k``, and each
      colocation group at its cheapest common device (this covers the costliest node);
    * (latency) the critical path with every node at its cheapest allowed device and free copies.

    "Allowed" honours support, pins and groups (:func:`simulate.allowed_devices`).
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
    for g in np.unique(problem.groups[problem.groups >= 0]):
        lb = max(lb, float(cost[problem.groups == g].sum(axis=0).min()))
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
