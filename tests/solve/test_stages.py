"""Contiguous stage cuts on the benchmark's max-load model: coarsening and ideals by hand; the DP
over ideals, CP-SAT and brute force agree on random small DAGs, and the scorer agrees with each."""

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplace.solve import Problem
from autoplace.solve import dnn_partitioning as dnn
from autoplace.solve._common import stages_of
from autoplace.solve.coarsen import coarsen
from autoplace.solve.maxload import cpsat_split, ideal_dp, ideals



def _bench(fpga, cpu, edges, comm, k, size=None, cap=np.inf, colors=None):
    """A benchmark input built in memory (nodes already in topological order)."""
    n = len(fpga)
    cost = np.column_stack([np.tile(np.asarray(fpga, float)[:, None], (1, k)), cpu])
    problem = Problem.build(cost, edges, comm, alpha=0.0, beta=1.0, node_mem=size,
                            mem_cap=[cap] * k + [np.inf], groups=colors)
    return dnn.Benchmark(problem=problem, ids=tuple(range(n)), k=k, comm=np.asarray(comm, float))


def test_coarsen_merges_groups_their_paths_and_free_leaves():
    # 0 -> 1 -> 2 -> 3, and 3 -> 4. Group {0, 2} forces 1 between them into the same stage.
    # Node 4 is a free sink (zero cost, zero size): it joins its only predecessor 3.
    p = Problem.build([[1, 1], [1, 1], [1, 1], [1, 1], [0, 0]],
                      [(0, 1), (1, 2), (2, 3), (3, 4)], groups=[0, -1, 0, -1, -1])
    assert coarsen(p).tolist() == [0, 0, 0, 1, 1]
    # Free node 0 feeding only node 2 joins it; free node 1 feeding 2 and 3 stays apart.
    # Coarse order: {1}, then {0, 2} (smallest member 0) before {3}.
    p = Problem.build([[0, 0], [0, 0], [1, 1], [1, 1]], [(0, 2), (1, 2), (1, 3)])
    assert coarsen(p).tolist() == [1, 0, 1, 2]


def test_ideals_of_a_diamond():
    # 0 -> {1, 2} -> 3: {}, {0}, {0,1}, {0,2}, {0,1,2}, all; as masks 0, 1, 3, 5, 7, 15.
    g = nx.DiGraph([(0, 1), (0, 2), (1, 3), (2, 3)])
    assert ideals(g, cap=10) == [0, 1, 3, 5, 7, 15]
    assert ideals(g, cap=5) is None


def test_ideal_dp_beats_one_topological_order_by_hand():
    # Chains 0 -> 2 (fpga 4, 4) and 1 -> 3 (3, 3) join at 4 (2); copies free, 2 accelerators.
    # {0, 2} | {1, 3, 4} loads 8 | 8: optimal (16 of work). Intervals of the order 0..4 give at
    # best {0, 1} | {2, 3, 4} = 7 | 9.
    b = _bench([4, 3, 4, 3, 2], [100] * 5, [(0, 2), (1, 3), (2, 4), (3, 4)], [0] * 5, k=2)
    assert dnn.max_load(b, dnn.interval_dp(b, "throughput")) == pytest.approx(9.0)
    split = ideal_dp(b)
    assert split.value == pytest.approx(8.0) and split.status == "OPTIMAL"
    assert dnn.max_load(b, split.assignment) == pytest.approx(8.0)


@st.composite
def benches(draw):
    """A random DAG of 2-7 nodes, 1-3 accelerators, a slower CPU, unsupported nodes, colour
    classes, memory and copy costs."""
    n = draw(st.integers(2, 7))
    k = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    fpga = rng.integers(0, 10, n).astype(float)
    fpga[rng.random(n) < 0.1] = np.inf
    cpu = rng.integers(5, 40, n).astype(float)
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
    comm = rng.integers(0, 4, n) * (rng.random(n) < 0.7)
    colors = np.where(rng.random(n) < 0.3, 0, -1)
    size = rng.integers(0, 4, n)
    cap = float(rng.integers(max(size.max(initial=0), 1), size.sum() + 2))
    return _bench(fpga, cpu, edges, comm, k, size, cap, colors)


