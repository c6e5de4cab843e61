"""CPU + GPU on a machine that has a CUDA GPU: builds, pipelines and profiling really run there.

Skipped where TVM sees no CUDA device (CI has none); run them on a GPU machine with
``python -m pytest tests/test_cuda.py``.
"""

import time

import numpy as np
import pytest
import tvm

import autoplace
from autoplace import zoo
from autoplace.profile import LocalRunner
from autoplace.profile.measure import TimingPolicy, probe_module
from autoplace.run.pipeline import Pipeline

pytestmark = pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA GPU on this machine")

DEVS = [autoplace.Device.cpu(0), autoplace.Device.cuda(0)]


def _single(mod, graph, name):
    return autoplace.compile(mod, autoplace.place(graph, DEVS, [("*", name)]))


@pytest.mark.parametrize("name", ["mlp", "branchy_cnn", "resnet"])
def test_a_plan_alternating_cpu_and_gpu_gives_the_cpu_outputs(name):
    m = zoo.load(name)
    g = autoplace.OpGraph.from_relax(m.mod)
    alternating = [DEVS[i % 2].name for i in range(len(g.nodes))]
    mixed = autoplace.compile(m.mod, autoplace.Plan.from_assignment(g, DEVS, alternating))
    want = _single(m.mod, g, "cpu0")(*m.inputs)
    for got, ref in zip(mixed(*m.inputs), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "resnet"])
def test_a_cpu_and_gpu_pipeline_gives_the_single_device_outputs(name):
    m = zoo.load(name)
    res = autoplace.optimize(m.mod, DEVS, objective="throughput", time_limit=5)
    g = res.graph
    cut = len(g.nodes) // 2  # the solver may keep everything on the GPU: cut by hand too
    halves = autoplace.Plan.from_assignment(
        g, DEVS, ["cuda0"] * cut + ["cpu0"] * (len(g.nodes) - cut),
        stages=(0,) * cut + (1,) * (len(g.nodes) - cut), objective="throughput")
    rng = np.random.default_rng(0)
    xs = [[rng.standard_normal(a.shape).astype(a.dtype) for a in m.inputs] for _ in range(6)]
    single = _single(m.mod, g, "cpu0")
    for plan in (res.plan, halves):
        with Pipeline.from_plan(m.mod, plan) as pipe:
            outs = pipe.run(xs)
        for x, out in zip(xs, outs, strict=True):
            for got, want in zip(out, single(*x), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _assert_seconds_of_one_call(runner):
    """The probe's timing is in seconds of one call: all the calls timed fit in the seconds the
    timing took (a figure in ms is 1000 times over), on any host at any load."""
    t0 = time.perf_counter()
    t = runner.measure(probe_module(), TimingPolicy(min_repeat_ms=1, max_repeats=5))
    took = time.perf_counter() - t0
    assert 0 < t.min_s <= t.median_s and t.min_s * t.number * t.repeats <= took, (t, took)


def test_the_gpu_is_profiled_like_any_device():
    runner = LocalRunner(DEVS[1])
    runner.check()
    info = runner.info()
    assert info["kind"] == "cuda" and info["hardware"] != "absent"
    _assert_seconds_of_one_call(runner)


def test_the_overheads_of_the_gpu_and_the_cpu_are_measured():
    from autoplace.run.overhead import measure_overheads

    figures = measure_overheads(DEVS, rounds=1, max_stages=3, max_segments=3)
    own = {(f.device, f.kind): f.seconds for f in figures if f.peer is None}
    assert {k for _, k in own} == {"call", "stage", "segment", "kernel"}
    assert all(s >= 0 for s in own.values()) and own["cuda0", "stage"] > 0
    assert own["cuda0", "kernel"] > 0  # a GPU's kernels are launched one by one from the host
    assert {(f.device, f.peer) for f in figures if f.peer} == {("cpu0", "cuda0"),
                                                               ("cuda0", "cpu0")}


# ------------------------------------------------- PyTorch's kernels on the GPU: torch:cuda:0

def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA GPU")
    return torch


def _convnet():
    """(model, input, Relax module) of :class:`torch_models.ConvNet`, from PyTorch."""
    _torch_cuda()
    import torch_models

    model, x = torch_models.convnet()
    return model, x, autoplace.from_torch(model, [x])


TORCH_GPU = autoplace.Device.torch("cuda", 0)


def test_a_conv_on_pytorchs_gpu_and_its_fused_tail_on_tvms_gpu_match_one_device():
    torch = _torch_cuda()
    model, x, mod = _convnet()
    g = autoplace.OpGraph.from_relax(mod)
    devs = [*DEVS, TORCH_GPU]
    mixed = autoplace.place(g, devs, [("op:nn.conv2d", "torch-cuda0"),
                                      ("op:nn.layer_norm", "torch-cuda0"),
                                      ("op:nn.softmax", "torch-cuda0"), ("op:matmul", "cpu0"),
                                      ("*", "cuda0")])
    built = autoplace.compile(mod, mixed)
    text = str(built.mod)
    assert text.count("autoplace.torch_op.") == 3 and "R.nn.conv2d" not in text
    assert "R.nn.relu" in text  # the conv's bias add and relu stay a TVM kernel on the GPU
    got = built(x.numpy())[0]
    want = autoplace.compile(mod, autoplace.place(g, devs, [("*", "cpu0")]))(x.numpy())[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-6)


def test_ops_the_importer_lacks_run_on_pytorchs_gpu():
    # adaptive_max_pool2d, cdist and searchsorted, and nonzero (a shape the data gives), called
    # on the GPU's tensors from a build whose other ops run on the GPU.
    torch = _torch_cuda()

    import torch_models

    torch.manual_seed(0)
    model, x, y = torch_models.Lacking().eval(), torch.randn(1, 3, 8, 8), torch.randn(5, 64)
    mod = autoplace.from_torch(model, [x, y])
    res = autoplace.optimize(mod, [DEVS[1], TORCH_GPU], cost_model=autoplace.RooflineCostModel(),
                             calibrate=False, db=None)
    g = res.graph
    assert all(d == "torch-cuda0" for n, d in zip(g.nodes, res.plan.assignment) if n.is_torch)
    assert "runs in PyTorch (torch-cuda0)" in res.summary()
    run = res.compile(trial=False)
    for x2, y2 in ((x, y), (torch.randn(1, 3, 8, 8), torch.randn(5, 64))):
        with torch.no_grad():
            want = model(x2, y2)
        for got, ref in zip(run(x2.numpy(), y2.numpy()), want, strict=True):
            np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_the_solver_weighs_pytorchs_gpu_kernels_and_its_plan_runs():
    torch = _torch_cuda()
    model, x, mod = _convnet()
    res = autoplace.optimize(mod, [*DEVS, TORCH_GPU], calibrate=False, db=None)
    assert res.problem.serial and "torch-cuda0:" in res.summary()
    with torch.no_grad():
        np.testing.assert_allclose(res.compile()(x.numpy())[0], model(x).numpy(), rtol=1e-4,
                                   atol=1e-6)


def test_pytorchs_gpu_is_profiled_like_any_device():
    torch = _torch_cuda()
    from autoplace.profile.torch_timings import measure_handoff
    from autoplace.profile.torch_runner import TorchRunner

    runner = TorchRunner(TORCH_GPU)
    runner.check()
    info = runner.info()
    assert info["place"] == "cuda" and info["hardware"] == torch.cuda.get_device_name(0)
    _assert_seconds_of_one_call(runner)
    assert 0 <= measure_handoff(strict=True, place="cuda:0") < 1e-3
