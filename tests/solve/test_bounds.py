"""The cheap lower bounds of ``_common.trivial_bound``, each shown on a hand-worked example."""

import numpy as np

from autoplace.solve import Problem, solve
from autoplace.solve._common import trivial_bound


def test_critical_path_at_cheapest_devices():
    # Chain 0 -> 1 -> 2 on 2 devices: cheapest costs 1 + 1 + 3 = 5 > total work 5 / 2.
    p = Problem.build([[1.0, 5.0], [2.0, 1.0], [3.0, 3.0]], [(0, 1), (1, 2)], alpha=10.0)
    assert trivial_bound(p, "latency") == 5.0
    assert trivial_bound(p, "throughput") == 3.0  # no path for a pipeline: the costliest node
    assert solve(p, "latency", "brute").value >= 5.0


def test_total_work_over_devices():
    # Four independent 2 s nodes on 2 devices: 8 s of work / 2 devices = 4 > path 2.
    p = Problem.build(np.full((4, 2), 2.0))
    assert trivial_bound(p, "latency") == 4.0
    assert solve(p, "latency", "brute").value == 4.0


def test_pins_raise_the_cheapest_cost_and_force_work_onto_one_device():
    # Three independent nodes all pinned to device 1, where each takes 2 s (1 s on device 0):
    # the pinned device must run 6 s; ignoring pins would give 3 / 2.
    p = Problem.build(np.tile([1.0, 2.0], (3, 1)), pins=[1, 1, 1])
    assert trivial_bound(p, "latency") == 6.0
    assert trivial_bound(p, "throughput") == 6.0


def test_colocation_group_runs_on_one_device():
    # Nodes 0 and 1 must share a device: 1 + 4 or 4 + 1 = 5, not 1 + 1 over two devices.
    p = Problem.build([[1.0, 4.0], [4.0, 1.0]], groups=[0, 0])
    assert trivial_bound(p, "latency") == 5.0
    assert solve(p, "latency", "brute").value == 5.0


def test_heuristics_report_the_bound():
    p = Problem.build(np.full((4, 2), 2.0))
    for solver in ("greedy", "heft", "auto"):
        sol = solve(p, "latency", solver)
        assert sol.bound == 4.0 and sol.value == 4.0 and sol.gap == 0.0


def test_weighted_load_relaxation_beats_total_work_over_devices():
    # Three independent nodes, 2 s on device 0 or 4 s on device 1. Total cheapest work over
    # devices: 6 / 2 = 3. Any plan loads some device 4 s (three on d0: 6; two: 4 | 4; one: 2 | 8),
    # and weights (2/3, 1/3) prove it: each node costs min(4/3, 4/3), 3 * 4/3 = 4.
    p = Problem.build(np.tile([2.0, 4.0], (3, 1)))
    assert 3.99 < trivial_bound(p, "latency") <= 4.0
    assert 3.99 < trivial_bound(p, "throughput") <= 4.0
    assert solve(p, "latency", "brute").value == 4.0
