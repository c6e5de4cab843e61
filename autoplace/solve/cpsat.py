"""CP-SAT models (OR-Tools) for both objectives, warm-started from the best baseline.

Times are integers: every duration is multiplied by ``scale`` (so the warm start's makespan is
about ``RESOLUTION`` units) and rounded *down*. The integer model is then a relaxation of the
real one, so ``BestObjectiveBound() / scale`` is a proven lower bound; the plan found is
re-scored by the simulator, which is the ``value`` returned.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

import numpy as np

from ._common import make_solution, stages_of
from .problem import InfeasibleError, Problem, Solution
from .simulate import allowed_devices, copies_needed, orders_from_times, simulate_throughput

log = logging.getLogger(__name__)

#: Integer time units the warm start's objective is scaled to.
RESOLUTION = 1_000_000
#: The most integer ticks one node's cost or one copy may scale to (CP-SAT refuses a model whose
#: intervals may overflow 64 bits).
MAX_TICKS = 2**40
#: Integer memory units the largest node size or capacity is scaled to.
MEMORY_RESOLUTION = 1_000_000_000
#: Most (node, level) variables the free throughput model with stage overheads may use; past it
#: the levels are cut, and the plan is no longer proven optimal.
MAX_LEVEL_VARS = 20_000


def _consumers(problem: Problem) -> list[list[int]]:
    succ: list[list[int]] = [[] for _ in range(problem.num_nodes)]
    for u, v in problem.edges.tolist():
        succ[u].append(v)
    return succ


def _placement_vars(model, problem: Problem, allowed: np.ndarray):
    """x[i, k]: node i on device k; need[u, k]: u's output is copied to k; z[u, j, k]: that
    copy goes over link (j, k). Adds the constraints tying them together."""
    n, d = problem.num_nodes, problem.num_devices
    succ = _consumers(problem)
    x = {(i, k): model.NewBoolVar(f"x{i}_{k}") for i in range(n) for k in range(d)
         if allowed[i, k]}
    # Every node runs on exactly one device it may use (support, pins, group pins).
    for i in range(n):
        model.AddExactlyOne(x[i, k] for k in range(d) if allowed[i, k])
    # Members of a colocation group share a device.
    for g in np.unique(problem.groups[problem.groups >= 0]):
        members = np.flatnonzero(problem.groups == g)
        for i in members[1:]:
            for k in np.flatnonzero(allowed[members[0]]):
                model.Add(x[i, k] == x[members[0], k])
    # Each device holds at most its memory capacity (in bytes when sizes are whole numbers,
    # else in MEMORY_RESOLUTION-ths of the largest quantity, rounded to within 1e-6 of a unit).
    finite = problem.mem_cap[np.isfinite(problem.mem_cap)]
    top = max(problem.node_mem.max(initial=0.0), finite.max(initial=0.0))
    whole = all(float(v).is_integer() for v in (*problem.node_mem, *finite)) and top < 2**50
    unit = 1.0 if whole else top / MEMORY_RESOLUTION
    for k in range(d):
        if np.isfinite(problem.mem_cap[k]) and top > 0:
            model.Add(sum(math.ceil(problem.node_mem[i] / unit - 1e-6) * x[i, k]
                          for i in range(n) if allowed[i, k])
                      <= math.floor(problem.mem_cap[k] / unit + 1e-6))
    need, z = {}, {}
    for u in range(n):
        for k in range(d):
            users = [x[v, k] for v in succ[u] if allowed[v, k]]
            if not users:
                continue
            need[u, k] = model.NewBoolVar(f"need{u}_{k}")
            # A copy to k exists exactly when u is elsewhere and some consumer of u is on k.
            for xv in users:
                model.AddBoolOr([xv.Not(), need[u, k]] + ([x[u, k]] if (u, k) in x else []))
            model.AddBoolOr(users).OnlyEnforceIf(need[u, k])
            if (u, k) in x:
                model.AddImplication(need[u, k], x[u, k].Not())
            # The copy travels on the link from u's device: z = x[u, j] and need[u, k].
            for j in range(d):
                if j != k and (u, j) in x:
                    z[u, j, k] = model.NewBoolVar(f"z{u}_{j}_{k}")
                    model.AddMultiplicationEquality(z[u, j, k], [x[u, j], need[u, k]])
    return x, need, z


def _status(solver, code, cp_model) -> str | None:
    if code == cp_model.OPTIMAL:
        return "OPTIMAL"
    if code == cp_model.FEASIBLE:
        return "FEASIBLE"
    if code in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
        return None
    return "UNKNOWN"


#: CP-SAT stops early once its best plan has improved by less than :data:`STALL_GAIN` for
#: :data:`STALL_FRACTION` of its time limit (at least :data:`STALL_MIN_S`): a plan's costs are
#: uncertain by several percent, so proving a bound where the search has stalled buys nothing
#: a user can measure, and the first output waits on it.
STALL_GAIN = 1e-3
STALL_FRACTION = 0.2
STALL_MIN_S = 1.0


def _run(model, time_limit: float, workers: int, cp_model):
    import threading

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = workers
    stall = _stall(solver, max(STALL_MIN_S, STALL_FRACTION * time_limit), cp_model)
    done = threading.Event()
    watch = threading.Thread(target=stall.watch, args=(done,), daemon=True)
    watch.start()
    try:
        code = solver.Solve(model, stall)
    finally:
        done.set()
        watch.join()
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"invalid CP-SAT model: {model.Validate()}")
    return solver, code


def _stall_callback(cp_model):
    class Stall(cp_model.CpSolverSolutionCallback):
        """Stops ``solver`` once no plan better by :data:`STALL_GAIN` came for ``patience_s``
        (``watch`` runs in a thread of its own: a stalled search calls back no more)."""

        def __init__(self, solver, patience_s: float):
            super().__init__()
            self.solver, self.patience_s = solver, patience_s
            self.best, self.since = math.inf, time.perf_counter()

        def on_solution_callback(self):
            value = self.ObjectiveValue()
            if value < self.best * (1 - STALL_GAIN):
                self.since = time.perf_counter()
            self.best = min(self.best, value)

        def watch(self, done):
            while not done.wait(0.05):
                if self.best < math.inf and time.perf_counter() - self.since > self.patience_s:
                    self.solver.StopSearch()
                    return

    return Stall


def _scale(upper: float, problem: Problem) -> float:
    """Integer ticks per second: :data:`RESOLUTION` over ``upper`` (a plan's seconds), fewer
    where a node's cost or a copy would then pass :data:`MAX_TICKS` (a bound near 0 made them
    overflow)."""
    cost = problem.cost[np.isfinite(problem.cost)]
    off = ~np.eye(problem.num_devices, dtype=bool)
    most_bytes = float(problem.out_bytes.max()) if problem.num_nodes else 0.0
    copies = problem.alpha[off] + most_bytes / problem.beta[off]
    copies = copies[np.isfinite(copies)]
    biggest = max(float(cost.max()) if cost.size else 0.0,
                  float(copies.max()) if copies.size else 0.0)
    return min(RESOLUTION / max(upper, 1e-12), MAX_TICKS / max(biggest, 1e-12))


def _stall(solver, patience_s: float, cp_model):
    return _stall_callback(cp_model)(solver, patience_s)


def _serial(problem: Problem, warm: Solution | None, time_limit: float, workers: int) -> Solution:
    """A ``serial`` problem's latency: one thread runs every node and copy, so the makespan is
    their sum, a linear objective over the placement alone (no schedule to choose)."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    upper = warm.value if warm else _serial_time(problem)
    scale = _scale(upper, problem)
    model = cp_model.CpModel()
    x, _, z = _placement_vars(model, problem, allowed_devices(problem))
    model.Minimize(sum(int(problem.cost[i, k] * scale) * v for (i, k), v in x.items())
                   + sum(int(problem.transfer_time(u, j, k) * scale) * v
                         for (u, j, k), v in z.items()))
    if warm:
        for (i, k), var in x.items():
            model.AddHint(var, int(warm.assignment[i] == k))
    found = _solve_latency(model, problem, x, time_limit, workers)
    if found is None:
        return _fallback(warm, time_limit)
    solver, status, a = found
    sol = make_solution(problem, "latency", a, "cpsat", status=status,
                        bound=solver.BestObjectiveBound() / scale, started=t0)
    return _no_worse(sol, warm)


