"""The actor call of a stage on a host: timed per host, stored by host name, and charged per stage
(one alone too) by the solver, so small stages over hosts are priced with their calls."""

import os

import numpy as np
import pytest

import autoplace
from autoplace.cluster import ClusterError
from autoplace.cluster.calls import HOW, host_overheads, measure_call_overheads
from autoplace.cluster.links import host_fingerprint
from autoplace.devices import Device
from autoplace.profile import OverheadFit, ProfileStore
from autoplace.solve import simulate_throughput, solve
from autoplace.solve.build import build_problem
from cluster_models import chain  # noqa: E402

HOSTS = [Device.cpu(0, host="alpha"), Device.cpu(0, host="beta")]


def _fits(host, actor_s, driver_s):
    fp = host_fingerprint(host)
    return [OverheadFit(fp, "", "call", actor_s, {"how": HOW}),
            OverheadFit(fp, "", "stage", driver_s, {"how": HOW})]


def test_host_overheads_match_devices_by_host():
    devs = [*HOSTS, Device.cpu(1, host="alpha"), Device.cpu(0)]
    fits = _fits("alpha", 5e-4, 4e-4) + _fits("beta", 6e-4, 3e-4)
    fits.append(OverheadFit(host_fingerprint("beta"), "", "call", 1.0, {"how": "other"}))
    got = host_overheads(devs, fits)
    # Each host's device its host's figures; this process's device (no host) none; a figure
    # measured some other way is not read.
    assert got == {"call_overhead_s": {"alpha-cpu0": 5e-4, "beta-cpu0": 6e-4, "alpha-cpu1": 5e-4},
                   "stage_overhead_s": {"alpha-cpu0": 4e-4, "beta-cpu0": 3e-4,
                                        "alpha-cpu1": 4e-4},
                   "machines": None}  # no machine recorded: test_cluster_machines
    with pytest.raises(ClusterError, match="no actor call measured for host 'beta'.*"
                                           "--measure-links"):
        host_overheads(devs, _fits("alpha", 5e-4, 4e-4))
    # A latency plan waits for each call, one at a time: the host's segment figure.
    fits.append(OverheadFit(host_fingerprint("alpha"), "", "segment", 1e-3, {"how": HOW}))
    fits.append(OverheadFit(host_fingerprint("beta"), "", "segment", 2e-3, {"how": HOW}))
    assert host_overheads(devs, fits, "latency") == {
        "segment_overhead_s": {"alpha-cpu0": 1e-3, "beta-cpu0": 2e-3, "alpha-cpu1": 1e-3},
        "machines": None}


@pytest.mark.parametrize("op_s, split", [(0.2e-3, False), (10e-3, True)])
def test_the_calls_keep_small_stages_on_one_host(op_s, split):
    # Two ops of op_s on either host; each actor call costs its host 0.5 ms and the driver
    # 0.4 ms. Split over the hosts: each host op_s + 0.5 + 0.4 ms (the call and the hand-off),
    # the driver 0.8 ms. On one host: one stage, 2 op_s + 0.5 ms (its call; no hand-off).
    # 0.2 ms ops: 1.1 ms split against 0.9 ms on one host; 10 ms ops: 10.9 against 20.5 ms.
    g = autoplace.OpGraph.from_relax(chain())
    got = host_overheads(HOSTS, _fits("alpha", 5e-4, 4e-4) + _fits("beta", 5e-4, 4e-4))
    p = build_problem(g, HOSTS, np.full((2, 2), op_s), {}, call_s=got["call_overhead_s"],
                      stage_overhead_s=got["stage_overhead_s"])
    sol = solve(p, "throughput", "brute")
    assert (len(set(sol.assignment)) == 2) == split
    # The copy between hosts (Link.default's network guess) is not the bottleneck here.
    assert sol.value == pytest.approx(op_s + 0.9e-3 if split else 2 * op_s + 0.5e-3, rel=1e-6)
    # Without the calls, the small ops were split too: 0.2 ms against 0.4 ms on one host.
    bare = build_problem(g, HOSTS, np.full((2, 2), op_s), {})
    assert len(set(solve(bare, "throughput", "brute").assignment)) == 2
    assert simulate_throughput(p, [0, 0], [0, 0]) == pytest.approx(2 * op_s + 0.5e-3)


def test_optimize_charges_the_given_calls():
    fits = _fits("alpha", 5e-4, 4e-4) + _fits("beta", 6e-4, 3e-4)
    res = autoplace.optimize(chain(), HOSTS, objective="throughput", cost_model=None,
                             check_devices=False, calibrate=False, db=None,
                             **host_overheads(HOSTS, fits))
    assert list(res.problem.call_s) == [5e-4, 6e-4]
    assert list(res.problem.stage_overhead_s) == [4e-4, 3e-4]
    line = next(n for n in res.overheads_note if n.startswith("call overhead:"))
    assert "alpha-cpu0 500.0 us" in line and "given for alpha-cpu0, beta-cpu0" in line
    # Roofline costs of two tiny ops are far below a call: one host, one stage, its call paid.
    assert len(set(res.plan.assignment)) == 1
    with pytest.raises(ValueError, match="call_overhead_s.*objective='throughput'"):
        autoplace.optimize(chain(), HOSTS, call_overhead_s=1e-3, check_devices=False,
                           calibrate=False, cost_model=None, db=None)


@pytest.mark.slow
def test_measured_calls_are_stored_by_host(ray_cluster, tmp_path):
    path = tmp_path / "profile.db"
    with ProfileStore(path) as store:
        fits = measure_call_overheads(store, calls=40)
        assert {(f.device, f.kind) for f in fits} == {
            (host_fingerprint(h), k) for h in ("alpha", "beta")
            for k in ("call", "stage", "segment")}
        for f in fits:  # seconds of a call: some, and less than a second
            assert 0 < f.seconds < 1 and f.detail["wall_s"] > 0
        # Stored: measured again only when asked (a restarted cluster keeps its host names).
        assert measure_call_overheads(store, calls=40) == []
    with ProfileStore(path) as store:
        got = host_overheads(HOSTS, store)
        assert set(got["call_overhead_s"]) == {"alpha-cpu0", "beta-cpu0"}
        # Both nodes, and this driver, are this machine: its cores are shared.
        m = got["machines"]
        assert set(m.machine) == {"alpha-cpu0", "beta-cpu0"} and len(set(m.machine.values())) == 1
        assert m.driver == m.machine["alpha-cpu0"]
        assert m.cores == {m.driver: float(len(os.sched_getaffinity(0)))}
        assert m.slowdown[m.driver] >= 1 and all(s >= 0 for s in m.daemon_cpu_s.values())
        assert set(host_overheads(HOSTS, store, "latency")["segment_overhead_s"]) == {
            "alpha-cpu0", "beta-cpu0"}
    with pytest.raises(ClusterError, match="no host 'gamma'"):
        measure_call_overheads(None, ["gamma"])
