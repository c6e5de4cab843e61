"""Solvers for the dnn-partitioning benchmark's own two models: an interval DP over a topological
order, the exact and CP-SAT max-load splits of :mod:`.maxload`, and a CP-SAT latency model."""

from __future__ import annotations

import logging
import time

import numpy as np

from autoplace.dnn_partitioning.benchmark import Benchmark, reordered, latency, max_load, units
from autoplace.dnn_partitioning.maxload import (Split, Ticks, _solve, _unproven, cpsat_general,
                                                cpsat_split, ideal_dp, placement_model)
from autoplace.solve.coarsen import coarsen
from autoplace.solve.problem import InfeasibleError, check_time_limit

log = logging.getLogger(__name__)


def _interval_loads(bench: Benchmark, objective: str, cuts: np.ndarray):
    """Cost of every interval ``[i, j)`` of the topological order, ``i`` and ``j`` in ``cuts``,
    as one accelerator stage and as the CPU stage: (acc, cpu), (n+1, n+1) arrays, ``inf`` where
    not allowed (unsupported node, over memory, a colour class cut). For ``"throughput"`` an
    accelerator stage costs its max-load; for ``"latency"`` its in-copies + compute +
    out-copies."""
    p = bench.problem
    n, fp, cpu = p.num_nodes, p.cost[:, 0], p.cost[:, bench.cpu]
    last_use = np.full(n, -1)
    first_pred = [[] for _ in range(n)]
    for u, v in p.edges.tolist():
        last_use[u] = max(last_use[u], v)
        first_pred[v].append(u)
    gmin, gmax = np.arange(n), np.arange(n)
    for g in np.unique(p.groups[p.groups >= 0]):
        members = np.flatnonzero(p.groups == g)
        gmin[members], gmax[members] = members.min(), members.max()
    acc = np.full((n + 1, n + 1), np.inf)
    cpu_load = np.full((n + 1, n + 1), np.inf)
    cap = p.mem_cap[0]
    for i in np.flatnonzero(cuts[:n]).tolist():
        comp = cpu_sum = mem = recv = send = 0.0
        received: set[int] = set()
        leaving: dict[int, list[int]] = {}
        lo, hi, ok = n, -1, True
        for j in range(i, n):  # add node j, the interval becomes [i, j + 1)
            lo, hi = min(lo, gmin[j]), max(hi, gmax[j])
            comp += fp[j]
            cpu_sum += cpu[j]
            mem += p.node_mem[j]
            ok = ok and np.isfinite(fp[j])
            for u in first_pred[j]:
                if u < i and u not in received:
                    received.add(u)
                    recv += bench.comm[u]
            if last_use[j] >= 0:
                send += bench.comm[j]
                leaving.setdefault(int(last_use[j]), []).append(j)
            for u in leaving.pop(j, ()):  # j was u's last consumer: u no longer sends
                send -= bench.comm[u]
            if lo < i:
                break
            if hi > j or not cuts[j + 1]:
                continue
            cpu_load[i, j + 1] = cpu_sum
            if ok and mem <= cap * (1 + 1e-12):
                acc[i, j + 1] = comp + recv + send
    return acc, cpu_load


def interval_dp(bench: Benchmark, objective: str = "throughput") -> np.ndarray:
    """Best split of one topological order of the coarse DAG (:func:`coarsen.coarsen`: colour
    classes kept whole) into consecutive stages, each on its own accelerator (at most ``k``) or
    on the CPU (at most one stage): exact over such splits for the max-load (throughput) or the
    summed stage time (a latency proxy, scored afterwards by :func:`latency`). Returns the
    assignment."""
    rep = coarsen(bench.problem)
    order = np.lexsort((np.arange(rep.size), rep))
    cuts = np.r_[True, rep[order][1:] != rep[order][:-1], True]
    a = np.empty(rep.size, dtype=np.int64)
    a[order] = _interval_dp(reordered(bench, order), objective, cuts)
    return a


