"""Exhaustive search for tiny problems: the reference the other solvers are tested against.

Definition used throughout the package: the latency of an assignment is the smallest makespan
over *all* schedules of it (any order of nodes on each device and of copies on each link), not
only the topological list schedule. Brute force therefore enumerates every feasible assignment
and, for each, every active schedule (Giffler-Thompson branching, which contains an optimal
schedule for the makespan), with branch-and-bound pruning. CP-SAT optimizes the same quantity,
and both report the schedule's node and copy orders, which :func:`simulate_latency` replays to
the same makespan.
"""

from __future__ import annotations

import itertools
import time

import networkx as nx
import numpy as np

from ._common import make_solution
from .problem import InfeasibleError, Problem, Solution
from .simulate import (allowed_devices, copies_needed, device_loads, hand_offs, link_loads,
                       orders_from_times, simulate_throughput, stage_overhead)

#: Most assignments brute force will enumerate.
MAX_ASSIGNMENTS = 200_000
#: Most topological orders it searches for the stagings of a throughput plan.
MAX_ORDERS = 20_000


def _assignments(problem: Problem):
    """Every assignment that respects support, pins, groups and memory."""
    allowed = allowed_devices(problem)
    n = problem.num_nodes
    # A group's members share one choice: enumerate one variable per group or free node.
    rep = np.arange(n)
    for g in np.unique(problem.groups[problem.groups >= 0]):
        members = np.flatnonzero(problem.groups == g)
        rep[members] = members[0]
    heads = np.unique(rep)
    total = np.prod([allowed[h].sum() for h in heads], dtype=float)
    if total > MAX_ASSIGNMENTS:
        raise ValueError(f"brute force would enumerate {total:.3g} assignments "
                         f"(limit {MAX_ASSIGNMENTS})")
    where = np.searchsorted(heads, rep)
    for choice in itertools.product(*(np.flatnonzero(allowed[h]).tolist() for h in heads)):
        a = np.asarray(choice, dtype=np.int64)[where]
        used = np.bincount(a, weights=problem.node_mem, minlength=problem.num_devices)
        if (used <= problem.mem_cap * (1 + 1e-12)).all():
            yield a


def _best_schedule(problem: Problem, a: np.ndarray, upper: float):
    """Smallest makespan of assignment ``a`` if below ``upper``: (makespan, starts, finishes,
    copies) or None. Branches over Giffler-Thompson conflict sets."""
    n, d = problem.num_nodes, problem.num_devices
    copies = copies_needed(problem, a)
    tasks = n + len(copies)
    cid = {c: n + j for j, c in enumerate(copies)}
    dur = [float(problem.cost[i, a[i]]) for i in range(n)]
    dur += [problem.transfer_time(u, int(a[u]), k) for u, k in copies]
    res = [int(a[i]) for i in range(n)] + [d + int(a[u]) * d + k for u, k in copies]
    if problem.serial:  # one thread runs every task
        res = [0] * tasks
    preds: list[list[int]] = [[] for _ in range(tasks)]
    for u, v in problem.edges.tolist():
        preds[v].append(u if a[u] == a[v] else cid[(u, int(a[v]))])
    for (u, _), t in cid.items():
        preds[t].append(u)
    preds = [sorted(set(p)) for p in preds]
    succs: list[list[int]] = [[] for _ in range(tasks)]
    for t, ps in enumerate(preds):
        for p in ps:
            succs[p].append(t)
    tail = list(dur)  # longest duration path from a task's start to the end
    topo = nx.DiGraph([(p, t) for t in range(tasks) for p in preds[t]])
    topo.add_nodes_from(range(tasks))
    for t in reversed(list(nx.topological_sort(topo))):
        tail[t] = dur[t] + max((tail[s] for s in succs[t]), default=0.0)
    best = [upper, None]
    start = [0.0] * tasks
    finish = [0.0] * tasks
    free = {}
    remaining = {}
    for t in range(tasks):
        remaining[res[t]] = remaining.get(res[t], 0.0) + dur[t]
    done = [False] * tasks

    def dfs(count: int, makespan: float) -> None:
        if count == tasks:
            if makespan < best[0] - 1e-12:
                best[0] = makespan
                best[1] = (list(start), list(finish))
            return
        ready = [t for t in range(tasks) if not done[t] and all(done[p] for p in preds[t])]
        est = {t: max(max((finish[p] for p in preds[t]), default=0.0), free.get(res[t], 0.0))
               for t in ready}
        lb = max(max(free.get(r, 0.0) + left for r, left in remaining.items()),
                 max(est[t] + tail[t] for t in ready), makespan)
        if lb >= best[0] - 1e-12:
            return
        star = min(ready, key=lambda t: (est[t] + dur[t], t))
        ect = est[star] + dur[star]
        conflict = [t for t in ready if res[t] == res[star] and (t == star or est[t] < ect)]
        for t in conflict:
            r = res[t]
            old = free.get(r, 0.0)
            start[t], finish[t] = est[t], est[t] + dur[t]
            done[t], free[r] = True, finish[t]
            remaining[r] -= dur[t]
            dfs(count + 1, max(makespan, finish[t]))
            remaining[r] += dur[t]
            done[t], free[r] = False, old

    dfs(0, 0.0)
    if best[1] is None:
        return None
    s, f = best[1]
    return best[0], np.array(s[:n]), np.array(f[:n]), {c: (s[cid[c]], f[cid[c]]) for c in copies}


