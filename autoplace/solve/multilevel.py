"""Coarsen, solve, project, refine: the solver for graphs too big for CP-SAT on every node.

1. :func:`coarsen.coarsen_placement` merges free leaves into their producer (lossless), and
   cheap leaves and chains (heuristic) into a coarse :class:`Problem`.
2. The coarse problem is solved by CP-SAT, warm-started from the list schedulers, when it has
   at most :data:`COARSE_CPSAT_MAX_NODES` nodes; else by the list schedulers alone: the
   single-device plan, and HEFT with each of :data:`WORK_WEIGHTS` for latency; the
   single-device plan, greedy, HEFT and the loads balanced by the weights of
   :func:`_common.load_relaxation` for throughput.
3. The coarse plan is projected onto the nodes: a coarse node's members share its device and
   run back to back in its place, a schedule of the same makespan and the same loads.
4. Local search on the full problem moves one node (a colocation group: all its members) to
   another device it may use and has room on, until no move helps or the time runs out. A move
   is kept when it lowers the objective, or keeps it and saves work (which frees devices for
   later moves). Latency tries the nodes of one critical chain of the current schedule on
   every device, then every node on its cheaper devices, each move scored by
   :func:`simulate_latency` with the schedule's node order. Throughput tries every node on
   every device, scored by device and link loads kept up to date move by move
   (:func:`simulate_throughput`'s terms without stage overheads); the result is kept only if
   ``simulate_throughput`` scores it, with its stages, better than the start.

The value is the simulator's on the full problem. The bound is :func:`_common.trivial_bound`'s
on the full problem, and the coarse solver's when the coarsening was lossless (the coarse
optimum is then the full one).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial

import numpy as np

from . import baselines
from ._common import load_relaxation, make_solution
from .coarsen import coarse_problem, coarsen_placement
from .problem import InfeasibleError, Problem, Solution
from .simulate import allowed_devices, simulate_latency, simulate_throughput, stages_of

log = logging.getLogger(__name__)

#: Largest coarse problem handed to CP-SAT.
COARSE_CPSAT_MAX_NODES = 300
#: Share of the time left that CP-SAT may use on the coarse problem; the rest refines.
CPSAT_SHARE = 0.5
#: HEFT work weights tried on a coarse latency problem (0 is plain HEFT; a few units did best on
#: the random DAGs of ``benchmarks/solve_scale.py``).
WORK_WEIGHTS = (0.0, 2.0, 8.0)


def solve_coarse(problem: Problem, objective: str, *, time_limit: float = 10.0,
                 workers: int = 2, contiguous: bool = False) -> Solution:
    """Coarsen, solve the coarse problem, project, refine on the full problem (module docstring).

    Parameters
    ----------
    problem : Problem
    objective : {"latency", "throughput"}
    time_limit : float
        Seconds for the whole solve. The coarsening and the first list scheduler that succeeds
        run to the end regardless (about 1.5 s on 10,000 nodes and 4 devices; all of them
        about 3.5 s).
    workers : int
        CP-SAT search workers.
    contiguous : bool
        Throughput: CP-SAT's coarse plan has one stage per device (the list schedulers' plans
        need not), and the local search keeps such a plan so.

    Returns
    -------
    Solution
        ``solver="coarse"``; OPTIMAL only when the bound meets the value, FEASIBLE when the
        bound is CP-SAT's on a lossless coarsening, else HEURISTIC.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    rep, lossless = coarsen_placement(problem)
    try:
        coarse = _solve_small(coarse_problem(problem, rep), objective, deadline, workers,
                              contiguous)
    except InfeasibleError:
        if lossless:  # the coarse optimum is the full one: nothing to place
            raise
        log.info("coarse problem unsolved (merged nodes too big?); solving the nodes themselves")
        rep, lossless = np.arange(problem.num_nodes), True
        coarse = _solve_small(problem, objective, deadline, workers, contiguous)
    scored = time.perf_counter()
    start = _project(problem, objective, coarse, rep)
    # Keep time to score the refined plan once more.
    end = deadline - 2 * (time.perf_counter() - scored)
    order = transfer_order = stages = None
    if objective == "latency":
        a, order, transfer_order = _refine_latency(problem, start, end)
    else:
        a, stages = _refine_throughput(problem, start, end, contiguous)
    solved = lossless and coarse.status in ("OPTIMAL", "FEASIBLE")
    sol = make_solution(problem, objective, a, "coarse", bound=coarse.bound if lossless else None,
                        order=order, transfer_order=transfer_order, stages=stages, started=t0,
                        status="FEASIBLE" if solved else "HEURISTIC")
    log.info("coarse: %d -> %d nodes (%s), coarse plan %.6g, projected %.6g, refined %.6g",
             problem.num_nodes, int(rep.max(initial=-1)) + 1,
             "lossless" if lossless else "heuristic", coarse.value, start.value, sol.value)
    if sol.bound >= sol.value * (1 - 1e-9):
        return replace(sol, status="OPTIMAL")
    return sol


