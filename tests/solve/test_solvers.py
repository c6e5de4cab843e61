"""Baselines and the registry, on examples small enough to work out by hand."""

import numpy as np
import pytest

from autoplace.solve import SOLVERS, InfeasibleError, Problem, simulate_latency, solve


def _fork():
    # 0 -> 1, 0 -> 2. Costs: node 0 (1, 5), node 1 (2, 2), node 2 (2, 2). Copies 0.5 s.
    # One device: 1 + 2 + 2 = 5. Best: 0 and 1 on d0, 2 on d1:
    # 0 [0, 1], 1 [1, 3], copy [1, 1.5], 2 [1.5, 3.5] -> 3.5.
    return Problem.build([[1.0, 5.0], [2.0, 2.0], [2.0, 2.0]], [(0, 1), (0, 2)], alpha=0.5)


@pytest.mark.parametrize("solver, value", [
    ("single", 5.0), ("single:0", 5.0), ("single:1", 9.0), ("priority", 5.0),
    ("greedy", 3.5), ("heft", 3.5), ("brute", 3.5), ("cpsat", 3.5),
])
def test_fork_latency(solver, value):
    sol = solve(_fork(), "latency", solver)
    assert sol.value == pytest.approx(value, rel=1e-5)
    replay = simulate_latency(_fork(), sol.assignment, sol.order, sol.transfer_order)
    assert replay.makespan == pytest.approx(sol.value, rel=1e-12)
    assert sol.bound <= sol.value + 1e-9


def test_fork_throughput_optimum():
    # Throughput: {0, 1} on d0 = 3 s, {2} on d1 = 2 s, link 0.5 s -> 3 s; {0} d0 and {1, 2} d1
    # gives max(1, 4) = 4; so 3 is optimal (every 2-way split of 5 s of work has a side >= 3).
    for solver in ("brute", "cpsat"):
        sol = solve(_fork(), "throughput", solver)
        assert sol.value == pytest.approx(3.0, rel=1e-5)
        assert sol.status == "OPTIMAL"
        assert sol.bound == pytest.approx(3.0, rel=1e-5)


def test_priority_takes_the_first_device_that_runs_the_op():
    # d0 cannot run node 1: ONNX Runtime style puts 0 and 2 on d0 and 1 on d1.
    p = Problem.build([[1.0, 9.0], [np.inf, 1.0], [1.0, 9.0]], [(0, 1), (1, 2)])
    assert solve(p, "latency", "priority").assignment.tolist() == [0, 1, 0]


def test_two_chains_optimum_and_heft():
    # Chains 0 -> 1 and 2 -> 3; every node 1 s on d0, 2 s on d1; copies 0.1 s.
    # All on d0: 4. Optimum 3.1: 0 [0, 1], 1 [1, 2] on d0; 2 on d1 [0, 2], copy [2, 2.1],
    # 3 on d0 [2.1, 3.1]. Anything on d1 costs 2 s and a head there delays its tail past 2.1,
    # a tail there starts after 1.1; two nodes on d1 take 4 s.
    p = Problem.build([[1.0, 2.0]] * 4, [(0, 1), (2, 3)], alpha=0.1)
    assert solve(p, "latency", "brute").value == pytest.approx(3.1)
    assert solve(p, "latency", "cpsat").value == pytest.approx(3.1)
    assert 3.1 - 1e-9 <= solve(p, "latency", "heft").value <= 4.0


def test_baselines_respect_memory_and_say_why_they_fail():
    # Each node needs 6 bytes, devices hold 10: one node per device; greedy must spread.
    p = Problem.build(np.ones((2, 2)), [(0, 1)], node_mem=6, mem_cap=10)
    assert sorted(solve(p, "latency", "greedy").assignment.tolist()) == [0, 1]
    with pytest.raises(InfeasibleError, match="no single device can run the whole model"):
        solve(p, "latency", "single")


def test_groups_and_pins_are_respected():
    p = Problem.build(np.ones((4, 3)), [(0, 1), (1, 2), (2, 3)], groups=[5, -1, -1, 5],
                      pins=[-1, -1, -1, 2])
    for solver in ("priority", "greedy", "heft", "cpsat", "brute"):
        a = solve(p, "latency", solver).assignment
        assert a[0] == a[3] == 2, solver


def test_infeasible_raises_before_solving():
    p = Problem.build([[1.0, np.inf]], pins=[1], node_names=["conv"], device_names=["a", "b"])
    for solver in SOLVERS:
        with pytest.raises(InfeasibleError, match="'conv' is pinned to 'b'"):
            solve(p, "throughput", solver)


def test_unknown_names_are_errors():
    with pytest.raises(ValueError, match="unknown solver 'magic'.*'heft'"):
        solve(_fork(), "latency", "magic")
    with pytest.raises(ValueError, match="unknown objective"):
        solve(_fork(), "energy", "heft")


