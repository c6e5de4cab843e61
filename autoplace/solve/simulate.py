"""The one scorer: every number a solver claims is re-computed here by code that did not produce it.

Latency model (:func:`simulate_latency`)
    Tasks are the nodes and the copies. A node runs on its device for ``cost[i, a[i]]`` seconds;
    a device runs one node at a time. A node's output is copied once per *destination device*
    that consumes it (not once per consumer), on the directed link ``(a[u], k)``, which carries
    one copy at a time and takes ``alpha + bytes / beta``. A node starts when its device is free
    and all its inputs are there. The order in which each device runs its nodes comes from a
    priority ``order`` (default: the topological numbering, i.e. list scheduling); the order in
    which each link sends its copies comes from ``transfer_order`` (default: in the order of each
    copy's first consumer in ``order``, ties by producer). Given those sequences the schedule is
    the earliest one (semi-active), so replaying the sequences of any valid schedule gives a
    makespan no larger than it. A ``serial`` problem's tasks run on one thread: the nodes in the
    topological order closest to ``order``, each followed by its copies; the makespan is their
    sum.

Throughput model (:func:`simulate_throughput`)
    Time per input of the pipeline: the maximum over devices of their load and over directed
    links of their summed copy time (one copy per tensor per destination device), and of the
    host's load. Every pipeline stage costs ``stage_overhead_s`` of its device: that time is
    added to its device's summed compute, and the host's load is the sum over all stages (one
    process hands every input from stage to stage). A plan of one stage costs no hand-off: it
    runs without a pipeline, called directly (:class:`autoplace.run.Pipeline` does so). Every
    stage, a plan of one stage too, also costs its device ``call_s`` (the call itself), which
    the host does not wait for. The stages are given, or :func:`stages_of` the assignment.
    Where devices share a machine (``problem.machines``), that machine is one more resource:
    its CPU seconds per input (:func:`machine_cpu`: the ops' seconds times their threads, each
    stage's call in its process and in the cluster's daemons, and, where the driving process
    runs there, its part of every call; each tensor that goes through the object store, on the
    machines of its ends, :func:`object_cpu`) over the cores its processes do not keep busy
    between calls (:meth:`~autoplace.solve.problem.Machines.background`).

Replicas model (:func:`simulate_replicas`)
    Data parallelism: each of several devices runs the whole model, taking the next input
    whenever it is free. Device ``k`` delivers ``1 / (T_k + o_k + c_k)`` inputs per second, where
    ``T_k`` is the model's summed compute there, ``o_k`` its ``stage_overhead_s`` (each replica
    is a worker thread the inputs are handed to) and ``c_k`` its ``call_s``; the time per input is
    the inverse of the summed rates, or the host's load if that is more: ``o_k + c_k`` per input
    device ``k`` takes. A replica's call counts there too, unlike a pipeline stage's: it copies
    the input in and the output out, which run in Python, under one lock for every replica.
    Where replicas share a machine, its CPU seconds per input (each replica's share of the
    inputs times its seconds per input, as in :func:`machine_cpu`) over the cores its processes
    leave free, if more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import networkx as nx
import numpy as np

from .problem import InfeasibleError, Problem


class Transfer(NamedTuple):
    """One copy of ``node``'s output from device ``src`` to device ``dst``."""

    node: int
    src: int
    dst: int
    start: float
    finish: float


@dataclass(frozen=True, eq=False)
class Schedule:
    """The simulated single-input schedule of one assignment.

    Attributes
    ----------
    makespan : float
        Finish time of the last node (0 for an empty problem).
    start, finish : (n,) float arrays
        Start and finish time of every node.
    transfers : tuple of Transfer
        Every copy, in the order each link sends them.
    busy : (d,) float array
        Summed compute seconds per device.
    order : (n,) int array
        The node priority order the devices followed.
    """

    makespan: float
    start: np.ndarray
    finish: np.ndarray
    transfers: tuple[Transfer, ...]
    busy: np.ndarray
    order: np.ndarray