def _solve_small(problem: Problem, objective: str, deadline: float, workers: int,
                 contiguous: bool) -> Solution:
    """The best list-scheduler plan, improved by CP-SAT when the problem is small enough."""
    rules = [baselines.single]
    if objective == "latency":
        rules += [partial(baselines.heft, work_weight=w) for w in WORK_WEIGHTS]
    else:
        rules += [baselines.greedy, baselines.heft, _balanced]
    small = problem.num_nodes <= COARSE_CPSAT_MAX_NODES
    try:
        best = baselines.best(problem, objective, rules, deadline)
    except InfeasibleError:
        if not small:
            raise
        best = None  # CP-SAT may still find a plan, or names the cause
    if small:
        from .cpsat import solve_cpsat

        left = max(0.0, deadline - time.perf_counter())
        return solve_cpsat(problem, objective, time_limit=CPSAT_SHARE * left, warm_start=best,
                           workers=workers, contiguous=contiguous)
    return best


def _balanced(problem: Problem, objective: str) -> Solution:
    """Each node (colocation group) on its device of least cost weighted by
    :func:`_common.load_relaxation`'s weights: the device loads balanced, copies and memory
    ignored (raises :class:`InfeasibleError` if memory overflows)."""
    t0 = time.perf_counter()
    cost = np.where(allowed_devices(problem), problem.cost, np.inf)
    item = np.arange(problem.num_nodes)
    for g in np.unique(problem.groups[problem.groups >= 0]):
        item[problem.groups == g] = np.flatnonzero(problem.groups == g)[0]
    heads, item = np.unique(item, return_inverse=True)
    rows = np.zeros((heads.size, problem.num_devices))
    np.add.at(rows, item, cost)
    _, weights = load_relaxation(rows)
    a = np.where(np.isfinite(rows), rows * weights, np.inf).argmin(axis=1)[item]
    return make_solution(problem, objective, a, "balanced", started=t0)


def _project(problem: Problem, objective: str, coarse: Solution, rep: np.ndarray) -> Solution:
    """The coarse plan on the full problem: members on their coarse node's device, in its place
    of the coarse order (members in index order), copies in the coarse copy order."""
    a = coarse.assignment[rep]
    if objective == "throughput":
        return make_solution(problem, objective, a, "coarse", stages=coarse.stages[rep])
    place = np.empty(coarse.order.size, dtype=np.int64)
    place[coarse.order] = np.arange(coarse.order.size)
    order = np.lexsort((np.arange(problem.num_nodes), place[rep]))
    sender = {int(rep[u]): int(u) for u, v in problem.edges.tolist() if rep[u] != rep[v]}
    transfer_order = [(sender[c], k) for c, k in coarse.transfer_order]
    return make_solution(problem, objective, a, "coarse", order=order,
                         transfer_order=transfer_order)


