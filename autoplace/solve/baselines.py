"""Baseline placements: single device, data-parallel replicas, device priority, greedy earliest
finish, HEFT.

Every baseline respects support, pins, colocation groups and memory, raising
:class:`InfeasibleError` with the cause when its rule cannot place a node. Values are scored by
the simulator; bounds are the trivial ones of :func:`_common.trivial_bound`.
"""

from __future__ import annotations

import time

import numpy as np

from ._common import make_solution
from .problem import InfeasibleError, Problem, Solution
from .simulate import (allowed_devices, check_feasible, orders_from_times, replica_periods,
                       simulate_replicas)


def single(problem: Problem, objective: str, device: int | None = None,
           stay: np.ndarray | None = None) -> Solution:
    """Everything on ``device``; with ``device=None`` the best feasible single device.
    ``stay``: a mask of nodes that keep their pinned device instead (PyTorch calls, which only
    their runtime device runs, beside "cpu0 alone").

    Raises
    ------
    InfeasibleError
        The device (every device, when ``device=None``) cannot hold the whole model; the message
        gives each device's cause.
    """
    t0 = time.perf_counter()
    devices = range(problem.num_devices) if device is None else [device]
    best, causes = None, []
    for k in devices:
        a = np.full(problem.num_nodes, k, dtype=np.int64)
        if stay is not None:
            a[stay & (problem.pins >= 0)] = problem.pins[stay & (problem.pins >= 0)]
        try:
            check_feasible(problem, a)
        except InfeasibleError as e:
            causes.append(str(e))
            continue
        sol = make_solution(problem, objective, a, f"single:{k}", started=t0)
        if best is None or sol.value < best.value:
            best = sol
    if best is None:
        raise InfeasibleError("no single device can run the whole model: " + "; ".join(causes))
    return best


def replicas(problem: Problem, objective: str = "throughput") -> Solution:
    """Data-parallel replicas: the fastest set of two or more devices that can each run and hold
    the whole model (support, pins, colocation and memory as for :func:`single`), every one of
    them running it on the inputs it takes (:func:`~autoplace.solve.simulate.simulate_replicas`).

    Devices join in order of their own rate; the best of those prefixes is returned (a device
    that adds less than the host's share of its hand-offs and calls is left out). The solution's
    ``assignment`` puts every node on its fastest replica, one stage; ``replicas`` lists them.

    Raises
    ------
    ValueError
        For ``objective="latency"``: replicas serve a stream of inputs, not one.
    InfeasibleError
        Fewer than two devices can run the whole model (the message says why each cannot).
    """
    if objective != "throughput":
        raise ValueError("replicas serve a stream of inputs: use objective='throughput'")
    t0 = time.perf_counter()
    fit, causes = [], []
    for k in range(problem.num_devices):
        try:
            check_feasible(problem, np.full(problem.num_nodes, k, dtype=np.int64))
            fit.append(k)
        except InfeasibleError as e:
            causes.append(str(e))
    if len(fit) < 2:
        raise InfeasibleError("replicas need two devices that can each run the whole model"
                              + (": " + "; ".join(causes) if causes else ""))
    period = replica_periods(problem, fit)
    ranked = [fit[j] for j in np.argsort(period, kind="stable")]
    value, chosen = min((simulate_replicas(problem, ranked[:m]), ranked[:m])
                        for m in range(2, len(ranked) + 1))
    return Solution(assignment=np.full(problem.num_nodes, chosen[0], dtype=np.int64),
                    objective="throughput", value=value, bound=0.0, status="HEURISTIC",
                    solver="replicas", stages=np.zeros(problem.num_nodes, dtype=np.int64),
                    wall_s=time.perf_counter() - t0, replicas=np.array(chosen, dtype=np.int64))


class _Placer:
    """Memory and colocation bookkeeping while nodes are placed one at a time."""

    def __init__(self, problem: Problem):
        self.p = problem
        self.allowed = [np.flatnonzero(row).tolist() for row in allowed_devices(problem)]
        self.free = problem.mem_cap.astype(float).copy()
        self.group_dev: dict[int, int] = {}

    def _need(self, i: int) -> float:
        g = self.p.groups[i]
        if g < 0:
            return float(self.p.node_mem[i])
        return float(self.p.node_mem[self.p.groups == g].sum())

    def candidates(self, i: int) -> list[int]:
        """Devices node ``i`` may go to now."""
        g = int(self.p.groups[i])
        if g >= 0 and g in self.group_dev:
            return [self.group_dev[g]]
        need = self._need(i)
        return [k for k in self.allowed[i] if need <= self.free[k] * (1 + 1e-12) + 1e-9]

    def place(self, i: int, k: int) -> None:
        g = int(self.p.groups[i])
        if g >= 0 and g in self.group_dev:
            return
        self.free[k] -= self._need(i)
        if g >= 0:
            self.group_dev[g] = k

    def stuck(self, i: int, rule: str) -> InfeasibleError:
        p = self.p
        return InfeasibleError(
            f"{rule} cannot place node {p.node_names[i]!r}: no device it may use has "
            f"{self._need(i):.6g} bytes of memory left (free: "
            + ", ".join(f"{p.device_names[k]}={self.free[k]:.6g}"
                        for k in self.allowed[i]) + ")")