def _interval_dp(bench: Benchmark, objective: str, cuts: np.ndarray) -> np.ndarray:
    acc, cpu_load = _interval_loads(bench, objective, cuts)
    n, k = bench.problem.num_nodes, bench.k
    combine = np.maximum if objective == "throughput" else np.add
    # f[j, used accelerators, cpu used] = best value of the prefix [0, j)
    f = np.full((n + 1, k + 1, 2), np.inf)
    arg: dict = {}
    f[0, 0, 0] = 0.0
    for j in range(1, n + 1):
        for used in range(k + 1):
            for c in range(2):
                best, choice = np.inf, None
                if used > 0:
                    vals = combine(f[:j, used - 1, c], acc[:j, j])
                    i = int(vals.argmin())
                    best, choice = vals[i], (i, used - 1, c, "acc")
                if c == 1:
                    vals = combine(f[:j, used, 0], cpu_load[:j, j])
                    i = int(vals.argmin())
                    if vals[i] < best:
                        best, choice = vals[i], (i, used, 0, "cpu")
                f[j, used, c] = best
                arg[j, used, c] = choice
    end = np.unravel_index(np.argmin(f[n]), f[n].shape)
    if not np.isfinite(f[n][end]):
        raise InfeasibleError("no split of the topological order into at most "
                              f"{k} accelerator stages and one CPU stage fits")
    a = np.empty(n, dtype=np.int64)
    j, used, c = n, int(end[0]), int(end[1])
    while j > 0:
        i, used2, c2, kind = arg[j, used, c]
        a[i:j] = used - 1 if kind == "acc" else bench.cpu
        j, used, c = i, used2, c2
    return a


def solve_benchmark(bench: Benchmark, objective: str, contiguous: bool = True,
                    time_limit: float = 10.0) -> Split:
    """A split of a benchmark input under its own model, with a lower bound, in about
    ``time_limit`` s: the first split below is always made (it takes well under a second on the
    benchmark's inputs), every later step stops at the limit and the best split so far is
    returned, its bound no less than :func:`path_bound` (latency) or :func:`load_bound`
    (throughput). ``status`` is ``"OPTIMAL"`` when the bound is proven tight, else
    ``"FEASIBLE"``.

    Throughput, contiguous: :func:`interval_dp` gives a first split; :func:`maxload.ideal_dp`
    finds the optimum when the coarse DAG has at most ``IDEAL_CAP`` ideals and it finishes in
    ``3/4 * time_limit``; otherwise :func:`maxload.cpsat_split` improves the first split in the
    time left and proves a bound. Throughput, any shape (``contiguous=False``): the contiguous
    split in half the time, then :func:`maxload.cpsat_general`, its bound over all splits.
    Latency (the model's splits are convex already; ``contiguous`` is ignored): :func:`interval_dp`,
    then :func:`cpsat_latency`. Values are scored by :func:`max_load` / :func:`latency`.
    """
    check_time_limit(time_limit)
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    if objective == "latency":
        a = interval_dp(bench, objective)
        split = cpsat_latency(bench, a, time_limit=deadline - time.perf_counter())
        score, floor = latency, path_bound(bench)
    elif contiguous:
        a = interval_dp(bench, objective)
        first = max_load(bench, a)
        split = ideal_dp(bench, first, cap=IDEAL_CAP, time_limit=0.75 * time_limit)
        if split is None:
            split = cpsat_split(bench, a, time_limit=deadline - time.perf_counter())
        score, floor = max_load, load_bound(bench)
    else:
        warm = solve_benchmark(bench, objective, True, time_limit / 2)
        split = cpsat_general(bench, warm.assignment, time_limit=deadline - time.perf_counter())
        score, floor = max_load, load_bound(bench)
    value = score(bench, split.assignment)
    bound = min(max(split.bound, floor), value)
    status = "OPTIMAL" if bound >= value * (1 - 1e-9) else split.status
    log.info("%s: %.6g (solver said %.6g), bound %.6g, %s in %.2f s", objective, value,
             split.value, bound, status, time.perf_counter() - t0)
    return Split(split.assignment, value, bound, status)


