"""Random small problems: exact solvers agree, the simulator agrees with every claim, baselines
never beat the optimum, infeasible inputs name their cause."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autoplace.solve import InfeasibleError, Problem, simulate_latency, simulate_throughput, solve
from autoplace.solve._common import trivial_bound
from autoplace.solve.bruteforce import best_staging, brute_force
from autoplace.solve.segments import serial_latency

HEURISTICS = ("single", "priority", "greedy", "heft")


@st.composite
def problems(draw, max_nodes=6):
    """A random DAG (edges src < dst) on 2-3 devices with support holes, pins, groups and
    integer memory. Device 0 supports everything so most draws are feasible."""
    n = draw(st.integers(2, max_nodes))
    d = draw(st.integers(2, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    cost = rng.integers(1, 10, (n, d)).astype(float)
    cost[:, 1:][rng.random((n, d - 1)) < 0.2] = np.inf
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
    pins = np.where(rng.random(n) < 0.1, 0, -1)
    groups = np.where(rng.random(n) < 0.2, 0, -1)
    mem = rng.integers(0, 4, n)
    cap = rng.integers(int(mem.sum() // d) + 1, int(mem.sum()) + 2, d)
    return Problem.build(cost, edges, rng.integers(0, 10, n), alpha=rng.uniform(0, 1, (d, d)),
                         beta=rng.uniform(1, 5, (d, d)), node_mem=mem, mem_cap=cap, pins=pins,
                         groups=groups)


def _solve_or_none(problem, objective, solver):
    try:
        return solve(problem, objective, solver, time_limit=20.0)
    except InfeasibleError:
        return None


def _brute_and_cpsat(problem, objective):
    """Brute force's and CP-SAT's solutions, or None where brute force finds none (and
    CP-SAT then raises too)."""
    brute = _solve_or_none(problem, objective, "brute")
    if brute is None:
        with pytest.raises(InfeasibleError):
            solve(problem, objective, "cpsat")
        return None
    return brute, solve(problem, objective, "cpsat", time_limit=20.0)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_latency_exact_solvers_agree_and_bound_baselines(problem):
    solved = _brute_and_cpsat(problem, "latency")
    if solved is None:
        return
    brute, cp = solved
    assert cp.status == "OPTIMAL"
    assert cp.value == pytest.approx(brute.value, rel=1e-4)
    for sol in (brute, cp):
        replay = simulate_latency(problem, sol.assignment, sol.order, sol.transfer_order)
        assert replay.makespan == pytest.approx(sol.value, rel=1e-12)
        assert sol.bound <= sol.value * (1 + 1e-12)
    assert cp.bound <= brute.value * (1 + 1e-9)
    for name in HEURISTICS:
        sol = _solve_or_none(problem, "latency", name)
        if sol is not None:
            assert sol.value >= brute.value * (1 - 1e-9), name
            assert sol.value == pytest.approx(
                simulate_latency(problem, sol.assignment, sol.order, sol.transfer_order).makespan)


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=7))
def test_serial_latency_is_every_task_summed_and_cpsat_finds_the_least(problem):
    """On one thread (a VM calling PyTorch beside TVM's kernels) nothing overlaps: every
    solver's value is its nodes' and copies' sum, and CP-SAT's is the least over every
    assignment."""
    problem = replace(problem, serial=True)
    solved = _brute_and_cpsat(problem, "latency")
    if solved is None:
        return
    brute, cp = solved
    assert cp.value == pytest.approx(brute.value, rel=1e-4)
    assert cp.gap < 1e-4  # OPTIMAL, or its integer times' floors leave a sliver of a gap
    assert cp.bound <= brute.value * (1 + 1e-9)
    for name in (*HEURISTICS, "cpsat", "coarse"):
        sol = _solve_or_none(problem, "latency", name)
        if sol is None:
            continue
        assert sol.value == pytest.approx(serial_latency(problem, sol.assignment), rel=1e-12)
        assert sol.value >= cp.value * (1 - 1e-4), name
        replay = simulate_latency(problem, sol.assignment, sol.order, sol.transfer_order)
        assert replay.makespan == pytest.approx(sol.value, rel=1e-12)
        assert replay.busy.sum() <= replay.makespan * (1 + 1e-12)  # nothing overlapped


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_nodes=8))
def test_throughput_exact_solvers_agree_and_bound_baselines(problem):
    solved = _brute_and_cpsat(problem, "throughput")
    if solved is None:
        return
    brute, cp = solved
    assert cp.status == "OPTIMAL"
    assert cp.value == pytest.approx(brute.value, rel=1e-4)
    assert simulate_throughput(problem, cp.assignment) == pytest.approx(cp.value, rel=1e-12)
    assert cp.bound <= brute.value * (1 + 1e-9)
    for name in HEURISTICS:
        sol = _solve_or_none(problem, "throughput", name)
        if sol is not None:
            assert sol.value >= brute.value * (1 - 1e-9), name


@settings(max_examples=60, deadline=None, database=None)
@given(problems(), st.sampled_from(["latency", "throughput", "serial"]))
def test_trivial_bound_never_exceeds_the_optimum(problem, objective):
    if objective == "serial":
        problem, objective = replace(problem, serial=True), "latency"
    brute = _solve_or_none(problem, objective, "brute")
    assume(brute is not None)
    assert trivial_bound(problem, objective) <= brute.value * (1 + 1e-9)


@settings(max_examples=15, deadline=None, database=None)
@given(problems(), st.sampled_from(["unsupported", "pins", "memory"]))
def test_infeasible_inputs_name_their_cause(problem, cause):
    n, d = problem.cost.shape
    kw = dict(cost=problem.cost.copy(), edges=problem.edges, out_bytes=problem.out_bytes)
    if cause == "unsupported":
        kw["cost"][n - 1] = np.inf
        message = f"'n{n - 1}' is supported on no device"
    elif cause == "pins":
        kw.update(groups=[0, 0] + [-1] * (n - 2), pins=[0, 1] + [-1] * (n - 2))
        kw["cost"][:2] = 1.0
        message = "group 0 has contradictory pins"
    else:
        assume(n > d)
        kw.update(node_mem=np.ones(n), mem_cap=np.full(d, (n - 0.5) / d))
        message = "bytes in total"
    bad = Problem.build(**kw)
    for solver in ("heft", "brute", "cpsat"):
        with pytest.raises(InfeasibleError, match=message):
            solve(bad, "latency", solver)


def _exact_throughput(problem, contiguous):
    """Brute force over every assignment and staging; the period its search computes for a
    staging is the simulator's."""
    import networkx as nx

    try:
        sol = brute_force(problem, "throughput", contiguous=contiguous)
    except InfeasibleError:
        return np.inf
    g = nx.DiGraph(problem.edges.tolist())
    g.add_nodes_from(range(problem.num_nodes))
    period, stages = best_staging(problem, sol.assignment,
                                  np.array(list(nx.all_topological_sorts(g))), contiguous)
    assert period == pytest.approx(simulate_throughput(problem, sol.assignment, stages))
    assert period == pytest.approx(sol.value)
    return sol.value


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(0, 2**32 - 1), st.sampled_from([None, 1, 2, 3]), st.booleans())
def test_throughput_with_stage_overhead_matches_brute_force_over_stagings(
        base, seed, max_stages, contiguous):
    rng = np.random.default_rng(seed)
    d = base.num_devices
    overhead = rng.choice([0.0, 0.5, 2.0, 6.0], d)
    call = rng.choice([0.0, 0.0, 1.0, 3.0], d)
    problem = Problem.build(base.cost, base.edges, base.out_bytes, alpha=base.alpha,
                            beta=base.beta, node_mem=base.node_mem, mem_cap=base.mem_cap,
                            pins=base.pins, groups=base.groups, stage_overhead_s=overhead,
                            call_s=call, max_stages=max_stages)
    optimum = _exact_throughput(problem, contiguous)
    if not np.isfinite(optimum):
        with pytest.raises(InfeasibleError):
            solve(problem, "throughput", "cpsat", contiguous=contiguous)
        return
    cp = solve(problem, "throughput", "cpsat", time_limit=20.0, contiguous=contiguous)
    assert cp.status == "OPTIMAL"
    assert cp.value == pytest.approx(optimum, rel=1e-4)
    assert cp.bound <= optimum * (1 + 1e-9)
    # The claim is the simulator's score of the plan's own stages, which obey max_stages.
    assert simulate_throughput(problem, cp.assignment, cp.stages) == cp.value
    assert len(set(cp.stages.tolist())) <= (max_stages or problem.num_nodes)
    for name in HEURISTICS:
        sol = _solve_or_none(problem, "throughput", name)
        if sol is not None:
            if not contiguous:  # heuristic plans are free: they may beat a contiguous optimum
                assert sol.value >= optimum * (1 - 1e-9), name
            assert simulate_throughput(problem, sol.assignment, sol.stages) == sol.value