def _assignment(problem: Problem, assignment) -> np.ndarray:
    a = np.asarray(assignment, dtype=np.int64)
    if a.shape != (problem.num_nodes,):
        raise ValueError(f"assignment has shape {a.shape}, expected ({problem.num_nodes},)")
    if a.size and (a.min() < 0 or a.max() >= problem.num_devices):
        raise ValueError(f"assignment names a device outside 0..{problem.num_devices - 1}")
    return a


def _check_supported(problem: Problem, a: np.ndarray) -> None:
    bad = np.flatnonzero(~problem.supported[np.arange(a.size), a])
    if bad.size:
        i = int(bad[0])
        raise InfeasibleError(f"node {problem.node_names[i]!r} is not supported on device "
                              f"{problem.device_names[a[i]]!r}")


def copies_needed(problem: Problem, assignment) -> list[tuple[int, int]]:
    """The ``(node, destination device)`` copies an assignment needs, sorted.

    Examples
    --------
    Node 0 on device 0 feeds nodes 1 and 2, both on device 1: one copy, not two.

    >>> p = Problem.build(np.ones((3, 2)), [(0, 1), (0, 2)])
    >>> copies_needed(p, [0, 1, 1])
    [(0, 1)]
    """
    a = _assignment(problem, assignment)
    if not problem.edges.size:
        return []
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    cross = a[u] != a[v]
    pairs = np.unique(u[cross] * problem.num_devices + a[v][cross])
    return [(int(p // problem.num_devices), int(p % problem.num_devices)) for p in pairs]


def simulate_latency(problem: Problem, assignment, order: Sequence[int] | None = None,
                     transfer_order: Sequence[tuple[int, int]] | None = None) -> Schedule:
    """Score one input's makespan under the latency model (see the module docstring).

    Parameters
    ----------
    problem : Problem
    assignment : (n,) ints
        Device of every node.
    order : sequence of int, optional
        Node priority: each device runs its nodes in this order. Default ``0..n-1``.
    transfer_order : sequence of (node, dst_device), optional
        Each link sends its copies in this order; must list exactly the needed copies.
        Default: by first consumer in ``order``, ties by producer.

    Returns
    -------
    Schedule

    Raises
    ------
    InfeasibleError
        A node is on a device that cannot run it.
    ValueError
        ``order``/``transfer_order`` are not permutations, or contradict the edges.
    """
    a = _assignment(problem, assignment)
    _check_supported(problem, a)
    n, d = problem.num_nodes, problem.num_devices
    order = np.arange(n) if order is None else np.asarray(order, dtype=np.int64)
    if sorted(order.tolist()) != list(range(n)):
        raise ValueError("order must be a permutation of the nodes")
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)

    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in problem.edges.tolist():
        preds[v].append(u)
    needed = copies_needed(problem, a)
    if transfer_order is None:
        first = {}
        for u, v in problem.edges.tolist():
            if a[u] != a[v]:
                key = (u, int(a[v]))
                first[key] = min(first.get(key, n), int(pos[v]))
        transfer_order = sorted(needed, key=lambda c: (first[c], c[0]))
    transfer_order = [(int(u), int(k)) for u, k in transfer_order]
    if sorted(transfer_order) != needed:
        raise ValueError(f"transfer_order must list exactly the needed copies {needed}")
    if problem.serial:  # one thread: the nodes in the topological order closest to ``order``,
        # each node's copies right after it
        dag = nx.DiGraph(problem.edges.tolist())
        dag.add_nodes_from(range(n))
        order = np.array(list(nx.lexicographical_topological_sort(dag, key=lambda v: pos[v])),
                         dtype=np.int64)
        pos[order] = np.arange(n)
        transfer_order = sorted(transfer_order, key=lambda c: (pos[c[0]], c[1]))

    # Task graph: nodes 0..n-1, copies n..n+c-1; arcs are data dependencies and resource sequences.
    cid = {c: n + j for j, c in enumerate(transfer_order)}
    dur = np.concatenate([problem.cost[np.arange(n), a],
                          [problem.transfer_time(u, int(a[u]), k) for u, k in transfer_order]])
    g = nx.DiGraph()
    g.add_nodes_from(range(n + len(cid)))
    for v in range(n):
        for u in preds[v]:
            g.add_edge(u, v) if a[u] == a[v] else g.add_edge(cid[(u, int(a[v]))], v)
    for (u, _), t in cid.items():
        g.add_edge(u, t)
    last_dev: dict[int, int] = {}
    for v in order.tolist():
        if a[v] in last_dev:
            g.add_edge(last_dev[a[v]], v)
        last_dev[a[v]] = v
    last_link: dict[tuple[int, int], int] = {}
    for u, k in transfer_order:
        link = (int(a[u]), k)
        if link in last_link:
            g.add_edge(last_link[link], cid[(u, k)])
        last_link[link] = cid[(u, k)]
    if problem.serial:  # one thread: each node, then its copies, after the previous task
        copies_of: dict[int, list[int]] = {}
        for u, k in transfer_order:
            copies_of.setdefault(u, []).append(cid[(u, k)])
        seq = [t for v in order.tolist() for t in (v, *copies_of.get(v, ()))]
        g.add_edges_from(zip(seq, seq[1:]))
    try:
        topo = list(nx.topological_sort(g))
    except nx.NetworkXUnfeasible:
        raise ValueError("order/transfer_order contradict the edges (a task would wait on itself)")
    start = np.zeros(len(dur))
    for t in topo:
        ready = max((start[p] + dur[p] for p in g.predecessors(t)), default=0.0)
        start[t] = ready
    finish = start + dur
    transfers = tuple(Transfer(u, int(a[u]), k, float(start[cid[(u, k)]]),
                               float(finish[cid[(u, k)]])) for u, k in transfer_order)
    return Schedule(
        makespan=float(finish[:n].max(initial=0.0)),
        start=start[:n].copy(),
        finish=finish[:n].copy(),
        transfers=transfers,
        busy=np.bincount(a, weights=dur[:n], minlength=d).astype(float),
        order=order,
    )


def link_loads(problem: Problem, assignment) -> np.ndarray:
    """(d, d) summed copy seconds per directed link (one copy per tensor per destination)."""
    a = _assignment(problem, assignment)
    d = problem.num_devices
    loads = np.zeros((d, d))
    for u, k in copies_needed(problem, a):
        loads[a[u], k] += problem.transfer_time(u, int(a[u]), k)
    return loads


def device_loads(problem: Problem, assignment) -> np.ndarray:
    """(d,) summed compute seconds per device."""
    a = _assignment(problem, assignment)
    _check_supported(problem, a)
    return np.bincount(a, weights=problem.cost[np.arange(a.size), a],
                       minlength=problem.num_devices).astype(float)


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


def _stages(problem: Problem, a: np.ndarray, stages) -> np.ndarray:
    """``stages`` checked against ``a`` (one device per stage, no edge back), or stages_of."""
    if stages is None:
        return stages_of(problem, a)
    s = np.asarray(stages, dtype=np.int64)
    if s.shape != a.shape:
        raise ValueError(f"stages has shape {s.shape}, expected {a.shape}")
    _, first = np.unique(s, return_index=True)
    if (a != a[first][np.searchsorted(s[first], s)]).any():
        raise ValueError("a stage spans several devices")
    if problem.edges.size and (s[problem.edges[:, 0]] > s[problem.edges[:, 1]]).any():
        raise ValueError("an edge goes from a later stage to an earlier one")
    return s


def stage_counts(problem: Problem, assignment, stages=None) -> np.ndarray:
    """(d,) number of pipeline stages on each device (``stages`` default: :func:`stages_of`)."""
    a = _assignment(problem, assignment)
    s = _stages(problem, a, stages)
    _, first = np.unique(s, return_index=True)
    return np.bincount(a[first], minlength=problem.num_devices)


def hand_offs(problem: Problem, counts) -> np.ndarray:
    """Seconds per input the stages' hand-offs cost each device, and the host in all (their
    sum), given ``counts`` stages per device (``(d,)``, or ``(m, d)`` for ``m`` plans):
    ``stage_overhead_s`` per stage, nothing for a plan of one stage (it is called directly,
    not through a pipeline)."""
    counts = np.asarray(counts)
    return problem.stage_overhead_s * counts * (counts.sum(axis=-1, keepdims=True) > 1)


def stage_overhead(problem: Problem, counts) -> np.ndarray:
    """Seconds per input the stages cost each device beyond their ops, given ``counts`` stages
    per device (``(d,)``, or ``(m, d)`` for ``m`` plans): each stage's call (``call_s``) and
    hand-off (:func:`hand_offs`)."""
    counts = np.asarray(counts)
    return problem.call_s * counts + hand_offs(problem, counts)


def replica_periods(problem: Problem, devices) -> np.ndarray:
    """Seconds per input of each of ``devices`` running the whole model as a replica: its ops,
    its hand-off and its call."""
    ks = np.asarray(devices, dtype=np.int64)
    return problem.cost[:, ks].sum(axis=0) + problem.stage_overhead_s[ks] + problem.call_s[ks]


def replica_host_s(problem: Problem, devices) -> float:
    """Seconds per input the host spends on replicas of ``devices`` (periods finite and
    positive): each one's hand-off and call (``o_k + c_k``), on the share of the inputs it
    takes."""
    ks = np.asarray(devices, dtype=np.int64)
    rate = 1.0 / replica_periods(problem, ks)
    return float((rate / rate.sum() * (problem.stage_overhead_s[ks] + problem.call_s[ks])).sum())


def machine_cpu(problem: Problem, assignment, stages=None, calls=None) -> np.ndarray:
    """(m, 4) CPU seconds per input of a plan on each machine of ``problem.machines`` (no rows
    without): the ops' seconds times their device's threads and the machine's slowdown, the
    calls in the processes that run them, in the cluster's daemons, and in the driving process
    (on its machine only), with the tensors that go through the object store
    (:func:`object_cpu`, the stages ``stages``) in the same columns.

    A device makes ``calls[k]`` calls per input: by default, its number of pipeline stages
    (``stages``, default :func:`stages_of`), a plan of one stage too (a call per stage per
    input, whether or not it is a pipeline).

    Examples
    --------
    Two nodes of 1 s, a device each, both devices on one machine: 2 s of CPU per input there,
    plus 0.1 s a call in each stage's process and 0.2 s in the driver's, on the machine too:

    >>> from autoplace.solve.problem import Machines
    >>> p = Problem.build(np.ones((2, 2)), [(0, 1)], machines=Machines.build(
    ...     [0, 0], [2.0], call_cpu_s=0.1, driver_cpu_s=0.2, driver=0))
    >>> machine_cpu(p, [0, 1]).tolist()
    [[2.0, 0.2, 0.0, 0.4]]
    """
    mach = problem.machines
    if mach is None:
        return np.zeros((0, 4))
    a = _assignment(problem, assignment)
    n_calls = _calls(problem, a, stages, calls)
    slow = np.where(mach.of >= 0, mach.slowdown[np.maximum(mach.of, 0)], 1.0)
    per_device = np.stack([device_loads(problem, a) * mach.threads * slow,
                           n_calls * mach.call_cpu_s,
                           n_calls * mach.daemon_cpu_s, np.zeros(problem.num_devices)], axis=1)
    out = np.zeros((mach.cores.size, 4))
    on = mach.of >= 0
    np.add.at(out, mach.of[on], per_device[on])
    if mach.driver >= 0:
        out[mach.driver, 3] += float((n_calls * mach.driver_cpu_s).sum())
    return out + object_cpu(problem, a, stages)


def object_flows(problem: Problem, assignment, stages=None) -> list[tuple[int, int, float]]:
    """The tensors of a pipeline plan that go through Ray's object store (larger than
    ``problem.machines.inline_bytes``), as ``(from, to, bytes)``: an end is a device, or
    ``num_devices`` for the driving process. A node's output goes once to each other stage that
    reads it (``stages``, default :func:`stages_of`), a model's input from the driving process
    to each stage that reads it, a model's output from its node to the driving process.

    Examples
    --------
    Node 0 on device 0 makes 200 bytes that nodes 1 and 2 on device 1 read (one stage, one
    copy); node 2's 50 bytes are the model's output; 150 bytes over an inline limit of 100:

    >>> from autoplace.solve.problem import Machines
    >>> p = Problem.build(np.ones((3, 2)), [(0, 1), (0, 2)], [200.0, 0.0, 50.0],
    ...                   machines=Machines.build([0, 0], [2.0], inline_bytes=100,
    ...                                           inputs=[(150.0, (0,))], outputs=(2,)))
    >>> object_flows(p, [0, 1, 1])
    [(0, 1, 200.0), (2, 0, 150.0)]
    """
    mach = problem.machines
    if mach is None or not problem.num_nodes:
        return []
    a = _assignment(problem, assignment)
    s = _stages(problem, a, stages)
    device_of = dict(zip(s.tolist(), a.tolist()))
    driver, limit, out_bytes = problem.num_devices, mach.inline_bytes, problem.out_bytes
    flows = []
    for u in np.flatnonzero(out_bytes > limit).tolist():
        readers = {int(s[v]) for v in problem.edges[problem.edges[:, 0] == u, 1]} - {int(s[u])}
        flows += [(int(a[u]), device_of[r], float(out_bytes[u])) for r in sorted(readers)]
    for size, nodes in mach.inputs:
        if size > limit:
            flows += [(driver, device_of[r], float(size))
                      for r in sorted({int(s[v]) for v in nodes})]
    flows += [(int(a[u]), driver, float(out_bytes[u])) for u in mach.outputs
              if out_bytes[u] > limit]
    return flows


def object_cpu(problem: Problem, assignment, stages=None) -> np.ndarray:
    """(m, 4) CPU seconds per input on each machine of ``problem.machines`` that the tensors
    of :func:`object_flows` cost, by the columns of :func:`machine_cpu`: the processes that
    make and read them (the stages' actors; the driving process where it is one end), the
    cluster's daemons on each end's machine, and the driving process, which owns them all.

    Examples
    --------
    200 bytes from device 0 to device 1 on one machine, each side costing 1 s + 0.01 s per
    byte (3 s): 3 s in each actor, 6 s in the daemons, 3 s in the driver:

    >>> from autoplace.solve.problem import Machines
    >>> p = Problem.build(np.ones((2, 2)), [(0, 1)], [200.0, 0.0], machines=Machines.build(
    ...     [0, 0], [2.0], driver=0, object_alpha=1.0, object_beta=0.01, inline_bytes=100))
    >>> object_cpu(p, [0, 1]).tolist()
    [[0.0, 6.0, 6.0, 3.0]]
    """
    mach = problem.machines
    if mach is None or mach.object_alpha is None:
        return np.zeros((0 if mach is None else mach.cores.size, 4))
    return _flows_cpu(problem, object_flows(problem, assignment, stages))


def _flows_cpu(problem: Problem, flows) -> np.ndarray:
    """(m, 4) CPU seconds of ``flows`` (``(from, to, bytes[, weight])``), as
    :func:`object_cpu` charges them."""
    mach = problem.machines
    out = np.zeros((mach.cores.size, 4))
    if mach.object_alpha is None:
        return out
    driver = problem.num_devices
    place = np.append(mach.of, mach.driver)  # machine of each end
    for i, j, size, *weight in flows:
        cost = (mach.object_alpha[i, j] + mach.object_beta[i, j] * size) * (weight or [1.0])[0]
        # (end, column) per side: src, dst, src_daemons, dst_daemons, driver
        for end, column, c in ((i, 3 if i == driver else 1, cost[0]),
                               (j, 3 if j == driver else 1, cost[1]),
                               (i, 2, cost[2]), (j, 2, cost[3]), (driver, 3, cost[4])):
            if place[end] >= 0:
                out[place[end], column] += c
    return out


def _calls(problem: Problem, a: np.ndarray, stages, calls) -> np.ndarray:
    """(d,) calls per input of each device: ``calls``, else its stages."""
    return (stage_counts(problem, a, stages).astype(float) if calls is None
            else np.asarray(calls, dtype=float))


def machine_loads(problem: Problem, assignment, stages=None, calls=None) -> np.ndarray:
    """(m,) seconds per input each shared machine needs for a plan: its CPU seconds per input
    (:func:`machine_cpu`) over the cores its processes leave free while the plan runs
    (:meth:`~autoplace.solve.problem.Machines.background`; none free: ``inf``)."""
    mach = problem.machines
    if mach is None:
        return np.zeros(0)
    a = _assignment(problem, assignment)
    n_calls = _calls(problem, a, stages, calls)
    return _spread(machine_cpu(problem, a, stages, n_calls).sum(axis=1),
                   mach.cores - mach.background(n_calls > 0))


def _spread(cpu: np.ndarray, free: np.ndarray) -> np.ndarray:
    """CPU seconds over free cores (``inf`` where none are free and some CPU is needed)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(free > 0, cpu / np.where(free > 0, free, 1.0),
                        np.where(cpu > 0, np.inf, 0.0))


def simulate_throughput(problem: Problem, assignment, stages=None) -> float:
    """Time per input of the pipeline: the busiest device, directed link, or the host.

    ``stages``: a stage per node (one device each, no edge back), by default
    :func:`stages_of`; they cost only with a ``stage_overhead_s`` or ``call_s``.

    Examples
    --------
    Two nodes of 1 s on two devices, 4 bytes crossing a link of 1 s + 4 B / (2 B/s) = 3 s:

    >>> p = Problem.build([[1.0, 1.0], [1.0, 1.0]], [(0, 1)], [4.0, 0.0], alpha=1.0, beta=2.0)
    >>> simulate_throughput(p, [0, 1])
    3.0

    With 2.5 s per stage, (a, b, a) is three stages: 7.5 s on the host, while a holds two
    (2 + 5 = 7 s). On one device the model is called directly: 3 s.

    >>> p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)], stage_overhead_s=2.5)
    >>> simulate_throughput(p, [0, 1, 0]), simulate_throughput(p, [0, 0, 0])
    (7.5, 3.0)

    A call of 0.5 s per stage costs a's two stages 1 s more, and the one stage 0.5 s:

    >>> p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)], stage_overhead_s=2.5, call_s=0.5)
    >>> simulate_throughput(p, [0, 1, 0]), simulate_throughput(p, [0, 0, 0])
    (8.0, 3.5)
    """
    a = _assignment(problem, assignment)
    loads, host = device_loads(problem, a), 0.0
    if stages is not None or problem.staged:
        counts = stage_counts(problem, a, stages)
        loads, host = loads + stage_overhead(problem, counts), hand_offs(problem, counts).sum()
    return float(max(loads.max(initial=0.0), link_loads(problem, a).max(initial=0.0), host,
                     machine_loads(problem, a, stages).max(initial=0.0)))


def simulate_replicas(problem: Problem, devices) -> float:
    """Time per input when every device of ``devices`` (two or more) runs the whole model on the
    inputs it takes (see the module's replicas model).

    Examples
    --------
    A model of 3 s on device 0 and 6 s on device 1: together 1/3 + 1/6 = 1/2 input per second.
    With 1 s of hand-off each: 1/4 + 1/7 inputs per second.

    >>> p = Problem.build([[1.0, 2.0], [2.0, 4.0]])
    >>> simulate_replicas(p, [0, 1])
    2.0
    >>> p = Problem.build([[1.0, 2.0], [2.0, 4.0]], stage_overhead_s=1.0)
    >>> round(simulate_replicas(p, [0, 1]), 4)
    2.5455
    """
    ks = np.asarray(devices, dtype=np.int64)
    if ks.size < 2 or np.unique(ks).size != ks.size:
        raise ValueError(f"replicas need two or more distinct devices, got {ks.tolist()}")
    period = replica_periods(problem, ks)
    if not np.isfinite(period).all():
        raise InfeasibleError("a replica's device cannot run every node")
    if (period <= 0).any():
        return 0.0
    return float(max(1.0 / (1.0 / period).sum(), replica_host_s(problem, ks),
                     replica_machine_s(problem, ks).max(initial=0.0)))


def replica_machine_s(problem: Problem, devices) -> np.ndarray:
    """(m,) seconds per input each shared machine needs for replicas of ``devices`` (periods
    finite and positive): each replica's ops (times its threads), calls and the model's inputs
    and outputs through the object store (:func:`object_cpu`), on the share of the inputs it
    takes, over the machine's cores."""
    mach = problem.machines
    if mach is None:
        return np.zeros(0)
    ks = np.asarray(devices, dtype=np.int64)
    rate = 1.0 / replica_periods(problem, ks)
    share = rate / rate.sum()
    slow = np.where(mach.of[ks] >= 0, mach.slowdown[np.maximum(mach.of[ks], 0)], 1.0)
    cpu = share * (problem.cost[:, ks].sum(axis=0) * mach.threads[ks] * slow
                   + mach.call_cpu_s[ks] + mach.daemon_cpu_s[ks])
    out = np.zeros(mach.cores.size)
    on = mach.of[ks] >= 0
    np.add.at(out, mach.of[ks][on], cpu[on])
    if mach.driver >= 0:
        out[mach.driver] += float((share * mach.driver_cpu_s[ks]).sum())
    # Each replica's share of the model's inputs and outputs that go through the object store.
    driver, limit = problem.num_devices, mach.inline_bytes
    flows = [(driver, int(k), b, w) for k, w in zip(ks, share) for b, _ in mach.inputs
             if b > limit]
    flows += [(int(k), driver, float(problem.out_bytes[u]), w) for k, w in zip(ks, share)
              for u in mach.outputs if problem.out_bytes[u] > limit]
    out += _flows_cpu(problem, flows).sum(axis=1)
    used = np.zeros(problem.num_devices, dtype=bool)
    used[ks] = True
    return _spread(out, mach.cores - mach.background(used))


def check_feasible(problem: Problem, assignment, stages=None) -> None:
    """Raise :class:`InfeasibleError` naming the node/device if ``assignment`` breaks a constraint.

    Checks support, pins, colocation groups and memory capacity; given ``stages`` (a
    throughput plan's), also ``max_stages``.
    """
    a = _assignment(problem, assignment)
    if stages is not None and problem.max_stages is not None:
        count = int(stage_counts(problem, a, stages).sum())
        if count > problem.max_stages:
            raise InfeasibleError(f"the plan has {count} stages, more than max_stages="
                                  f"{problem.max_stages}")
    names, devs = problem.node_names, problem.device_names
    _check_supported(problem, a)
    bad = np.flatnonzero((problem.pins >= 0) & (problem.pins != a))
    if bad.size:
        i = int(bad[0])
        raise InfeasibleError(f"node {names[i]!r} is pinned to {devs[problem.pins[i]]!r} "
                              f"but placed on {devs[a[i]]!r}")
    for g in np.unique(problem.groups[problem.groups >= 0]):
        members = np.flatnonzero(problem.groups == g)
        if np.unique(a[members]).size > 1:
            raise InfeasibleError(
                f"colocation group {int(g)} is split: {names[members[0]]!r} on "
                f"{devs[a[members[0]]]!r} but "
                f"{names[members[a[members] != a[members[0]]][0]]!r} elsewhere")
    used = np.bincount(a, weights=problem.node_mem, minlength=problem.num_devices)
    over = np.flatnonzero(used > problem.mem_cap * (1 + 1e-12))
    if over.size:
        k = int(over[0])
        raise InfeasibleError(f"device {devs[k]!r} holds {used[k]:.6g} bytes, over its capacity "
                              f"of {problem.mem_cap[k]:.6g} bytes")


def allowed_devices(problem: Problem) -> np.ndarray:
    """(n, d) bool: devices each node may use given support, pins and its group's pins/support."""
    allowed = problem.supported.copy()
    pinned = problem.pins >= 0
    allowed[pinned] = False
    allowed[np.flatnonzero(pinned), problem.pins[pinned]] = problem.supported[
        np.flatnonzero(pinned), problem.pins[pinned]]
    for g in np.unique(problem.groups[problem.groups >= 0]):
        members = problem.groups == g
        allowed[members] = allowed[members].all(axis=0)
    return allowed


def precheck(problem: Problem) -> None:
    """Raise :class:`InfeasibleError` naming the cause when no placement can exist.

    Detects: a node no device supports, a pin to a device that cannot run the node, two pins in
    one colocation group, a group with no common device, a node or group larger than every
    device it may use, and total memory above total capacity.
    """
    names, devs = problem.node_names, problem.device_names
    none = np.flatnonzero(~problem.supported.any(axis=1))
    if none.size:
        raise InfeasibleError(f"node {names[none[0]]!r} is supported on no device")
    for i in np.flatnonzero(problem.pins >= 0):
        if not problem.supported[i, problem.pins[i]]:
            raise InfeasibleError(f"node {names[i]!r} is pinned to {devs[problem.pins[i]]!r}, "
                                  "which cannot run it")
    for g in np.unique(problem.groups[problem.groups >= 0]):
        members = np.flatnonzero(problem.groups == g)
        gp = problem.pins[members]
        if np.unique(gp[gp >= 0]).size > 1:
            i, j = members[gp >= 0][:1][0], members[(gp >= 0) & (gp != gp[gp >= 0][0])][0]
            raise InfeasibleError(
                f"colocation group {int(g)} has contradictory pins: {names[i]!r} on "
                f"{devs[problem.pins[i]]!r}, {names[j]!r} on {devs[problem.pins[j]]!r}")
    allowed = allowed_devices(problem)
    for i in np.flatnonzero(~allowed.any(axis=1)):
        raise InfeasibleError(f"colocation group {int(problem.groups[i])} of node "
                              f"{names[i]!r} has no device that can run all its members")
    mem = problem.node_mem.copy()
    for g in np.unique(problem.groups[problem.groups >= 0]):
        members = problem.groups == g
        mem[members] = problem.node_mem[members].sum()
    fits = allowed & (mem[:, None] <= problem.mem_cap[None, :] * (1 + 1e-12))
    for i in np.flatnonzero(~fits.any(axis=1)):
        what = (f"node {names[i]!r}" if problem.groups[i] < 0
                else f"colocation group {int(problem.groups[i])} (with node {names[i]!r})")
        raise InfeasibleError(f"{what} needs {mem[i]:.6g} bytes, more than any device it may "
                              "use can hold")
    if problem.node_mem.sum() > problem.mem_cap.sum() * (1 + 1e-12):
        raise InfeasibleError(f"the nodes need {problem.node_mem.sum():.6g} bytes in total, more "
                              f"than the {problem.mem_cap.sum():.6g} bytes of all devices")


def orders_from_times(start: np.ndarray, finish: np.ndarray,
                      copies: dict[tuple[int, int], tuple[float, float]]
                      ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Node order and transfer order that replay a valid schedule in :func:`simulate_latency`.

    Tasks are sorted by ``(start, finish, producer, node-before-copy)``; this order is consistent
    with every data dependency and every resource sequence of a valid schedule, so the replay
    finishes no later than the schedule it came from.
    """
    keys = [(float(start[i]), float(finish[i]), i, 0, -1) for i in range(len(start))]
    keys += [(s, f, u, 1, k) for (u, k), (s, f) in copies.items()]
    keys.sort()
    order = np.array([key[2] for key in keys if key[3] == 0], dtype=np.int64)
    return order, [(key[2], key[4]) for key in keys if key[3] == 1]