def _brute(b):
    """Least max-load over every chain split: each device's nodes one stage, at most one CPU
    stage, colour classes whole, memory and support respected."""
    p, best = b.problem, np.inf
    for a in itertools.product(range(b.k + 1), repeat=p.num_nodes):
        a = np.array(a)
        if (~np.isfinite(p.cost[np.arange(a.size), a])).any():
            continue
        if any(len(set(a[p.groups == g])) > 1 for g in set(p.groups[p.groups >= 0].tolist())):
            continue
        if (np.bincount(a, weights=p.node_mem, minlength=b.k + 1)[:b.k] > p.mem_cap[0]).any():
            continue
        if len(set(stages_of(p, a).tolist())) != len(set(a.tolist())):
            continue
        best = min(best, dnn.max_load(b, a))
    return best


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(benches())
def test_ideal_dp_cpsat_and_brute_force_agree(b):
    optimum = _brute(b)
    assert np.isfinite(optimum)  # the CPU side can always hold everything
    dp = ideal_dp(b)
    assert dp.status == "OPTIMAL"
    assert dp.value == pytest.approx(optimum, rel=1e-9, abs=1e-9)
    first = dnn.interval_dp(b, "throughput")
    assert dnn.max_load(b, first) >= optimum - 1e-9
    cp = cpsat_split(b, first, time_limit=10)
    assert cp.status == "OPTIMAL"
    assert cp.value == pytest.approx(optimum, rel=1e-9, abs=1e-9)
    assert cp.bound <= optimum + 1e-9
    for split in (dp, cp):
        a = split.assignment
        assert dnn.max_load(b, a) == pytest.approx(split.value, rel=1e-12, abs=1e-12)
        assert len(set(stages_of(b.problem, a).tolist())) == len(set(a.tolist()))
        assert (split.assignment[~np.isfinite(b.problem.cost[:, 0])] == b.cpu).all()


def test_solve_benchmark_turns_to_cpsat_past_the_ideal_cap(monkeypatch):
    # Same chains as above: with no room for ideals CP-SAT proves the optimum 8 itself.
    b = _bench([4, 3, 4, 3, 2], [100] * 5, [(0, 2), (1, 3), (2, 4), (3, 4)], [0] * 5, k=2)
    monkeypatch.setattr(dnn, "IDEAL_CAP", 2)
    split = dnn.solve_benchmark(b, "throughput", time_limit=10)
    assert split.status == "OPTIMAL"
    assert split.value == pytest.approx(8.0) and split.bound == pytest.approx(8.0, rel=1e-5)


def test_op_graph_throughput_is_optimal_and_proven(bench):
    # Colour classes spread over the topological order: without coarsening the old interval DP
    # could not cut op_bert_l-3 at all (49.35, everything on one accelerator).
    b = dnn.load(f"{bench}/throughput/op_bert_l-3_inference.json")
    split = dnn.solve_benchmark(b, "throughput", time_limit=30)
    assert split.status == "OPTIMAL" and split.bound == split.value
    assert split.value == pytest.approx(dnn.max_load(b, split.assignment))
    assert split.value < 0.6 * 49.35
    cp = cpsat_split(b, dnn.interval_dp(b, "throughput"), time_limit=30)
    assert cp.bound <= split.value * (1 + 1e-9) and cp.value >= split.value * (1 - 1e-9)


def test_op_graph_latency_beats_the_papers_greedy(bench):
    b = dnn.load(f"{bench}/latency/op_resnet50_inference.json")
    split = dnn.solve_benchmark(b, "latency")
    assert split.value == pytest.approx(dnn.latency(b, split.assignment))
    assert split.bound <= split.value < 839.5363  # README's greedy value