def _units(problem: Problem) -> list[np.ndarray]:
    """The nodes that move together with each node: its colocation group, or itself."""
    units = [np.array([i]) for i in range(problem.num_nodes)]
    for g in np.unique(problem.groups[problem.groups >= 0]):
        members = np.flatnonzero(problem.groups == g)
        for i in members:
            units[i] = members
    return units


def _critical_chain(problem: Problem, a: np.ndarray, sched) -> list[int]:
    """Nodes of one chain of tasks that meet end to end from time 0 to the makespan: each task
    starts when a data input (its producer, or the copy bringing it), the node before it on its
    device, or the copy before it on its link ends."""
    n = problem.num_nodes
    if n == 0:
        return []
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in problem.edges.tolist():
        preds[v].append(u)
    before = np.full(n, -1)
    last: dict[int, int] = {}
    for v in sched.order.tolist():
        before[v] = last.get(int(a[v]), -1)
        last[int(a[v])] = v
    copies = {(t.node, t.dst): t for t in sched.transfers}
    link_before, last_on = {}, {}
    for t in sched.transfers:
        link_before[t] = last_on.get((t.src, t.dst))
        last_on[(t.src, t.dst)] = t
    tol = 1e-12 * sched.makespan
    chain, task = [], ("node", int(np.argmax(sched.finish)))
    while task is not None:
        kind, x = task
        task = None
        if kind == "copy":
            if x.start > tol and sched.finish[x.node] >= x.start - tol:
                task = ("node", x.node)
            elif x.start > tol and link_before[x] is not None:
                task = ("copy", link_before[x])  # it waited for the link
            continue
        chain.append(x)
        s = sched.start[x]
        if s <= tol:
            break
        for u in preds[x]:
            if a[u] == a[x] and sched.finish[u] >= s - tol:
                task = ("node", u)
                break
            if a[u] != a[x] and copies[(u, int(a[x]))].finish >= s - tol:
                task = ("copy", copies[(u, int(a[x]))])
                break
        if task is None and before[x] >= 0:
            task = ("node", int(before[x]))  # it waited for its device
    return chain


def _refine_latency(problem: Problem, start: Solution, deadline: float):
    """Move nodes while (``simulate_latency``'s makespan, total work) gets smaller; returns the
    assignment, node order and transfer order.

    Each pass tries the nodes of the schedule's critical chain on every other device, then every
    node on its cheaper devices (a move that keeps the makespan and saves work frees the
    devices for later moves), costliest over their best first; moves are scored with the node
    order of the schedule they change.
    """
    a = start.assignment.copy()
    began = time.perf_counter()
    sched = simulate_latency(problem, a, start.order, start.transfer_order)
    took = time.perf_counter() - began
    transfer_order = start.transfer_order
    allowed = allowed_devices(problem)
    cost = np.where(allowed, problem.cost, np.inf)
    cheapest = cost.min(axis=1)
    used = np.bincount(a, weights=problem.node_mem, minlength=problem.num_devices)
    units = _units(problem)
    moved = True
    while moved:
        moved = False
        excess = problem.cost[np.arange(a.size), a] - cheapest
        chain = set(_critical_chain(problem, a, sched))
        tries = sorted(chain, key=lambda v: -excess[v])
        tries += [v for v in np.argsort(-excess, kind="stable").tolist()
                  if excess[v] > 0 and v not in chain]
        for v in tries:
            members, j = units[v], int(a[v])
            need = problem.node_mem[members].sum()
            for k in np.argsort(cost[v], kind="stable").tolist():
                if v not in chain and cost[v, k] >= cost[v, j]:
                    break
                full = used[k] + need > problem.mem_cap[k] * (1 + 1e-12)
                if k == j or not allowed[v, k] or full:
                    continue
                began = time.perf_counter()
                if began + took > deadline:  # the next simulation would end past it
                    return a, sched.order, transfer_order
                trial = a.copy()
                trial[members] = k
                s = simulate_latency(problem, trial, sched.order)
                took = time.perf_counter() - began
                saved = (problem.cost[members, j] - problem.cost[members, k]).sum()
                if s.makespan < sched.makespan * (1 - 1e-12) or (
                        s.makespan <= sched.makespan and saved > 0):
                    a, sched, moved = trial, s, True
                    transfer_order = [(t.node, t.dst) for t in s.transfers]
                    used[j] -= need
                    used[k] += need
                    break
    return a, sched.order, transfer_order


