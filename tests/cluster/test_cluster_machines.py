"""Hosts that share one machine share its cores: a plan over them delivers no more than the
machine's cores over the CPU seconds per input spent there (its stages' ops and calls, the
cluster's daemons, the driving process); hosts on machines of their own are priced as before.
No Ray needed: the machines are given, or read from measured figures."""

import numpy as np
import pytest

import autoplace
from autoplace.cluster.calls import HOW, background_shares, host_overheads, shared_machines
from autoplace.cluster.links import host_fingerprint
from autoplace.cluster.pipeline import INLINE_BYTES
from autoplace.devices import Device
from autoplace.profile import OverheadFit
from autoplace.report.explain import machine_lines
from autoplace.solve import Problem, simulate_replicas, simulate_throughput
from autoplace.solve.build import SharedMachines
from autoplace.solve.problem import Machines
from autoplace.solve.segments import concurrent_latency, machine_latency
from cluster_models import chain  # noqa: E402

HOSTS = [Device.cpu(0, host="alpha"), Device.cpu(0, host="beta")]


def _two_ops(cores, **machine):
    """Two ops of 4 s in a chain on either of two devices, both on one machine of ``cores``."""
    return Problem.build(np.full((2, 2), 4.0), [(0, 1)],
                         machines=Machines.build([0, 0], [cores], **machine))


def test_a_pipeline_over_hosts_of_one_machine_is_bound_by_its_cores():
    # A stage a device: 4 s each. On the machine per input: 8 s of ops, a call per stage of
    # 0.5 s in its actor and 0.25 s in the daemons, 0.5 s in the driver: 10.5 s of CPU.
    # Two cores: 5.25 s per input, not 4; four cores: 2.625 s, and the stages' 4 s stand.
    calls = dict(call_cpu_s=0.5, daemon_cpu_s=0.25, driver_cpu_s=0.5, driver=0)
    assert simulate_throughput(_two_ops(2.0, **calls), [0, 1]) == pytest.approx(5.25)
    assert simulate_throughput(_two_ops(4.0, **calls), [0, 1]) == pytest.approx(4.0)
    # The driver on another machine: 9.5 s there, 4.75 s per input on two cores.
    away = {**calls, "driver": -1}
    assert simulate_throughput(_two_ops(2.0, **away), [0, 1]) == pytest.approx(4.75)
    # Ops 1.25x as long with every core busy: 10 s of ops, 12.5 s of CPU, 6.25 s per input.
    assert simulate_throughput(_two_ops(2.0, slowdown=1.25, **calls), [0, 1]) == \
        pytest.approx(6.25)
    # One host, one stage of 8 s: 9.25 s of CPU on two cores is not the bottleneck.
    assert simulate_throughput(_two_ops(2.0, **calls), [0, 0], [0, 0]) == pytest.approx(8.0)
    # On one core, the pipeline gains nothing over one host: 10.5 s against 9.25 s of CPU.
    assert simulate_throughput(_two_ops(1.0, **calls), [0, 1]) == pytest.approx(10.5)
    assert simulate_throughput(_two_ops(1.0, **calls), [0, 0], [0, 0]) == pytest.approx(9.25)


def test_replicas_on_one_machine_share_its_cores():
    # The whole model, 8 s, on each of two devices: 4 s per input side by side. On one core
    # each input still takes 8 s of it; on two, 4 s.
    assert simulate_replicas(_two_ops(1.0), [0, 1]) == pytest.approx(8.0)
    assert simulate_replicas(_two_ops(2.0), [0, 1]) == pytest.approx(4.0)


def test_branches_on_hosts_of_one_machine_run_side_by_side_as_far_as_its_cores_allow():
    # Two branches of 3 s from one input, on devices 0 and 1, joined on device 0 (1 s): side
    # by side 4 s. On one core every op waits its turn: 7 s; with 0.5 s of CPU per segment
    # call in the actor (three segments) 8.5 s; on two cores the branches fit: 4 s stands.
    cost = [[3.0, 3.0], [3.0, 3.0], [1.0, 1.0]]
    edges = [(0, 2), (1, 2)]
    a = [0, 1, 0]
    for cores, call, want in ((1.0, 0.0, 7.0), (1.0, 0.5, 8.5), (2.0, 0.5, 4.25)):
        p = Problem.build(cost, edges, machines=Machines.build([0, 0], [cores], call_cpu_s=call))
        side_by_side = concurrent_latency(p, a).makespan
        assert side_by_side == pytest.approx(4.0)
        assert max(side_by_side, machine_latency(p, a)) == pytest.approx(want)


