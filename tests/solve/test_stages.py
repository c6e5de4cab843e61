"""Splits on the benchmark's two models: coarsening and ideals by hand; on random small DAGs the
DP over ideals, CP-SAT and brute force agree on contiguous max-load, and CP-SAT and brute force on
max-load of any shape and on latency; the scorers agree with every claimed value and bounds hold."""

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplace.solve import InfeasibleError, Problem
from autoplace import dnn_partitioning as dnn
from autoplace.solve._common import stages_of
from autoplace.solve.coarsen import coarsen
from autoplace.dnn_partitioning.maxload import cpsat_general, cpsat_split, ideal_dp, ideals



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
def benches(draw, max_n=7, max_k=3):
    """A random DAG of 2-``max_n`` nodes, 1-``max_k`` accelerators, a slower CPU, unsupported
    nodes, colour classes, memory and copy costs."""
    n = draw(st.integers(2, max_n))
    k = draw(st.integers(1, max_k))
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


def _brute_any(b, score):
    """Least ``score`` over every assignment the scorer accepts (support, colour classes, memory;
    for latency convex accelerator sets without a cycle between them)."""
    best = np.inf
    for a in itertools.product(range(b.k + 1), repeat=b.problem.num_nodes):
        try:
            best = min(best, score(b, np.array(a)))
        except InfeasibleError:
            continue
    return best


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(benches(max_n=6, max_k=2))
def test_general_max_load_cpsat_and_brute_force_agree(b):
    optimum = _brute_any(b, dnn.max_load)
    contiguous = ideal_dp(b)
    assert optimum <= contiguous.value + 1e-9
    split = cpsat_general(b, contiguous.assignment, time_limit=10)
    assert split.status == "OPTIMAL"
    assert split.value == pytest.approx(optimum, rel=1e-9, abs=1e-9)
    assert dnn.max_load(b, split.assignment) == pytest.approx(split.value, rel=1e-12, abs=1e-12)
    assert split.bound <= optimum + 1e-9


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(benches(max_n=6, max_k=2))
def test_latency_cpsat_and_brute_force_agree(b):
    optimum = _brute_any(b, dnn.latency)
    first = dnn.interval_dp(b, "latency")
    assert dnn.latency(b, first) >= optimum - 1e-9
    assert dnn.path_bound(b) <= optimum + 1e-9
    split = dnn.cpsat_latency(b, first, time_limit=10)
    assert split.status == "OPTIMAL"
    assert split.value == pytest.approx(optimum, rel=1e-9, abs=1e-9)
    assert dnn.latency(b, split.assignment) == pytest.approx(split.value, rel=1e-12, abs=1e-12)
    assert split.bound <= optimum + 1e-9


def test_latency_runs_branches_on_accelerators_in_parallel():
    # Fork 0 -> {1, 2} -> 3 on 2 accelerators; 1 and 2 take 5 there, 0 and 3 nothing on the
    # CPU; copies free. 1 and 2 on their own accelerators, 0 and 3 on the CPU: 0 + 5 + 0 = 5.
    # One topological order cut into intervals (one CPU interval) puts 1 and 2 in series: 10.
    b = _bench([0, 5, 5, 0], [0, 100, 100, 0], [(0, 1), (0, 2), (1, 3), (2, 3)], [0] * 4, k=2)
    first = dnn.interval_dp(b, "latency")
    assert dnn.latency(b, first) == pytest.approx(10.0)
    split = dnn.cpsat_latency(b, first, time_limit=10)
    assert split.status == "OPTIMAL" and split.value == pytest.approx(5.0)
    assert dnn.latency(b, split.assignment) == pytest.approx(5.0)


