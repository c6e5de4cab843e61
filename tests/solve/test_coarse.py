"""Coarsen, solve, project, refine: merges worked out by hand; on random small DAGs the lossless
merges keep the optimum, projection keeps the coarse plan's value, and the "coarse" solver's
plan is feasible, scored by the simulator, and its bound never above brute force's optimum."""

import dataclasses
import importlib
import time
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autoplace.solve import (InfeasibleError, Problem, baselines, check_feasible, multilevel,
                             simulate_latency, simulate_throughput, solve)
from autoplace.solve.bruteforce import brute_force
from autoplace.solve.coarsen import coarse_problem, coarsen_placement


@st.composite
def problems(draw, max_nodes=6, free_leaves=0):
    """A random DAG on 2-3 devices, mostly chains (edge i-1 -> i), with free nodes (zero cost,
    zero memory), costs that favour one device more often than not, support holes, pins,
    groups, integer memory and paid copies; ``free_leaves`` of the nodes are free and last,
    each fed by one earlier node."""
    n = draw(st.integers(2, max_nodes - free_leaves)) + free_leaves
    d = draw(st.integers(2, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    speed = rng.choice([1.0, 2.0], (1, d))
    cost = rng.integers(1, 10, (n, 1)) * speed + rng.integers(0, 3, (n, d))
    cost[:, 1:][rng.random((n, d - 1)) < 0.15] = np.inf
    free = rng.random(n) < 0.25
    free[n - free_leaves:] = True
    cost[free] = 0.0
    inner = n - free_leaves
    edges = {(i - 1, i) for i in range(1, inner) if rng.random() < 0.7}
    edges |= {(i, j) for i in range(inner) for j in range(i + 2, inner) if rng.random() < 0.2}
    edges |= {(int(rng.integers(0, i)), i) for i in range(inner, n)}
    pins = np.where((rng.random(n) < 0.1) & ~free, 0, -1)
    groups = np.where((rng.random(n) < 0.15) & ~free, 0, -1)
    mem = np.where(free, 0, rng.integers(0, 4, n))
    cap = rng.integers(int(mem.sum() // d) + 1, int(mem.sum()) + 2, d)
    return Problem.build(cost, sorted(edges), rng.integers(0, 10, n),
                         alpha=rng.uniform(0, 1, (d, d)), beta=rng.uniform(1, 5, (d, d)),
                         node_mem=mem, mem_cap=cap, pins=pins, groups=groups)


def _brute(problem, objective):
    try:
        return brute_force(problem, objective).value
    except InfeasibleError:
        return None


def test_free_leaf_joins_its_producer_losslessly():
    # 0 -> 1 -> 2, 1 -> 3; node 3 costs nothing anywhere and feeds no one: it joins 1.
    # Node 2 costs 1 s too, so it is no free leaf; no chain link (1 has two consumers).
    p = Problem.build([[1, 2], [2, 1], [1, 1], [0, 0]], [(0, 1), (1, 2), (1, 3)])
    rep, lossless = coarsen_placement(p, heuristic=False)
    assert rep.tolist() == [0, 1, 2, 1] and lossless


def test_chain_links_merge_only_when_the_nodes_agree():
    # Chain 0 -> 1 -> 2 -> 3 -> 4, every node cheapest on device 0, except that 2 is pinned to
    # device 1 (so it shares no device with 1) and 3 and 4 are in different groups.
    cost = np.tile([1.0, 2.0], (5, 1))
    p = Problem.build(cost, [(0, 1), (1, 2), (2, 3), (3, 4)], pins=[-1, -1, 1, -1, -1],
                      groups=[-1, -1, -1, 0, 1])
    rep, lossless = coarsen_placement(p)
    assert rep.tolist() == [0, 0, 1, 2, 3] and not lossless
    # A link between nodes cheapest on different devices stays.
    p = Problem.build([[1.0, 2.0], [2.0, 1.0]], [(0, 1)])
    assert coarsen_placement(p)[0].tolist() == [0, 1]


def test_cheap_leaf_joins_its_producer():
    # 0 -> 1 and 0 -> 2; leaf 2 costs 0.5 s anywhere, less than the 1 s copy of its input
    # (alpha 1): it joins 0. Leaf 1 costs 2 s or more: it stays (and is cheapest on device 1,
    # node 0 on device 0, so the link 0 -> 1 does not merge either).
    p = Problem.build([[1.0, 1.5], [3.0, 2.0], [0.5, 0.5]], [(0, 1), (0, 2)], alpha=1.0)
    rep, lossless = coarsen_placement(p)
    assert rep.tolist() == [0, 1, 0] and not lossless


def test_coarse_problem_sums_members_and_sends_the_last_ones_output():
    # Chain 0 -> 1 -> 2 merged into one coarse node, which feeds 3 with node 2's output.
    p = Problem.build([[1.0, 2.0], [1.0, np.inf], [2.0, 3.0], [1.0, 1.0]],
                      [(0, 1), (1, 2), (2, 3)], [5.0, 6.0, 7.0, 8.0], node_mem=[1, 2, 3, 4],
                      pins=[-1, 0, -1, -1], groups=[-1, -1, -1, 4])
    q = coarse_problem(p, np.array([0, 0, 0, 1]))
    assert q.cost.tolist() == [[4.0, np.inf], [1.0, 1.0]]
    assert q.edges.tolist() == [[0, 1]]
    assert q.out_bytes.tolist() == [7.0, 0.0]
    assert q.node_mem.tolist() == [6.0, 4.0]
    assert q.pins.tolist() == [0, -1] and q.groups.tolist() == [-1, 4]


@settings(max_examples=40, deadline=None, database=None)
@given(problems(free_leaves=2), st.sampled_from(["latency", "throughput"]),
       st.sampled_from([0.0, 3.0]), st.sampled_from([None, 1, 2]))
def test_lossless_merges_keep_the_optimum(problem, objective, overhead, max_stages):
    if objective == "throughput":
        problem = dataclasses.replace(
            problem, stage_overhead_s=np.full(problem.num_devices, overhead),
            max_stages=max_stages)
    rep, lossless = coarsen_placement(problem, heuristic=False)
    assert lossless
    assume(rep.max() + 1 < problem.num_nodes)
    full, coarse = _brute(problem, objective), _brute(coarse_problem(problem, rep), objective)
    assert (full is None) == (coarse is None)
    if full is not None:
        assert coarse == pytest.approx(full, rel=1e-9)


@settings(max_examples=30, deadline=None, database=None)
@given(problems(max_nodes=10))
def test_projection_keeps_the_coarse_plans_value(problem):
    rep, _ = coarsen_placement(problem)
    coarse = coarse_problem(problem, rep)
    for objective in ("latency", "throughput"):
        try:
            sol = baselines.heft(coarse, objective)
        except InfeasibleError:
            return
        full = multilevel._project(problem, objective, sol, rep)
        check_feasible(problem, full.assignment)
        if objective == "throughput":
            assert full.value == pytest.approx(sol.value, rel=1e-12)
        else:  # a sender's copy may leave before its coarse node's other members end
            assert full.value <= sol.value * (1 + 1e-12)


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(["latency", "throughput"]), st.booleans(),
       st.sampled_from([0.0, 0.5, 3.0]), st.sampled_from([None, 1, 2]))
def test_coarse_plan_is_feasible_scored_and_bounded_by_the_optimum(problem, objective, cpsat,
                                                                   overhead, max_stages):
    if objective == "throughput":  # pipeline stages cost overhead s each, at most max_stages
        problem = dataclasses.replace(
            problem, stage_overhead_s=np.full(problem.num_devices, overhead),
            max_stages=max_stages)
    if not cpsat:  # the list schedulers may fail on memory (CP-SAT may not): give them room
        problem = dataclasses.replace(problem, mem_cap=np.full(problem.num_devices, np.inf))
    optimum = _brute(problem, objective)
    assume(optimum is not None)
    # cpsat=False: the path of graphs too big for CP-SAT (list schedulers, then local search).
    with mock.patch.object(multilevel, "COARSE_CPSAT_MAX_NODES", 10**6 if cpsat else 0):
        sol = solve(problem, objective, "coarse", time_limit=5.0)
    check_feasible(problem, sol.assignment, sol.stages)
    if objective == "latency":
        replay = simulate_latency(problem, sol.assignment, sol.order, sol.transfer_order)
        assert replay.makespan == sol.value
    else:
        assert simulate_throughput(problem, sol.assignment, sol.stages) == sol.value
    assert sol.bound <= optimum * (1 + 1e-9)
    assert sol.value >= optimum * (1 - 1e-9)


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize("cpsat", [True, False])
def test_pins_groups_and_support_survive_projection_and_refinement(objective, cpsat):
    # Device 1 is 4x faster for every node, and copies are free: left alone, a plan would put
    # everything there. But node 2 is pinned to device 0, nodes 3 and 6 share a group and 6
    # cannot run on device 1, and node 5 cannot either.
    cost = np.tile([4.0, 1.0], (8, 1))
    cost[[5, 6], 1] = np.inf
    p = Problem.build(cost, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (1, 7)],
                      pins=[-1, -1, 0, -1, -1, -1, -1, -1], groups=[-1, -1, -1, 9, -1, -1, 9, -1])
    with mock.patch.object(multilevel, "COARSE_CPSAT_MAX_NODES", 10**6 if cpsat else 0):
        a = solve(p, objective, "coarse", time_limit=2.0).assignment
    assert a[2] == 0 and a[5] == 0 and a[3] == a[6] == 0
    assert (a[[0, 1, 4, 7]] == 1).any()  # unconstrained nodes did go to the fast device


def test_auto_coarsens_past_the_cpsat_size(monkeypatch):
    # (autoplace.solve the attribute is the function; the module is in sys.modules.)
    monkeypatch.setattr(importlib.import_module("autoplace.solve"), "AUTO_CPSAT_MAX_NODES", 3)
    p = Problem.build(np.tile([1.0, 2.0], (5, 1)), [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert solve(p, "latency", "auto").solver == "coarse"


def test_heft_work_weight_trades_finish_time_for_work():
    # Independent nodes 0 (1 s on d0, 5 s on d1) and 1 (1 s / 1.2 s); 0 goes first (higher
    # rank) to d0, [0, 1]. Plain HEFT puts 1 where it ends first: d1 at 1.2 s rather than d0 at
    # 2 s. With weight 8, d1 scores 1.2 + 8 * 0.2 = 2.8 > 2: node 1 goes to d0.
    p = Problem.build([[1.0, 5.0], [1.0, 1.2]])
    assert baselines.heft(p, "latency").assignment.tolist() == [0, 1]
    assert baselines.heft(p, "latency", work_weight=8.0).assignment.tolist() == [0, 0]


@settings(max_examples=30, deadline=None, database=None)
@given(problems(max_nodes=10), st.sampled_from(["latency", "throughput"]))
def test_refinement_never_worsens_its_start(problem, objective):
    try:
        start = baselines.heft(problem, objective)
    except InfeasibleError:
        return
    if objective == "latency":
        deadline = time.perf_counter() + 5
        a, order, transfer_order = multilevel._refine_latency(problem, start, deadline)
        value = simulate_latency(problem, a, order, transfer_order).makespan
    else:
        a, stages = multilevel._refine_throughput(problem, start, time.perf_counter() + 5, False)
        value = simulate_throughput(problem, a, stages)
    check_feasible(problem, a)
    assert value <= start.value


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_refinement_spreads_a_one_device_plan(objective):
    # Four independent 1 s nodes, all on device 0: 4 s either way. Moving two to device 1 halves
    # it, and nothing does better: 2 s.
    p = Problem.build(np.ones((4, 2)))
    start = baselines.single(p, objective, 0)
    deadline = time.perf_counter() + 600  # never reached: the search stops once nothing improves
    if objective == "latency":
        a = multilevel._refine_latency(p, start, deadline)[0]
        assert simulate_latency(p, a).makespan == 2.0
    else:
        a = multilevel._refine_throughput(p, start, deadline, False)[0]
        assert simulate_throughput(p, a) == 2.0


def test_a_plan_that_costs_nothing_scales_without_overflow():
    # Ops that cost 0: the bound is 0, and copies of seconds scaled by RESOLUTION / 1e-12
    # overflowed CP-SAT's intervals (a case hypothesis found above).
    problem = Problem.build(np.zeros((4, 2)), [(0, 2), (1, 2), (2, 3)], [1.0, 7.0, 9.0, 5.0],
                            alpha=np.array([[0.6, 0.79], [0.76, 0.43]]),
                            beta=np.array([[4.9, 1.8], [3.4, 1.2]]), mem_cap=[1.0, 1.0])
    for solver in ("coarse", "cpsat"):
        sol = solve(problem, "latency", solver, time_limit=5.0)
        assert sol.value == 0.0 and len(set(sol.assignment.tolist())) == 1