def _solve_latency(model, problem: Problem, x, time_limit: float, workers: int):
    """Run a latency model: ``(solver, status, assignment)``, or None where CP-SAT found no
    placement in time; raises where it proved there is none."""
    from ortools.sat.python import cp_model

    solver, code = _run(model, time_limit, workers, cp_model)
    status = _status(solver, code, cp_model)
    if status is None:
        raise InfeasibleError("CP-SAT proved the latency model infeasible (support, pins, "
                              "groups and memory admit no placement)")
    if status == "UNKNOWN":
        return None
    n, d = problem.num_nodes, problem.num_devices
    a = np.array([next(k for k in range(d) if (i, k) in x and solver.Value(x[i, k]))
                  for i in range(n)], dtype=np.int64)
    return solver, status, a


def _latency(problem: Problem, warm: Solution | None, time_limit: float, workers: int) -> Solution:
    from ortools.sat.python import cp_model

    if problem.serial:
        return _serial(problem, warm, time_limit, workers)
    t0 = time.perf_counter()
    n, d = problem.num_nodes, problem.num_devices
    allowed = allowed_devices(problem)
    upper = warm.value if warm else _serial_time(problem)
    scale = _scale(upper, problem)
    horizon = int(math.ceil(upper * scale)) + 1
    model = cp_model.CpModel()

    # --- Variables -------------------------------------------------------------------------
    x, need, z = _placement_vars(model, problem, allowed)
    start = [model.NewIntVar(0, horizon, f"s{i}") for i in range(n)]
    end = [model.NewIntVar(0, horizon, f"e{i}") for i in range(n)]
    dur = {(i, k): int(problem.cost[i, k] * scale) for (i, k) in x}
    node_iv = {(i, k): model.NewOptionalFixedSizeIntervalVar(start[i], dur[i, k], x[i, k],
                                                             f"run{i}_{k}") for (i, k) in x}
    cstart = {key: model.NewIntVar(0, horizon, f"cs{key}") for key in need}
    cend = {key: model.NewIntVar(0, horizon, f"ce{key}") for key in need}
    cdur = {(u, j, k): int(problem.transfer_time(u, j, k) * scale) for (u, j, k) in z}
    copy_iv = {(u, j, k): model.NewOptionalFixedSizeIntervalVar(cstart[u, k], cdur[u, j, k],
                                                                z[u, j, k], f"cp{u}_{j}_{k}")
               for (u, j, k) in z}
    makespan = model.NewIntVar(0, horizon, "makespan")

    # --- Constraints -----------------------------------------------------------------------
    # A node ends its device's duration after it starts.
    for i in range(n):
        model.Add(end[i] == start[i] + sum(dur[i, k] * x[i, k] for k in range(d)
                                           if (i, k) in x))
    # A copy ends its link's duration after it starts (zero when there is no copy).
    for (u, k) in need:
        model.Add(cend[u, k] == cstart[u, k] + sum(cdur[u, j, k] * z[u, j, k]
                                                   for j in range(d) if (u, j, k) in z))
        # A copy starts after its producer ends.
        model.Add(cstart[u, k] >= end[u])
    # A consumer starts after its producer ends, and after the copy to its device arrives.
    for u, v in problem.edges.tolist():
        model.Add(start[v] >= end[u])
        for k in range(d):
            if (v, k) in x and (u, k) in need:
                model.Add(start[v] >= cend[u, k]).OnlyEnforceIf([x[v, k], need[u, k]])
    # A device runs one node at a time.
    for k in range(d):
        model.AddNoOverlap(iv for (i, kk), iv in node_iv.items() if kk == k)
    # A directed link carries one copy at a time.
    for j in range(d):
        for k in range(d):
            ivs = [iv for (u, jj, kk), iv in copy_iv.items() if (jj, kk) == (j, k)]
            if len(ivs) > 1:
                model.AddNoOverlap(ivs)
    # The makespan is the last end.
    for i in range(n):
        model.Add(makespan >= end[i])

    # --- Objective -------------------------------------------------------------------------
    model.Minimize(makespan)
    if warm:
        _hint_latency(model, problem, warm, scale, x, need, z, start, cstart)

    # --- Solve -----------------------------------------------------------------------------
    found = _solve_latency(model, problem, x, time_limit, workers)
    if found is None:
        return _fallback(warm, time_limit)
    solver, status, a = found
    s = np.array([solver.Value(v) for v in start], dtype=float)
    e = np.array([solver.Value(v) for v in end], dtype=float)
    copies = {c: (solver.Value(cstart[c]), solver.Value(cend[c]))
              for c in copies_needed(problem, a)}
    order, transfer_order = orders_from_times(s, e, copies)
    bound = solver.BestObjectiveBound() / scale
    sol = make_solution(problem, "latency", a, "cpsat", status=status, bound=bound, order=order,
                        transfer_order=transfer_order, started=t0)
    return _no_worse(sol, warm)