def test_contiguous_throughput_is_not_bounded_by_a_non_contiguous_warm_start():
    # Chain 0 -> 1 -> 2 costing 1, 2, 1 on either device: alternating (a, b, a) gives a period of
    # 2, any chain of stages at least 3. The contiguous model must find its period-3 plan, not
    # call itself infeasible because the (alternating) warm start's period is out of its reach.
    from autoplace.solve._common import stages_of
    from autoplace.solve.cpsat import solve_cpsat

    cost = np.array([[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]])
    p = Problem.build(cost, [(0, 1), (1, 2)], [8, 8, 8], alpha=np.zeros((2, 2)),
                      beta=np.full((2, 2), 1e15))
    free = solve_cpsat(p, "throughput", time_limit=5)
    chain = solve_cpsat(p, "throughput", time_limit=5, contiguous=True)
    assert free.value == pytest.approx(2.0) and chain.value == pytest.approx(3.0)
    assert len(set(stages_of(p, chain.assignment))) == len(set(chain.assignment))
    warm = solve_cpsat(p, "throughput", time_limit=5, contiguous=True, warm_start=free)
    assert warm.value == pytest.approx(3.0)


def test_a_stage_overhead_makes_cpsat_cut_fewer_stages():
    # Chain 0 -> 1 -> 2 costing 2, 3, 2 anywhere, free copies. Without an overhead (a, b, a) is
    # best: a 2 + 2 = 4, b 3. With 1.5 s per stage it costs a 4 + 2 * 1.5 = 7; one device,
    # called directly, 7; a cut into two stages max(5 + 1.5, 2 + 1.5, host 2 * 1.5) = 6.5,
    # optimal.
    from autoplace.solve.simulate import simulate_throughput

    cost = np.array([[2.0, 2.0], [3.0, 3.0], [2.0, 2.0]])
    assert solve(Problem.build(cost, [(0, 1), (1, 2)]), "throughput", "cpsat").value == 4.0
    p = Problem.build(cost, [(0, 1), (1, 2)], stage_overhead_s=1.5)
    for contiguous in (False, True):
        sol = solve(p, "throughput", "cpsat", contiguous=contiguous)
        assert sol.value == pytest.approx(6.5) and sol.status == "OPTIMAL"
        assert len(set(sol.stages.tolist())) == 2
        assert simulate_throughput(p, sol.assignment, sol.stages) == sol.value


@pytest.mark.parametrize("solver", ["cpsat", "heft", "greedy", "priority", "coarse", "brute"])
def test_a_pipeline_that_would_lose_to_one_device_is_not_returned(solver):
    # The same chain at 2.5 s per stage: every cut costs more than calling the model on one
    # device (7 s, no pipeline, no overhead), so each solver returns that, one stage.
    cost = np.array([[2.0, 2.0], [3.0, 3.0], [2.0, 2.0]])
    p = Problem.build(cost, [(0, 1), (1, 2)], stage_overhead_s=2.5)
    sol = solve(p, "throughput", solver)
    assert sol.value == pytest.approx(7.0)
    assert len(set(sol.assignment.tolist())) == 1
    assert sol.stages is None or len(set(sol.stages.tolist())) == 1
    assert sol.bound <= sol.value


def test_cpsat_breaks_period_ties_with_the_fewest_stages():
    # Chain a -> b -> c -> d -> e on three devices, free copies, 0.1 s per stage. a (5 s) on
    # device 0 sets the period 5.1 s; b..e (1 s each) fit in the slack of devices 1 and 2 in
    # many stagings (alternating them makes five stages), but one stage on one device suffices.
    cost = np.array([[5.0, 9.0, 9.0]] + [[9.0, 1.0, 1.0]] * 4)
    p = Problem.build(cost, [(0, 1), (1, 2), (2, 3), (3, 4)], stage_overhead_s=0.1)
    alternating = solve(p, "throughput", "cpsat", time_limit=0.01)  # hint: 5 stages
    for warm in (None, alternating):
        sol = solve(p, "throughput", "cpsat", warm_start=warm)
        assert sol.value == pytest.approx(5.1) and sol.status == "OPTIMAL"
        assert len(set(sol.stages.tolist())) == 2
        assert sol.bound == pytest.approx(5.1, rel=1e-4)


def test_max_stages_limits_the_pipeline():
    # Same chain, no overhead: at most one stage means one device, 4 s; two stages give 3.
    cost = np.array([[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]])
    for limit, value in ((1, 4.0), (2, 3.0), (3, 2.0)):
        p = Problem.build(cost, [(0, 1), (1, 2)], max_stages=limit)
        sol = solve(p, "throughput", "cpsat")
        assert sol.value == pytest.approx(value) and sol.status == "OPTIMAL", limit
        assert len(set(sol.stages.tolist())) <= limit


def test_too_many_levels_are_cut_and_nothing_is_claimed(monkeypatch):
    # Chain 1, 2, 1 at 0.1 s per stage: (a, b, a) needs 3 levels, 2.2 s (a: 2 + 0.2). With
    # room for one level per node CP-SAT sees only one-stage plans: 4 s (called directly, no
    # overhead), not proven optimal.
    from autoplace.solve import cpsat

    cost = np.array([[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]])
    p = Problem.build(cost, [(0, 1), (1, 2)], stage_overhead_s=0.1)
    assert solve(p, "throughput", "cpsat").value == pytest.approx(2.2)
    monkeypatch.setattr(cpsat, "MAX_LEVEL_VARS", 3)
    sol = cpsat.solve_cpsat(p, "throughput", warm_start=solve(p, "throughput", "single"))
    assert sol.value == pytest.approx(4.0) and sol.status == "FEASIBLE"
    assert sol.bound < sol.value
