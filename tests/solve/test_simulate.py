"""Hand-worked schedules for the one simulator every solver is scored by."""

import numpy as np
import pytest

from autoplace.solve import InfeasibleError, Problem, simulate_latency, simulate_throughput
from autoplace.solve.simulate import check_feasible, link_loads, precheck, stage_counts


def _chain():
    # 0 -> 1; node 0 costs 1 s on d0 / 3 s on d1, node 1 costs 4 s / 2 s.
    # The 10-byte tensor crosses a link of alpha 1 s, beta 10 B/s: 1 + 10/10 = 2 s.
    return Problem.build([[1.0, 3.0], [4.0, 2.0]], [(0, 1)], [10.0, 0.0], alpha=1.0, beta=10.0)


def test_chain_split_pays_the_copy():
    # node 0 on d0 [0, 1], copy [1, 3], node 1 on d1 [3, 5]: makespan 5.
    s = simulate_latency(_chain(), [0, 1])
    assert s.makespan == pytest.approx(5.0)
    assert s.start.tolist() == [0.0, 3.0]
    assert s.transfers == ((0, 0, 1, 1.0, 3.0),)
    assert s.busy.tolist() == [1.0, 2.0]


def test_chain_same_device_has_no_copy():
    # [1, 0]: node 0 on d1 [0, 3], copy 3..5, node 1 on d0 [5, 9].
    assert simulate_latency(_chain(), [1, 0]).makespan == pytest.approx(9.0)
    assert simulate_latency(_chain(), [1, 1]).transfers == ()


def test_one_copy_per_destination_device_not_per_consumer():
    # 0 feeds 1 and 2, both on d1; every node 1 s, copy 2 s.
    # node 0 [0, 1], ONE copy [1, 3], node 1 [3, 4], node 2 [4, 5] -> 5 (two copies would give 7).
    p = Problem.build(np.ones((3, 2)), [(0, 1), (0, 2)], [1.0, 0, 0], alpha=1.0, beta=1.0)
    s = simulate_latency(p, [0, 1, 1])
    assert len(s.transfers) == 1
    assert s.makespan == pytest.approx(5.0)


def test_link_carries_one_copy_at_a_time():
    # 0 and 1 on d0 feed 2 on d1; nodes 1 s, copies 2 s.
    # 0 [0, 1], 1 [1, 2]; copy of 0 [1, 3], copy of 1 waits for the link [3, 5]; node 2 [5, 6].
    p = Problem.build(np.ones((3, 2)), [(0, 2), (1, 2)], [1.0, 1.0, 0], alpha=1.0, beta=1.0)
    s = simulate_latency(p, [0, 0, 1])
    assert [(t.start, t.finish) for t in s.transfers] == [(1.0, 3.0), (3.0, 5.0)]
    assert s.makespan == pytest.approx(6.0)


def test_order_and_transfer_order_change_the_schedule():
    # Independent nodes 0, 1 on one device, 2 s and 1 s; 1 feeds 2 on d1 (copy 1 s, node 2 1 s).
    # Topological order: 0 [0, 2], 1 [2, 3], copy [3, 4], 2 [4, 5] -> 5.
    # Order (1, 0, 2): 1 [0, 1], copy [1, 2], 2 [2, 3], 0 [1, 3] -> 3.
    p = Problem.build([[2.0, 2.0], [1.0, 1.0], [1.0, 1.0]], [(1, 2)], alpha=1.0)
    assert simulate_latency(p, [0, 0, 1]).makespan == pytest.approx(5.0)
    assert simulate_latency(p, [0, 0, 1], order=[1, 0, 2]).makespan == pytest.approx(3.0)
    with pytest.raises(ValueError, match="contradict"):
        simulate_latency(p, [0, 0, 0], order=[2, 1, 0])
    with pytest.raises(ValueError, match="exactly the needed copies"):
        simulate_latency(p, [0, 0, 1], transfer_order=[])


def test_throughput_is_busiest_device_or_link():
    # Nodes 0, 1 on d0 (1 s + 1 s), node 2 on d1 (1 s); 0 -> 2 and 1 -> 2 cross: copies of
    # 1 + 4/2 = 3 s each on link d0->d1: 6 s, the bottleneck.
    p = Problem.build(np.ones((3, 2)), [(0, 2), (1, 2)], [4.0, 4.0, 0], alpha=1.0, beta=2.0)
    assert simulate_throughput(p, [0, 0, 1]) == pytest.approx(6.0)
    assert link_loads(p, [0, 0, 1])[0, 1] == pytest.approx(6.0)
    assert simulate_throughput(p, [0, 0, 0]) == pytest.approx(3.0)


def test_unsupported_node_is_infeasible_in_the_simulator():
    p = Problem.build([[1.0, np.inf]], node_names=["conv"], device_names=["cpu", "npu"])
    with pytest.raises(InfeasibleError, match="'conv' is not supported on device 'npu'"):
        simulate_latency(p, [1])


def _named(**kw):
    return Problem.build([[1.0, 1.0], [1.0, np.inf], [1.0, 1.0]], [(0, 1), (1, 2)],
                         node_names=["a", "b", "c"], device_names=["cpu", "gpu"], **kw)


@pytest.mark.parametrize("kw, assignment, message", [
    ({}, [0, 1, 0], "'b' is not supported on device 'gpu'"),
    ({"pins": [-1, -1, 1]}, [0, 0, 0], "'c' is pinned to 'gpu' but placed on 'cpu'"),
    ({"groups": [3, -1, 3]}, [0, 0, 1], "colocation group 3 is split"),
    ({"node_mem": [5, 5, 5], "mem_cap": [12, 100]}, [0, 0, 0],
     "'cpu' holds 15 bytes, over its capacity of 12 bytes"),
])
def test_check_feasible_names_the_cause(kw, assignment, message):
    with pytest.raises(InfeasibleError, match=message):
        check_feasible(_named(**kw), assignment)


