"""Splits for the dnn-partitioning benchmark's max-load model: for contiguous splits an exact
dynamic program over ideals (downsets) and a CP-SAT model with a proven bound where the ideals
are too many; for splits of any shape a CP-SAT model (:func:`cpsat_general`) whose parts the
latency model shares (:func:`placement_model`).

A contiguous split is a chain of ideals ``∅ = I0 ⊂ I1 ⊂ ... ⊂ Is = V``; stage ``Ij \\ Ij-1``
runs on its own accelerator (at most ``k``) or on the CPU side (at most one stage). The contiguous
solvers work on the coarse DAG of :func:`coarsen.coarsen` and score stages as :func:`max_load` does:

* accelerator: its ``fpgaLatency`` sum, plus ``cost(u)`` for each of its nodes ``u`` feeding
  another stage and for each node of another stage feeding it; at most ``maxSizePerFPGA``;
  only nodes supported on an accelerator;
* CPU side: its ``cpuLatency`` sum.
"""

from __future__ import annotations

import logging
import math
import time
from typing import NamedTuple

import numpy as np

from autoplace.dnn_partitioning.benchmark import Benchmark, max_load, units
from autoplace.solve._common import stages_of
from autoplace.solve.coarsen import coarse_graph, coarsen
from autoplace.solve.cpsat import RESOLUTION

log = logging.getLogger(__name__)

class Split(NamedTuple):
    """A split: device of every node, its value as the solver computed it, a proven lower bound
    on the value of every split the solver searches, and ``"OPTIMAL"`` or ``"FEASIBLE"``."""

    assignment: np.ndarray
    value: float
    bound: float
    status: str

    @property
    def gap(self) -> float:
        """``(value - bound) / value``: how far from optimal the split may be (0 when proven)."""
        return max(0.0, (self.value - self.bound) / self.value) if self.value > 0 else 0.0


class Ticks:
    """Times as integer ticks for a CP-SAT model: a known plan's ``upper`` value is about
    ``RESOLUTION`` ticks. Counts are rounded down and capped at ``horizon`` (a larger one exceeds
    every value worth finding), so a model in ticks is a relaxation: its bound holds."""

    def __init__(self, upper: float):
        self.per_unit = RESOLUTION / upper if upper > 0 else 1.0
        self.horizon = int(math.ceil(upper * self.per_unit)) + 1

    def __call__(self, value: float) -> int:
        return int(min(math.floor(value * self.per_unit), self.horizon))


def ideals(graph, cap: int, deadline: float = math.inf) -> list[int] | None:
    """Every ideal of a DAG on nodes ``0..q-1`` as a bit mask, by size; ``None`` past ``cap``
    ideals or ``deadline`` (a ``time.perf_counter()`` value).

    Examples
    --------
    A fork 0 -> 1, 0 -> 2 has the ideals {}, {0}, {0, 1}, {0, 2}, {0, 1, 2}:

    >>> import networkx as nx
    >>> ideals(nx.DiGraph([(0, 1), (0, 2)]), cap=10)
    [0, 1, 3, 5, 7]
    """
    q = graph.number_of_nodes()
    preds = [sum(1 << u for u in graph.predecessors(v)) for v in range(q)]
    out, layer = [0], [0]
    while layer:
        nxt = set()
        for ideal in layer:
            for v in range(q):
                if not (ideal >> v) & 1 and preds[v] & ~ideal == 0:
                    nxt.add(ideal | 1 << v)
        if len(out) + len(nxt) > cap or time.perf_counter() > deadline:
            return None
        layer = sorted(nxt)
        out.extend(layer)
    return out