class _Loads:
    """Device and directed-link loads of an assignment (``simulate_throughput``'s terms without
    stage overheads), updated in place as nodes move."""

    def __init__(self, problem: Problem, a: np.ndarray):
        n, d = problem.num_nodes, problem.num_devices
        self.p, self.a = problem, a
        self.preds: list[list[int]] = [[] for _ in range(n)]
        # users[u, k]: edges from u into nodes on device k.
        self.users = np.zeros((n, d), dtype=np.int64)
        for u, v in problem.edges.tolist():
            self.preds[v].append(u)
            self.users[u, a[v]] += 1
        self.device = np.bincount(a, weights=problem.cost[np.arange(n), a], minlength=d)
        self.link = np.zeros((d, d))
        for u, k in zip(*np.nonzero(self.users)):
            if k != a[u]:
                self.link[a[u], k] += problem.transfer_time(u, int(a[u]), int(k))

    def score(self) -> tuple[float, float]:
        """(the busiest device's or link's load, the summed loads)."""
        return (max(self.device.max(), self.link.max()),
                float(self.device.sum() + self.link.sum()))

    def move(self, u: int, k: int) -> None:
        """Put node ``u`` on device ``k``: its compute, its output's copies, its inputs'."""
        p, a, j = self.p, self.a, int(self.a[u])
        self.device[j] -= p.cost[u, j]
        self.device[k] += p.cost[u, k]
        for w in np.flatnonzero(self.users[u]).tolist():
            if w != j:
                self.link[j, w] -= p.transfer_time(u, j, w)
            if w != k:
                self.link[k, w] += p.transfer_time(u, k, w)
        for q in self.preds[u]:
            i = int(a[q])
            self.users[q, j] -= 1
            if self.users[q, j] == 0 and i != j:
                self.link[i, j] -= p.transfer_time(q, i, j)
            self.users[q, k] += 1
            if self.users[q, k] == 1 and i != k:
                self.link[i, k] += p.transfer_time(q, i, k)
        a[u] = k


def _refine_throughput(problem: Problem, start: Solution, deadline: float, contiguous: bool):
    """Move nodes while (busiest load, summed loads) gets smaller; the result if
    ``simulate_throughput`` scores it better with its stages (within ``max_stages``, one per
    device if ``contiguous``), else the start. Returns the assignment and stages."""
    a = start.assignment.copy()
    loads = _Loads(problem, a)
    allowed = allowed_devices(problem)
    used = np.bincount(a, weights=problem.node_mem, minlength=problem.num_devices)
    units = _units(problem)
    best = loads.score()
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for v in range(problem.num_nodes):
            members, j = units[v], int(a[v])
            if members[0] != v:  # a group moves once, with its first member
                continue
            if time.perf_counter() > deadline:
                break
            need, choice = problem.node_mem[members].sum(), None
            for k in np.flatnonzero(allowed[v]).tolist():
                if k == j or used[k] + need > problem.mem_cap[k] * (1 + 1e-12):
                    continue
                for u in members.tolist():
                    loads.move(u, k)
                score = loads.score()
                if score[0] < best[0] or (score[0] == best[0] and
                                          score[1] < best[1] * (1 - 1e-12)):
                    best, choice = score, k
                for u in members.tolist():
                    loads.move(u, j)
            if choice is not None:
                for u in members.tolist():
                    loads.move(u, choice)
                used[j] -= need
                used[choice] += need
                improved = True
    stages = stages_of(problem, a)
    count = len(np.unique(stages))
    if ((a != start.assignment).any() and count <= (problem.max_stages or problem.num_nodes)
            and (not contiguous or count == len(np.unique(a)))
            and simulate_throughput(problem, a, stages) < start.value):
        return a, stages
    return start.assignment, start.stages
