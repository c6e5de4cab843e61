"""Data-parallel replicas: every device runs the whole model on the inputs it takes."""

import numpy as np
import pytest

from autoplace.solve import InfeasibleError, Problem, simulate_replicas, simulate_throughput, solve


def test_replicas_beat_every_pipeline_of_a_chain_on_equal_devices():
    # Three nodes of 1 s, free copies, two equal devices: the best pipeline cuts 2 + 1 (2 s per
    # input); two replicas of the whole model deliver 1/3 + 1/3 inputs per second (1.5 s).
    p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)])
    pipe = solve(p, "throughput", "cpsat", contiguous=True)
    assert pipe.value == pytest.approx(2.0) and pipe.replicas is None
    sol = solve(p, "throughput", "cpsat", contiguous=True, replicate=True)
    assert sol.value == pytest.approx(1.5) and sol.solver == "cpsat+replicas"
    assert sorted(sol.replicas.tolist()) == [0, 1]
    assert simulate_replicas(p, sol.replicas) == sol.value
    # The assignment is the whole model on the first replica, one stage.
    assert set(sol.assignment.tolist()) == {sol.replicas[0]} and set(sol.stages.tolist()) == {0}
    assert sol.bound <= sol.value


def test_a_pipeline_that_beats_the_replicas_is_kept():
    # Node 0 costs 1 s on a and 9 s on b, node 1 the other way round; b's whole model is 10 s
    # like a's. A pipeline a -> b: 1 s per input; replicas: 1 / (1/10 + 1/10) = 5 s.
    p = Problem.build([[1.0, 9.0], [9.0, 1.0]], [(0, 1)])
    sol = solve(p, "throughput", "cpsat", replicate=True)
    assert sol.replicas is None and sol.value == pytest.approx(1.0)
    assert simulate_throughput(p, sol.assignment, sol.stages) == sol.value


def test_replicas_leave_out_a_device_whose_hand_offs_cost_the_host_more_than_it_adds():
    # Whole model 1 s everywhere; hand-offs 0.1 s on a and b, 20 s on c. a and b: 1.1 / 2 =
    # 0.55 s per input. Adding c raises the rate to 2/1.1 + 1/21 but the host then spends
    # (2 * 0.1 / 1.1 + 20 / 21) / that rate = 0.61 s per input on hand-offs.
    p = Problem.build(np.full((1, 3), 1.0), stage_overhead_s=[0.1, 0.1, 20.0])
    sol = solve(p, "throughput", "replicas")
    assert sorted(sol.replicas.tolist()) == [0, 1] and sol.value == pytest.approx(0.55)
    assert simulate_replicas(p, [0, 1, 2]) == pytest.approx(0.6079, abs=1e-4)


def test_each_replica_pays_its_call():
    # Whole model 1 s on a, 2 s on b; b's call 2 s (a GPU's upload and download, say), a's 0.
    # Without the call, replicas: 1 / (1 + 1/2) = 0.667 s per input. With it, b adds 1/4 input
    # per second: 1 / 1.25 = 0.8 s.
    p = Problem.build([[1.0, 2.0]], call_s=[0.0, 2.0])
    assert simulate_replicas(p, [0, 1]) == pytest.approx(0.8)
    assert solve(p, "throughput", "replicas").value == pytest.approx(0.8)
    # A hand-off of 0.5 s on each: a 1.5, b 4.5; the host 0.5 per input: 1 / (1/1.5 + 1/4.5).
    q = Problem.build([[1.0, 2.0]], stage_overhead_s=0.5, call_s=[0.0, 2.0])
    assert simulate_replicas(q, [0, 1]) == pytest.approx(1.125)


def test_replicas_need_two_devices_that_hold_and_run_the_whole_model():
    # Each node needs 6 bytes, devices hold 10: the model fits on no device whole.
    p = Problem.build(np.ones((2, 2)), [(0, 1)], node_mem=6, mem_cap=10)
    with pytest.raises(InfeasibleError, match="replicas need two devices"):
        solve(p, "throughput", "replicas")
    sol = solve(p, "throughput", "cpsat", replicate=True)
    assert sol.replicas is None and sorted(sol.assignment.tolist()) == [0, 1]
    # Device b cannot run node 1: one device is no replica set.
    p = Problem.build([[1.0, 1.0], [1.0, np.inf]], [(0, 1)])
    with pytest.raises(InfeasibleError, match="replicas need two devices"):
        solve(p, "throughput", "replicas")
    with pytest.raises(ValueError, match="objective='throughput'"):
        solve(p, "latency", "replicas")
    with pytest.raises(ValueError, match="two or more distinct devices"):
        simulate_replicas(p, [0])


def test_the_host_pays_each_replicas_hand_off_and_call():
    # Whole model 0.1 s on either device, hand-off 0.1 s, call 0.2 s: each replica takes
    # 0.4 s an input, two take 0.2 s; but the host copies every input in and out and hands it
    # on, 0.3 s, one input at a time.
    p = Problem.build([[0.1, 0.1]], stage_overhead_s=0.1, call_s=0.2)
    assert simulate_replicas(p, [0, 1]) == pytest.approx(0.3)
    assert simulate_replicas(Problem.build([[0.1, 0.1]], stage_overhead_s=0.1, call_s=0.0),
                             [0, 1]) == pytest.approx(0.1)
