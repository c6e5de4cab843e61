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
    roomy = problem.node_mem.sum() <= problem.mem_cap.min()
    free = (np.isfinite(problem.cost).all(axis=1) & (problem.cost.max(axis=1, initial=0) == 0)
            & ((problem.node_mem == 0) | roomy) & (problem.pins < 0))
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
