"""Pipelined execution: stage split (skips, tuples, DAGs), numerics, ordering, errors, shutdown."""

import os
import threading

import numpy as np
import pytest
from tvm.script import ir as I
from tvm.script import relax as R

import autoplace
from autoplace import zoo
from autoplace.backend import in_own_thread, limit_tvm_threads, process_cpus
from autoplace.run.baseline import time_sequential
from autoplace.run.cores import stage_threads
from autoplace.run.pipeline import Pipeline, PipelineClosedError, PipelineError
from autoplace.run.split import split


# A -> B -> C, and C reads A too: "a" must travel from stage 0 to stage 2 past stage 1.
@I.ir_module
class Skip:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.exp(a)
            c = R.add(b, a)
            R.output(c)
        return c


# A tuple-valued node whose fields go to different stages, and a tuple of three results.
@I.ir_module
class Multi:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            parts = R.split(x, 2, axis=1)
            p0 = parts[0]
            p1 = parts[1]
            s = R.add(p0, p1)
            m = R.multiply(p0, p1)
            t = R.subtract(s, m)
            u = R.exp(p1)
            out = (t, u, s)
            R.output(out)
        return out


# A diamond of stages: 0 -> {1, 2} -> 3; stage 2 reads stage 0, not stage 1.
@I.ir_module
class Diamond:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.exp(a)
            c = R.multiply(a, y)
            d = R.add(b, c)
            R.output(d)
        return d


def _plan(mod, devs, devices, stages):
    g = autoplace.OpGraph.from_relax(mod)
    return autoplace.Plan.from_assignment(g, devs, devices, stages=tuple(stages),
                                          objective="throughput")


def _within(seconds, fn):
    """Run ``fn`` in a thread; fail if it takes longer than ``seconds`` (a hang), else return or
    raise what it did."""
    box = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: hung"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _inputs(arrays, n, rng):
    return [[rng.standard_normal(a.shape).astype(a.dtype) for a in arrays] for _ in range(n)]