def priority(problem: Problem, objective: str) -> Solution:
    """Each node on the first device, in device-list order, that may run it and has room.

    This is the rule of ONNX Runtime execution providers and OpenVINO HETERO.
    """
    t0 = time.perf_counter()
    placer = _Placer(problem)
    a = np.zeros(problem.num_nodes, dtype=np.int64)
    for i in range(problem.num_nodes):
        cands = placer.candidates(i)
        if not cands:
            raise placer.stuck(i, "priority")
        a[i] = cands[0]
        placer.place(i, cands[0])
    return make_solution(problem, objective, a, "priority", started=t0)


class _Timeline:
    """A partial schedule under the latency model: device and link timelines, copies made."""

    def __init__(self, problem: Problem, insertion: bool):
        d = problem.num_devices
        self.p, self.insertion = problem, insertion
        # Per device: start and finish of its tasks in time order, in the first count[k] slots.
        self.starts = np.zeros((d, problem.num_nodes))
        self.finishes = np.zeros((d, problem.num_nodes))
        self.count = np.zeros(d, dtype=np.int64)
        self.link_free = np.zeros((d, d))
        self.copies: dict[tuple[int, int], tuple[float, float]] = {}
        self.a = np.full(problem.num_nodes, -1, dtype=np.int64)
        self.start = np.zeros(problem.num_nodes)
        self.finish = np.zeros(problem.num_nodes)

    def _arrivals(self, preds: list[int], k: int):
        """Ready time on ``k`` and the new copies it needs, each (key, start, finish)."""
        ready, new, link_free = 0.0, [], {}
        for u in preds:
            j = int(self.a[u])
            if j == k:
                ready = max(ready, self.finish[u])
            elif (u, k) in self.copies:
                ready = max(ready, self.copies[(u, k)][1])
            else:
                s = max(self.finish[u], link_free.get(j, self.link_free[j, k]))
                f = s + self.p.transfer_time(u, j, k)
                link_free[j] = f
                new.append(((u, k), s, f))
                ready = max(ready, f)
        return ready, new

    def _slot(self, k: int, ready: float, dur: float) -> float:
        """Earliest start on ``k`` at or after ``ready`` for ``dur`` seconds (the first idle gap
        that fits when inserting, else after the device's last task)."""
        m = self.count[k]
        starts, finishes = self.starts[k], self.finishes[k]
        if m == 0:
            return ready
        if not self.insertion:
            return max(ready, float(finishes[m - 1]))
        # Tasks on a device are disjoint, so finishes are sorted too: skip those done by `ready`.
        j = int(np.searchsorted(finishes[:m], ready, side="right"))
        if j == m:
            return max(ready, float(finishes[m - 1]))
        prev_end = np.empty(m - j)
        prev_end[0] = finishes[j - 1] if j else 0.0
        prev_end[1:] = finishes[j:m - 1]
        begin = np.maximum(ready, prev_end)
        fits = np.flatnonzero(begin + dur <= starts[j:m])
        return float(begin[fits[0]]) if fits.size else max(ready, float(finishes[m - 1]))

    def eft(self, i: int, preds: list[int], k: int) -> tuple[float, float, list]:
        ready, new = self._arrivals(preds, k)
        dur = float(self.p.cost[i, k])
        s = self._slot(k, ready, dur)
        return s, s + dur, new

    def commit(self, i: int, k: int, s: float, f: float, new: list) -> None:
        self.a[i], self.start[i], self.finish[i] = k, s, f
        m = self.count[k]
        t = int(np.searchsorted(self.finishes[k, :m], f, side="right")) if self.insertion else m
        for times, value in ((self.starts[k], s), (self.finishes[k], f)):
            times[t + 1:m + 1] = times[t:m]
            times[t] = value
        self.count[k] = m + 1
        for key, cs, cf in new:
            self.copies[key] = (cs, cf)
            j = int(self.a[key[0]])
            self.link_free[j, k] = max(self.link_free[j, k], cf)


