"""The public dnn-partitioning benchmark (Tarnawski et al., NeurIPS 2020): import, its own two
scoring models and plan export.

Devices: accelerators ``0..k-1`` ("fpga0".."fpga{k-1}"), then one CPU side (device ``k``).
In the :class:`Problem` made from a file, a copy of node ``u``'s output costs the edge ``cost``
of ``u`` (``out_bytes = cost``, ``alpha = 0``, ``beta = 1``), sizes are ``node_mem`` with
``maxSizePerFPGA`` per accelerator, colour classes are colocation groups. The benchmark's own
max-load and latency models differ from autoplace's simulator and are implemented separately
here (:func:`max_load`, :func:`latency`), exactly as the benchmark's README describes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import networkx as nx
import numpy as np

from autoplace.solve.problem import InfeasibleError, Problem

log = logging.getLogger(__name__)

#: The paper's greedy baseline on the ``latency/`` inputs, scored by :func:`latency` (from the
#: benchmark's README), by input name (the file name less ``_inference.json``).
PAPER_GREEDY_LATENCY = {
    "bert24": 100.2185, "gnmt": 268.5005, "inceptionv3": 2485.2396, "resnet50": 4197.0555,
    "op_bert_l-3": 416.2044, "op_bert_l-6": 494.1352, "op_bert_l-12": 867.8395,
    "op_resnet50": 839.5363}


@dataclass(frozen=True, eq=False)
class Benchmark:
    """One benchmark input, nodes renumbered in topological order.

    Attributes
    ----------
    problem : Problem
        The same placement as an autoplace problem (see module docstring).
    ids : tuple of int
        Original node id of each node.
    k : int
        Number of identical accelerators (``maxFPGAs``).
    comm : (n,) float array
        ``cost`` of the edges leaving each node (0 for sinks).
    """

    problem: Problem
    ids: tuple[int, ...]
    k: int
    comm: np.ndarray

    @property
    def cpu(self) -> int:
        """Device index of the CPU side."""
        return self.k


def load(path) -> Benchmark:
    """Read a benchmark JSON file into a :class:`Benchmark`."""
    try:
        with open(path) as f:
            raw = json.load(f)
        return _from_json(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else e
        raise ValueError(f"{path}: not a dnn-partitioning input ({what}); the format is described "
                         "in benchmarks/data/dnn-partitioning/README.md (nodes, edges, maxFPGAs, "
                         "maxSizePerFPGA)") from None


def _from_json(raw: dict) -> Benchmark:
    g = nx.DiGraph()
    g.add_nodes_from(int(nd["id"]) for nd in raw["nodes"])
    g.add_edges_from((int(e["sourceId"]), int(e["destId"])) for e in raw["edges"])
    ids = list(nx.lexicographical_topological_sort(g))
    index = {v: i for i, v in enumerate(ids)}
    nodes = {int(nd["id"]): nd for nd in raw["nodes"]}
    n, k = len(ids), int(raw["maxFPGAs"])
    cost = np.empty((n, k + 1))
    comm = np.zeros(n)
    for e in raw["edges"]:
        comm[index[int(e["sourceId"])]] = float(e["cost"])
    colors: dict = {}
    groups = np.full(n, -1, dtype=np.int64)
    for i, v in enumerate(ids):
        nd = nodes[v]
        cost[i, :k] = float(nd["fpgaLatency"]) if nd["supportedOnFpga"] else np.inf
        cost[i, k] = float(nd["cpuLatency"])
        if nd.get("colorClass") is not None:
            groups[i] = colors.setdefault(nd["colorClass"], len(colors))
    sizes = np.array([float(nodes[v]["size"]) for v in ids])
    problem = Problem.build(
        cost, [(index[u], index[v]) for u, v in g.edges], comm, alpha=0.0, beta=1.0,
        node_mem=sizes, mem_cap=[float(raw["maxSizePerFPGA"])] * k + [np.inf], groups=groups,
        node_names=[str(nodes[v].get("name", v)) for v in ids],
        device_names=[f"fpga{a}" for a in range(k)] + ["cpu"])
    return Benchmark(problem=problem, ids=tuple(ids), k=k, comm=comm)


def check(bench: Benchmark, assignment) -> None:
    """Raise :class:`InfeasibleError` unless every node is on a device that supports it, colour
    classes are whole and every accelerator holds at most ``maxSizePerFPGA`` bytes."""
    p, a = bench.problem, np.asarray(assignment)
    if a.shape != (p.num_nodes,) or ((a < 0) | (a > bench.cpu)).any():
        raise InfeasibleError(f"an assignment is {p.num_nodes} devices in 0..{bench.cpu}")
    if not np.isfinite(p.cost[np.arange(a.size), a]).all():
        raise InfeasibleError("a node is on an accelerator that does not support it")
    unit = units(p)
    _, first = np.unique(unit, return_index=True)
    if (a[first][unit] != a).any():
        raise InfeasibleError("a colour class is split over devices")
    mem = np.bincount(a, weights=p.node_mem, minlength=bench.k + 1)[:bench.k]
    if (mem > p.mem_cap[0] * (1 + 1e-12)).any():
        raise InfeasibleError("an accelerator holds more than maxSizePerFPGA bytes")


def max_load(bench: Benchmark, assignment) -> float:
    """The benchmark's throughput model: the largest device load.

    CPU load = its ``cpuLatency`` sum. Accelerator load = its ``fpgaLatency`` sum plus, for every
    node ``u`` whose output is consumed on another device, ``cost(u)`` once on ``u``'s device and
    once on each other device consuming it (the CPU pays no communication).

    Raises
    ------
    InfeasibleError
        The assignment breaks support, colour classes or memory (:func:`check`).
    """
    check(bench, assignment)
    p, a = bench.problem, np.asarray(assignment)
    load = np.bincount(a, weights=p.cost[np.arange(a.size), a], minlength=p.num_devices)
    for u in range(p.num_nodes):
        users = {int(a[v]) for v in p.edges[p.edges[:, 0] == u, 1]} - {int(a[u])}
        for dev in users | ({int(a[u])} if users else set()):
            if dev != bench.cpu:
                load[dev] += bench.comm[u]
    return float(load.max(initial=0.0))


def _convex(problem: Problem, members: np.ndarray) -> bool:
    """No path leaves ``members`` and comes back."""
    inside = np.zeros(problem.num_nodes, dtype=bool)
    inside[members] = True
    reach_out = np.zeros(problem.num_nodes, dtype=bool)  # reachable from the set via outside
    for u, v in sorted(problem.edges.tolist(), key=lambda e: e[0]):
        if (inside[u] and not inside[v]) or (reach_out[u] and not inside[v]):
            reach_out[v] = True
        if reach_out[u] and inside[v]:
            return False
    return True


def latency(bench: Benchmark, assignment) -> float:
    """The benchmark's latency model (the paper's greedy baseline scorer).

    A CPU node starts when its producers finish and takes ``cpuLatency``. An accelerator's
    (convex) subgraph starts when every outside producer feeding it has finished, pays their
    ``cost`` once each, runs its nodes one after another, pays the ``cost`` of each of its
    nodes feeding the outside; all its nodes finish then. Latency is the last finish.

    Raises
    ------
    InfeasibleError
        An accelerator's node set is not convex, accelerators wait for each other in a cycle,
        or :func:`check` fails.
    """
    p, a = bench.problem, np.asarray(assignment)
    preds = [[] for _ in range(p.num_nodes)]
    succs = [[] for _ in range(p.num_nodes)]
    for u, v in p.edges.tolist():
        preds[v].append(u)
        succs[u].append(v)
    # Quotient DAG: each accelerator's set is one unit, each CPU node its own unit.
    unit = [f"acc{a[i]}" if a[i] != bench.cpu else i for i in range(p.num_nodes)]
    q = nx.DiGraph()
    q.add_nodes_from(set(unit))
    q.add_edges_from((unit[u], unit[v]) for u, v in p.edges.tolist() if unit[u] != unit[v])
    for dev in range(bench.k):
        members = np.flatnonzero(a == dev)
        if members.size and not _convex(p, members):
            raise InfeasibleError(f"accelerator {p.device_names[dev]!r} holds a non-convex set")
    if not nx.is_directed_acyclic_graph(q):
        raise InfeasibleError("accelerators wait for each other's outputs in a cycle")
    check(bench, a)
    finish = np.zeros(p.num_nodes)
    for un in nx.topological_sort(q):
        if not isinstance(un, str):
            finish[un] = max((finish[u] for u in preds[un]), default=0.0) + p.cost[un, bench.cpu]
            continue
        members = np.flatnonzero(a == int(un[3:]))
        inside = set(members.tolist())
        feeders = {u for v in members for u in preds[v] if u not in inside}
        t = max((finish[u] for u in feeders), default=0.0)
        t += sum(bench.comm[u] for u in feeders)
        t += sum(p.cost[v, a[v]] for v in members)
        t += sum(bench.comm[v] for v in members if any(w not in inside for w in succs[v]))
        finish[members] = t
    return float(finish.max(initial=0.0))


def reordered(bench: Benchmark, order: np.ndarray) -> Benchmark:
    """The same input with its nodes renumbered so that node ``i`` is ``order[i]`` (a
    topological order)."""
    p = bench.problem
    pos = np.empty_like(order)
    pos[order] = np.arange(order.size)
    problem = Problem.build(
        p.cost[order], pos[p.edges], bench.comm[order], alpha=0.0, beta=1.0,
        node_mem=p.node_mem[order], mem_cap=p.mem_cap, groups=p.groups[order],
        node_names=[p.node_names[i] for i in order], device_names=p.device_names)
    return Benchmark(problem=problem, ids=tuple(bench.ids[i] for i in order), k=bench.k,
                     comm=bench.comm[order])


def plan_json(bench: Benchmark, assignment, objective: str) -> dict:
    """The plan in the benchmark's own form, with ``maxLoad`` (throughput) or ``latency``."""
    a = np.asarray(assignment)
    plan: dict = {}
    if objective == "throughput":
        plan["maxLoad"] = max_load(bench, a)
    else:
        plan["latency"] = latency(bench, a)
    plan["cpus"] = [{"nodes": [bench.ids[i] for i in np.flatnonzero(a == bench.cpu)]}]
    plan["fpgas"] = [{"nodes": [bench.ids[i] for i in np.flatnonzero(a == dev)]}
                     for dev in range(bench.k)]
    return plan


def units(problem) -> np.ndarray:
    """Colour class of every node as ``0..G-1`` (a node without one alone), numbered by first
    node: what a split must keep on one device.

    Examples
    --------
    >>> from autoplace.solve import Problem
    >>> units(Problem.build(np.ones((4, 2)), [], groups=[-1, 5, -1, 5])).tolist()
    [0, 1, 2, 1]
    """
    n = problem.num_nodes
    key = np.where(problem.groups >= 0, problem.groups, -1 - np.arange(n))
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse.ravel()]