def test_devices_on_machines_of_their_own_are_priced_as_without_machines():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, d = int(rng.integers(2, 7)), 3
        edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
        kw = dict(out_bytes=rng.uniform(0, 1e6, n), alpha=1e-3, beta=1e9,
                  stage_overhead_s=rng.uniform(0, 1e-3, d), call_s=rng.uniform(0, 1e-3, d))
        cost = rng.uniform(1e-3, 1e-2, (n, d))
        plain = Problem.build(cost, edges, **kw)
        # Machines named, but no device on one: every device keeps its own.
        alone = Problem.build(cost, edges, **kw, machines=Machines.build(
            [-1] * d, [1.0], call_cpu_s=1.0, daemon_cpu_s=1.0, driver_cpu_s=1.0))
        a = rng.integers(0, d, n)
        assert simulate_throughput(alone, a) == simulate_throughput(plain, a)
        assert simulate_replicas(alone, [0, 1, 2]) == simulate_replicas(plain, [0, 1, 2])
        assert machine_latency(alone, a) == 0.0


def _fits(host, machine, *, cores=2, driver_machine="10.0.0.1", slowdown=1.1):
    """A host's measured calls, as measure_call_overheads stores them: beyond the shares of a
    core they keep busy (actor 0.02, daemons 0.01, driver 0.03), 0.5 ms in the actor, 0.1 ms in
    the daemons, 0.4 ms in the driver (one at a time: 0.6, 0.2, 1.0 ms)."""
    fp = host_fingerprint(host)
    detail = {"how": HOW, "host": host, "machine": machine, "machine_cores": cores, "cpus": 1,
              "driver_machine": driver_machine, "machine_slowdown": slowdown,
              "shares": {"actor": 0.02, "daemons": 0.01, "driver": 0.03}}
    return [OverheadFit(fp, "", "call", 5e-4, {**detail, "beyond": {
                "actor": 5e-4, "daemons": 1e-4, "driver": 4e-4}}),
            OverheadFit(fp, "", "stage", 4e-4, detail),
            OverheadFit(fp, "", "segment", 9e-4, {**detail, "actor_cpu_s": 6e-4,
                                                  "daemons_cpu_s": 2e-4, "driver_cpu_s": 1e-3})]


def test_hosts_at_one_address_share_a_machine():
    fits = _fits("alpha", "10.0.0.1") + _fits("beta", "10.0.0.1")
    got = shared_machines(HOSTS, fits)
    both = ("alpha-cpu0", "beta-cpu0")
    assert got == SharedMachines(
        dict.fromkeys(both, "10.0.0.1"), {"10.0.0.1": 2.0}, {"10.0.0.1": 1.1},
        dict.fromkeys(both, 1), dict.fromkeys(both, 5e-4), dict.fromkeys(both, 1e-4),
        dict.fromkeys(both, 4e-4), "10.0.0.1", dict.fromkeys(both, 0.02),
        dict.fromkeys(both, 0.01), dict.fromkeys(both, 0.03), {}, float(INLINE_BYTES))
    assert host_overheads(HOSTS, fits)["machines"] == got
    # A latency plan's calls are made one at a time: their figures then.
    late = host_overheads(HOSTS, fits, "latency")["machines"]
    assert late.call_cpu_s == dict.fromkeys(both, 6e-4)
    assert late.driver_cpu_s == dict.fromkeys(both, 1e-3)
    # Two addresses: machines of their own, no bound; nor from figures without machines.
    assert shared_machines(HOSTS, _fits("alpha", "10.0.0.1") + _fits("beta", "10.0.0.2")) is None
    old = [OverheadFit(f.device, "", f.kind, f.seconds, {"how": HOW}) for f in fits]
    assert shared_machines(HOSTS, old) is None


