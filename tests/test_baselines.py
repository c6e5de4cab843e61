"""Honest baselines (all threads on one device, data-parallel replicas) and the guard that returns
the best of them unless the solver's multi-device plan beats it by more than its costs' spread."""

import json

import numpy as np
import pytest

import autoplace
from autoplace import Device, zoo
from autoplace.predict import MeasuredCostModel
from autoplace.profile import DeviceProfile, LocalRunner, fingerprint
from autoplace.solve.simulate import simulate_throughput


class Flat:
    """Every op 1 ms on every device: 10 ms for branchy_cnn's 10 ops."""

    def predict(self, graph, device):
        return np.full(len(graph.nodes), 1e-3)


def _profile(graph, cv, threads=None, scale=1.0, device=None):
    """A profile of this machine's CPU (so no mismatch warning): every op 100 µs, each with
    relative spread ``cv``; ``threads`` measured with that many TVM threads."""
    info = LocalRunner(device or Device.cpu(0)).info()
    if threads is not None:
        info = {**info, "threads": threads}
    keys = {n.workload_key for n in graph.nodes}
    return DeviceProfile(f"test-{info['threads']}t", fingerprint(info), info,
                         {k: scale * 1e-4 for k in keys}, {k: cv for k in keys}, {})


def test_throughput_replicates_the_model_when_replicas_win(devs, rng):
    # 10 ms of ops, 115 µs per stage or replica: the best pipeline cuts 5 + 5 ms (5.115 ms per
    # input and a copy), two replicas deliver one input per (10 + 0.115) / 2 = 5.06 ms.
    m = zoo.load("branchy_cnn")
    res = autoplace.optimize(m.mod, devs, objective="throughput", cost_model=Flat(),
                             stage_overhead_s=115e-6, time_limit=5, db=None)
    assert res.plan.replicas == ("a", "b") and res.plan.solver.endswith("+replicas")
    assert res.predicted_latency_s == pytest.approx((10e-3 + 115e-6) / 2)
    assert res.baselines["replicas"] == pytest.approx(res.predicted_latency_s)
    assert "replicated: the whole model on each of a, b" in res.summary()
    expl = res.explain()
    assert "replicas of the whole model are predicted faster" in str(expl)
    assert all(n.reason.startswith("replicated") for n in expl.nodes)
    assert expl.device_s == pytest.approx({"a": 5e-3, "b": 5e-3})
    assert autoplace.Plan.from_json(res.plan.to_json()) == res.plan
    from autoplace.report import plot_stage_loads

    bars = {p.get_gid(): p.get_height() for p in plot_stage_loads(res).axes[0].patches}
    # Each replica takes half the inputs: 5 ms of compute and 57.5 µs of hand-off per input.
    assert bars["load:a:replica"] == pytest.approx(5.0)
    assert bars["load:b:replica"] == pytest.approx(5.0)
    assert bars["load:host"] == pytest.approx(0.115)  # ms, like the plot's axis
    xs = [[rng.standard_normal(a.shape).astype(a.dtype) for a in m.inputs] for _ in range(10)]
    single = autoplace.compile(m.mod, autoplace.place(res.graph, devs, [("*", "a")]))
    with res.pipeline(trial=False) as pipe:  # the replicas, not what a trial here keeps
        outs = pipe.run(xs)
        assert [d.name for _, d in pipe.workers] == ["a", "b"]
        assert pipe.stats.workers == "replicas" and pipe.stats.inputs == 10
    for x, out in zip(xs, outs):
        for got, want in zip(out, single(*x), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Asked not to replicate: the pipeline, with the replicas still a baseline beside it.
    pipe_res = autoplace.optimize(m.mod, devs, objective="throughput", cost_model=Flat(),
                                  stage_overhead_s=115e-6, time_limit=5, replicate=False, db=None)
    assert not pipe_res.plan.replicas and len(set(pipe_res.plan.stages)) == 2
    assert "replicas" not in pipe_res.baselines


def test_a_plan_whose_gain_is_within_its_costs_spread_gives_way_to_the_baseline(devs):
    # branchy_cnn's two branches run side by side on a and b: a gain of about two ops' time.
    # Measured with a spread of ±50 % per op that gain is well within two sigma; at ±0.1 % it
    # is not.
    m = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(m.mod)
    noisy = autoplace.optimize(m.mod, devs, cost_model=MeasuredCostModel(_profile(g, 0.5)),
                               time_limit=5, db=None)
    solver = autoplace.optimize(m.mod, devs, cost_model=MeasuredCostModel(_profile(g, 0.5)),
                                time_limit=5, baseline_guard=False, db=None)
    assert len(solver.plan.used_devices()) == 2 and solver.guard is None
    assert noisy.plan.used_devices() == (devs[0],) and noisy.plan.solver == "single:0"
    d = noisy.guard
    assert not d.kept and d.baseline == "only a" and d.plan_s == solver.predicted_latency_s
    assert 0 < d.gain_s < d.margin_s and d.baseline_s == pytest.approx(noisy.predicted_latency_s)
    # Each value's sigma: every op (100 µs ± 50 %) in quadrature over its 10 nodes.
    assert d.baseline_sigma_s == pytest.approx(0.5 * 1e-4 * np.sqrt(10))
    why = str(noisy.explain())
    assert "why this plan: returned the baseline only a" in why and "within 2 sigma" in why
    assert "baseline_guard=False" in why and f"guard: {d}" in noisy.summary()
    assert "the solver's plan was Plan(latency, 10 nodes on 2/2 devices" in why  # what it found
    sure = autoplace.optimize(m.mod, devs, cost_model=MeasuredCostModel(_profile(g, 1e-3)),
                              time_limit=5, db=None)
    assert len(sure.plan.used_devices()) == 2 and sure.guard.kept
    assert "kept the solver's plan" in sure.explain().guard


def test_roofline_costs_carry_their_spread(devs):
    # A roofline estimate is far from exact (RooflineCostModel.spread): the branches side by
    # side, predicted a little faster than one device, are not a gain the guard believes.
    m = zoo.load("branchy_cnn")
    res = autoplace.optimize(m.mod, devs, cost_model=autoplace.RooflineCostModel(),
                             time_limit=5, segment_overhead_s=0, db=None)
    d = res.guard
    rel = autoplace.RooflineCostModel.spread
    assert not d.kept and d.unknown == 0 and d.plan_s < d.baseline_s
    assert 0 < d.baseline_sigma_s <= rel * d.baseline_s and d.gain_s < d.margin_s
    assert len(res.plan.used_devices()) == 1
    kept = autoplace.optimize(m.mod, devs, cost_model=autoplace.RooflineCostModel(),
                              time_limit=5, segment_overhead_s=0, baseline_guard=False, db=None)
    assert len(kept.plan.used_devices()) == 2


def _two_ops(spread, edges=()):
    """Two ops of 1 s on either of two devices, free copies; the same relative spread
    everywhere."""
    from autoplace.solve import Problem

    p = Problem.build(np.ones((2, 2)), edges, alpha=0.0)
    return p, np.full((2, 2), spread)


@pytest.mark.parametrize("spread, kept", [(0.1, True), (0.5, False), (np.nan, True)])
def test_the_gain_must_clear_two_sigma_of_the_plans_value(spread, kept):
    from autoplace.report.baselines import guard, predict_baselines, value_sigma
    from autoplace.solve import solve

    # Independent ops on a and b: 1 s against 2 s on one device, a gain of 1 s. The plan's
    # sigma is sqrt(2) * spread (two ops of 1 s), so the margin is 2 sqrt(2) * spread: 0.28 s
    # keeps the plan, 1.41 s does not; an unknown spread counts as none.
    p, sp = _two_ops(spread)
    sol = solve(p, "latency", "cpsat")
    assert sol.value == 1.0
    if not np.isnan(spread):
        assert value_sigma(p, sol, sp) == (pytest.approx(np.sqrt(2) * spread), 0)
    found = predict_baselines(p, "latency", sp)
    chosen, d = guard(p, sol, sp, found, "plan")
    assert d.kept is kept and (chosen is None) is kept
    assert d.gain_s == 1.0 and d.margin_s == pytest.approx(
        0 if np.isnan(spread) else 2 * np.sqrt(2) * spread)
    if not kept:
        assert chosen.name == "only d0" and chosen.solution.value == 2.0


def _all_threads(p, value, sigma):
    """An "all threads" baseline of ``value`` ± ``sigma`` (its plan: d0 alone)."""
    from autoplace.report.baselines import Baseline
    from autoplace.solve import solve

    return Baseline("all threads", value, sigma, solution=solve(p, "latency", "single:0"),
                    threads=2, problem=p)


@pytest.mark.parametrize("value, sigma, returned", [(1.9, 0.2, None), (1.0, 0.05, "all threads")])
def test_all_threads_must_clear_the_margin_over_the_solvers_one_device(value, sigma, returned):
    from autoplace.report.baselines import guard, predict_baselines
    from autoplace.solve import solve

    # The solver's plan: both ops on d0, 2 s. All threads takes the cores of both devices:
    # 1.9 s ± 0.2 beats it within 2 sigma of its own value (0.4 s), 1.0 s ± 0.05 does not.
    p, sp = _two_ops(0.1)
    one = solve(p, "latency", "single:0")
    found = [*predict_baselines(p, "latency", sp), _all_threads(p, value, sigma)]
    chosen, d = guard(p, one, sp, found, "d0 alone")
    assert d.baseline == "all threads" and d.kept is (returned is None)
    assert (chosen and chosen.name) == returned
    if returned is None:
        assert "takes several devices and beats it by only 100 ms, within 2 sigma" in str(d)


def test_a_split_plan_is_judged_against_one_device_when_all_threads_is_within_the_margin():
    from autoplace.report.baselines import guard, predict_baselines
    from autoplace.solve import solve

    # The split plan (1 s) against all threads (1.9 s, within the margin of d0's 2 s): the
    # plan is judged against d0 alone, and kept; all threads at 0.5 s beats both.
    p, sp = _two_ops(0.1)
    split = solve(p, "latency", "cpsat")
    found = predict_baselines(p, "latency", sp)
    chosen, d = guard(p, split, sp, [*found, _all_threads(p, 1.9, 0.2)], "split")
    assert chosen is None and d.kept and d.baseline in ("only d0", "only d1")
    assert "all threads (1.9 s ± 200 ms) takes several devices and beats" in str(d)
    chosen, d = guard(p, split, sp, [*found, _all_threads(p, 0.5, 0.01)], "split")
    assert chosen.name == "all threads" and not d.kept and not d.passed_over


class FlatWithCalls(Flat):
    """Flat costs, and overheads measured per device (as profiles give them): a call, and
    optionally the least a kernel costs."""

    def __init__(self, calls, kernels=None):
        self.calls, self.kernels = calls, kernels or {}

    def overheads(self, devices):
        out = {d.name: {"call": self.calls[d.name]} for d in devices if d.name in self.calls}
        for name, s in self.kernels.items():
            out.setdefault(name, {})["kernel"] = s
        return out


def test_a_latency_build_pays_the_call_of_the_devices_it_uses(devs):
    # mlp: a chain of 12 ops of 1 ms on either device. A call on a costs 2 ms (a GPU's call
    # moves the inputs and outputs between host and device), on b 0.1 ms: the model runs on b,
    # and each baseline carries its own device's call.
    m = zoo.load("mlp")
    res = autoplace.optimize(m.mod, devs, cost_model=FlatWithCalls({"a": 2e-3, "b": 1e-4}),
                             time_limit=5, db=None)
    assert res.baselines["only a"] == pytest.approx(14e-3)
    assert res.baselines["only b"] == pytest.approx(12.1e-3)
    assert res.plan.used_devices() == (devs[1],)
    assert res.predicted_latency_s == pytest.approx(12.1e-3)
    assert res.delivery.call_s == pytest.approx(1e-4)
    assert any("a 2000.0 us, b 100.0 us" in n and "largest of the devices it uses" in n
               for n in res.overheads_note)
    # The calls swapped: the model runs on a.
    swapped = autoplace.optimize(m.mod, devs, time_limit=5,
                                 cost_model=FlatWithCalls({"a": 1e-4, "b": 2e-3}), db=None)
    assert swapped.plan.used_devices() == (devs[0],)
    assert swapped.predicted_latency_s == pytest.approx(12.1e-3)


def test_no_kernel_is_charged_less_than_its_devices_kernel_floor(devs):
    # mlp's 12 ops of 1 ms, built as 4 kernels (matmul, add, relu); the same call on both. A
    # kernel on a costs at least 5 ms: each of a's kernels takes 2 ms more, charged to its
    # first op, and the model runs on b.
    m = zoo.load("mlp")
    res = autoplace.optimize(m.mod, devs, time_limit=5, db=None,
                             cost_model=FlatWithCalls({"a": 1e-4, "b": 1e-4}, {"a": 5e-3}))
    assert res.problem.cost[:, 0].tolist() == [3e-3, 1e-3, 1e-3] * 4
    assert res.problem.cost[:, 1].tolist() == [1e-3] * 12
    assert res.plan.used_devices() == (devs[1],)
    assert res.baselines["only a"] == pytest.approx(20.1e-3)
    assert any(n.startswith("kernel floor: a 5000.00 us") for n in res.overheads_note)


def test_a_throughput_plan_pays_each_devices_call_per_input(devs):
    # The same mlp: 12 ms of ops on either device, a's call 2 ms, b's 0.1 ms; hand-offs of
    # 1 ms. Each device alone pays its own call: a 14 ms, b 12.1 ms per input; replicas pay
    # both, each its own: 1 / (1/15 + 1/13.1) ms. A pipeline's stages pay their device's call.
    m = zoo.load("mlp")
    res = autoplace.optimize(m.mod, devs, objective="throughput", time_limit=5, db=None,
                             cost_model=FlatWithCalls({"a": 2e-3, "b": 1e-4}),
                             stage_overhead_s=1e-3)
    assert res.problem.call_s.tolist() == [2e-3, 1e-4]
    assert res.baselines["only a"] == pytest.approx(14e-3)
    assert res.baselines["only b"] == pytest.approx(12.1e-3)
    assert res.baselines["replicas"] == pytest.approx(1 / (1 / 15e-3 + 1 / 13.1e-3))
    assert res.solution.value == pytest.approx(simulate_throughput(
        res.problem, res.solution.assignment, res.solution.stages)
        if res.solution.replicas is None else res.baselines["replicas"])
    assert any("each stage and each replica pays its device's" in n for n in res.overheads_note)
    # Two stages, six ops each: a 6 + 2 + 1 ms, b 6 + 0.1 + 1 ms per input.
    a = np.array([0] * 6 + [1] * 6)
    assert simulate_throughput(res.problem, a) == pytest.approx(9e-3)


def test_a_plan_no_faster_than_a_baseline_is_never_returned():
    from autoplace.report.baselines import guard, predict_baselines
    from autoplace.solve._common import make_solution

    # A chain split over two devices with free copies takes as long as one device: no gain,
    # even with no spread to weigh.
    p, sp = _two_ops(np.nan, edges=[(0, 1)])
    split = make_solution(p, "latency", [0, 1], "split")
    chosen, d = guard(p, split, sp, predict_baselines(p, "latency", sp), "split")
    assert not d.kept and d.gain_s == 0 and chosen.name == "only d0"
    assert "which is no faster" in str(d)


def test_the_sigma_of_replicas_weighs_each_replica_by_how_much_it_moves_the_rate():
    from autoplace.report.baselines import value_sigma
    from autoplace.solve import Problem, solve

    # One op of 1 s on each of two devices: v = 1 / (1 + 1) = 0.5 s; dv/dT_k = v^2 / T_k^2 =
    # 0.25, so sigma = sqrt(2) * 0.25 * 0.1.
    p = Problem.build(np.ones((1, 2)))
    sol = solve(p, "throughput", "replicas")
    assert sol.value == 0.5
    sigma, unknown = value_sigma(p, sol, np.full((1, 2), 0.1))
    assert sigma == pytest.approx(np.sqrt(2) * 0.025) and unknown == 0


def test_the_all_threads_baseline_is_predicted_only_from_a_profile_at_that_count(devs, rng):
    from autoplace.run.cores import all_threads

    m = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(m.mod)
    threads = all_threads(devs)[0]
    one = _profile(g, 0.01)
    res = autoplace.optimize(m.mod, devs, cost_model=MeasuredCostModel(one), time_limit=5, db=None)
    assert "all threads" not in res.baselines
    assert res.baseline_notes["all threads"].startswith(
        f"not predicted: no profile of a measured with {threads} TVM threads")
    assert "all threads baseline: not predicted" in res.summary()
    # With a profile at that count (everything 2.5x as fast), the baseline is predicted and,
    # faster than any split, returned: one device with all the threads.
    more = _profile(g, 0.01, threads=threads, scale=0.4)
    model = MeasuredCostModel({"a": one, "b": one, "all threads": more})
    res = autoplace.optimize(m.mod, devs, cost_model=model, time_limit=5, db=None)
    assert res.baselines["all threads"] == pytest.approx(0.4 * res.baselines["only a"])
    assert res.plan.threads == threads and res.plan.used_devices() == (devs[0],)
    assert res.guard.baseline == "all threads" and not res.guard.kept
    assert f"profile: all-threads baseline ({threads} threads) <- " in res.summary()
    assert not any(n.startswith("warning") for n in res.profiles_note)
    run = res.compile()  # runs on the caller's thread, its pool given that many threads
    x = [rng.standard_normal(a.shape).astype(a.dtype) for a in m.inputs]
    single = autoplace.compile(m.mod, autoplace.place(g, devs, [("*", "a")]))
    for got, want in zip(run(*x), single(*x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_all_threads_build_runs_on_the_callers_thread_and_pays_no_hand_off(devs, rng):
    """Built, the all-threads baseline is called on the caller's thread (its TVM pool given the
    threads), as a user would call it: its kernels and its call, no hand-off to a worker,
    for one inference or a stream."""
    import dataclasses

    from autoplace.profile.measurements import OverheadFit
    from autoplace.run.cores import all_threads

    m = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(m.mod)
    threads = all_threads(devs)[0]
    one = _profile(g, 0.01)
    one = dataclasses.replace(one, overheads=(OverheadFit(one.fingerprint, "", "stage", 30e-6),))
    model = MeasuredCostModel({"a": one, "b": one,
                               "all threads": _profile(g, 0.01, threads=threads, scale=0.4)})
    lat = autoplace.optimize(m.mod, devs, cost_model=model, time_limit=5, db=None)
    kernels = 0.4 * lat.baselines["only a"]
    assert lat.baselines["all threads"] == pytest.approx(kernels)
    assert lat.plan.threads == threads and lat.plan.predicted_s == pytest.approx(kernels)
    assert "worker thread" not in lat.baseline_notes["all threads"]
    thr = autoplace.optimize(m.mod, devs, cost_model=model, objective="throughput",
                             stage_overhead_s=1e-3, time_limit=5, db=None)
    assert thr.baselines["all threads"] == pytest.approx(0.4 * thr.baselines["only a"])
    assert thr.plan.threads == threads
    with thr.pipeline() as pipe:  # called directly, on this thread
        assert pipe._direct is not None and not pipe._threads
        xs = [m.inputs] * 3
        for got, want in zip(pipe.run(xs), [lat.compile()(*x) for x in xs]):
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_cli_run_reports_every_baseline_measured_in_the_same_run(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "autoplace", "optimize", "--model", "zoo:mlp",
                        "--device", "cpu:0", "--device", "cpu:1", "--objective", "throughput",
                        "--run", "6", "--time-limit", "2", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    for key in ("sequential_inputs_per_s", "all_threads_inputs_per_s", "replicas_inputs_per_s",
                "measured_inputs_per_s"):
        assert rep[key] > 0, key
    assert rep["baselines_max_abs_err"] == {"all_threads": 0.0, "replicas": 0.0}
    assert {"only cpu0", "replicas"} <= set(rep["baselines_s"])


@pytest.mark.parametrize("cost, kept", [(1.0, True), (0.2, False)])
def test_replicas_must_beat_one_device_by_more_than_their_hand_offs_spread(cost, kept):
    from autoplace.report.baselines import HAND_OFF_SPREAD, guard, predict_baselines
    from autoplace.solve import Problem, solve

    # One op of `cost` s on either device, exact; a replica's hand-off 0.17 s. Replicas:
    # (cost + 0.17) / 2 s an input against `cost` on one device. At 1 s they gain 0.415 s; at
    # 0.2 s only 0.015 s, inside two sigma of the hand-offs' spread.
    p = Problem.build([[cost, cost]], stage_overhead_s=0.17)
    sp = np.zeros((1, 2))
    sol = solve(p, "throughput", "replicas")
    assert sol.value == pytest.approx((cost + 0.17) / 2)
    chosen, d = guard(p, sol, sp, predict_baselines(p, "throughput", sp), "replicas")
    # dv/dT_k = 1/4 for each of two replicas, each hand-off's sigma HAND_OFF_SPREAD * 0.17.
    assert d.plan_sigma_s == pytest.approx(np.sqrt(2) * 0.25 * HAND_OFF_SPREAD * 0.17)
    assert d.baseline == "only d0" and d.gain_s == pytest.approx(cost - sol.value)
    assert d.kept is kept and (chosen is None) is kept


def test_replicas_the_host_limits_rest_on_their_hand_offs_alone():
    from autoplace.report.baselines import HAND_OFF_SPREAD, value_sigma
    from autoplace.solve import Problem, solve

    # Whole model 0.1 s, hand-off 0.2 s: each replica 0.3 s, two 0.15 s, but the host hands
    # every input on, 0.2 s. Its sigma is that of the hand-offs, each on half the inputs.
    p = Problem.build([[0.1, 0.1]], stage_overhead_s=0.2)
    sol = solve(p, "throughput", "replicas")
    assert sol.value == pytest.approx(0.2)
    sigma, unknown = value_sigma(p, sol, np.full((1, 2), 0.5))
    assert sigma == pytest.approx(np.sqrt(2) * 0.5 * HAND_OFF_SPREAD * 0.2) and unknown == 0