def best_staging(problem: Problem, assignment, orders: np.ndarray, contiguous: bool = False):
    """The least throughput period of ``assignment`` over its stagings, and that staging.

    A staging lists its stages in a topological order: the runs of one device along the nodes
    in that order are its stages. ``orders`` holds every topological order (one per row), so the
    result is exact. ``contiguous`` keeps stagings with at most one stage per device. Returns
    ``(inf, None)`` when no staging obeys ``max_stages`` (and ``contiguous``).
    """
    a = np.asarray(assignment)
    seq = a[orders]
    first = np.ones(seq.shape, dtype=bool)
    first[:, 1:] = seq[:, 1:] != seq[:, :-1]
    runs = np.stack([(first & (seq == k)).sum(axis=1) for k in range(problem.num_devices)], 1)
    ok = runs.sum(axis=1) <= (problem.max_stages or problem.num_nodes)
    if contiguous:
        ok &= (runs <= 1).all(axis=1)
    if not ok.any():
        return np.inf, None
    period = np.maximum((device_loads(problem, a) + stage_overhead(problem, runs)).max(axis=1),
                        hand_offs(problem, runs).sum(axis=1))
    period = np.maximum(period, link_loads(problem, a).max(initial=0.0))
    best = int(np.flatnonzero(ok)[np.argmin(period[ok])])
    stages = np.empty(problem.num_nodes, dtype=np.int64)
    stages[orders[best]] = np.cumsum(first[best]) - 1
    return float(period[best]), stages


def brute_force(problem: Problem, objective: str, time_limit: float = 60.0,
                contiguous: bool = False) -> Solution:
    """Optimal placement by enumeration (status OPTIMAL, bound = value).

    Throughput with stage overheads, ``max_stages`` or ``contiguous`` (one stage per device)
    enumerates the stagings of every assignment too (every topological order, see
    :func:`best_staging`); without them the stages do not change the period.

    Raises
    ------
    InfeasibleError
        No assignment satisfies support, pins, groups and memory (and the stage limits).
    ValueError
        Too many assignments to enumerate, or ``time_limit`` ran out.
    """
    t0 = time.perf_counter()
    best_a, best_v, best_sched = None, np.inf, None
    staged = objective == "throughput" and (contiguous or problem.max_stages is not None
                                            or problem.staged)
    if staged:
        g = nx.DiGraph()
        g.add_nodes_from(range(problem.num_nodes))
        g.add_edges_from(problem.edges.tolist())
        orders = np.array(list(itertools.islice(nx.all_topological_sorts(g), MAX_ORDERS + 1)))
        if len(orders) > MAX_ORDERS:
            raise ValueError(f"more than {MAX_ORDERS} topological orders to search for stagings")
    for a in _assignments(problem):
        if time.perf_counter() - t0 > time_limit:
            raise ValueError(f"brute force ran past its time limit of {time_limit} s")
        if objective == "throughput":
            v, stages = (best_staging(problem, a, orders, contiguous) if staged
                         else (simulate_throughput(problem, a), None))
            if v < best_v - 1e-12:
                best_a, best_v, best_sched = a, v, stages
            continue
        found = _best_schedule(problem, a, best_v)
        if found is not None:
            best_a, best_v, best_sched = a, found[0], found[1:]
    if best_a is None:
        raise InfeasibleError("no assignment satisfies support, pins, groups, memory "
                              "and the stage limits")
    if objective == "throughput":
        return make_solution(problem, objective, best_a, "brute", status="OPTIMAL",
                             bound=best_v, stages=best_sched, started=t0)
    order, transfer_order = orders_from_times(*best_sched)
    return make_solution(problem, objective, best_a, "brute", status="OPTIMAL", bound=best_v,
                         order=order, transfer_order=transfer_order, started=t0)