def test_the_processes_busy_between_calls_leave_fewer_cores():
    # As in the first test (10.5 s of CPU per input), but each stage's actor keeps 0.25 of a
    # core busy between calls, the daemons 0.1, the driver 0.15: 1.25 of the two cores are
    # left, 8.4 s per input. One host, one stage: 9.25 s of CPU on 1.5 cores is 6.17 s, under
    # its 8 s of ops.
    p = _two_ops(2.0, call_cpu_s=0.5, daemon_cpu_s=0.25, driver_cpu_s=0.5, driver=0,
                 actor_share=0.25, daemon_share=0.1, driver_share=0.15)
    assert simulate_throughput(p, [0, 1]) == pytest.approx(10.5 / 1.25)
    assert simulate_throughput(p, [0, 0], [0, 0]) == pytest.approx(8.0)
    assert p.machines.background([True, False]).tolist() == pytest.approx([0.5])
    # Processes that keep every core busy leave none: no rate at all.
    full = _two_ops(1.0, actor_share=0.5)
    assert simulate_throughput(full, [0, 1]) == np.inf


class _Ops:
    """Every op ``s`` seconds on every device."""

    def __init__(self, s):
        self.s = s

    def predict(self, graph, device):
        return np.full(len(graph.nodes), self.s)


@pytest.mark.parametrize("cores, split", [(2, True), (1, False)])
def test_optimize_prices_the_shared_machine(cores, split):
    # Two ops of 10 ms, the calls of _fits. Over both hosts: each stage 10 + 0.5 + 0.4 ms
    # (10.9 ms: the prediction as if each host had its own machine); the machine spends
    # 20 ms of ops x 1.1, 2 x (0.5 + 0.1) ms in the calls, 0.8 ms in the driver: 24.0 ms of
    # CPU per input, on the cores less 2 x 0.02 + 0.01 + 0.03 = 0.08 kept busy between calls:
    # 24.0 / 1.92 = 12.5 ms on two cores, beating one host's 20.5 ms (ops and a call).
    # On one core, 24.0 / 0.92 = 26.1 ms against one host's (20 x 1.1 + 0.5 + 0.1 + 0.4) /
    # (1 - 0.06) = 24.5 ms: one host.
    fits = _fits("alpha", "10.0.0.1", cores=cores) + _fits("beta", "10.0.0.1", cores=cores)
    res = autoplace.optimize(chain(), HOSTS, objective="throughput", cost_model=_Ops(10e-3),
                             check_devices=False, calibrate=False, db=None, replicate=False,
                             **host_overheads(HOSTS, fits))
    assert (len(set(res.plan.assignment)) == 2) == split
    if split:
        assert res.plan.predicted_s == pytest.approx(24.0e-3 / 1.92)
        apart = autoplace.optimize(chain(), HOSTS, objective="throughput",
                                   cost_model=_Ops(10e-3), check_devices=False,
                                   calibrate=False, db=None, replicate=False,
                                   **{**host_overheads(HOSTS, fits), "machines": None})
        assert apart.plan.predicted_s == pytest.approx(10.9e-3)
    else:
        assert res.plan.predicted_s == pytest.approx(23.0e-3 / 0.94)
    line = next(x for x in res.explain().overheads if x.startswith("hosts alpha, beta"))
    assert line.startswith(f"hosts alpha, beta and the driving process share one machine of "
                           f"{cores} cores, its ops 1.10x as long with every core busy: ")
    assert machine_lines(res.problem, res.solution, {}) != ()


def test_the_shares_come_from_calls_close_together_and_apart():
    # 1 ms per input close together: the actor 0.5 ms of CPU a call; 11 ms apart: 1.5 ms. A
    # line through the two: 0.1 of a core kept busy, 0.4 ms a call beyond it. The driver spent
    # less apart (noise): no share, its close figure. No daemons read (nan): nothing.
    t = {"wall": 1e-3, "actor": 0.5e-3, "driver": 0.4e-3, "daemons": float("nan"),
         "spaced_wall": 11e-3, "spaced_actor": 1.5e-3, "spaced_driver": 0.3e-3,
         "spaced_daemons": float("nan")}
    got = background_shares(t)
    assert got["actor"] == pytest.approx((0.1, 0.4e-3))
    assert got["driver"] == pytest.approx((0.0, 0.4e-3))
    assert got["daemons"] == (0.0, 0.0)