def test_latency_refuses_accelerators_feeding_each_other():
    # Edges 0 -> 2 and 1 -> 3; colour classes {0, 3} and {1, 2}; everything free on an
    # accelerator, 1 on the CPU; an accelerator holds two nodes. {0, 3} and {1, 2} on two
    # accelerators are each convex but wait for each other: not a plan (it would score 0).
    # With one class on the CPU the other waits for it: latency 2.
    b = _bench([0] * 4, [1] * 4, [(0, 2), (1, 3)], [0] * 4, k=2, size=[1] * 4, cap=2,
               colors=[0, 1, 1, 0])
    with pytest.raises(InfeasibleError, match="cycle"):
        dnn.latency(b, [0, 1, 1, 0])
    split = dnn.cpsat_latency(b, np.full(4, b.cpu), time_limit=10)
    assert split.status == "OPTIMAL" and split.value == pytest.approx(2.0)
    assert split.bound == pytest.approx(2.0, rel=1e-5)


def test_general_max_load_beats_every_pipeline():
    # Chain 0 -> 1 -> 2, one accelerator; fpga 1, 100, 1; cpu 5, 10, 5; copies free. Ends on the
    # accelerator, the middle on the CPU: max(1 + 1, 10) = 10. A pipeline (one accelerator
    # stage, one CPU stage, in order) at best puts 0 or 2 alone on the accelerator: 15.
    b = _bench([1, 100, 1], [5, 10, 5], [(0, 1), (1, 2)], [0] * 3, k=1)
    assert dnn.solve_benchmark(b, "throughput", contiguous=True).value == pytest.approx(15.0)
    split = dnn.solve_benchmark(b, "throughput", contiguous=False)
    assert split.status == "OPTIMAL" and split.value == pytest.approx(10.0)
    assert split.assignment.tolist() == [0, 1, 0]
    assert split.bound == pytest.approx(10.0, rel=1e-5)


def test_solvers_out_of_time_keep_the_warm_start_with_a_bound():
    # Fork 0 -> {1, 2} -> 3 (as above): the warm start, everything on the CPU, is feasible.
    # With no time CP-SAT cannot even complete its hint: each solver keeps the warm start (or
    # a better split) and never says "the warm start breaks the model's constraints".
    b = _bench([0, 5, 5, 0], [0, 10, 10, 0], [(0, 1), (0, 2), (1, 3), (2, 3)], [0] * 4, k=2)
    warm = np.full(4, b.cpu)
    for solver, score in ((dnn.cpsat_latency, dnn.latency), (cpsat_general, dnn.max_load),
                          (cpsat_split, dnn.max_load)):
        for limit in (0, 1e-9):
            split = solver(b, warm, time_limit=limit)
            assert split.value == pytest.approx(score(b, split.assignment))
            assert split.value <= score(b, warm) and split.bound <= split.value


def test_solve_benchmark_out_of_time_returns_the_first_split_and_its_gap():
    # 0 -> 1 -> 2 on one accelerator: fpga 1, 100, 1; cpu 5, 10, 5; copies free (as below). With
    # no time for CP-SAT the interval DP's split stands; the bound is at least load_bound: the
    # cheaper latencies 1 + 10 + 1 over two devices, 6, and at least the dearest node, 10.
    b = _bench([1, 100, 1], [5, 10, 5], [(0, 1), (1, 2)], [0] * 3, k=1)
    assert dnn.load_bound(b) == pytest.approx(10.0)
    for objective, contiguous in (("throughput", True), ("throughput", False), ("latency", True)):
        split = dnn.solve_benchmark(b, objective, contiguous, time_limit=1e-9)
        assert split.bound <= split.value and 0 <= split.gap < 1
        assert split.status in ("OPTIMAL", "FEASIBLE")
    with pytest.raises(ValueError, match="time_limit must be positive"):
        dnn.solve_benchmark(b, "latency", time_limit=float("nan"))


def test_large_latency_input_short_of_time_returns_a_plan(bench):
    # op_bert_l-12 (783 nodes): completing the warm start used to take CP-SAT over a second
    # (assumptions: one thread, weak presolve) and a time-out read as a broken warm start.
    b = dnn.load(f"{bench}/latency/op_bert_l-12_inference.json")
    split = dnn.solve_benchmark(b, "latency", time_limit=1)
    assert split.value == pytest.approx(dnn.latency(b, split.assignment))
    assert dnn.path_bound(b) <= split.bound <= split.value and 0 <= split.gap < 1