#: Most ideals :func:`solve_benchmark` lets the exact DP enumerate before it turns to CP-SAT.
IDEAL_CAP = 20_000


def _cheapest(bench: Benchmark) -> np.ndarray:
    """Each node's cheaper latency, accelerator or CPU (the CPU's where no accelerator runs
    it)."""
    p = bench.problem
    return np.where(np.isfinite(p.cost[:, 0]), np.minimum(p.cost[:, 0], p.cost[:, bench.cpu]),
                    p.cost[:, bench.cpu])


def path_bound(bench: Benchmark) -> float:
    """A lower bound on the latency model: the longest path with each node at the cheaper of
    its latencies, copies free (a stage finishes no earlier than its start plus its nodes)."""
    p = bench.problem
    best = _cheapest(bench)
    path = best.copy()
    for u, v in p.edges[np.argsort(p.edges[:, 1], kind="stable")].tolist():
        path[v] = max(path[v], path[u] + best[v])
    return float(path.max(initial=0.0))


def load_bound(bench: Benchmark) -> float:
    """A lower bound on the max-load model: every node adds at least its cheaper latency to one
    of the ``k + 1`` devices, so the largest load is at least their mean and at least the
    dearest node's."""
    best = _cheapest(bench)
    return float(max(best.sum() / (bench.k + 1), best.max(initial=0.0)))


def _windows(bench: Benchmark, unit: np.ndarray) -> list[list[tuple[int, int]]]:
    """The edges between units of each shortest stretch of the critical path (at each node's
    cheaper latency) whose units exceed ``maxSizePerFPGA``."""
    p = bench.problem
    size = np.bincount(unit, weights=p.node_mem)
    cap = p.mem_cap[0] * (1 + 1e-12)
    best = _cheapest(bench)
    path, prev = best.copy(), np.full(p.num_nodes, -1)
    for u, v in p.edges[np.argsort(p.edges[:, 1], kind="stable")].tolist():
        if path[u] + best[v] > path[v]:
            path[v], prev[v] = path[u] + best[v], u
    if not p.num_nodes:
        return []
    chain = [int(path.argmax())]
    while prev[chain[-1]] >= 0:
        chain.append(int(prev[chain[-1]]))
    chain.reverse()
    windows = []
    for i in range(len(chain)):
        held: set[int] = set()
        for j in range(i, len(chain)):
            held.add(int(unit[chain[j]]))
            if size[list(held)].sum() > cap:
                window = [(chain[t], chain[t + 1]) for t in range(i, j)
                          if unit[chain[t]] != unit[chain[t + 1]]]
                if window:
                    windows.append(window)
                break
    return windows


