"""Latency plans run as segments, one worker per device: outputs, overlap, errors, the model."""

import threading
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm.script import ir as I
from tvm.script import relax as R

import autoplace
from autoplace import zoo
from autoplace.run import ConcurrentModel, PipelineError
from autoplace.solve import Problem, simulate_latency
from autoplace.solve.segments import concurrent_latency, segments, serial_latency

from test_compile import check_every_position_id_placement


# Two branches of the same work from one input, joined at the end.
@I.ir_module
class TwoBranches:
    @R.function
    def main(x: R.Tensor((192, 192), "float32"), w: R.Tensor((192, 192), "float32")):
        with R.dataflow():
            a1 = R.matmul(x, w)
            a2 = R.matmul(a1, w)
            a3 = R.matmul(a2, w)
            b1 = R.matmul(w, x)
            b2 = R.matmul(b1, x)
            b3 = R.matmul(b2, x)
            out = R.add(a3, b3)
            R.output(out)
        return out


def _reference(mod, inputs, devs):
    graph = autoplace.OpGraph.from_relax(mod)
    return autoplace.compile(mod, autoplace.place(graph, devs, [("*", devs[0].name)]))(*inputs)


def _two_branch_inputs(rng):
    return [(rng.standard_normal((192, 192)) / 14).astype("float32") for _ in range(2)]


def test_branches_on_two_devices_run_at_the_same_time(devs, rng, monkeypatch):
    # Each branch's segment (0 on a, 1 on b) waits inside its call until the other's has begun:
    # both are running at once by construction, whatever the host's load, and a runner that
    # ran them one after the other would leave the first waiting, and fail this test.
    from tvm import relax

    meet, missed = threading.Barrier(2), []

    class Meeting(relax.VirtualMachine):
        def __getitem__(self, name):
            fn = super().__getitem__(name)
            if name not in ("segment0", "segment1"):
                return fn

            def met(*args):
                try:
                    meet.wait(timeout=60)
                except threading.BrokenBarrierError:
                    missed.append(name)
                return fn(*args)

            return met

    monkeypatch.setattr(relax, "VirtualMachine", Meeting)
    graph = autoplace.OpGraph.from_relax(TwoBranches)
    plan = autoplace.Plan.from_assignment(graph, devs, ["a"] * 3 + ["b"] * 3 + ["a"])
    inputs = _two_branch_inputs(rng)
    with ConcurrentModel.from_plan(TwoBranches, plan) as run:
        assert run.segments == 3
        for _ in range(3):
            [out] = run(*inputs)
            assert not missed, f"{missed} waited 60 s for the other branch: run one at a time"
            np.testing.assert_allclose(out, _reference(TwoBranches, inputs, devs)[0], rtol=1e-4)
            first = {b.device: b for b in run.busy if b.segment < 2}
            assert set(first) == {"a", "b"}
            a, b = first["a"], first["b"]
            assert a.start_s < b.finish_s and b.start_s < a.finish_s, run.busy
            join = [x for x in run.busy if x.segment == 2]
            assert join and join[0].start_s >= max(a.finish_s, b.finish_s)


def test_every_placement_of_the_position_id_pattern_runs(devs, rng):
    """BERT's ``arange + offset`` position ids, on every two-device placement."""
    def run(mod, plan, *xs):
        with ConcurrentModel.from_plan(mod, plan) as model:
            return model(*xs)[0]

    check_every_position_id_placement(devs, rng, run)


@pytest.mark.parametrize("name", ["zoo:inception", "zoo:transformer"])
def test_optimized_plans_give_the_single_device_outputs(name, devs):
    model = zoo.from_spec(name)
    res = autoplace.optimize(model.mod, devs, db=None, time_limit=5)
    with ConcurrentModel.from_plan(res.source_mod, res.plan, order=res.solution.order) as run:
        outs = run(*model.inputs)
        again = run(*model.inputs)
    for o, r, o2 in zip(outs, _reference(model.mod, model.inputs, devs), again):
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6 * np.abs(r).max())
        np.testing.assert_array_equal(o, o2)