def _list_schedule(problem: Problem, objective: str, order: list[int], insertion: bool,
                   rule: str, work_weight: float = 0.0) -> Solution:
    t0 = time.perf_counter()
    preds: list[list[int]] = [[] for _ in range(problem.num_nodes)]
    for u, v in problem.edges.tolist():
        preds[v].append(u)
    placer = _Placer(problem)
    tl = _Timeline(problem, insertion)
    loads = np.zeros(problem.num_devices)
    # Seconds each node would take beyond its cheapest allowed device.
    allowed = allowed_devices(problem)
    cheapest = np.where(allowed, problem.cost, np.inf).min(axis=1, keepdims=True)
    excess = np.subtract(problem.cost, cheapest, out=np.zeros_like(problem.cost), where=allowed)
    for i in order:
        cands = placer.candidates(i)
        if not cands:
            raise placer.stuck(i, rule)
        inputs = sorted(preds[i])
        options = [(k, *tl.eft(i, inputs, k)) for k in cands]
        if objective == "latency":
            k, s, f, new = min(options, key=lambda o: (o[2] + work_weight * excess[i, o[0]],
                                                       o[0]))
        else:  # balance the pipeline: smallest resulting device load, then earliest finish
            k, s, f, new = min(options, key=lambda o: (loads[o[0]] + problem.cost[i, o[0]],
                                                       o[2], o[0]))
        loads[k] += problem.cost[i, k]
        placer.place(i, k)
        tl.commit(i, k, s, f, new)
    node_order, transfer_order = orders_from_times(tl.start, tl.finish, tl.copies)
    return make_solution(problem, objective, tl.a, rule, order=node_order,
                         transfer_order=transfer_order, started=t0)


def greedy(problem: Problem, objective: str) -> Solution:
    """Nodes in topological order, each on the device where it finishes earliest (append-only).

    For ``objective="throughput"`` each node goes where the device load stays smallest.
    """
    return _list_schedule(problem, objective, list(range(problem.num_nodes)), False, "greedy")


def upward_rank(problem: Problem) -> np.ndarray:
    """HEFT's upward rank: mean cost over supporting devices plus the longest path of mean
    costs and mean copy times to an exit node.

    Examples
    --------
    Chain 0 -> 1, costs (1, 3) and (2, 2), a copy always 1 s: rank(1) = 2, rank(0) = 2 + 1 + 2.

    >>> p = Problem.build([[1.0, 3.0], [2.0, 2.0]], [(0, 1)], alpha=1.0)
    >>> upward_rank(p).tolist()
    [5.0, 2.0]
    """
    d = problem.num_devices
    cost = np.where(problem.supported, problem.cost, np.nan)
    w = np.nan_to_num(np.nanmean(cost, axis=1))
    off = ~np.eye(d, dtype=bool)
    rank = w.copy()
    if d > 1:
        alpha = problem.alpha[off].mean()
        inv_beta = (1.0 / problem.beta[off]).mean()
    for u, v in sorted(problem.edges.tolist(), key=lambda e: -e[0]):
        comm = alpha + problem.out_bytes[u] * inv_beta if d > 1 else 0.0
        rank[u] = max(rank[u], w[u] + comm + rank[v])
    return rank


def heft(problem: Problem, objective: str, work_weight: float = 0.0) -> Solution:
    """HEFT (Topcuoglu, Hariri, Wu 2002): nodes by decreasing upward rank, each on the device
    of earliest finish with insertion into idle device gaps; copies queue on their link.

    ``work_weight`` (latency): each node goes where its finish time plus ``work_weight`` times
    the seconds it takes beyond its cheapest allowed device is least. Plain HEFT (0) spends work
    to finish each node early; on wide graphs, where the makespan is mostly total work over the
    devices, a weight of a few units gives shorter plans.
    """
    rank = upward_rank(problem)
    order = sorted(range(problem.num_nodes), key=lambda i: (-rank[i], i))
    return _list_schedule(problem, objective, order, True, "heft", work_weight)


def best(problem: Problem, objective: str, rules=None, deadline: float | None = None) -> Solution:
    """The best plan of the ``rules`` that succeed (default: :func:`heft`, :func:`greedy`,
    :func:`priority`, :func:`single`), each called ``rule(problem, objective)``; once one has
    succeeded, none starts past ``deadline`` (``time.perf_counter()`` seconds). Raises the
    first rule's :class:`InfeasibleError` when none succeeds."""
    found, errors = None, []
    for rule in rules or (heft, greedy, priority, single):
        if found is not None and deadline is not None and time.perf_counter() > deadline:
            break
        try:
            sol = rule(problem, objective)
        except InfeasibleError as e:
            errors.append(e)
            continue
        if found is None or sol.value < found.value:
            found = sol
    if found is None:
        raise errors[0]
    return found