def _serial_time(problem: Problem) -> float:
    """An upper bound on any semi-active schedule: every node at its slowest supported cost and
    every possible copy, one after another."""
    slowest = np.where(problem.supported, problem.cost, 0.0).max(axis=1).sum()
    d = problem.num_devices
    per_copy = (problem.alpha + problem.out_bytes.max(initial=0.0) / problem.beta).max()
    return float(slowest + problem.num_nodes * (d - 1) * per_copy) if d > 1 else float(slowest)


def _fallback(warm: Solution | None, time_limit: float) -> Solution:
    """CP-SAT found nothing in time: the warm start (HEURISTIC), or an error without one."""
    if warm is None:
        raise InfeasibleError(f"no placement found: every baseline failed and CP-SAT found none "
                              f"in {time_limit:.1f} s (infeasibility not proven)")
    log.warning("CP-SAT found no solution in %.1f s; returning the warm start %s",
                time_limit, warm.solver)
    return replace(warm, status="HEURISTIC")


def _contiguous(problem: Problem, sol: Solution) -> bool:
    """Every device's node set is convex: one stage per device used."""
    return len(np.unique(stages_of(problem, sol.assignment))) == len(np.unique(sol.assignment))


def _no_worse(sol: Solution, warm: Solution | None) -> Solution:
    """``sol``, or the warm start with CP-SAT's bound when the warm start simulates better."""
    if warm is None or sol.value <= warm.value:
        return sol
    return replace(warm, bound=max(warm.bound, min(sol.bound, warm.value)), solver="cpsat",
                   status="OPTIMAL" if sol.bound >= warm.value * (1 - 1e-9) else "FEASIBLE")


