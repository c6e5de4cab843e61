"""The public dnn-partitioning benchmark (Tarnawski et al., NeurIPS 2020): import, its own two
scoring models, solvers for them, export, and the ``autoplace solve`` CLI command.

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
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np

from .coarsen import coarsen
from .maxload import Split, cpsat_split, ideal_dp
from .problem import InfeasibleError, Problem

log = logging.getLogger(__name__)


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
                         "in the benchmark's README (nodes, edges, maxFPGAs, maxSizePerFPGA)") from None


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


def max_load(bench: Benchmark, assignment) -> float:
    """The benchmark's throughput model: the largest device load.

    CPU load = its ``cpuLatency`` sum. Accelerator load = its ``fpgaLatency`` sum plus, for every
    node ``u`` whose output is consumed on another device, ``cost(u)`` once on ``u``'s device and
    once on each other device consuming it (the CPU pays no communication).
    """
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
        An accelerator's node set is not convex.
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


def _reordered(bench: Benchmark, order: np.ndarray) -> Benchmark:
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
    a[order] = _interval_dp(_reordered(bench, order), objective, cuts)
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


def solve_benchmark(bench: Benchmark, objective: str, contiguous: bool = True,
                    time_limit: float = 10.0) -> Split:
    """A contiguous split of a benchmark input under its own model, with a lower bound.

    Throughput: :func:`interval_dp` gives a first split; :func:`maxload.ideal_dp` finds the
    optimum when the coarse DAG has at most ``IDEAL_CAP`` ideals and it finishes in
    ``3/4 * time_limit``; otherwise :func:`maxload.cpsat_split` improves the first split in the
    time left and proves a bound. Latency: :func:`interval_dp`, bounded by the longest path at
    each node's cheaper latency. Values are scored by :func:`max_load` / :func:`latency`.
    Non-contiguous plans are not searched yet: ``contiguous=False`` raises.
    """
    if not contiguous:
        raise NotImplementedError("non-contiguous max-load search is not implemented yet")
    t0 = time.perf_counter()
    a = interval_dp(bench, objective)
    if objective == "latency":
        return Split(a, latency(bench, a), path_bound(bench), "FEASIBLE")
    first = max_load(bench, a)
    split = ideal_dp(bench, first, cap=IDEAL_CAP, time_limit=0.75 * time_limit)
    if split is None:
        left = max(1.0, time_limit - (time.perf_counter() - t0))
        split = cpsat_split(bench, a, time_limit=left)
    value = max_load(bench, split.assignment)
    log.info("%s: max-load %.6g (solver said %.6g), bound %.6g, %s in %.2f s", objective, value,
             split.value, split.bound, split.status, time.perf_counter() - t0)
    return split._replace(value=value, bound=min(split.bound, value))


#: Most ideals :func:`solve_benchmark` lets the exact DP enumerate before it turns to CP-SAT.
IDEAL_CAP = 20_000


def path_bound(bench: Benchmark) -> float:
    """A lower bound on the latency model: the longest path with each node at the cheaper of
    its latencies, copies free (a stage finishes no earlier than its start plus its nodes)."""
    p = bench.problem
    best = np.where(np.isfinite(p.cost[:, 0]), np.minimum(p.cost[:, 0], p.cost[:, bench.cpu]),
                    p.cost[:, bench.cpu])
    path = best.copy()
    for u, v in p.edges[np.argsort(p.edges[:, 1], kind="stable")].tolist():
        path[v] = max(path[v], path[u] + best[v])
    return float(path.max(initial=0.0))


def register_cli(subparsers) -> None:
    """Add ``solve FILE --format dnn-partitioning --objective ... [--contiguous]
    [--time-limit S] [--json]`` to an argparse subparsers object."""
    cmd = subparsers.add_parser("solve", help="place a benchmark input and print the plan")
    cmd.add_argument("file")
    cmd.add_argument("--format", choices=["dnn-partitioning"], default="dnn-partitioning")
    cmd.add_argument("--objective", choices=["throughput", "latency"], default="throughput")
    cmd.add_argument("--contiguous", action="store_true",
                     help="convex stages (a pipeline); currently the only mode")
    cmd.add_argument("--time-limit", type=float, default=10.0)
    cmd.add_argument("--json", action="store_true", help="print only the plan JSON")
    cmd.set_defaults(handler=run_cli)


def run_cli(args) -> int:
    """Handler of the ``solve`` command: print the plan JSON on stdout."""
    bench = load(args.file)
    t0 = time.perf_counter()
    split = solve_benchmark(bench, args.objective, contiguous=True, time_limit=args.time_limit)
    plan = plan_json(bench, split.assignment, args.objective)
    if not args.json:
        key = "maxLoad" if args.objective == "throughput" else "latency"
        log.info("%s: %s %.6g (lower bound %.6g, %s) in %.2f s", args.file, key, plan[key],
                 split.bound, split.status, time.perf_counter() - t0)
    print(json.dumps(plan))
    return 0