def _assert_matches_single(mod, plan, devs, xs, **kwargs):
    g = autoplace.OpGraph.from_relax(mod)
    single = autoplace.compile(mod, autoplace.place(g, devs, [("*", "a")]))
    with Pipeline.from_plan(mod, plan, **kwargs) as pipe:
        outs = _within(30, lambda: pipe.run(xs))
    assert len(outs) == len(xs)
    for x, out in zip(xs, outs):  # in input order: each result is its own input's
        for got, want in zip(out, single(*x), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return pipe


# ----------------------------------------------------------------------------- split


def test_skip_connection_travels_past_the_middle_stage(devs, rng):
    plan = _plan(Skip, devs, ["a", "b", "a"], [0, 1, 2])
    st = split(Skip, plan)
    assert [(s.inputs, s.outputs) for s in st.stages] == [
        (("x",), ("a",)), (("a",), ("b",)), (("a", "b"), ("c",))]
    xs = _inputs([np.zeros((4, 8), "float32")], 5, rng)
    with Pipeline.from_plan(Skip, plan) as pipe:
        outs = _within(20, lambda: pipe.run(xs))
    for (x,), (out,) in zip(xs, outs):
        a = np.maximum(x, 0)
        np.testing.assert_allclose(out, np.exp(a) + a, rtol=1e-6)


def test_tuple_fields_cross_stages_as_tensors_and_stages_return_several(devs, rng):
    plan = _plan(Multi, devs, ["a", "a", "a", "b", "b"], [0, 0, 0, 1, 1])
    st = split(Multi, plan)
    # stage 0 sends one field of the split, and two tensors; s is also a model output.
    assert st.stages[0].outputs == ("parts[1]", "s", "m")
    assert st.stages[1].inputs == ("parts[1]", "s", "m")
    assert st.outputs == ("t", "u", "s")
    xs = _inputs([np.zeros((4, 8), "float32")], 4, rng)
    _assert_matches_single(Multi, plan, devs, xs)


def test_a_dag_of_stages(devs, rng):
    plan = _plan(Diamond, devs, ["a", "b", "a", "b"], [0, 1, 2, 3])
    st = split(Diamond, plan)
    assert [s.inputs for s in st.stages] == [("x",), ("a",), ("y", "a"), ("b", "c")]
    xs = _inputs([np.zeros((4, 8), "float32")] * 2, 6, rng)
    _assert_matches_single(Diamond, plan, devs, xs)


def test_split_leaves_the_module_unchanged(devs):
    before = Skip.script()
    split(Skip, _plan(Skip, devs, ["a", "b", "a"], [0, 1, 2]))
    assert Skip.script() == before


def test_a_node_before_its_input_stage_is_an_error(devs):
    with pytest.raises(autoplace.PlanError, match="'b' is in stage 0 but reads 'a'.*later stage 1"):
        split(Skip, _plan(Skip, devs, ["a", "a", "a"], [1, 0, 2]))


def test_a_stage_on_two_devices_and_a_plan_without_stages_are_errors(devs):
    with pytest.raises(autoplace.PlanError, match="stage 0 spans devices"):
        split(Skip, _plan(Skip, devs, ["a", "b", "a"], [0, 0, 1]))
    g = autoplace.OpGraph.from_relax(Skip)
    with pytest.raises(autoplace.PlanError, match="no stages"):
        split(Skip, autoplace.Plan.from_assignment(g, devs, ["a", "a", "a"]))


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("name", ["mlp", "branchy_cnn"])
def test_optimized_throughput_plans_match_the_single_device_build(name, devs, rng):
    # Free hand-offs, so that the solver cuts these small models into stages (replicas of the
    # whole model would beat any pipeline on two equal devices: not asked for here; nor one
    # device with both cores' threads, which the guard may return instead).
    m = zoo.load(name)
    res = autoplace.optimize(m.mod, devs, objective="throughput", time_limit=5,
                             stage_overhead_s=0.0, replicate=False, baseline_guard=False)
    assert len(set(res.plan.stages)) > 1
    pipe = _assert_matches_single(m.mod, res.plan, devs, _inputs(m.inputs, 8, rng))
    assert pipe.stats.inputs == 8 and len(pipe.stats.busy_s) == len(pipe.staged.stages)
    assert all(0 <= u for u in pipe.stats.utilisation)


def test_torch_resnet_in_three_stages_matches(devs, rng):
    pytest.importorskip("torch")
    m = zoo.load("resnet")
    n = len(autoplace.OpGraph.from_relax(m.mod).nodes)
    stages = [3 * i // n for i in range(n)]
    plan = _plan(m.mod, devs, ["ab"[s % 2] for s in stages], stages)
    _assert_matches_single(m.mod, plan, devs, _inputs(m.inputs, 4, rng), queue_size=1)


def test_a_stream_that_refills_its_buffers_gives_each_input_its_own_result(devs):
    # A camera-style source writes every frame into the same arrays. Stage 2 reads the model
    # input y after stage 0 has moved on to later frames: the pipeline must copy inputs when it
    # takes them. The arrays are 64-byte aligned, so TVM could take them over without a copy.
    def aligned():
        raw = np.zeros(32 + 16, "float32")
        start = (-raw.ctypes.data % 64) // 4
        return raw[start:start + 32].reshape(4, 8)

    x, y = aligned(), aligned()

    def frames():
        for k in range(12):
            x[:], y[:] = k, -k
            yield [x, y]

    plan = _plan(Diamond, devs, ["a", "b", "a", "b"], [0, 1, 2, 3])
    with Pipeline.from_plan(Diamond, plan, queue_size=4) as pipe:
        outs = _within(20, lambda: pipe.run(frames()))
    np.testing.assert_allclose([out[0][0, 0] for out in outs],
                               [np.exp(k) - k * k for k in range(12)], rtol=1e-6)


# ----------------------------------------------------------------------------- errors, shutdown


@pytest.fixture
def skip_pipe(devs):
    with Pipeline.from_plan(Skip, _plan(Skip, devs, ["a", "b", "a"], [0, 1, 2])) as pipe:
        yield pipe


def test_a_stage_that_raises_surfaces_in_the_caller_with_the_stage_named(skip_pipe, rng):
    xs = _inputs([np.zeros((4, 8), "float32")], 6, rng)
    xs[3] = [np.zeros((5, 8), "float32")]  # wrong shape: stage 0's VM rejects it
    with pytest.raises(PipelineError, match="stage 0 on a failed on input 3") as e:
        _within(20, lambda: skip_pipe.run(xs))
    assert e.value.stage == 0 and e.value.input_index == 3 and e.value.__cause__ is not None
    assert len(_within(20, lambda: skip_pipe.run(xs[:3]))) == 3  # still usable


def test_an_input_iterable_that_raises_midway(skip_pipe, rng):
    def gen():
        yield from _inputs([np.zeros((4, 8), "float32")], 5, rng)
        raise ValueError("source broke")

    with pytest.raises(ValueError, match="source broke"):
        _within(20, lambda: skip_pipe.run(gen()))
    with pytest.raises(TypeError, match="expected 1 arrays"):
        _within(20, lambda: skip_pipe.run([[np.zeros((4, 8), "float32")] * 2]))
    assert len(_within(20, lambda: skip_pipe.run(_inputs([np.zeros((4, 8), "float32")], 2, rng)))) == 2


@pytest.mark.parametrize("micro_batch", [1, 3, 8])
def test_micro_batches_keep_input_order_and_name_the_failing_input(devs, rng, micro_batch):
    # 7 inputs: with 3 per micro-batch the last batch is partial; with 8 there is one batch.
    plan = _plan(Skip, devs, ["a", "b", "a"], [0, 1, 2])
    xs = _inputs([np.zeros((4, 8), "float32")], 7, rng)
    _assert_matches_single(Skip, plan, devs, xs, micro_batch=micro_batch)
    with Pipeline.from_plan(Skip, plan, micro_batch=micro_batch) as pipe:
        bad = list(xs)
        bad[4] = [np.zeros((5, 8), "float32")]
        with pytest.raises(PipelineError, match="failed on input 4"):
            _within(20, lambda: pipe.run(bad))
        assert len(_within(20, lambda: pipe.run(xs))) == 7  # still usable
    with pytest.raises(ValueError, match="micro_batch must be at least 1"):
        Pipeline(split(Skip, plan), [None] * 3, micro_batch=0)


def _endless(taken: threading.Event, after: int = 5):
    """Inputs without end; sets ``taken`` once ``after`` of them have been taken (a pipeline is
    then running with inputs in it, however slowly the host runs it)."""
    n = 0
    while True:
        yield [np.ones((4, 8), "float32")]
        n += 1
        if n == after:
            taken.set()


def test_close_while_inputs_are_pending(devs):
    pipe = Pipeline.from_plan(Skip, _plan(Skip, devs, ["a", "b", "a"], [0, 1, 2]), queue_size=1)
    box, taken = {}, threading.Event()
    runner = threading.Thread(
        target=lambda: box.setdefault("e", _catch(lambda: pipe.run(_endless(taken)))))
    runner.start()
    assert taken.wait(60)
    _within(60, pipe.close)  # a close that waits on a worker hangs, and fails here
    runner.join(60)
    assert not runner.is_alive()
    assert isinstance(box["e"], PipelineClosedError)
    assert not any(t.is_alive() for t in pipe._threads)
    with pytest.raises(PipelineClosedError):
        pipe.run([[np.ones((4, 8), "float32")]])


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


def test_a_one_stage_plan_is_called_on_the_callers_thread(devs, rng):
    # What optimize returns when no pipeline is predicted to beat one device: no worker, same
    # results, errors and closing as a pipeline's.
    plan = _plan(Skip, devs, ["b"] * 3, [0, 0, 0])
    xs = _inputs([np.zeros((4, 8), "float32")], 5, rng)
    before = threading.active_count()
    _assert_matches_single(Skip, plan, devs, xs)
    with Pipeline.from_plan(Skip, plan) as pipe:
        assert threading.active_count() == before
        assert pipe.run(xs[:2])[1][0].shape == (4, 8) and pipe.stats.inputs == 2
        assert len(pipe.stats.busy_s) == 1 and 0 < pipe.stats.busy_s[0] <= pipe.stats.wall_s
        bad = list(xs)
        bad[3] = [np.zeros((5, 8), "float32")]
        with pytest.raises(PipelineError, match="stage 0 on b failed on input 3") as e:
            pipe.run(bad)
        assert e.value.input_index == 3 and e.value.__cause__ is not None

        def gen():
            yield xs[0]
            raise ValueError("source broke")

        with pytest.raises(ValueError, match="source broke"):
            pipe.run(gen())
        with pytest.raises(TypeError, match="expected 1 arrays"):
            pipe.run([xs[0] * 2])
    with pytest.raises(PipelineClosedError):
        pipe.run(xs)


def test_time_sequential_and_empty_runs(skip_pipe, rng):
    assert skip_pipe.run([]) == [] and skip_pipe.stats.inputs == 0
    outs, sec = time_sequential(lambda x: [x + 1], [[np.zeros(2)]] * 3)
    assert len(outs) == 3 and sec >= 0


def test_a_stage_thread_runs_on_its_cores_whatever_its_parent_was_pinned_to():
    """``config_threadpool(1, n)`` would pin the calling thread to core 0; ours puts it on the
    cores it is given, also when the thread that started it (``runtime.NumThreads`` pins its
    caller) was pinned elsewhere."""
    import tvm

    out = {}
    everything = set(process_cpus())

    def body(cores):
        limit_tvm_threads(1, cores)
        out[tuple(cores)] = (os.sched_getaffinity(0),
                             tvm.get_global_func("runtime.NumThreads")())

    def pinned_parent(cores):
        os.sched_setaffinity(0, {min(everything)})
        t = threading.Thread(target=body, args=(cores,))
        t.start()
        t.join()

    for cores in (sorted(everything), [max(everything)]):
        t = threading.Thread(target=pinned_parent, args=(cores,))
        t.start()
        t.join()
        assert out[tuple(cores)] == (set(cores), 1)


def _recorded_pool_configs(monkeypatch) -> list[tuple[str, int, int]]:
    """A list that ``runtime.config_threadpool`` calls are recorded in from now on: (thread
    name, mode, threads)."""
    import tvm

    configs = []
    real = tvm.get_global_func

    def recording(name, *args, **kwargs):
        fn = real(name, *args, **kwargs)
        if name != "runtime.config_threadpool":
            return fn
        return lambda *a: configs.append((threading.current_thread().name, a[0], a[1])) or fn(*a)

    monkeypatch.setattr(tvm, "get_global_func", recording)
    return configs


def test_a_compiled_model_sets_up_its_callers_pool_once_and_leaves_a_workers_alone(monkeypatch):
    """The caller's thread gets TVM's default count in the mode stages run with (not TVM's
    "big cores" default, which pins it to core 0), once; a thread autoplace set up keeps its
    pool."""
    from autoplace.backend import own_pool, threads

    configs = _recorded_pool_configs(monkeypatch)
    m = zoo.load("mlp")
    run = autoplace.compile(m.mod, autoplace.place(autoplace.OpGraph.from_relax(m.mod),
                                                   [autoplace.Device.cpu(0)], [("*", "cpu0")]))
    default = threads.tvm_threads()
    out = {}

    def caller():
        mine = os.sched_getaffinity(0)
        run(*m.inputs)
        run(*m.inputs)
        out["calls"] = list(configs)
        out["caller"] = (own_pool(), os.sched_getaffinity(0) == mine)

    def worker():
        limit_tvm_threads(2, process_cpus())
        run(*m.inputs)
        out["worker"] = own_pool()

    for name, body in (("caller", caller), ("worker", worker)):
        t = threading.Thread(target=body, name=name)
        t.start()
        t.join()
    assert out == {"calls": [("caller", -3, default)], "caller": (default, True), "worker": 2}
    assert configs == [("caller", -3, default), ("worker", -3, 2)]


def test_in_own_thread_keeps_the_callers_affinity_and_raises_what_fn_raised():
    mine = os.sched_getaffinity(0)

    def pin():
        os.sched_setaffinity(0, {min(mine)})
        return os.sched_getaffinity(0)

    assert in_own_thread(pin) == {min(mine)} and os.sched_getaffinity(0) == mine
    with pytest.raises(ZeroDivisionError):
        in_own_thread(lambda: 1 / 0)


def test_settle_returns_once_the_workers_of_an_ended_pool_stop_spinning():
    """A pool's workers spin on after the thread that owned it has ended; settle waits them
    out, so that the next timing has the cores to itself."""
    import resource
    import time

    from autoplace.backend import settle

    m = zoo.load("inception")  # parallel kernels: the pool starts its workers
    run = autoplace.compile(m.mod, autoplace.place(autoplace.OpGraph.from_relax(m.mod),
                                                   [autoplace.Device.cpu(0)], [("*", "cpu0")]))

    def work():
        limit_tvm_threads(2, process_cpus())
        for _ in range(20):
            run(*m.inputs)

    in_own_thread(work)
    # Returned as the process went quiet, before its limit (a loaded host's workers spin on
    # longer in wall time); then this process's own CPU-seconds, which other processes' load
    # does not add to, stay under half of a quiet window's (spinning workers take a core each).
    limit, window = 120.0, 0.2
    waited = settle(max_s=limit)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(window)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    busy = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    assert waited < limit and busy < 0.5 * window, (waited, busy)


def test_cpu_devices_split_the_cores_and_tvm_threads(monkeypatch):
    from autoplace.backend import threads

    cpu0, cpu1, gpu = autoplace.Device.cpu(0), autoplace.Device.cpu(1), autoplace.Device.cuda(0)
    monkeypatch.setattr(threads, "tvm_threads", lambda: 8)
    cores = list(range(16))
    assert stage_threads([cpu0, gpu, cpu0], cpus=cores) == [(8, tuple(cores)), None,
                                                            (8, tuple(cores))]
    assert stage_threads([cpu1, cpu0, gpu], cpus=cores) == [(4, tuple(range(8, 16))),
                                                            (4, tuple(range(8))), None]
    monkeypatch.setattr(threads, "tvm_threads", lambda: 1)
    assert stage_threads([cpu0, cpu1], cpus=[0, 1]) == [(1, (0,)), (1, (1,))]
    assert stage_threads([cpu0, cpu1, autoplace.Device.cpu(2)], cpus=[0, 1]) == [
        (1, (0,)), (1, (1,)), (1, (0,))]  # more devices than cores: they share
    assert stage_threads([cpu0, gpu], num_threads=3, cpus=[0, 1]) == [(2, (0, 1)), None]
    assert stage_threads([gpu]) == [None]
    with pytest.raises(ValueError, match="at least 1"):
        stage_threads([cpu0], num_threads=0)


# ----------------------------------------------------------------------------- stage overhead


def test_measure_stage_overhead_fits_a_line_through_its_timings(devs):
    import inspect

    import autoplace.run.pipeline as pipeline
    from autoplace.run.overhead import measure_stage_overhead

    fit = measure_stage_overhead(devs, max_stages=3, inputs=20, rounds=1)
    assert fit.devices == ("a", "b") and len(fit.seconds) == 3 and min(fit.seconds) > 0
    # Two pipelines (2 and 3 stages): the line goes through both; one stage is a direct call.
    line = fit.fixed_s + fit.per_stage_s * np.arange(2, 4)
    np.testing.assert_allclose(line, fit.seconds[1:], rtol=1e-9)
    assert "us * stages" in str(fit)
    # Measured as a pipeline runs by default: inputs handed on in micro-batches.
    default = inspect.signature(Pipeline).parameters["micro_batch"].default
    assert fit.micro_batch == pipeline.MICRO_BATCH == default > 1
    fit1 = measure_stage_overhead(devs, max_stages=3, inputs=20, rounds=1, micro_batch=1)
    assert fit1.micro_batch == 1
    with pytest.raises(ValueError, match="max_stages >= 3"):
        measure_stage_overhead(devs, max_stages=2)


class _FlatCosts:
    """The same seconds for every op on every device."""

    def __init__(self, seconds):
        self.seconds = seconds

    def predict(self, graph, device):
        return np.full(len(graph.nodes), self.seconds)


def test_the_stage_overhead_makes_optimize_cut_fewer_stages(devs):
    # mlp: without a hand-off the solver cuts 12 tiny ops into stages (each pays its call);
    # at 1 ms per stage (more than the whole model) calling it on one device pays best.
    # (Replicas of the whole model would beat both: not asked for here.) The costs are given,
    # 20 us an op on either device, so that the plans do not depend on this host's CPU.
    m = zoo.load("mlp")
    flat = _FlatCosts(20e-6)
    free = autoplace.optimize(m.mod, devs, objective="throughput", stage_overhead_s=0.0,
                              contiguous=False, replicate=False, cost_model=flat, db=None)
    costly = autoplace.optimize(m.mod, devs, objective="throughput", stage_overhead_s=1e-3,
                                contiguous=False, cost_model=flat, db=None)
    assert len(set(free.plan.stages)) > 1 and len(set(costly.plan.stages)) == 1
    assert costly.problem.stage_overhead_s.tolist() == [1e-3, 1e-3]
    # one stage, called directly: its ops and its device's call
    assert costly.predicted_latency_s == pytest.approx(
        (costly.problem.cost.sum(axis=0) + costly.problem.call_s).min())
    default = autoplace.optimize(m.mod, devs, objective="throughput")
    assert (default.problem.stage_overhead_s > 0).all()
    assert len(set(default.plan.stages)) <= len(devs)  # one stage per device by default
    capped = autoplace.optimize(m.mod, devs, objective="throughput", stage_overhead_s=0.0,
                                max_stages=2, contiguous=False)
    assert len(set(capped.plan.stages)) <= 2
    with pytest.raises(ValueError, match="objective='throughput'"):
        autoplace.optimize(m.mod, devs, stage_overhead_s=0.0)
    with pytest.raises(ValueError, match="unknown device"):
        autoplace.optimize(m.mod, devs, objective="throughput", stage_overhead_s={"c": 1e-4})


def test_pipeline_stats_print_with_units():
    from autoplace.run.pipeline import PipelineStats

    stats = PipelineStats(inputs=32, wall_s=0.4, busy_s=(0.3, 0.1))
    assert str(stats) == "32 inputs in 0.4 s: 80.0 inputs/s; stages busy 0.3 s (75%), 0.1 s (25%)"


# ----------------------------------------------------------------------------- replicas


def _replicated(mod, devs, replicas=("a", "b")):
    g = autoplace.OpGraph.from_relax(mod)
    n = len(g.nodes)
    return autoplace.Plan.from_assignment(g, devs, [replicas[0]] * n, stages=(0,) * n,
                                          objective="throughput", replicas=tuple(replicas))


def test_replicas_run_the_whole_model_on_each_device_in_input_order(devs, rng):
    m = zoo.load("branchy_cnn")
    before = threading.active_count()
    pipe = _assert_matches_single(m.mod, _replicated(m.mod, devs, ("b", "a")), devs,
                                  _inputs(m.inputs, 12, rng))
    assert [d.name for _, d in pipe.workers] == ["b", "a"]
    assert pipe.stats.inputs == 12 and pipe.stats.workers == "replicas"
    assert len(pipe.stats.busy_s) == 2 and sum(pipe.stats.busy_s) > 0
    assert "replicas busy" in str(pipe.stats)
    assert threading.active_count() == before  # its two workers stopped when it closed


def test_a_replica_that_raises_surfaces_in_the_caller_and_nothing_hangs(devs, rng):
    xs = _inputs([np.zeros((4, 8), "float32")], 8, rng)
    with Pipeline.from_plan(Skip, _replicated(Skip, devs)) as pipe:
        assert len(pipe._threads) == 2
        bad = list(xs)
        bad[5] = [np.zeros((5, 8), "float32")]
        with pytest.raises(PipelineError, match="stage 0 on [ab] failed on input 5") as e:
            _within(20, lambda: pipe.run(bad))
        assert e.value.input_index == 5 and e.value.__cause__ is not None

        def gen():
            yield from xs[:3]
            raise ValueError("source broke")

        with pytest.raises(ValueError, match="source broke"):
            _within(20, lambda: pipe.run(gen()))
        with pytest.raises(TypeError, match="expected 1 arrays"):
            _within(20, lambda: pipe.run([xs[0] * 2]))
        outs = _within(20, lambda: pipe.run(xs))  # still usable
        for (x,), (out,) in zip(xs, outs):
            a = np.maximum(x, 0)
            np.testing.assert_allclose(out, np.exp(a) + a, rtol=1e-6)

    pipe = Pipeline.from_plan(Skip, _replicated(Skip, devs), queue_size=1)
    box, taken = {}, threading.Event()
    runner = threading.Thread(
        target=lambda: box.setdefault("e", _catch(lambda: pipe.run(_endless(taken)))))
    runner.start()
    assert taken.wait(60)
    _within(60, pipe.close)
    runner.join(60)
    assert not runner.is_alive() and isinstance(box["e"], PipelineClosedError)
    assert not any(t.is_alive() for t in pipe._threads)


def test_a_plan_with_threads_runs_on_the_callers_thread_with_that_many(devs, rng):
    from autoplace.backend import threads as pools

    g = autoplace.OpGraph.from_relax(Skip)
    plan = autoplace.Plan.from_assignment(g, devs, ["a"] * 3, stages=(0,) * 3,
                                          objective="throughput", threads=2)
    before = threading.active_count()
    out = {}

    def caller():
        with Pipeline.from_plan(Skip, plan) as pipe:
            out["workers"] = threading.active_count() - before - 1  # this thread aside
            out["first"] = pipe.run(_inputs([np.zeros((4, 8), "float32")], 2, rng))
            out["pool"] = pools._pool.threads

    t = threading.Thread(target=caller)
    t.start()
    t.join()
    assert out["workers"] == 0 and out["pool"] == 2 and len(out["first"]) == 2
    _assert_matches_single(Skip, plan, devs, _inputs([np.zeros((4, 8), "float32")], 5, rng))
    with pytest.raises(ValueError, match="threads is for a model of one stage"):
        Pipeline(split(Skip, _plan(Skip, devs, ["a", "b", "a"], [0, 1, 2])), [None] * 3,
                 threads=2)
    with pytest.raises(ValueError, match="replicas run a model of one stage"):
        Pipeline(split(Skip, _plan(Skip, devs, ["a", "b", "a"], [0, 1, 2])), [None] * 3,
                 replicas=devs)


def test_own_pool_gives_a_plans_count_and_then_the_default_back(monkeypatch):
    """A compiled model with ``threads`` sets its caller's pool to that count; one without sets
    TVM's default back, unless limit_tvm_threads set the thread up (a worker keeps its pool)."""
    from autoplace.backend import own_pool, threads as pools

    configs = _recorded_pool_configs(monkeypatch)
    default = pools.tvm_threads()
    seen = {}

    def caller():
        seen["calls"] = [own_pool(), own_pool(default + 1), own_pool(default + 1), own_pool()]
        limit_tvm_threads(default + 2, process_cpus())
        seen["worker"] = own_pool()

    in_own_thread(caller)
    assert seen == {"calls": [default, default + 1, default + 1, default],
                    "worker": default + 2}
    assert [n for _, _, n in configs] == [default, default + 1, default, default + 2]


# Returns its input as it is and a constant beside a result computed from it.
@I.ir_module
class Echo:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            R.output(a)
        return (x, a, R.const(np.full((2,), 3.0, "float32")))


def test_replicas_keep_each_input_apart_from_the_next(devs, rng):
    # A replica copies each input into a tensor it keeps for the next: the inputs of the
    # second model are handed back as outputs, so they must not be overwritten.
    xs = _inputs([np.zeros((4, 8), "float32")], 24, rng)
    for mod in (Skip, Echo):
        with Pipeline.from_plan(mod, _replicated(mod, devs)) as pipe:
            outs = _within(20, lambda: pipe.run(xs))
        assert len(outs) == len(xs)
        for (x,), out in zip(xs, outs):
            a = np.maximum(x, 0)
            want = [np.exp(a) + a] if mod is Skip else [x, a, np.full((2,), 3.0, "float32")]
            assert len(out) == len(want)
            for got, w in zip(out, want):
                np.testing.assert_allclose(got, w, rtol=1e-6)


def test_a_one_stage_plan_returns_inputs_and_constants_as_the_model_does(devs, rng):
    import tvm

    xs = _inputs([np.zeros((4, 8), "float32")], 5, rng)
    # A build of one result returns it bare (no tuple of one to index on every call).
    with Pipeline.from_plan(Skip, _plan(Skip, devs, ["b"] * 3, [0] * 3)) as pipe:
        fn, dev = pipe._direct
        assert isinstance(fn(tvm.runtime.tensor(xs[0][0], dev)), tvm.runtime.Tensor)
        for (x,), (out,) in zip(xs, pipe.run(xs)):
            a = np.maximum(x, 0)
            np.testing.assert_allclose(out, np.exp(a) + a, rtol=1e-6)
    with Pipeline.from_plan(Echo, _plan(Echo, devs, ["b"], [0])) as pipe:
        assert pipe._direct is not None  # called on this thread, no worker
        outs = pipe.run(xs)
    for (x,), (echo, a, c) in zip(xs, outs):
        np.testing.assert_array_equal(echo, x)
        np.testing.assert_allclose(a, np.maximum(x, 0), rtol=1e-6)
        np.testing.assert_array_equal(c, np.full((2,), 3.0, "float32"))
        assert echo is not x  # a copy, as every output is