@pytest.mark.parametrize("kw, message", [
    ({"pins": [-1, 1, -1]}, "'b' is pinned to 'gpu', which cannot run it"),
    ({"groups": [0, -1, 0], "pins": [0, -1, 1]}, "group 0 has contradictory pins"),
    ({"groups": [-1, 2, 2], "pins": [-1, -1, 1]}, "group 2 of node 'b' has no device"),
    ({"node_mem": [1, 30, 1], "mem_cap": [20, 100]}, "'b' needs 30 bytes"),
    ({"node_mem": [10, 10, 10], "mem_cap": [15, 14]}, "30 bytes in total"),
])
def test_precheck_names_the_cause(kw, message):
    with pytest.raises(InfeasibleError, match=message):
        precheck(_named(**kw))


def test_precheck_unsupported_everywhere():
    p = Problem.build([[1.0], [np.inf]], node_names=["x", "y"])
    with pytest.raises(InfeasibleError, match="'y' is supported on no device"):
        precheck(p)


def test_each_stage_adds_its_overhead_to_its_device():
    # Chain 0 -> 1 -> 2, every node 1 s, 2.5 s per stage, free copies.
    # (a, b, a): the devices' node sets form a cycle, so a holds two stages: 2 + 2 * 2.5 = 7
    # (b: 1 + 2.5), and the host hands off three: 7.5, the period.
    # (a, a, b): one stage each: a 2 + 2.5 = 4.5, b 1 + 2.5 = 3.5, host 5.
    p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)], stage_overhead_s=2.5)
    assert stage_counts(p, [0, 1, 0]).tolist() == [2, 1]
    assert simulate_throughput(p, [0, 1, 0]) == pytest.approx(7.5)
    assert simulate_throughput(p, [0, 0, 1]) == pytest.approx(5.0)
    # Given stages count as given: (a, a, b) cut into three stages costs a 2 + 5 = 7, host 7.5.
    assert simulate_throughput(p, [0, 0, 1], stages=[0, 1, 2]) == pytest.approx(7.5)
    # A per-device overhead: only b's stage costs (0.5 s): max(2, 1 + 0.5, 0.5) = 2.
    q = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)], stage_overhead_s=[0.0, 0.5])
    assert simulate_throughput(q, [0, 0, 1]) == pytest.approx(2.0)
    # Without an overhead the stages do not matter.
    assert simulate_throughput(_chain(), [0, 1], stages=[0, 1]) == simulate_throughput(
        _chain(), [0, 1])


def test_every_stage_pays_its_call_on_its_device_but_not_on_the_host():
    # Chain 0 -> 1 -> 2, every node 1 s, free copies; a's call 0.5 s, b's 4 s; no hand-off.
    p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)], call_s=[0.5, 4.0])
    assert p.staged
    # One stage pays its call: a 3 + 0.5; b 3 + 4.
    assert simulate_throughput(p, [0, 0, 0]) == pytest.approx(3.5)
    assert simulate_throughput(p, [1, 1, 1]) == pytest.approx(7.0)
    # (a, a, b): a 2 + 0.5, b 1 + 4 = 5; the host hands nothing off.
    assert simulate_throughput(p, [0, 0, 1]) == pytest.approx(5.0)
    # (a, b, a): a holds two stages and pays two calls: 2 + 1 = 3; b 1 + 4.
    assert simulate_throughput(p, [0, 1, 0]) == pytest.approx(5.0)
    assert simulate_throughput(p, [0, 0, 0], stages=[0, 1, 2]) == pytest.approx(4.5)
    # With a hand-off of 2 s per stage too, the host carries the hand-offs alone: (a, a, b)
    # is a 2 + 0.5 + 2, b 1 + 4 + 2 = 7, the host 4.
    q = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)], stage_overhead_s=2.0,
                      call_s=[0.5, 4.0])
    assert simulate_throughput(q, [0, 0, 1]) == pytest.approx(7.0)
    assert simulate_throughput(q, [0, 0, 0]) == pytest.approx(3.5)  # no hand-off, one call
    with pytest.raises(ValueError, match="call_s must be finite"):
        Problem.build(np.ones((1, 2)), call_s=[0.0, np.inf])


def test_stages_must_be_a_pipeline_of_the_assignment():
    p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)], stage_overhead_s=1.0)
    with pytest.raises(ValueError, match="spans several devices"):
        simulate_throughput(p, [0, 0, 1], stages=[0, 0, 0])
    with pytest.raises(ValueError, match="later stage to an earlier"):
        simulate_throughput(p, [0, 0, 1], stages=[1, 0, 2])
    with pytest.raises(ValueError, match="shape"):
        simulate_throughput(p, [0, 0, 1], stages=[0, 1])


def test_max_stages_is_checked_with_the_stages():
    p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)], max_stages=2)
    check_feasible(p, [0, 1, 0])  # a latency plan has no stages
    with pytest.raises(InfeasibleError, match="3 stages, more than max_stages=2"):
        check_feasible(p, [0, 1, 0], stages=[0, 1, 2])
    with pytest.raises(ValueError, match="max_stages must be at least 1"):
        Problem.build(np.ones((1, 1)), max_stages=0)
    with pytest.raises(ValueError, match="stage_overhead_s must be finite"):
        Problem.build(np.ones((1, 2)), stage_overhead_s=[0.0, -1.0])