def test_a_failing_segment_raises_in_the_caller_and_the_model_goes_on(devs, rng):
    graph = autoplace.OpGraph.from_relax(TwoBranches)
    plan = autoplace.Plan.from_assignment(graph, devs, ["a"] * 3 + ["b"] * 3 + ["a"])
    inputs = _two_branch_inputs(rng)
    with ConcurrentModel.from_plan(TwoBranches, plan) as run:
        with pytest.raises(PipelineError, match="segment .* failed"):
            run(inputs[0], np.zeros((3, 3), "float32"))  # the wrong shape fails in a segment
        [out] = run(*inputs)
        np.testing.assert_allclose(out, _reference(TwoBranches, inputs, devs)[0], rtol=1e-4)
        with pytest.raises(TypeError, match="expected 2 inputs"):
            run(inputs[0])


def test_an_all_threads_plan_gives_its_one_worker_the_plans_threads(devs):
    """One device with ``plan.threads`` (the all-threads baseline): its worker has that many
    TVM threads over every core, as the single VM of that plan runs, not the device's share."""
    from autoplace.backend import process_cpus

    graph = autoplace.OpGraph.from_relax(TwoBranches)
    one = autoplace.Plan.from_assignment(graph, devs, ["a"] * len(graph.nodes))
    cores = tuple(process_cpus())
    with ConcurrentModel.from_plan(TwoBranches, replace(one, threads=2)) as run:
        assert run.threads == {"a": (min(2, len(cores)), cores)}
    with ConcurrentModel.from_plan(TwoBranches, replace(one, threads=2), num_threads=1) as run:
        assert run.threads == {"a": (1, cores)}


def test_closing_stops_the_workers(devs):
    graph = autoplace.OpGraph.from_relax(TwoBranches)
    plan = autoplace.Plan.from_assignment(graph, devs, ["a"] * 3 + ["b"] * 3 + ["a"])
    run = ConcurrentModel.from_plan(TwoBranches, plan)
    workers = [t for t in threading.enumerate() if t.name.startswith("autoplace-")]
    assert len(workers) >= 2
    run.close()
    assert not any(t.is_alive() for t in workers)
    with pytest.raises(PipelineError, match="closed"):
        run(np.zeros((192, 192), "float32"), np.zeros((192, 192), "float32"))


# ----------------------------------------------------------------------------- the model

def _random_dag(draw, n):
    edges = [(u, v) for v in range(1, n) for u in range(v) if draw(st.booleans())]
    return edges


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_segments_respect_data_and_device_order(data):
    n = data.draw(st.integers(1, 9))
    d = data.draw(st.integers(1, 3))
    edges = _random_dag(data.draw, n)
    a = np.array(data.draw(st.lists(st.integers(0, d - 1), min_size=n, max_size=n)))
    p = Problem.build(np.ones((n, d)), edges)
    seg = segments(p, a)
    for u, v in edges:
        assert seg[u] <= seg[v]  # a segment reads only from itself or lower ones
        if a[u] != a[v]:  # a result another device reads ends its segment
            assert not ((seg == seg[u]) & (np.arange(n) > u)).any()
    for s in np.unique(seg):
        assert np.unique(a[seg == s]).size == 1  # one device per segment


def test_with_no_overhead_the_concurrent_model_is_the_latency_model():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = 8
        edges = [(u, v) for v in range(1, n) for u in range(v) if rng.random() < 0.3]
        p = Problem.build(rng.random((n, 2)), edges, rng.random(n) * 1e3, alpha=1e-2, beta=1e5)
        a = rng.integers(0, 2, n)
        assert concurrent_latency(p, a).makespan == pytest.approx(
            simulate_latency(p, a).makespan)


def test_overhead_is_charged_once_per_segment():
    # Chain on devices 0, 1, 0: three segments of one node each.
    p = Problem.build(np.ones((3, 2)), [(0, 1), (1, 2)])
    assert concurrent_latency(p, [0, 1, 0], overhead=0.5).makespan == pytest.approx(4.5)
    assert concurrent_latency(p, [0, 0, 0], overhead=0.5).makespan == pytest.approx(3.5)
    assert serial_latency(p, [0, 1, 0]) == pytest.approx(3.0)