def _words(masks: list[int], q: int) -> np.ndarray:
    """Bit masks over ``q`` nodes as rows of uint64 words."""
    nbytes = 8 * max(1, -(-q // 64))
    buf = b"".join(m.to_bytes(nbytes, "little") for m in masks)
    return np.frombuffer(buf, dtype="<u8").reshape(len(masks), -1).astype(np.uint64)


class _Stages:
    """Loads of ``J \\ I`` for ideals ``I ⊂ J`` of the coarse DAG, vectorized over ``I``."""

    def __init__(self, bench: Benchmark, rep: np.ndarray, masks: list[int]):
        import scipy.sparse as sp

        p = bench.problem
        n, q = p.num_nodes, int(rep.max()) + 1
        self.words = _words(masks, q)
        bits = np.unpackbits(self.words.view(np.uint8), axis=1, bitorder="little")[:, :q]
        x = bits[:, rep].astype(bool)  # (ideals, n): node in ideal
        fpga, cpu = p.cost[:, 0], p.cost[:, bench.cpu]
        finite = np.isfinite(fpga)
        self.fpga = x @ np.where(finite, fpga, 0.0)
        self.unsupported = x @ (~finite).astype(float)
        self.cpu = x @ cpu
        self.size = x @ p.node_mem
        self.cap = float(p.mem_cap[0])
        #: Stage loads are a difference of per-ideal terms when I's successors all lie in J,
        #: unless unsupported nodes or memory can make an accelerator stage infeasible.
        self.separable = bool(finite.all() and p.node_mem.sum() <= self.cap)
        self.cheap = x @ np.where(finite, np.minimum(fpga, cpu), cpu)  # a lower bound on a load
        adj = sp.csr_matrix((np.ones(len(p.edges)), (p.edges[:, 0], p.edges[:, 1])), shape=(n, n))
        frontier = x & (adj @ (~x).T.astype(float)).T.astype(bool)  # has a successor outside
        self.out = frontier @ bench.comm
        # Frontier nodes of each ideal (padded): their comm, and their successors outside the
        # ideal as coarse-node words.
        width = max(1, int(frontier.sum(axis=1).max(initial=0)))
        idx = np.argsort(~frontier, axis=1, kind="stable")[:, :width]
        real = np.take_along_axis(frontier, idx, axis=1)
        self.front_comm = np.where(real, bench.comm[idx], 0.0)
        succ = [0] * n
        for u, v in p.edges.tolist():
            succ[u] |= 1 << int(rep[v])
        self.front_succ = _words(succ, q)[idx] & ~self.words[:, None, :]
        self.front_succ[~real] = 0

    def loads(self, j: int, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(accelerator, CPU) load of ``J \\ I`` for ideal ``J = j`` and each ideal ``I`` in
        ``cand`` (all subsets of ``J``); ``inf`` where an accelerator cannot hold it."""
        jw = self.words[j]
        # A frontier node u of I costs a copy into J \\ I when a successor lies in J, and no
        # longer sends from J when no successor lies beyond J.
        succ = self.front_succ[cand]
        into = (succ & jw).any(axis=2)
        beyond = (succ & ~jw).any(axis=2)
        comm = self.out[j] + (self.front_comm[cand] * (into.astype(float) - beyond)).sum(axis=1)
        acc = self.fpga[j] - self.fpga[cand] + comm
        bad = ((self.unsupported[j] - self.unsupported[cand]) > 0) | (
            self.size[j] - self.size[cand] > self.cap * (1 + 1e-12))
        return np.where(bad, np.inf, acc), self.cpu[j] - self.cpu[cand]


def _separator_prefix(graph, masks: list[int], words: np.ndarray) -> np.ndarray:
    """For every ideal J, the index of the largest separator S (the only ideal of its size) that
    J holds with every successor of S, or -1. The ideals inside S are exactly those numbered up
    to S (any smaller ideal grows into one of S's size), and each has all its successors in J.
    """
    q = graph.number_of_nodes()
    sizes = np.array([mask.bit_count() for mask in masks])
    counts = np.bincount(sizes)
    prefix = np.full(len(masks), -1)
    for i in np.flatnonzero(counts[sizes] == 1):
        reach = masks[i]
        for v in range(q):
            if masks[i] >> v & 1:
                reach |= sum(1 << w for w in graph.successors(v))
        holds = ~(_words([reach], q) & ~words).any(axis=1)
        prefix[holds] = np.maximum(prefix[holds], i)
    return prefix


def _staircase(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(values[i], offsets[i])`` that no pair with a value as small and a larger
    offset beats: ``min max(values, x - offsets)`` over them is the minimum over all."""
    order = np.argsort(values, kind="stable")
    v, h = values[order], np.maximum.accumulate(offsets[order])
    keep = np.isfinite(v) & np.r_[True, h[1:] > h[:-1]]
    return v[keep], h[keep]


def _stairs(g: np.ndarray, acc_offset: np.ndarray, cpu_offset: np.ndarray):
    """Staircases over a prefix of ideals ``I`` for stages whose load is ``x - offset(I)``,
    padded with ``(inf, 0)``: (values, offsets) of shape (a, c, w) for an accelerator stage after
    ``g[a, c]``, and of shape (a, w) for a CPU stage after ``g[a, 0]``."""
    acc = [[_staircase(g[a, c], acc_offset) for c in range(2)] for a in range(len(g))]
    cpu = [_staircase(g[a, 0], cpu_offset) for a in range(len(g))]
    width = max(1, max(len(v) for v, _ in [*cpu, *(x for row in acc for x in row)]))

    def pad(pairs):
        return (np.array([np.r_[v, np.full(width - len(v), np.inf)] for v, _ in pairs]),
                np.array([np.r_[h, np.zeros(width - len(h))] for _, h in pairs]))

    (av, ah), (cv, ch) = pad([x for row in acc for x in row]), pad(cpu)
    return (av.reshape(len(g), 2, width), ah.reshape(len(g), 2, width)), (cv, ch)


def ideal_dp(bench: Benchmark, upper: float = math.inf, *, cap: int = 200_000,
             time_limit: float = 60.0) -> Split | None:
    """The best contiguous split (exact), or ``None`` past ``cap`` ideals or ``time_limit`` s.

    ``upper`` (the max-load of a known contiguous split) prunes stages that cannot be in a better
    one; the result is still exact.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    p, k = bench.problem, bench.k
    rep = coarsen(p)
    graph = coarse_graph(p, rep)
    masks = ideals(graph, cap, deadline)
    if masks is None:
        log.info("ideal DP: more than %d ideals or over %.1f s", cap, time_limit)
        return None
    st = _Stages(bench, rep, masks)
    m = len(masks)
    limit = upper * (1 + 1e-9) + 1e-12
    by_cheap = np.argsort(st.cheap, kind="stable")
    cheap_sorted = st.cheap[by_cheap]
    prefix = _separator_prefix(graph, masks, st.words) if st.separable else np.full(m, -1)

    def candidates(j: int, after: int = -1) -> np.ndarray:
        """Ideals numbered after ``after``, strictly inside J, whose stage could fit ``limit``."""
        lo = np.searchsorted(cheap_sorted, st.cheap[j] - limit, side="left")
        hi = np.searchsorted(cheap_sorted, st.cheap[j], side="right")
        if j - after - 1 < hi - lo:
            cand = np.arange(after + 1, j)
            cand = cand[st.cheap[cand] >= st.cheap[j] - limit]
        else:
            cand = by_cheap[lo:hi]
            cand = cand[(cand > after) & (cand != j)]
        return cand[~(st.words[cand] & ~st.words[j]).any(axis=1)]

    # g[a, c, j]: least max-load of ideal j split into at most a accelerator and c CPU stages.
    g = np.full((k + 1, 2, m), np.inf)
    g[:, :, 0] = 0.0
    # Over a separator's prefix an accelerator stage costs (fpga + out)(J) - (fpga - out)(I)
    # and a CPU stage cpu(J) - cpu(I): one staircase per (a, c) answers the best I there.
    stairs: dict[int, tuple] = {}
    for j in range(1, m):
        if time.perf_counter() > deadline:
            log.info("ideal DP: over %.1f s after %d of %d ideals", time_limit, j, m)
            return None
        pre = int(prefix[j])
        if pre >= 0 and pre not in stairs:
            stairs[pre] = _stairs(g[:, :, :pre + 1], st.fpga[:pre + 1] - st.out[:pre + 1],
                                  st.cpu[:pre + 1])
        cand = candidates(j, pre)
        acc, cpu = st.loads(j, cand)
        prev = g[:, :, cand]
        g[1:, :, j] = np.maximum(prev[:-1], acc).min(axis=2, initial=np.inf)
        g[:, 1, j] = np.minimum(g[:, 1, j], np.maximum(prev[:, 0], cpu).min(axis=1,
                                                                             initial=np.inf))
        if pre >= 0:
            (v, h), (cv, ch) = stairs[pre]
            g[1:, :, j] = np.minimum(g[1:, :, j], np.maximum(v, st.fpga[j] + st.out[j] - h)
                                     .min(axis=2)[:-1])
            g[:, 1, j] = np.minimum(g[:, 1, j], np.maximum(cv, st.cpu[j] - ch).min(axis=1))
        g[:, :, j] = np.minimum.accumulate(g[:, :, j], axis=0)
        g[:, 1, j] = np.minimum(g[:, 1, j], g[:, 0, j])
    best = float(g[k, 1, m - 1])
    if not np.isfinite(best):
        return None
    # Walk back, taking at each ideal the stage that gives its value.
    stages, j, used, c = [], m - 1, k, 1
    while j:
        v = g[used, c, j]
        if used and g[used - 1, c, j] == v:
            used -= 1
            continue
        if c and g[used, 0, j] == v:
            c = 0
            continue
        cand = candidates(j)
        acc, cpu = st.loads(j, cand)
        options = []
        if used:
            via = np.maximum(g[used - 1, c, cand], acc)
            options.append((via.min(), int(cand[via.argmin()]), "acc"))
        if c:
            via = np.maximum(g[used, 0, cand], cpu)
            options.append((via.min(), int(cand[via.argmin()]), "cpu"))
        _, i, kind = min(options)
        stages.append((j, i, kind))
        j, used, c = (i, used - 1, c) if kind == "acc" else (i, used, 0)
    a = np.empty(p.num_nodes, dtype=np.int64)
    accelerators = iter(range(k))
    for hi, lo, kind in reversed(stages):
        coarse = masks[hi] & ~masks[lo]
        members = np.isin(rep, [b for b in range(coarse.bit_length()) if coarse >> b & 1])
        a[members] = next(accelerators) if kind == "acc" else bench.cpu
    log.info("ideal DP: %d ideals, max-load %.6g in %.2f s", m, best, time.perf_counter() - t0)
    return Split(a, best, best, "OPTIMAL")


def cpsat_split(bench: Benchmark, warm: np.ndarray, *, time_limit: float = 10.0,
                workers: int = 2) -> Split:
    """The best contiguous split CP-SAT finds in ``time_limit`` s (building the model included)
    from the contiguous ``warm`` assignment, with its proven lower bound; ``warm`` with the
    bound 0 when it finds nothing better in time.

    Loads are in :class:`Ticks` of the warm start's max-load: the bound holds for the real loads.
    """
    from ortools.sat.python import cp_model

    deadline = time.perf_counter() + time_limit
    p, k = bench.problem, bench.k
    rep = coarsen(p)
    q, positions = int(rep.max()) + 1, k + 1
    upper = max_load(bench, warm)
    if time_limit <= 0:
        return _unproven(warm, upper)
    ticks = Ticks(upper)
    fpga = np.bincount(rep, weights=np.where(np.isfinite(p.cost[:, 0]), p.cost[:, 0], 0.0),
                       minlength=q)
    cpu = np.bincount(rep, weights=p.cost[:, bench.cpu], minlength=q)
    size = np.bincount(rep, weights=p.node_mem, minlength=q)
    unsupported = np.bincount(rep, weights=~np.isfinite(p.cost[:, 0]), minlength=q) > 0
    model = cp_model.CpModel()

    # --- Variables -------------------------------------------------------------------------
    # y[c][s]: coarse node c is in stage s or earlier; x[c][s]: in stage s; on_cpu[s]: stage s
    # is the CPU side.
    y = [[model.NewBoolVar(f"y{c}_{s}") for s in range(positions - 1)] + [model.NewConstant(1)]
         for c in range(q)]
    x = [[model.NewBoolVar(f"x{c}_{s}") for s in range(positions)] for c in range(q)]
    on_cpu = [model.NewBoolVar(f"cpu{s}") for s in range(positions)]
    period = model.NewIntVar(0, ticks.horizon, "period")

    # --- Constraints -----------------------------------------------------------------------
    # Stages are numbered along the chain: x is the step of the monotone y.
    for c in range(q):
        for s in range(positions):
            model.Add(x[c][s] == y[c][s] - (y[c][s - 1] if s else 0))
    # No edge goes back to an earlier stage.
    for u, v in coarse_graph(p, rep).edges:
        for s in range(positions - 1):
            model.AddImplication(y[v][s], y[u][s])
    # One stage (maybe empty) is the CPU side, so at most k are accelerators; nodes no
    # accelerator supports are on it.
    model.AddExactlyOne(on_cpu)
    for c in np.flatnonzero(unsupported):
        for s in range(positions):
            model.AddImplication(x[c][s], on_cpu[s])
    # An accelerator stage holds at most maxSizePerFPGA bytes.
    cap = float(p.mem_cap[0])
    if size.sum() > cap:
        for s in range(positions):
            model.Add(sum(int(size[c]) * x[c][s] for c in range(q)) <= int(cap)
                      ).OnlyEnforceIf(on_cpu[s].Not())
    # A node feeding another stage costs its comm on its own stage (sends) and on each stage
    # of a consumer (receives); these only bound the loads from below, which is exact when
    # minimizing.
    comm_terms = _copy_terms(model, p.edges, rep, [ticks(c) for c in bench.comm], x, positions)
    # Every stage's load fits in the period.
    for s in range(positions):
        model.Add(sum(ticks(fpga[c]) * x[c][s] for c in range(q)) + sum(comm_terms[s])
                  <= period).OnlyEnforceIf(on_cpu[s].Not())
        model.Add(sum(ticks(cpu[c]) * x[c][s] for c in range(q)) <= period
                  ).OnlyEnforceIf(on_cpu[s])

    # --- Objective -------------------------------------------------------------------------
    model.Minimize(period)
    stage = stages_of(p, warm)
    for c in range(q):
        sc = int(stage[np.flatnonzero(rep == c)[0]])
        for s in range(positions):
            model.AddHint(x[c][s], int(sc == s))
            if s < positions - 1:
                model.AddHint(y[c][s], int(sc <= s))
    cpu_stage = stage[warm == bench.cpu]
    cpu_at = int(cpu_stage[0]) if cpu_stage.size else positions - 1  # past the warm's stages
    for s in range(positions):
        model.AddHint(on_cpu[s], int(s == cpu_at))

    # --- Solve -----------------------------------------------------------------------------
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.0, deadline - time.perf_counter())
    solver.parameters.num_workers = workers
    code = solver.Solve(model)
    bound = solver.BestObjectiveBound() / ticks.per_unit
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        log.info("CP-SAT found no split in %.1f s; keeping the warm start", time_limit)
        return _unproven(warm, upper)
    a = np.empty(p.num_nodes, dtype=np.int64)
    accelerators = iter(range(k))
    for s in range(positions):
        members = np.isin(rep, [c for c in range(q) if solver.Value(x[c][s])])
        if members.any():
            a[members] = bench.cpu if solver.Value(on_cpu[s]) else next(accelerators)
    value = max_load(bench, a)
    if value > upper:
        a, value = np.asarray(warm), upper
    status = "OPTIMAL" if code == cp_model.OPTIMAL else "FEASIBLE"
    return Split(a, value, min(bound, value), status)


def _canonical(bench: Benchmark, unit: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """The same split with the accelerators renumbered by their first unit."""
    a = np.asarray(assignment)
    used = sorted({int(d) for d in a if d != bench.cpu}, key=lambda d: unit[a == d].min())
    mapping = {d: i for i, d in enumerate(used)} | {bench.cpu: bench.cpu}
    return np.array([mapping[int(d)] for d in a], dtype=np.int64)


def placement_model(model, bench: Benchmark, unit: np.ndarray, ticks: Ticks):
    """The part of a CP-SAT model every split shares: ``x[g][d]`` (unit ``g`` on device ``d``,
    the CPU last) and, per accelerator, the scaled copy terms of the benchmark (``cost(u)`` for
    each of its nodes ``u`` feeding another device, and for each outside node feeding it).

    Copy terms are in ``ticks`` and only bounded from below: exact when minimized.
    """
    p, k = bench.problem, bench.k
    g_count, devices = int(unit.max(initial=-1)) + 1, bench.k + 1
    unsupported = np.bincount(unit, weights=~np.isfinite(p.cost[:, 0]), minlength=g_count) > 0
    size = np.bincount(unit, weights=np.ceil(p.node_mem), minlength=g_count)

    # --- Variables -------------------------------------------------------------------------
    x = [[model.NewBoolVar(f"x{g}_{d}") for d in range(devices)] for g in range(g_count)]

    # --- Constraints -----------------------------------------------------------------------
    # Every unit is on one device; nodes no accelerator supports are on the CPU.
    for g in range(g_count):
        model.AddExactlyOne(x[g])
        if unsupported[g]:
            model.Add(x[g][bench.cpu] == 1)
    # An accelerator holds at most maxSizePerFPGA bytes (sizes rounded up: exact for whole
    # bytes, as in the benchmark).
    if size.sum() > p.mem_cap[0]:
        for a in range(k):
            model.Add(sum(int(size[g]) * x[g][a] for g in range(g_count))
                      <= math.floor(p.mem_cap[0]))
    # Identical accelerators: accelerator a holds a unit only if a - 1 holds an earlier one.
    for a in range(1, k):
        seen = model.NewConstant(0)  # accelerator a - 1 holds one of the units before g
        for g in range(g_count):
            model.AddImplication(x[g][a], seen)
            nxt = model.NewBoolVar(f"seen{a - 1}_{g}")
            model.AddBoolOr([seen, x[g][a - 1]]).OnlyEnforceIf(nxt)
            model.AddImplication(seen, nxt)
            model.AddImplication(x[g][a - 1], nxt)
            seen = nxt
    # A node feeding another device costs its copy on its own accelerator (sends) and on each
    # accelerator consuming it (receives).
    return x, _copy_terms(model, p.edges, unit, [ticks(c) for c in bench.comm], x, k)


def _complete_hint(model, fixed: list, time_limit: float, workers: int) -> bool:
    """Hint every variable of ``model`` with a solution in which the literals ``fixed`` hold.

    Any completion will do, so the search runs on a copy with the literals fixed and no
    objective, where presolve can use them (with assumptions instead, CP-SAT searches on one
    thread and presolves weakly, which takes seconds on the op-level inputs). Returns False
    when ``time_limit`` s found none.

    Raises
    ------
    ValueError
        No completion exists: the literals break the model's constraints.
    """
    from ortools.sat.python import cp_model

    copy = model.Clone()
    for lit in fixed:
        copy.Add(copy.GetBoolVarFromProtoIndex(lit.Index()) == 1)
    copy.ClearObjective()
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_time_in_seconds = max(0.0, time_limit)
    code = solver.Solve(copy)
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"invalid CP-SAT model: {copy.Validate()}")
    if code == cp_model.INFEASIBLE:
        raise ValueError("the warm start breaks the model's constraints")
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    for i in range(len(model.Proto().variables)):
        model.AddHint(model.GetIntVarFromProtoIndex(i),
                      solver.Value(copy.GetIntVarFromProtoIndex(i)))
    return True


def cpsat_general(bench: Benchmark, warm: np.ndarray, *, time_limit: float = 10.0,
                  workers: int = 2) -> Split:
    """The best split of any shape (stages need not be convex nor ordered) CP-SAT finds for the
    max-load model in ``time_limit`` s (building the model included) from the feasible ``warm``
    assignment, with a proven lower bound on every split's max-load; ``warm`` with the bound 0
    when it finds nothing better in time.

    Loads are in :class:`Ticks` of the warm start's max-load: the bound holds for the real loads.
    """
    from ortools.sat.python import cp_model

    deadline = time.perf_counter() + time_limit
    p, k = bench.problem, bench.k
    unit = units(p)
    g_count = int(unit.max(initial=-1)) + 1
    upper = max_load(bench, warm)
    if time_limit <= 0:
        return _unproven(warm, upper)
    ticks = Ticks(upper)
    model = cp_model.CpModel()
    x, copies = placement_model(model, bench, unit, ticks)
    fpga = np.bincount(unit, weights=np.where(np.isfinite(p.cost[:, 0]), p.cost[:, 0], 0.0),
                       minlength=g_count)
    cpu = np.bincount(unit, weights=p.cost[:, bench.cpu], minlength=g_count)
    period = model.NewIntVar(0, ticks.horizon, "period")
    # Every device's load fits in the period.
    for a in range(k):
        model.Add(sum(ticks(fpga[g]) * x[g][a] for g in range(g_count)) + sum(copies[a])
                  <= period)
    model.Add(sum(ticks(cpu[g]) * x[g][bench.cpu] for g in range(g_count)) <= period)
    model.Minimize(period)
    return _solve(model, bench, unit, x, warm, upper, ticks, max_load, deadline, workers)


def _unproven(warm, upper: float) -> Split:
    """``warm`` (of value ``upper``) kept as the split, with nothing proven."""
    return Split(np.asarray(warm), upper, 0.0, "FEASIBLE")


def _solve(model, bench, unit, x, warm, upper, ticks, score, deadline, workers) -> Split:
    """Hint ``warm`` in full, solve until ``deadline`` (a ``time.perf_counter()`` value), read
    and rescore the split; keep ``warm`` unless the split scores better, or when CP-SAT finds
    nothing in time."""
    from ortools.sat.python import cp_model

    warm = _canonical(bench, unit, warm)
    first = {int(g): int(warm[np.flatnonzero(unit == g)[0]]) for g in range(len(x))}
    if not _complete_hint(model, [x[g][d] for g, d in first.items()],
                          deadline - time.perf_counter(), workers):
        log.info("CP-SAT had no time to complete the warm start; keeping it")
        return _unproven(warm, upper)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_time_in_seconds = max(0.0, deadline - time.perf_counter())
    code = solver.Solve(model)
    bound = solver.BestObjectiveBound() / ticks.per_unit
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _unproven(warm, upper)
    a = np.array([next(d for d in range(bench.k + 1) if solver.Value(x[g][d])) for g in unit],
                 dtype=np.int64)
    value = score(bench, a)
    if value > upper:
        a, value = warm, upper
    status = "OPTIMAL" if code == cp_model.OPTIMAL else "FEASIBLE"
    return Split(a, value, min(bound, value), status)


def _copy_terms(model, edges: np.ndarray, unit, weight, x, slots: int) -> list[list]:
    """Per slot (stage or accelerator), the weighted copy booleans it pays: a node whose unit
    ``x`` puts in the slot while a reading unit is elsewhere sends there, and a slot holding a
    reading unit but not the node receives. The booleans are only forced up, which is exact
    when minimizing. ``weight[u]`` is node ``u``'s copy in ticks."""
    users: dict[int, set[int]] = {}
    for u, v in edges.tolist():
        if unit[u] != unit[v]:
            users.setdefault(u, set()).add(int(unit[v]))
    terms: list[list] = [[] for _ in range(slots)]
    for u, readers in users.items():
        cu, w = int(unit[u]), weight[u]
        if w == 0:
            continue
        for s in range(slots):
            send, recv = model.NewBoolVar(f"send{u}_{s}"), model.NewBoolVar(f"recv{u}_{s}")
            for cv in readers:
                model.AddBoolOr([send, x[cv][s]]).OnlyEnforceIf(x[cu][s])
                model.AddBoolOr([recv, x[cu][s]]).OnlyEnforceIf(x[cv][s])
            terms[s] += [w * send, w * recv]
    return terms
