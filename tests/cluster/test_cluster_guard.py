"""The guard over hosts: a pipeline over the hosts of a cluster is kept only if it beats the best
one-host plan (one device, or a pipeline over the devices of one host) and replicas of the whole
model on the hosts. Worked examples on arrays, then what optimize says about them."""

import numpy as np
import pytest

import autoplace
from autoplace.devices import Device
from autoplace.report.baselines import guard, host_baselines, predict_baselines
from autoplace.solve import Problem, simulate_throughput
from autoplace.solve.problem import Solution
from cluster_models import chain  # noqa: E402

NAMES = ["a0", "a1", "b0"]


def _pipeline(problem, assignment):
    """The solver's plan: ``assignment``, a stage per run of one device."""
    a = np.asarray(assignment)
    stages = np.concatenate([[0], np.cumsum(a[1:] != a[:-1])])
    return Solution(a, "throughput", simulate_throughput(problem, a, stages), 0.0, "FEASIBLE",
                    "test", stages=stages)


def _decide(problem, hosts, sol):
    unknown = np.full(problem.cost.shape, np.nan)  # no spread: margins of 0
    found = predict_baselines(problem, "throughput", unknown)
    found += host_baselines(problem, "throughput", hosts, unknown)
    return found, guard(problem, sol, unknown, found, "the solver's plan")


def test_a_pipeline_over_one_host_beats_one_over_two():
    # Four ops of 1 s, a chain; each device holds two. Host a has two devices, b one. A copy
    # within a is free, between hosts 3 s. Over both hosts, a0: ops 0-1, b0: ops 2-3: 2 s a
    # device, 3 s the link. Host a's pipeline (a0: 0-1, a1: 2-3): 2 s. No device, and so no
    # replica, holds the model.
    alpha = np.array([[0, 0, 3], [0, 0, 3], [3, 3, 0]], dtype=float)
    p = Problem.build(np.ones((4, 3)), [(0, 1), (1, 2), (2, 3)], [1.0] * 4, alpha=alpha,
                      beta=np.inf, node_mem=[1.0] * 4, mem_cap=[2.0] * 3, device_names=NAMES)
    sol = _pipeline(p, [0, 0, 2, 2])
    assert sol.value == 3.0
    found, (chosen, decision) = _decide(p, ["a", "a", "b"], sol)
    assert [b.name for b in found if b.value is not None] == ["priority", "greedy", "host a"]
    assert chosen.name == "host a" and chosen.value == 2.0
    assert np.bincount(chosen.solution.assignment, minlength=3).tolist() == [2, 2, 0]
    assert not decision.kept and "returned the baseline host a (2 s" in str(decision)


def test_replicas_on_each_host_beat_a_pipeline_over_them():
    # Two ops of 1 s; hosts a and b, a device each. An actor's call costs its device 0.5 s per
    # input, a stage's hand-off 0.1 s (the driver's). The pipeline: 1 + 0.5 + 0.1 = 1.6 s a
    # device. Replicas: each 2 + 0.6 s, together 1 / (2 / 2.6) = 1.3 s (the driver: 0.6 s).
    # One host: 2 + 0.5 s, one stage (no hand-off).
    p = Problem.build(np.ones((2, 2)), [(0, 1)], [1.0, 1.0], alpha=0.0, beta=np.inf,
                      stage_overhead_s=0.1, call_s=0.5, device_names=["a0", "b0"])
    sol = _pipeline(p, [0, 1])
    assert sol.value == pytest.approx(1.6)
    found, (chosen, decision) = _decide(p, ["a", "b"], sol)
    assert {b.name: b.value for b in found} == pytest.approx(
        {"only a0": 2.5, "only b0": 2.5, "replicas": 1.3, "priority": 2.5, "greedy": 1.6})
    assert chosen.name == "replicas" and list(chosen.solution.replicas) == [0, 1]
    assert "returned the baseline replicas (1.3 s" in str(decision)


def test_the_pipeline_over_hosts_is_kept_when_it_beats_both():
    # As above without the calls, but b0 holds only one op: no replicas. The pipeline: 1 s per
    # input; a0 alone: 2 s.
    p = Problem.build(np.ones((2, 2)), [(0, 1)], [1.0, 1.0], alpha=0.0, beta=np.inf,
                      node_mem=[1.0, 1.0], mem_cap=[2.0, 1.0], device_names=["a0", "b0"])
    sol = _pipeline(p, [0, 1])
    found, (chosen, decision) = _decide(p, ["a", "b"], sol)
    assert "replicas" not in {b.name for b in found if b.value is not None}
    assert chosen is None and decision.kept and decision.baseline == "only a0"
    assert str(decision).startswith("kept the solver's plan (1 s")


class _Costs:
    """Every op costs 10 ms on every device."""

    def predict(self, graph, device):
        return np.full(len(graph.nodes), 10e-3)


def test_optimize_over_hosts_names_the_hosts_of_its_baselines():
    # alpha has two CPU devices, beta one. Every op 10 ms anywhere: the replicas of the whole
    # model on the three devices (30 ms each, 10 ms per input) are the plan; the baselines say
    # which host each runs on, host alpha's best plan is among them, and no all-threads
    # baseline adds up CPUs of different hosts.
    devs = [Device.cpu(0, host="alpha"), Device.cpu(1, host="alpha"), Device.cpu(0, host="beta")]
    res = autoplace.optimize(chain(ops=("relu", "exp", "tanh")), devs, objective="throughput", cost_model=_Costs(),
                             check_devices=False, calibrate=False, db=None,
                             stage_overhead_s=0.0)
    assert res.baseline_notes["only beta-cpu0"] == "host beta"
    assert res.baseline_notes["replicas"].endswith("(hosts alpha, beta)")
    assert res.baseline_notes["host alpha"] == "alpha-cpu0, alpha-cpu1"
    assert "host beta" not in res.baselines  # one device: its "only" baseline
    assert res.baselines["only alpha-cpu0"] == pytest.approx(30e-3)
    assert res.baselines["host alpha"] == pytest.approx(20e-3)  # 1 op and 2 ops on its two
    assert res.baselines["replicas"] == pytest.approx(10e-3)
    assert "all threads" not in res.baselines
    assert "several hosts" in res.baseline_notes["all threads"]
    assert res.plan.replicas == ("alpha-cpu0", "alpha-cpu1", "beta-cpu0")
    assert "host alpha" in res.summary()