def cpsat_latency(bench: Benchmark, warm: np.ndarray, *, time_limit: float = 10.0,
                  workers: int = 2) -> Split:
    """The best split CP-SAT finds for the latency model in ``time_limit`` s (building the model
    included) from the feasible ``warm`` assignment, with a proven lower bound on every split's
    latency; ``warm`` with the bound 0 when it finds nothing better in time.

    Times are in :class:`maxload.Ticks` of the warm start's latency: the bound holds for the
    real latency.
    """
    from ortools.sat.python import cp_model

    deadline = time.perf_counter() + time_limit
    p, k, n = bench.problem, bench.k, bench.problem.num_nodes
    unit = units(p)
    upper = latency(bench, warm)
    if time_limit <= 0:
        return _unproven(warm, upper)
    ticks = Ticks(upper)
    horizon = ticks.horizon
    model = cp_model.CpModel()
    x, copies = placement_model(model, bench, unit, ticks)
    fpga = np.where(np.isfinite(p.cost[:, 0]), p.cost[:, 0], 0.0)
    cpu = p.cost[:, bench.cpu]

    # --- Variables -------------------------------------------------------------------------
    # finish[v]: when node v finishes; start[a], end[a]: when accelerator a's subgraph starts
    # and finishes; rank, acc_rank: a topological number of the units (CPU nodes, accelerators).
    finish = [model.NewIntVar(0, horizon, f"finish{v}") for v in range(n)]
    start = [model.NewIntVar(0, horizon, f"start{a}") for a in range(k)]
    end = [model.NewIntVar(0, horizon, f"end{a}") for a in range(k)]
    rank = [model.NewIntVar(0, n, f"rank{v}") for v in range(n)]
    acc_rank = [model.NewIntVar(0, n, f"acc_rank{a}") for a in range(k)]
    makespan = model.NewIntVar(0, horizon, "latency")

    def on(v, d):
        return x[unit[v]][d]

    # --- Constraints -----------------------------------------------------------------------
    # A CPU node runs for its cpuLatency once its producers finish, and ranks after them.
    for v in range(n):
        model.Add(finish[v] >= ticks(cpu[v])).OnlyEnforceIf(on(v, bench.cpu))
    for u, v in p.edges.tolist():
        model.Add(finish[v] >= finish[u] + ticks(cpu[v])).OnlyEnforceIf(on(v, bench.cpu))
        model.Add(rank[v] >= rank[u] + 1).OnlyEnforceIf(on(v, bench.cpu))
    # An accelerator starts once every outside producer feeding it finishes, and ranks after
    # them.
    for u, v in p.edges.tolist():
        if unit[u] != unit[v]:
            for a in range(k):
                outside_feeds = [on(v, a), on(u, a).Not()]
                model.Add(start[a] >= finish[u]).OnlyEnforceIf(outside_feeds)
                model.Add(acc_rank[a] >= rank[u] + 1).OnlyEnforceIf(outside_feeds)
    # It runs its in-copies, its nodes and its out-copies; its nodes finish (and rank) with it.
    for a in range(k):
        model.Add(end[a] >= start[a] + sum(copies[a])
                  + sum(ticks(fpga[v]) * on(v, a) for v in range(n)))
        for v in range(n):
            model.Add(finish[v] >= end[a]).OnlyEnforceIf(on(v, a))
            model.Add(rank[v] >= acc_rank[a]).OnlyEnforceIf(on(v, a))
    # Valid inequalities. same[u, v]: producer u and consumer v share an accelerator.
    # work[v]: when v's own run ends (an accelerator runs its nodes in a topological order); it
    # is at least a producer's plus v's run and the copies between them.
    same = {}
    for u, v in p.edges.tolist():
        if unit[u] != unit[v]:
            same[u, v] = model.NewBoolVar(f"same{u}_{v}")
            model.AddImplication(same[u, v], on(u, bench.cpu).Not())
            for a in range(k):
                model.Add(on(u, a) == on(v, a)).OnlyEnforceIf(same[u, v])
    work = [model.NewIntVar(0, horizon, f"work{v}") for v in range(n)]
    run = [ticks(cpu[v]) * on(v, bench.cpu)
           + ticks(fpga[v]) * (1 - on(v, bench.cpu)) for v in range(n)]
    for v in range(n):
        model.Add(work[v] >= run[v])
        model.Add(work[v] <= finish[v])
    for u, v in p.edges.tolist():
        if (u, v) not in same:
            model.Add(work[v] >= work[u] + run[v])
            continue
        sent, received = model.NewBoolVar(f"sent{u}_{v}"), model.NewBoolVar(f"recv{u}_{v}")
        model.AddBoolOr([sent, same[u, v], on(u, bench.cpu)])
        model.AddBoolOr([received, same[u, v], on(v, bench.cpu)])
        w = ticks(bench.comm[u])
        model.Add(work[v] >= work[u] + run[v] + w * sent + w * received)
    # An accelerator's nodes on a path are consecutive (it is convex), so each stretch of the
    # critical path too big for one accelerator has an edge between devices.
    for window in _windows(bench, unit):
        model.AddBoolOr([same[e].Not() for e in window])
    # The latency is the last finish.
    model.AddMaxEquality(makespan, finish)

    # --- Objective and solve ---------------------------------------------------------------
    model.Minimize(makespan)
    return _solve(model, bench, unit, x, warm, upper, ticks, latency, deadline, workers)
