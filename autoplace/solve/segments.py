"""How a latency plan runs on several devices at once: segments, and what they cost.

A *segment* is a run of nodes on one device that executes as one call: one worker thread per
device runs its segments in order, each as soon as the tensors it reads are there
(:class:`autoplace.run.ConcurrentModel`). Segments of different devices overlap in time where
the data allows, as the latency model of :func:`~autoplace.solve.simulate.simulate_latency`
assumes; each segment costs its device a fixed ``overhead`` before its first node (the call
and the hand-off of its inputs from other workers).

:func:`concurrent_latency` scores a plan run that way; :func:`serial_latency` scores the same
plan run by one VM on one thread, one kernel after another (``autoplace.compile``). Whichever
is smaller is what the plan can deliver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .problem import Problem
from .simulate import Schedule, copies_needed, machine_loads, simulate_latency


def segments(problem: Problem, assignment, order: Sequence[int] | None = None) -> np.ndarray:
    """Segment of every node; a segment reads only from lower ones, and a device's segments
    run in increasing order.

    A segment is one call: it starts once all its inputs are there and hands its outputs on
    when it ends. So nodes are taken in ``order`` (a topological order; default ``0..n-1``) and
    each joins its device's open segment when that segment already waits for everything the
    node reads from other segments (else it opens a new one, rather than hold the whole
    segment back); and a node whose output another device reads closes its segment, so that
    the other device gets it as soon as it is computed. Work of one device that no other
    device waits on shares a segment.

    Examples
    --------
    A chain a -> b -> c on devices 0, 1, 0: three segments. Two branches (0 -> 1 on device 0,
    2 -> 3 on device 1) joined by node 4 on device 0: each branch is a segment, and node 4, which
    waits for both, a third.

    >>> p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)])
    >>> segments(p, [0, 1, 0]).tolist()
    [0, 1, 2]
    >>> p = Problem.build(np.ones((5, 2)), [(0, 1), (2, 3), (1, 4), (3, 4)])
    >>> segments(p, [0, 0, 1, 1, 0]).tolist()
    [0, 0, 1, 1, 2]
    """
    a = np.asarray(assignment, dtype=np.int64)
    n = a.size
    order = list(range(n)) if order is None else [int(i) for i in order]
    preds: list[list[int]] = [[] for _ in range(n)]
    crosses = np.zeros(n, dtype=bool)  # read by another device
    for u, v in problem.edges.tolist():
        preds[v].append(u)
        crosses[u] |= a[u] != a[v]
    seg = np.full(n, -1, dtype=np.int64)
    waits: list[set[int]] = []  # segments each segment waits for, directly
    open_seg: dict[int, int | None] = {}  # device -> its open segment
    for v in order:
        k = int(a[v])
        needs = {int(seg[u]) for u in preds[v]}
        if -1 in needs:
            raise ValueError("order is not topological: a node comes before a node it reads")
        s = open_seg.get(k)
        if s is None or not needs - {s} <= waits[s]:
            s = len(waits)
            waits.append(needs)
        seg[v] = s
        open_seg[k] = None if crosses[v] else s
    return seg


def _charged(problem: Problem, a: np.ndarray, seg: np.ndarray, overhead) -> Problem:
    """``problem`` with each segment's first node costing ``overhead`` of its device more."""
    over = np.broadcast_to(np.asarray(overhead, dtype=float), (problem.num_devices,))
    _, first = np.unique(seg, return_index=True)
    cost = problem.cost.copy()
    cost[first, a[first]] += over[a[first]]
    return replace(problem, cost=cost, serial=False)  # workers side by side, whatever problem says


def segment_order(seg: np.ndarray, order: Sequence[int] | None = None) -> np.ndarray:
    """Nodes in the order the workers run them: by segment, then by ``order`` within one."""
    n = len(seg)
    pos = np.empty(n, dtype=np.int64)
    pos[np.arange(n) if order is None else np.asarray(order, dtype=np.int64)] = np.arange(n)
    return np.lexsort((pos, np.asarray(seg)))


def concurrent_latency(problem: Problem, assignment, overhead=0.0,
                       order: Sequence[int] | None = None) -> Schedule:
    """The schedule of the plan run as :func:`segments` (of ``order``), one worker per device,
    side by side (a ``serial`` problem too): each segment first costs its device ``overhead``
    seconds (one figure, or one per device)."""
    a = np.asarray(assignment, dtype=np.int64)
    seg = segments(problem, a, order)
    return simulate_latency(_charged(problem, a, seg, overhead), a, segment_order(seg, order))


def serial_latency(problem: Problem, assignment) -> float:
    """Seconds of the plan run by one VM on one thread: every node's cost and every copy, one
    after another."""
    a = np.asarray(assignment, dtype=np.int64)
    compute = float(problem.cost[np.arange(a.size), a].sum())
    return compute + sum(problem.transfer_time(u, int(a[u]), k)
                         for u, k in copies_needed(problem, a))


def machine_latency(problem: Problem, assignment, order: Sequence[int] | None = None) -> float:
    """The least seconds one input of the plan run as :func:`segments` takes on the machines
    that devices share (``problem.machines``; 0 without): the CPU seconds spent there, a call
    per segment (:func:`~autoplace.solve.simulate.machine_cpu`), over its cores. Segments of
    devices on one machine run side by side only as far as its cores allow.

    Examples
    --------
    Two branches of 2 s on devices 0 and 1 and their join (1 s on device 0), both devices on
    one machine of one core: 5 s, though side by side they would take 3 s.

    >>> from autoplace.solve.problem import Machines
    >>> p = Problem.build([[2.0, 2.0], [2.0, 2.0], [1.0, 1.0]], [(0, 2), (1, 2)],
    ...                   machines=Machines.build([0, 0], [1.0]))
    >>> machine_latency(p, [0, 1, 0])
    5.0
    """
    if problem.machines is None:
        return 0.0
    a = np.asarray(assignment, dtype=np.int64)
    seg = segments(problem, a, order)
    _, first = np.unique(seg, return_index=True)
    calls = np.bincount(a[first], minlength=problem.num_devices)
    return float(machine_loads(problem, a, calls=calls).max(initial=0.0))
