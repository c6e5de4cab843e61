"""Helpers shared by the solvers: scoring a plan into a Solution, stages, trivial bounds."""

from __future__ import annotations

import time

import networkx as nx
import numpy as np

from .problem import Problem, Solution
from .simulate import check_feasible, simulate_latency, simulate_throughput


def graph(problem: Problem) -> nx.DiGraph:
    """The node DAG as a networkx graph."""
    g = nx.DiGraph()
    g.add_nodes_from(range(problem.num_nodes))
    g.add_edges_from(problem.edges.tolist())
    return g


def stages_of(problem: Problem, assignment) -> np.ndarray:
    """Stage of every node, numbered in topological order of the stage DAG.

    When the devices' node sets form a DAG (every device's set is convex), each device holding
    nodes is one stage. Otherwise a device may hold several stages: a node's level is the number
    of device changes on its longest incoming path, and a stage is a (level, device) pair.
    """
    a = np.asarray(assignment, dtype=np.int64)
    q = nx.DiGraph()
    q.add_nodes_from(np.unique(a).tolist())
    q.add_edges_from((int(a[u]), int(a[v])) for u, v in problem.edges.tolist() if a[u] != a[v])
    if nx.is_directed_acyclic_graph(q):
        first = {k: int(np.flatnonzero(a == k)[0]) for k in q.nodes}
        rank = {k: r for r, k in enumerate(nx.lexicographical_topological_sort(q, key=first.get))}
        return np.array([rank[k] for k in a.tolist()], dtype=np.int64)
    level = np.zeros(a.size, dtype=np.int64)
    for u, v in sorted(problem.edges.tolist(), key=lambda e: e[1]):
        level[v] = max(level[v], level[u] + int(a[u] != a[v]))
    keys = sorted(set(zip(level.tolist(), a.tolist())))
    rank = {key: r for r, key in enumerate(keys)}
    return np.array([rank[key] for key in zip(level.tolist(), a.tolist())], dtype=np.int64)


def trivial_bound(problem: Problem, objective: str) -> float:
    """A cheap valid lower bound: total best-case work over all devices, the costliest node,
    and (latency) the critical path with every node at its fastest and free communication."""
    best = problem.cost.min(axis=1) if problem.num_nodes else np.zeros(0)
    lb = max(float(best.sum()) / problem.num_devices, float(best.max(initial=0.0)))
    if objective == "latency":
        path = best.copy()
        for u, v in sorted(problem.edges.tolist(), key=lambda e: e[1]):
            path[v] = max(path[v], path[u] + best[v])
        lb = max(lb, float(path.max(initial=0.0)))
    return lb


def make_solution(problem: Problem, objective: str, assignment, solver: str, *,
                  status: str = "HEURISTIC", bound: float | None = None, order=None,
                  transfer_order=None, started: float | None = None) -> Solution:
    """Check ``assignment`` and score it with the simulator into a :class:`Solution`.

    ``bound`` defaults to :func:`trivial_bound`; a status of OPTIMAL also sets the bound to the
    simulated value when the claimed bound is within 1e-9 relative of it.
    """
    a = np.asarray(assignment, dtype=np.int64)
    check_feasible(problem, a)
    lb = trivial_bound(problem, objective) if bound is None else float(bound)
    wall = 0.0 if started is None else time.perf_counter() - started
    if objective == "latency":
        s = simulate_latency(problem, a, order, transfer_order)
        value = s.makespan
        lb = min(max(lb, trivial_bound(problem, objective)), value)
        return Solution(assignment=a, objective=objective, value=value, bound=lb, status=status,
                        solver=solver, start=s.start, wall_s=wall, order=s.order,
                        transfer_order=tuple((t.node, t.dst) for t in s.transfers))
    value = simulate_throughput(problem, a)
    lb = min(max(lb, trivial_bound(problem, objective)), value)
    return Solution(assignment=a, objective=objective, value=value, bound=lb, status=status,
                    solver=solver, stages=stages_of(problem, a), wall_s=wall)