def _hint_latency(model, problem, warm, scale, x, need, z, start, cstart):
    """AddHint the warm start's schedule (floors of its times keep every precedence)."""
    a = warm.assignment
    from .simulate import simulate_latency
    sched = simulate_latency(problem, a, warm.order, warm.transfer_order)
    for (i, k), var in x.items():
        model.AddHint(var, int(a[i] == k))
    needed = {(t.node, t.dst): t for t in sched.transfers}
    for (u, k), var in need.items():
        model.AddHint(var, int((u, k) in needed))
        t = needed.get((u, k))
        model.AddHint(cstart[u, k], int(math.floor(t.start * scale)) if t else
                      int(math.floor(sched.finish[u] * scale)))
    for (u, j, k), var in z.items():
        model.AddHint(var, int((u, k) in needed and a[u] == j))
    for i in range(problem.num_nodes):
        model.AddHint(start[i], int(math.floor(sched.start[i] * scale)))


def _throughput(problem: Problem, warm: Solution | None, time_limit: float, workers: int,
                contiguous: bool) -> Solution:
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    n, d = problem.num_nodes, problem.num_devices
    allowed = allowed_devices(problem)
    # Without a warm start: every node and copy in series, and a stage per node on one device.
    # The model charges a plan of one stage its hand-off, which the simulator does not: a warm
    # start on one device needs that much room above its value. Every stage costs its device
    # its call and hand-off; the host, the hand-offs.
    per_stage = problem.stage_overhead_s + problem.call_s
    ov_max = float(per_stage.max(initial=0.0))
    upper = warm.value + ov_max if warm else _serial_time(problem) + n * ov_max
    scale = _scale(upper, problem)
    overhead = [int(per_stage[k] * scale) for k in range(d)]
    hand_off = [int(problem.stage_overhead_s[k] * scale) for k in range(d)]
    # Free stages are modelled only when they cost something or are limited.
    needed = 0 if contiguous or (not any(overhead) and problem.max_stages is None) \
        else _max_levels(problem, allowed, upper)
    levels = min(needed, max(1, MAX_LEVEL_VARS // max(n, 1)))
    if levels < needed:
        log.info("throughput model: %d levels of the %d an optimal staging may need", levels,
                 needed)
    model = cp_model.CpModel()

    # --- Variables -------------------------------------------------------------------------
    x, need, z = _placement_vars(model, problem, allowed)
    cap = int(math.ceil(upper * scale)) + 1
    period = model.NewIntVar(0, cap, "period")
    # stages[k]: pipeline stages on device k (contiguous: 1 if used; free: its levels used).
    stages = [0] * d
    if contiguous:
        used = [model.NewBoolVar(f"used{k}") for k in range(d)]
        for (i, k), var in x.items():
            model.AddImplication(var, used[k])
        stages = used
    elif levels:
        # level[i]: the stage DAG position of node i; a stage is a (level, device) pair.
        y = {(i, lv): model.NewBoolVar(f"y{i}_{lv}") for i in range(n) for lv in range(levels)}
        level = [model.NewIntVar(0, levels - 1, f"level{i}") for i in range(n)]
        on = {(lv, k): model.NewBoolVar(f"on{lv}_{k}") for lv in range(levels) for k in range(d)}
        stages = [sum(on[lv, k] for lv in range(levels)) for k in range(d)]

    # --- Constraints -----------------------------------------------------------------------
    # Every device's summed compute and stage overheads fit in the period.
    for k in range(d):
        model.Add(sum(int(problem.cost[i, k] * scale) * x[i, k] for i in range(n)
                      if (i, k) in x) + overhead[k] * stages[k] <= period)
    # Every directed link's summed copy time fits in the period.
    copies_on: dict[tuple[int, int], list] = {}  # (j, k) -> its copies' terms, z read once
    for (u, j, k), var in z.items():
        copies_on.setdefault((j, k), []).append(int(problem.transfer_time(u, j, k) * scale) * var)
    for j in range(d):
        for k in range(d):
            terms = copies_on.get((j, k))
            if terms:
                model.Add(sum(terms) <= period)
    # The host's load, every stage's hand-off, fits in the period.
    if any(hand_off) and (contiguous or levels):
        model.Add(sum(hand_off[k] * stages[k] for k in range(d)) <= period)
    if contiguous:
        # Devices take distinct pipeline positions and no edge goes back: every device's
        # node set is convex, so the devices form a chain of stages.
        pos = [model.NewIntVar(0, d - 1, f"pos{k}") for k in range(d)]
        model.AddAllDifferent(pos)
        dev = [model.NewIntVar(0, d - 1, f"dev{i}") for i in range(n)]
        rank = [model.NewIntVar(0, d - 1, f"rank{i}") for i in range(n)]
        for i in range(n):
            model.Add(dev[i] == sum(k * x[i, k] for k in range(d) if (i, k) in x))
            model.AddElement(dev[i], pos, rank[i])
        for u, v in problem.edges.tolist():
            model.Add(rank[u] <= rank[v])
    elif levels:
        # Every node has one level.
        for i in range(n):
            model.AddExactlyOne(y[i, lv] for lv in range(levels))
            model.Add(level[i] == sum(lv * y[i, lv] for lv in range(levels)))
        # No edge goes to a lower level, and an edge between devices goes to a higher one.
        for u, v in problem.edges.tolist():
            model.Add(level[u] <= level[v])
            for k in range(d):
                if (u, k) in x:
                    cond = [x[u, k]] + ([x[v, k].Not()] if (v, k) in x else [])
                    model.Add(level[v] >= level[u] + 1).OnlyEnforceIf(cond)
        # A node at level lv on device k makes (lv, k) a stage.
        for (i, k), var in x.items():
            for lv in range(levels):
                model.AddBoolOr([var.Not(), y[i, lv].Not(), on[lv, k]])
    if problem.max_stages is not None and (contiguous or levels):
        # At most max_stages stages in all.
        model.Add(sum(stages) <= problem.max_stages)

    # --- Objective -------------------------------------------------------------------------
    # The period, then the fewest stages among plans of that period: a stage that fits in
    # another device's slack is free in the model but adds a hand-off to every input's
    # latency and a thread. ``weight`` exceeds any stage count, so no stage buys a period unit.
    weight = d * max(levels, 1) + 1 if contiguous or levels else 1
    model.Minimize(period * weight + (sum(stages) if weight > 1 else 0))
    if warm:
        for (i, k), var in x.items():
            model.AddHint(var, int(warm.assignment[i] == k))
        if levels:
            _hint_levels(model, problem, warm, y, level, on)

    # --- Solve -----------------------------------------------------------------------------
    solver, code = _run(model, time_limit, workers, cp_model)
    status = _status(solver, code, cp_model)
    if status is None:
        raise InfeasibleError("CP-SAT proved the throughput model infeasible (support, pins, "
                              "groups, memory" + (", contiguity" if contiguous else "")
                              + (", max_stages" if problem.max_stages is not None else "") + ")")
    if status == "UNKNOWN":
        return _fallback(warm, time_limit)
    a = np.array([next(k for k in range(d) if (i, k) in x and solver.Value(x[i, k]))
                  for i in range(n)], dtype=np.int64)
    staging = stages_of(problem, a)
    if levels:
        # The model's stages, unless stages_of's score as well with no more stages.
        keys = list(zip((solver.Value(v) for v in level), a.tolist()))
        rank = {key: r for r, key in enumerate(sorted(set(keys)))}
        mine = np.array([rank[key] for key in keys], dtype=np.int64)
        staging = min((staging, mine), key=lambda s: (
            _stage_count(s) > (problem.max_stages or n), simulate_throughput(problem, a, s),
            _stage_count(s)))
    if levels < needed:  # the model saw only some stagings: no proof
        status, bound = "FEASIBLE", None
    else:
        # period * weight + stages >= the objective's bound, stages < weight.
        bound = math.floor(solver.BestObjectiveBound() / weight) / scale
    sol = make_solution(problem, "throughput", a, "cpsat", status=status, stages=staging,
                        bound=bound, started=t0)
    return _no_worse(sol, warm)


def _stage_count(stages: np.ndarray) -> int:
    return len(np.unique(stages))


def _max_levels(problem: Problem, allowed: np.ndarray, upper: float) -> int:
    """Levels enough for an optimal free staging: its stages in all. A device holds at most its
    allowed nodes' worth, and no more stages than its overheads fit in ``upper``; all stages'
    overheads fit in ``upper`` too (the host's load)."""
    ov, host = problem.stage_overhead_s + problem.call_s, problem.stage_overhead_s
    fit = np.where(ov > 0, np.floor(upper / np.where(ov > 0, ov, 1.0) + 1e-9), np.inf)
    total = min(float(np.minimum(allowed.sum(axis=0), fit).sum()), problem.num_nodes,
                problem.max_stages or problem.num_nodes)
    if (host > 0).all():
        total = min(total, float(np.floor(upper / host.min() + 1e-9)))
    return max(1, int(total))


def _hint_levels(model, problem: Problem, warm: Solution, y, level, on) -> None:
    """AddHint the warm start's stages (numbered in stage DAG order, so they are levels)."""
    stages = warm.stages if warm.stages is not None else stages_of(problem, warm.assignment)
    levels = 1 + max(lv for _, lv in y)
    if stages.max(initial=0) >= levels:
        return
    for (i, lv), var in y.items():
        model.AddHint(var, int(stages[i] == lv))
    for i, var in enumerate(level):
        model.AddHint(var, int(stages[i]))
    held = set(zip(stages.tolist(), warm.assignment.tolist()))
    for key, var in on.items():
        model.AddHint(var, int(key in held))


def solve_cpsat(problem: Problem, objective: str, *, time_limit: float = 10.0,
                warm_start: Solution | None = None, workers: int = 2,
                contiguous: bool = False) -> Solution:
    """Solve with CP-SAT, warm-started from ``warm_start`` or the best baseline.

    Parameters
    ----------
    problem : Problem
    objective : {"latency", "throughput"}
    time_limit : float
        Seconds for CP-SAT.
    warm_start : Solution, optional
        Hinted to CP-SAT and returned (status HEURISTIC) if CP-SAT finds nothing better.
    workers : int
        CP-SAT search workers.
    contiguous : bool
        Throughput only: every device's node set must be convex (a pipeline of stages).
        Otherwise, when the problem has a ``stage_overhead_s`` or ``max_stages``, the model
        chooses the stages too (a level per node; a stage is a level and a device).

    Returns
    -------
    Solution
        ``value`` from the simulator; ``bound`` from CP-SAT's best objective bound.
    """
    from .baselines import best as best_baseline

    if warm_start is None:
        try:
            warm_start = best_baseline(problem, objective)
        except InfeasibleError as e:
            log.info("no baseline placement (%s); CP-SAT starts cold", e)
    warm = warm_start
    if objective == "throughput" and warm is not None and (
            (contiguous and not _contiguous(problem, warm)) or (
            problem.max_stages is not None and warm.stages is not None
            and _stage_count(warm.stages) > problem.max_stages)):
        # The warm start bounds the period and may be returned: it must obey the stages too.
        from .baselines import single

        try:
            warm = single(problem, objective)
        except InfeasibleError:
            warm = None
    if objective == "latency":
        return _latency(problem, warm, time_limit, workers)
    return _throughput(problem, warm, time_limit, workers, contiguous)
