"""Coarsening that cannot hurt a contiguous split: merge nodes that every such split keeps together.

A contiguous split is a chain of stages ``I1 \\ I0, I2 \\ I1, ...`` for ideals (downsets)
``I0 ⊂ I1 ⊂ ...`` of the DAG, one device per stage. :func:`coarsen` merges

* each colocation group (its members share a device, hence a stage);
* every cycle that merging creates (a path between two members of one stage stays in it);
* a free node (zero cost everywhere it may run, unpinned, and zero memory unless every device
  could hold the whole model) that has no successor into its only predecessor, and one that has
  one successor and only free copies coming in (no predecessor, or copies of zero bytes and zero
  alpha) into that successor: on their stage it adds no work and saves a copy.

Every contiguous split that keeps groups whole is then a split of the coarse DAG, and one at
least as good exists that keeps the merged leaves with their neighbour (under the max-load and
latency models of the dnn-partitioning benchmark and autoplace's throughput model).

Placements of any shape (the ``"coarse"`` solver, :mod:`multilevel`) cannot merge groups and
the paths between their members this way. :func:`coarsen_placement` merges there only free
leaves (lossless) and, as a heuristic, cheap leaves and chain links; :func:`coarse_problem`
builds the coarse :class:`Problem`.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from .problem import Problem


def _relabel(problem: Problem, rep: np.ndarray) -> np.ndarray:
    """Merge the cycles among coarse nodes and number the result in a topological order
    (ties: smallest member first)."""
    q = nx.DiGraph()
    q.add_nodes_from(np.unique(rep).tolist())
    q.add_edges_from((int(rep[u]), int(rep[v])) for u, v in problem.edges.tolist()
                     if rep[u] != rep[v])
    cond = nx.condensation(q)
    first = {c: min(cond.nodes[c]["members"]) for c in cond.nodes}
    rank = {c: r for r, c in enumerate(nx.lexicographical_topological_sort(cond, key=first.get))}
    return np.array([rank[cond.graph["mapping"][int(r)]] for r in rep], dtype=np.int64)


def _free(problem: Problem) -> np.ndarray:
    """(n,) bool: zero cost on every device (all of which support it), unpinned, and zero memory
    unless every device could hold the whole model."""
    roomy = problem.node_mem.sum() <= problem.mem_cap.min()
    return (np.isfinite(problem.cost).all(axis=1) & (problem.cost.max(axis=1, initial=0) == 0)
            & ((problem.node_mem == 0) | roomy) & (problem.pins < 0))


def _paid_in(problem: Problem, rep: np.ndarray, c: int) -> bool:
    """Whether a copy into coarse node ``c`` from another one can cost time."""
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    into = (rep[v] == c) & (rep[u] != c)
    return bool(into.any() and (problem.alpha.max() > 0 or (problem.out_bytes[u[into]] > 0).any()))


def coarsen(problem: Problem) -> np.ndarray:
    """Coarse node of every node, numbered in a topological order of the coarse DAG.

    Examples
    --------
    Group {0, 2} forces the path 0 -> 1 -> 2 into one coarse node; 3 stays alone.

    >>> p = Problem.build(np.ones((4, 2)), [(0, 1), (1, 2), (2, 3)], groups=[0, -1, 0, -1])
    >>> coarsen(p).tolist()
    [0, 0, 0, 1]
    """
    n = problem.num_nodes
    rep = np.arange(n)
    for g in np.unique(problem.groups[problem.groups >= 0]):
        members = np.flatnonzero(problem.groups == g)
        rep[members] = members[0]
    rep = _relabel(problem, rep)
    q = coarse_graph(problem, rep)
    free = _free(problem)
    zero = {c: bool(free[rep == c].all()) for c in q.nodes}
    paid_in = {c: _paid_in(problem, rep, c) for c in q.nodes}
    changed = True
    while changed:
        changed = False
        for c in list(nx.topological_sort(q)):
            if not zero[c]:
                continue
            ins, outs = list(q.predecessors(c)), list(q.successors(c))
            if not outs and len(ins) == 1:
                into = ins[0]
            elif len(outs) == 1 and not paid_in[c]:
                into = outs[0]
            else:
                continue
            rep[rep == c] = into
            zero[into] = zero[into] and zero[c]
            paid_in[into] = _paid_in(problem, rep, into)
            q = nx.contracted_nodes(q, into, c, self_loops=False)
            changed = True
    return _relabel(problem, rep)


def coarse_graph(problem: Problem, rep: np.ndarray) -> nx.DiGraph:
    """The DAG of coarse nodes ``0..rep.max()`` (edges between distinct coarse nodes)."""
    q = nx.DiGraph()
    q.add_nodes_from(range(int(rep.max(initial=-1)) + 1))
    q.add_edges_from((int(rep[u]), int(rep[v])) for u, v in problem.edges.tolist()
                     if rep[u] != rep[v])
    return q


def coarsen_placement(problem: Problem, *, heuristic: bool = True) -> tuple[np.ndarray, bool]:
    """Coarse node of every node for placements of any shape, and whether no merge can hurt.

    Coarse nodes keep what the full problem says about them: support, pins and colocation groups
    (a group stays a group of coarse nodes, so it is not forced into one node), and every coarse
    node sends at most one tensor out (only one of its members has consumers outside it).

    Lossless (always): a free node (zero cost on every device, unpinned, ungrouped, zero memory
    unless every device could hold the whole model) with one predecessor and no consumer (once
    its free consumers joined it) joins that predecessor. Any plan, latency or throughput, does
    no worse with the node moved there: on its producer's device, right after it, it takes no
    time, needs no copy and adds no stage, and no one waits for it. A coarse plan projects to a
    full one no worse (:func:`coarse_problem`), so the coarse optimum is the full one.

    Heuristic (``heuristic=True``):

    * a *cheap leaf* (no consumer, one predecessor, costing no more anywhere it may run than the
      cheapest copy of its input) joins its predecessor;
    * a *chain link* ``u -> v`` where ``v`` is ``u``'s only consumer, ``u`` is ``v``'s only
      input, and both are cheapest on the same device, merges ``u`` and ``v``.

    These force their nodes onto one device, back to back: plans that split them (to balance
    the devices' loads, or to run a leaf in parallel) are lost, so the coarse optimum may be
    worse than the full one and its bound is not one for the full problem. A merge happens only
    when the merged nodes share an allowed device, hold at most one group, and fit one device's
    memory.

    Returns
    -------
    rep : (n,) int array
        Coarse node of every node, numbered in a topological order of the coarse DAG.
    lossless : bool
        Whether only lossless merges were made.

    Examples
    --------
    Chain 0 -> 1 -> 2 with a free leaf 3 hanging off 2: 3 joins 2 (lossless); then 0 and 1,
    both cheapest on device 0, merge (heuristic), but 2 is cheapest on device 1.

    >>> p = Problem.build([[1, 2], [2, 3], [2, 1], [0, 0]], [(0, 1), (1, 2), (2, 3)])
    >>> coarsen_placement(p, heuristic=False)
    (array([0, 1, 2, 2]), True)
    >>> coarsen_placement(p)
    (array([0, 0, 1, 1]), False)
    """
    from .simulate import allowed_devices

    n = problem.num_nodes
    allowed = allowed_devices(problem)
    cost = problem.cost.copy()
    mem = problem.node_mem.astype(float).copy()
    group = problem.groups.copy()
    succ: list[set[int]] = [set() for _ in range(n)]
    pred: list[set[int]] = [set() for _ in range(n)]
    in_bytes = np.zeros(n)
    for u, v in problem.edges.tolist():
        succ[u].add(v)
        pred[v].add(u)
        in_bytes[v] = max(in_bytes[v], problem.out_bytes[u])
    parent = np.arange(n)

    def merge(u: int, v: int) -> None:
        """Coarse node ``v``, whose only input is coarse node ``u``, joins it."""
        parent[v] = u
        allowed[u] &= allowed[v]
        cost[u] += cost[v]
        mem[u] += mem[v]
        group[u] = max(group[u], group[v])
        succ[u].discard(v)
        for w in succ[v]:
            pred[w].discard(v)
            pred[w].add(u)
            succ[u].add(w)

    def fits(u: int, v: int) -> bool:
        common = allowed[u] & allowed[v]
        return bool(common.any() and (group[u] < 0 or group[v] < 0 or group[u] == group[v])
                    and mem[u] + mem[v] <= problem.mem_cap[common].max() * (1 + 1e-12))

    def cheapest(u: int) -> int:
        return int(np.where(allowed[u], cost[u], np.inf).argmin())

    free = _free(problem) & (problem.groups < 0)
    # Nodes are numbered topologically: a node's consumers are merged into it before it is seen.
    for v in range(n - 1, -1, -1):
        if free[v] and not succ[v] and len(pred[v]) == 1:
            merge(next(iter(pred[v])), v)
    roots = int((parent == np.arange(n)).sum())
    if heuristic:
        off = ~np.eye(problem.num_devices, dtype=bool)
        for v in range(n - 1, -1, -1):
            if parent[v] != v or succ[v] or len(pred[v]) != 1:
                continue
            u = next(iter(pred[v]))
            # The leaf's input is one tensor (only one member of u has consumers outside u).
            copy = (problem.alpha[off] + in_bytes[v] / problem.beta[off]).min(initial=np.inf)
            if fits(u, v) and cost[v][allowed[v]].max() <= copy:
                merge(u, v)
        for u in range(n):
            while parent[u] == u and len(succ[u]) == 1:
                v = next(iter(succ[u]))
                if len(pred[v]) != 1 or not fits(u, v) or cheapest(u) != cheapest(v):
                    break
                merge(u, v)
    lossless = int((parent == np.arange(n)).sum()) == roots
    rep = parent
    while (rep != rep[rep]).any():
        rep = rep[rep]
    return _relabel(problem, rep), lossless


def coarse_problem(problem: Problem, rep: np.ndarray) -> Problem:
    """The problem over coarse nodes ``rep`` (each sending at most one tensor out, as those of
    :func:`coarsen_placement` do): costs and memory summed, unsupported where any member is,
    members' pin and group, the output of the member with outside consumers.

    A coarse plan and its projection ``assignment[rep]`` then have the same copies, loads and
    stages, and a coarse schedule run member by member is a full schedule no longer than it (a
    sender's copies may leave before the members after it end).
    """
    m, d = int(rep.max(initial=-1)) + 1, problem.num_devices
    cost = np.zeros((m, d))
    np.add.at(cost, rep, problem.cost)
    pins = np.full(m, -1, dtype=np.int64)
    np.maximum.at(pins, rep, problem.pins)
    groups = np.full(m, -1, dtype=np.int64)
    np.maximum.at(groups, rep, problem.groups)
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    cross = rep[u] != rep[v]
    out_bytes = np.zeros(m)
    out_bytes[rep[u[cross]]] = problem.out_bytes[u[cross]]
    first = np.full(m, problem.num_nodes)
    np.minimum.at(first, rep, np.arange(problem.num_nodes))
    return Problem.build(
        cost, np.unique(np.stack([rep[u[cross]], rep[v[cross]]], axis=1), axis=0), out_bytes,
        alpha=problem.alpha, beta=problem.beta,
        node_mem=np.bincount(rep, weights=problem.node_mem, minlength=m),
        mem_cap=problem.mem_cap, pins=pins, groups=groups,
        stage_overhead_s=problem.stage_overhead_s, call_s=problem.call_s,
        max_stages=problem.max_stages,
        node_names=[problem.node_names[i] for i in first], device_names=problem.device_names,
        serial=problem.serial, machines=problem.machines)
