"""Solving over the fastest k hosts: worked examples, and never worse than over every host."""

import numpy as np
import pytest

from autoplace.cluster.solve import host_order, restricted, solve_over_hosts
from autoplace.solve import InfeasibleError, Problem, simulate_throughput, solve


def test_fastest_hosts_first():
    # Host 0's device takes 3 s in all, host 1's two devices 1 + 1 s at their best, host 2 4 s.
    cost = np.array([[2.0, 1.0, 9.0, 2.0], [1.0, 9.0, 1.0, 2.0]])
    assert host_order(Problem.build(cost), [0, 1, 1, 2]) == [1, 0, 2]


def test_restricted_keeps_the_devices_and_their_pins():
    p = Problem.build(np.ones((2, 3)), [(0, 1)], [4.0], alpha=np.arange(9.0).reshape(3, 3),
                      pins=[2, -1])
    r = restricted(p, [0, 2])
    assert r.cost.shape == (2, 2) and r.alpha[0, 1] == 2.0 and r.alpha[1, 0] == 6.0
    assert list(r.pins) == [1, -1]
    with pytest.raises(InfeasibleError):
        restricted(p, [0, 1])


def test_a_slow_network_keeps_the_plan_on_one_host():
    # Two ops of 1 s; a copy between hosts takes 5 s: one host (2 s) beats any pipeline (5 s).
    p = Problem.build([[1.0] * 4] * 2, [(0, 1)], [5.0], alpha=0.0, beta=1.0)
    sol, tried = solve_over_hosts(p, [0, 1, 2, 3], solver="brute")
    assert sol.value == 2.0 and len(set(sol.assignment)) == 1
    assert tried == {1: 2.0, 2: 2.0, 4: 2.0}


@pytest.mark.parametrize("seed", range(4))
def test_never_worse_than_every_host(seed):
    rng = np.random.default_rng(seed)
    n, hosts = 30, 12
    host_of = np.repeat(np.arange(hosts), 2)
    cost = rng.uniform(1, 3, (n, 1)) * rng.uniform(0.5, 2, (1, 2 * hosts))
    src = np.arange(1, n)
    edges = np.stack([np.maximum(0, src - rng.integers(1, 3, n - 1)), src], 1)
    same = host_of[:, None] == host_of[None, :]
    p = Problem.build(cost, np.unique(edges, axis=0), rng.uniform(0.1, 2, n), alpha=0.0,
                      beta=np.where(same, 10.0, 0.5))
    every = solve(p, "throughput", "greedy")
    sol, tried = solve_over_hosts(p, host_of, solver="greedy")
    assert sol.value == pytest.approx(simulate_throughput(p, sol.assignment, sol.stages))
    assert sol.value <= every.value + 1e-12 and tried[hosts] == pytest.approx(every.value)
