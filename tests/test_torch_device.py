"""PyTorch as a placement target: ops the Relax importer lacks run as PyTorch calls from the VM,
on a torch device (issue 42)."""

import re
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import autoplace  # noqa: E402
from autoplace import Device, RooflineCostModel  # noqa: E402
from autoplace.annotate import annotate_lifted  # noqa: E402
from autoplace.backend import torch_bridge  # noqa: E402
from autoplace.backend.torch_calls import fold_batch_norm  # noqa: E402
from autoplace.graph import OpGraph  # noqa: E402
from autoplace.graph.chains import chain_activation, fused_chains  # noqa: E402
from autoplace.predict.torch_costs import TorchCostModel  # noqa: E402
from autoplace.profile.torch_timings import time_torch_device  # noqa: E402
from autoplace.profile import DeviceUnavailable  # noqa: E402

import torch_models  # noqa: E402
from fastest import fastest_call_s  # noqa: E402


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 3, 8, 8, generator=g), torch.randn(5, 64, generator=g)


@pytest.fixture(scope="module")
def lacking():
    model = torch_models.Lacking().eval()
    x, y = _inputs()
    mod = autoplace.from_torch(model, [x, y])
    res = autoplace.optimize(mod, [Device.cpu(0)], cost_model=RooflineCostModel(),
                             calibrate=False, db=None)
    return model, mod, res


def test_ops_the_importer_lacks_become_pytorch_calls(lacking):
    _, mod, _ = lacking
    g = OpGraph.from_relax(mod)
    torch_ops_seen = {n.op_type for n in g.nodes if n.is_torch}
    # nonzero's float() and sum read a tensor whose shape depends on the data: PyTorch too
    assert torch_ops_seen == {"torch.adaptive_max_pool2d", "torch._cdist_forward",
                              "torch.searchsorted", "torch.nonzero", "torch._to_copy",
                              "torch.sum"}
    assert {"nn.conv2d", "nn.relu", "add"} <= {n.op_type for n in g.nodes}
    # the data-dependent op is sized at the example input: 1 x 3 x 8 x 8 elements, 4-d indices
    nz = next(n for n in g.nodes if n.op_type == "torch.nonzero")
    assert nz.outputs[0].shape[1] == 4 and 0 < nz.outputs[0].shape[0] <= 192


def test_plan_pins_pytorch_calls_to_an_added_torch_device(lacking):
    _, mod, res = lacking
    assert [d.name for d in res.plan.devices] == ["cpu0", "torch"]
    g = res.graph
    for n, dev in zip(g.nodes, res.plan.assignment):
        assert dev == ("torch" if n.is_torch else "cpu0"), n.name
    summary = res.summary()
    assert "runs in PyTorch (torch), 6 op(s): the importer lacks aten._cdist_forward, " \
        "aten.adaptive_max_pool2d, aten.nonzero, aten.searchsorted; aten._to_copy, aten.sum give " \
        "or read a tensor whose shape depends on the data" in summary
    assert "hand-off from the VM" in summary
    text = str(res.explain())
    assert "runs in PyTorch: the importer lacks aten.searchsorted" in text and "torch-timed" in text


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_build_matches_pytorch(lacking, seed):
    model, _, res = lacking
    run = res.compile(trial=False)
    x, y = _inputs(seed)  # seed 1: another count of nonzero elements than the example's
    with torch.no_grad():
        want = [t.numpy() for t in model(x, y)]
    got = run(x.numpy(), y.numpy())
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_data_dependent_output_and_unique_run_end_to_end():
    class Unique(torch.nn.Module):
        def forward(self, x):
            # masked_select: the importer has it, but its output's shape depends on the data
            return (torch.unique(x.round()) * 2, torch.nonzero(x > 0),
                    torch.masked_select(x, x > 0).sum())

    x = torch.randn(6, 5)
    mod = autoplace.from_torch(Unique(), [x])
    res = autoplace.optimize(mod, [Device.cpu(0)], cost_model=RooflineCostModel(),
                             calibrate=False, db=None)
    run = res.compile(trial=False)
    for seed in (0, 3):
        z = torch.randn(6, 5, generator=torch.Generator().manual_seed(seed)) * (seed + 1)
        want = [t.numpy() for t in Unique()(z)]
        got = run(z.numpy())
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_an_op_raising_in_pytorch_names_it():
    class Sample(torch.nn.Module):
        def forward(self, p):
            return torch.multinomial(p, 2)

    p = torch.rand(3, 5)
    mod = autoplace.from_torch(Sample(), [p])
    run = autoplace.optimize(mod, [Device.cpu(0)], cost_model=RooflineCostModel(),
                             calibrate=False, db=None).compile(trial=False)
    with pytest.raises(Exception, match=r"PyTorch op aten\.multinomial\.default .*raised "
                                        r"RuntimeError: probability tensor"):
        run(-p.numpy())
    assert run(p.numpy())[0].shape == (3, 2)  # the model still runs after


def test_pytorch_calls_are_registered_by_a_stable_id(lacking):
    _, mod, _ = lacking
    names = {op.id for op in torch_bridge.registered()}
    again = autoplace.from_torch(torch_models.Lacking().eval(), list(_inputs()))
    assert {op.id for op in torch_bridge.registered()} == names  # same model: same ids, none new
    assert torch_bridge.missing(["autoplace.torch_op.0000", "other"]) == ["autoplace.torch_op.0000"]
    assert OpGraph.from_relax(again).summary() == OpGraph.from_relax(mod).summary()


def test_torch_device_specs():
    assert Device.torch().name == "torch" and Device.torch().runtime == "torch"
    assert Device.torch("cuda", 0).name == "torch-cuda0"
    assert Device.from_spec("torch:cpu") == Device.torch()
    assert Device.from_spec("torch:cuda:1") == Device.torch("cuda", 1)
    assert Device.torch().spec == "torch:cpu" and Device.torch("cuda", 1).spec == "torch:cuda:1"
    assert Device.from_dict(Device.torch().to_dict()) == Device.torch()
    assert Device.torch().tvm_device() == Device.cpu(0).tvm_device()  # host memory, shared
    assert Device.torch().can_run("nn.conv2d") and Device.torch().can_run("torch.cdist")
    assert not Device.torch().can_run("nn.conv3d")
    assert not Device.torch(fallback_only=True).can_run("nn.conv2d")
    assert not Device.cpu(0).can_run("torch.cdist")
    assert autoplace.Link.default(Device.cpu(0), Device.torch()).time(1e6) == 0
    with pytest.raises(ValueError, match="torch"):
        Device.from_spec("torch:tpu")


def test_torch_costs_are_timed_and_charged(lacking):
    _, mod, res = lacking
    g = OpGraph.from_relax(mod)
    calls_only = Device.torch(fallback_only=True)
    timings = time_torch_device(g, calls_only, handoff_s=5e-6)
    model = TorchCostModel(timings)
    cost = model.predict(g, calls_only)
    torch_nodes = [n.index for n in g.nodes if n.is_torch]
    assert np.isfinite(cost[torch_nodes]).all() and (cost[torch_nodes] > 5e-6).all()
    assert np.isinf(np.delete(cost, torch_nodes)).all()
    assert len(timings.calls) == len({g.nodes[i].workload_key for i in torch_nodes})
    assert np.isinf(model.predict(g, Device.cpu(0))).all()
    # a torch device that takes ordinary ops too: those with an equivalent (conv, add, relu)
    every = TorchCostModel(time_torch_device(g, Device.torch(), handoff_s=5e-6)).predict(
        g, Device.torch())
    kinds = {n.op_type: np.isfinite(every[n.index]) for n in g.nodes}
    assert kinds["nn.conv2d"] and kinds["nn.relu"] and kinds["greater"] and not kinds["arange"]
    # the plan charges them: the torch column of the solver's costs, hand-off included
    k = [d.name for d in res.plan.devices].index("torch")
    assert np.isfinite(res.problem.cost[torch_nodes, k]).all()
    assert np.isinf(res.problem.cost[torch_nodes, 0]).all()


def test_torch_device_without_pytorch_is_one_line_and_exit_2(monkeypatch, capsys):
    import sys

    from autoplace.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert main(["optimize", "--model", "zoo:mlp", "--device", "cpu:0",
                 "--device", "torch:cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PyTorch is not installed: pip install" in err[0]


def test_a_saved_module_with_pytorch_calls_loads_where_they_are_registered(tmp_path, monkeypatch):
    class Cdist(torch.nn.Module):
        def forward(self, a, b):
            return torch.cdist(a, b).relu()

    a, b = torch.randn(4, 8), torch.randn(3, 8)
    m = autoplace.optimize_module(Cdist(), (a, b), [Device.cpu(0)], eager_fallback=False,
                                  cost_model=RooflineCostModel(), calibrate=False, db=None)
    torch.testing.assert_close(m(a, b), torch.cdist(a, b).relu())
    m.save(tmp_path / "m.apmod")
    torch.testing.assert_close(autoplace.load_module(tmp_path / "m.apmod")(a, b),
                               torch.cdist(a, b).relu())
    monkeypatch.setattr(torch_bridge, "_REGISTRY", {})  # another process: nothing registered
    with pytest.raises(ValueError, match="PyTorch op.*not registered.*import the same model"):
        autoplace.load_module(tmp_path / "m.apmod")


def test_what_is_not_built_yet_says_so(lacking):
    _, mod, res = lacking
    with pytest.raises(ValueError, match="objective='latency'"):
        autoplace.optimize(mod, [Device.cpu(0)], objective="throughput",
                           cost_model=RooflineCostModel(), calibrate=False, db=None)
    with pytest.raises(ValueError, match=r"concurrent=False"):
        res.compile(concurrent=True)
    if not torch.cuda.is_available():  # timed here, so present whatever check_devices says
        with pytest.raises(DeviceUnavailable, match="torch:cuda:0: PyTorch finds no CUDA GPU 0"):
            autoplace.optimize(mod, [Device.cpu(0), Device.torch("cuda", 0)],
                               check_devices=False, cost_model=RooflineCostModel(),
                               calibrate=False, db=None)
    # a TVM op and no TVM device: one line naming the op
    with pytest.raises(autoplace.InfeasibleError, match=r"node '\w+' \(arange\) can run on no "
                                                        r"device: torch has no PyTorch equivalent"):
        autoplace.optimize(mod, [Device.torch()], cost_model=RooflineCostModel(),
                           calibrate=False, db=None)


# ----------------------------------------------------------------- Relax ops placed on PyTorch

@pytest.fixture(scope="module")
def convnet():
    model, x = torch_models.convnet()
    return model, x, autoplace.from_torch(model, [x])


def test_a_conv_on_pytorch_and_its_fused_tail_on_tvm_matches_one_device(convnet):
    model, x, mod = convnet
    g = OpGraph.from_relax(mod)
    devs = [Device.cpu(0), Device.torch()]
    mixed = autoplace.place(g, devs, [("op:nn.conv2d", "torch"), ("op:nn.layer_norm", "torch"),
                                      ("op:matmul", "torch"), ("op:nn.softmax", "torch"),
                                      ("*", "cpu0")])
    assert mixed.assignment[g.index(next(n.name for n in g.nodes if n.op_type == "add"))] == "cpu0"
    one = autoplace.place(g, devs, [("*", "cpu0")])
    got = autoplace.compile(mod, mixed)(x.numpy())[0]
    want = autoplace.compile(mod, one)(x.numpy())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-6)
    # annotate wrote the conv as a call into PyTorch, its bias add and relu as Relax ops
    text = str(autoplace.annotate(mod, mixed))
    assert text.count("autoplace.torch_op.") == 4 and "R.nn.conv2d" not in text
    assert "R.nn.relu" in text


#: cpu0 stated at a tenth of roofline's untuned-TVM peak (0.4 GFLOP/s): roofline charges its
#: conv of ``convnet`` 1.5 ms, over ten times what PyTorch's call measures on any host at any
#: load (at the untuned peak it charges 0.15 ms, which a loaded host's PyTorch can exceed).
SLOW_CPU = Device.cpu(0, peak_flops=4e8)


def test_the_solver_puts_ops_on_pytorch_where_they_cost_less(convnet):
    # The conv goes to PyTorch, a reshape (free on TVM) stays.
    model, x, mod = convnet
    res = autoplace.optimize(mod, [SLOW_CPU, Device.torch()], cost_model=RooflineCostModel(),
                             calibrate=False, db=None, baseline_guard=False)
    where = {n.op_type: d for n, d in zip(res.graph.nodes, res.plan.assignment)}
    assert where["nn.conv2d"] == "torch"
    assert "torch-timed" in res.plan.cost_sources[0]
    with torch.no_grad():
        np.testing.assert_allclose(res.compile(trial=False)(x.numpy())[0], model(x).numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_a_plan_with_pytorch_calls_is_solved_as_one_thread_runs_it(convnet):
    # The VM runs TVM's kernels and PyTorch's calls one after another, so the solver sums them:
    # nothing overlaps, and where the hand-offs between the two are free (shared memory: the
    # call's own hand-off is in its cost), each op goes where it costs least.
    model, x, mod = convnet
    res = autoplace.optimize(mod, [Device.cpu(0), Device.torch()], cost_model=RooflineCostModel(),
                             calibrate=False, db=None, baseline_guard=False)
    p = res.problem
    assert p.serial and res.delivery.runner == "vm"
    a = np.array([p.device_names.index(d) for d in res.plan.assignment])
    chosen = p.cost[np.arange(len(a)), a]
    assert not np.isinf(p.cost).all(axis=1).any()
    # each op, or each chain run as one call (a colocation group), where it costs least
    alone = p.groups < 0
    np.testing.assert_allclose(chosen[alone], p.cost[alone].min(axis=1), rtol=1e-5, atol=1e-9)
    for g in np.unique(p.groups[~alone]):
        members = p.groups == g
        assert chosen[members].sum() == pytest.approx(p.cost[members].sum(axis=0).min(),
                                                      rel=1e-5, abs=1e-9)
    assert res.solution.value == pytest.approx(chosen.sum(), rel=1e-9)
    assert res.predicted_latency_s == pytest.approx(res.delivery.serial_s, rel=1e-9)
    # the solver's bound, which the benchmark's room divides by: no plan over these costs is
    # predicted faster, and it is at least each op on its cheapest device
    assert res.solution.bound >= p.cost.min(axis=1).sum() * (1 - 1e-9)
    assert res.solution.bound <= res.solution.value * (1 + 1e-9)


def test_timing_ordinary_ops_on_pytorch_waits_once_for_tvms_pool(convnet, monkeypatch,
                                                                  tmp_path):
    # A model without importer fallbacks: its torch-device costs are all equivalent Relax ops.
    import autoplace.backend as backend

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))  # nothing kept by other tests

    waits = []
    monkeypatch.setattr(backend, "settle", lambda **kw: waits.append(kw) or 0.0)
    g = OpGraph.from_relax(convnet[2])
    assert not any(n.is_torch for n in g.nodes)
    timings = time_torch_device(g, Device.torch(), handoff_s=5e-6)
    assert len(waits) == 1 and timings.calls
    prof = _profile_of(timings)
    time_torch_device(g, Device.torch(), handoff_s=5e-6, profile=prof)  # nothing to time
    assert len(waits) == 1


def test_a_call_is_charged_what_it_costs_in_the_models_sequence(convnet, monkeypatch):
    # Timed alone, a call runs the same code again and again; in the model the next call is
    # another op's. Each is charged its share of what the calls took one after another beyond
    # their times alone.
    from autoplace.profile import torch_timings

    g = OpGraph.from_relax(convnet[2])
    dev = Device.torch()
    timings = time_torch_device(g, dev, handoff_s=5e-6)
    model = TorchCostModel(timings)
    cost = model.predict(g, dev)
    runs = [n for n in g.nodes if np.isfinite(cost[n.index])]
    extra = timings.in_sequence_s
    assert extra >= 0.0 and "in the model's sequence" in model.describe(g)
    from autoplace.profile.host_cache import cpu_cache_bytes

    mb = f"{cpu_cache_bytes() / 2**20:.3g} MB"  # the cache the timing's copies fill, named
    assert f"timed here on copies filling twice the {mb} last-level cache" in model.describe(g)
    for n in runs:
        assert cost[n.index] == pytest.approx(timings.calls[n.workload_key] + 5e-6 + extra)

    # the sequence itself: every node with a call, in order, on inputs of its own
    from autoplace.profile import torch_runner

    seconds, excess, ran = torch_runner.time_in_sequence(runs)
    assert seconds > 0 and np.isfinite(excess) and ran == [n.index for n in runs]
    monkeypatch.setattr(torch_runner, "SEQUENCE_MAX_BYTES", 16)
    assert torch_runner.time_in_sequence(runs) is None  # inputs past the limit: not timed

    prof = _profile_of(timings)  # the calls as timed: none timed again
    monkeypatch.setattr(torch_timings, "kept_dir", lambda place: None)  # the sequence timed
    first = [n.index for n in runs[:2]]
    for found, want in (((1e-3, 2e-5, first), 2e-5),
                        ((1e-3, -1e-6, first), 0.0),  # never below alone
                        (None, 0.0)):  # not measured: nothing charged
        monkeypatch.setattr(torch_timings, "time_in_sequence",
                            lambda nodes, place, found=found: found)
        fresh = time_torch_device(g, dev, handoff_s=5e-6, profile=prof)
        assert fresh.in_sequence_s == pytest.approx(want)
        got = TorchCostModel(fresh).predict(g, dev)
        assert got[runs[0].index] == pytest.approx(timings.calls[runs[0].workload_key] + 5e-6
                                                   + want)


def _profile_of(timings):
    """A profile that measured ``timings``' calls (no overheads)."""
    from autoplace.profile.profiles import DeviceProfile

    return DeviceProfile("torch", "fp", {"kind": "torch"}, dict(timings.calls), {}, {})


def test_pytorch_costs_carry_a_spread(convnet):
    # A PyTorch call timed alone runs slower in a build: its cost is uncertain, not exact, so
    # a plan whose PyTorch side all but ties TVM alone is a close call that the build runs.
    model, x, mod = convnet
    res = autoplace.optimize(mod, [SLOW_CPU, Device.torch()], cost_model=RooflineCostModel(),
                             calibrate=False, db=None, baseline_guard=False)
    assert "torch" in res.plan.assignment
    assert "no known spread" not in res.expected_error  # roofline's and PyTorch's both known


#: A stride-1 NCHW conv2d's Relax attributes, its padding aside.
CONV_ATTRS = dict(data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype="",
                  strides=[1, 1], dilation=[1, 1], groups=1)


def test_a_relax_op_without_a_pytorch_equivalent_costs_inf_on_the_torch_device():
    from autoplace.backend.torch_equivalents import equivalent

    attrs = CONV_ATTRS
    shapes = [((1, 3, 8, 8), "float32"), ((4, 3, 3, 3), "float32")]
    assert equivalent("nn.conv2d", {**attrs, "padding": [1, 1, 1, 1]}, shapes,
                      [((1, 4, 8, 8), "float32")], "c") is not None
    assert equivalent("nn.conv2d", {**attrs, "padding": [0, 0, 1, 1]}, shapes,
                      [((1, 4, 7, 7), "float32")], "c") is None  # asymmetric padding
    assert equivalent("nn.conv2d", {**attrs, "padding": [1, 1, 1, 1], "data_layout": "NHWC"},
                      shapes, [((1, 4, 8, 8), "float32")], "c") is None


def test_a_module_from_pytorch_has_eager_among_its_baselines():
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), torch.randn(2, 8)
    m = autoplace.optimize_module(model, (x,), [Device.cpu(0)], cost_model=RooflineCostModel(),
                                  calibrate=False, db=None, torch_compile=False)
    with torch.no_grad():  # the same call, timed here: a baseline in ms is 1000 times over
        assert 0 < m.result.baselines["pytorch eager"] < 50 * fastest_call_s(lambda: model(x))
    line = next(ln for ln in m.summary().splitlines() if "baseline pytorch eager" in ln)
    assert "measured here: median of" in line and "schedule" not in line


@pytest.mark.parametrize("name", ["scatter_reduce", "embedding_bag", "bessel_j0"])
def test_more_ops_the_importer_lacks_match_pytorch(name):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 3, mode="sum")
    index = torch.tensor([0, 1, 1, 3, 2, 0])
    fn, xs = {
        "scatter_reduce": (lambda x: torch.zeros(4).scatter_reduce(
            0, index, x, reduce="amax", include_self=False) * 2, [torch.randn(6)]),
        "embedding_bag": (lambda i: bag(i, torch.tensor([0, 2])), [torch.tensor([1, 2, 4, 5])]),
        "bessel_j0": (lambda x: torch.special.bessel_j0(x) + 1, [torch.randn(5)]),
    }[name]

    class Model(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    mod = autoplace.from_torch(Model(), xs)
    assert any(n.is_torch for n in OpGraph.from_relax(mod).nodes)
    run = autoplace.optimize(mod, [Device.cpu(0)], cost_model=RooflineCostModel(),
                             calibrate=False, db=None).compile(trial=False)
    with torch.no_grad():
        np.testing.assert_allclose(run(*[x.numpy() for x in xs])[0], Model()(*xs).numpy(),
                                   rtol=1e-6, atol=1e-6)


class _EveryEquivalent(torch.nn.Module):
    """conv -> batch norm -> hardswish (add, clip, multiply, divide) -> relu6 (clip) -> gelu,
    tanh-gelu, reductions (mean, sum; amax and amin the importer lacks) -> linear."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        F = torch.nn.functional
        y = F.relu6(F.hardswish(self.bn(self.conv(x))))
        y = F.gelu(y) + F.gelu(y, approximate="tanh")
        z = y.mean((2, 3)) + y.sum((2, 3)) * 0.01 + y.amax((2, 3)) - y.amin((2, 3))
        return self.fc(z)


def test_every_relax_op_with_an_equivalent_runs_on_pytorch_and_matches():
    torch.manual_seed(0)
    model = _EveryEquivalent().eval()
    with torch.no_grad():  # batch norm with statistics of its own
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 8, 8)
    mod = autoplace.from_torch(model, (x,))
    g = OpGraph.from_relax(mod)
    kinds = {n.op_type for n in g.nodes}
    assert {"nn.batch_norm", "clip", "mean", "sum", "nn.gelu", "nn.gelu_tanh"} <= kinds
    devs = [Device.cpu(0), Device.torch()]
    on_torch = [n.name for n in g.nodes if devs[1].can_run(n.op_type)]
    assert {g.nodes[g.index(n)].op_type for n in on_torch} >= {"nn.batch_norm", "clip", "mean"}
    plan = autoplace.place(g, devs, [*((f"name:{n}", "torch") for n in on_torch), ("*", "cpu0")])
    text = str(autoplace.annotate(mod, plan))
    assert "R.nn.batch_norm" not in text and "R.clip" not in text and "R.mean" not in text
    got = autoplace.compile(mod, plan)(x.numpy())[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_a_clip_whose_bounds_are_not_numbers_has_no_equivalent():
    from autoplace.backend.torch_equivalents import equivalent

    shape = [((1, 4), "float32")]
    assert equivalent("clip", {}, shape, shape, "c", ("T.int64(0)", "T.float64(6)")) is not None
    assert equivalent("clip", {}, shape, shape, "c", ("lv3", "T.float64(6)")) is None
    assert equivalent("clip", {}, shape, shape, "c") is None


class Weighted(torch.nn.Module):
    """A strided conv, a grouped conv and a linear on a 3-D input: weights the torch device
    can hold."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4)
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        y = torch.relu(self.b(torch.relu(self.a(x))))
        return self.fc(y.flatten(2).transpose(1, 2))


def test_constant_weights_are_held_by_the_pytorch_call_and_the_faster_variant_runs():
    from autoplace.backend.torch_bridge import lookup
    from autoplace.backend.torch_calls import Fastest

    torch.manual_seed(0)
    model, x = Weighted().eval(), torch.randn(1, 8, 12, 12)
    mod = autoplace.from_torch(model, [x])
    g = OpGraph.from_relax(mod)
    plan = autoplace.place(g, [Device.cpu(0), Device.torch()],
                           [("op:nn.conv2d", "torch"), ("op:matmul", "torch"), ("*", "cpu0")])
    built = autoplace.compile(mod, plan)
    with torch.no_grad():
        want = model(x).numpy()
    for _ in range(10):  # the first calls try each variant in turn; every one must match
        np.testing.assert_allclose(built(x.numpy())[0], want, rtol=1e-4, atol=1e-5)
    ops = [lookup(n) for n in torch_bridge.called(autoplace.annotate(mod, plan))]
    assert sorted(op.name.split("[")[0] for op in ops) == ["torch.conv2d"] * 2 + ["torch.matmul"]
    # each call takes the activation alone: its weight is the call's, packed for oneDNN too
    text = str(autoplace.annotate(mod, plan))
    for op in ops:
        assert re.search(re.escape(f'"{op.global_name}"') + r", \w+, ty_args=", text), op.name
    for op in ops:
        assert isinstance(op.target, Fastest) and len(op.target.variants) == 2
        assert op.target.chosen is not None
    # nor does TVM hold them too: the build's constants are the biases alone
    lifted = annotate_lifted(mod, plan)[1]
    assert sorted(v.shape for v, _ in lifted) == [(1, 16, 1, 1), (1, 16, 1, 1), (8,)]


def test_a_batch_norm_on_pytorch_holds_its_statistics_and_hands_back_its_data_alone():
    # Its other two outputs are the constants as they were: handed back by the call, they would
    # be copies (a result must not share an input's memory) and hand-offs on every call.
    torch.manual_seed(0)
    model = _EveryEquivalent().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 8, 8)
    mod = autoplace.from_torch(model, (x,))
    plan = autoplace.place(OpGraph.from_relax(mod), [Device.cpu(0), Device.torch()],
                           [("op:nn.batch_norm", "torch"), ("op:torch.*", "torch"),
                            ("*", "cpu0")])
    text = str(autoplace.annotate(mod, plan))
    (name,) = [n for n in torch_bridge.called(text) if "batch_norm" in torch_bridge.lookup(n).name]
    assert torch_bridge.lookup(name).outputs == (((1, 8, 8, 8), "float32"),)
    assert re.search(re.escape(f'"{name}"') + r", \w+, ty_args=", text)
    with torch.no_grad():
        np.testing.assert_allclose(autoplace.compile(mod, plan)(x.numpy())[0], model(x).numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_the_same_op_with_other_weights_is_another_call():
    from autoplace.backend.torch_calls import with_constant_weight
    from autoplace.backend.torch_equivalents import equivalent

    op = equivalent("matmul", {"out_dtype": "float32"}, [((4, 8), "float32"), ((8, 3), "float32")],
                    [((4, 3), "float32")], "mm")
    w = np.random.default_rng(0).random((8, 3)).astype("float32")
    one, other = with_constant_weight(op, "matmul", w, (4, 8)), \
        with_constant_weight(op, "matmul", w + 1, (4, 8))
    assert one.id != other.id and one.id == with_constant_weight(op, "matmul", w, (4, 8)).id
    x = torch.randn(4, 8)
    for _ in range(10):
        np.testing.assert_allclose(other.call([x]).numpy(), (x @ torch.from_numpy(w + 1)).numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_fastest_settles_on_the_variant_of_least_time():
    from autoplace.backend.torch_calls import Fastest

    slow = lambda x: time.sleep(0.004) or x + 1  # noqa: E731
    fast = lambda x: x + 1  # noqa: E731
    f = Fastest([slow, fast], trials=2)
    assert [f(1) for _ in range(6)] == [2] * 6 and f.chosen == 1
    assert Fastest([slow]).chosen == 0


def test_a_conv_is_charged_the_faster_of_plain_and_packed(monkeypatch):
    from autoplace.backend import torch_calls as ops
    from autoplace.profile import torch_runner
    from autoplace.profile.measure import TimingPolicy

    torch.manual_seed(0)
    mod = autoplace.from_torch(torch.nn.Conv2d(4, 8, 3).eval(), [torch.randn(1, 4, 10, 10)])
    node = OpGraph.from_relax(mod).nodes[0]
    packed, real = [], ops.packed_call

    def slow_packed(op, op_type, w, x_shape, **kw):  # a packed call 5 ms slower than any plain one
        call = real(op, op_type, w, x_shape, **kw)
        packed.append(call)
        return lambda x: time.sleep(0.005) or call(x)

    monkeypatch.setattr(ops, "packed_call", slow_packed)
    timings, real_timing = [], torch_runner.call_timing
    monkeypatch.setattr(torch_runner, "call_timing",
                        lambda *a, **k: timings.append(real_timing(*a, **k)) or timings[-1])
    policy = TimingPolicy(min_repeat_ms=1.0, min_repeats=3, max_repeats=3)
    op = torch_runner.torch_op_for(node)
    t = torch_runner.time_torch_call(node, op, policy)
    plain, slowed = timings
    assert packed and slowed.median_s >= 0.005
    assert t is plain  # the plain call was faster, and is charged


class MaskedAttention(torch.nn.Module):
    """Attention over a padding mask built as encoders build it: the mask's ops (equal,
    logical_not, casts, where, full_like, broadcast_to, expand_dims and squeeze) beside the
    attention's."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x, ids):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, -1)
        keep = torch.logical_not(ids == 0).unsqueeze(1).unsqueeze(1)
        scores = (q @ k.transpose(-1, -2)) * 0.25
        scores = torch.where(keep.expand_as(scores), scores, torch.full_like(scores, -1e4))
        out = torch.softmax(scores, -1) @ v
        return out.squeeze(1) * (ids > 0).float().unsqueeze(-1), torch.maximum(x, x.mean())


def test_mask_ops_run_on_pytorch_and_match():
    torch.manual_seed(0)
    model = MaskedAttention().eval()
    x, ids = torch.randn(1, 6, 16), torch.tensor([[5, 3, 0, 2, 0, 1]])
    mod = autoplace.from_torch(model, (x, ids))
    g = OpGraph.from_relax(mod)
    devs = [Device.cpu(0), Device.torch()]
    on_torch = {n.op_type for n in g.nodes if devs[1].can_run(n.op_type)}
    assert {"equal", "logical_not", "astype", "where", "full_like", "greater", "maximum",
            "broadcast_to", "expand_dims", "squeeze"} <= on_torch
    plan = autoplace.place(g, devs, [*((f"op:{t}", "torch") for t in on_torch), ("*", "cpu0")])
    text = str(autoplace.annotate(mod, plan))
    assert "R.where" not in text and "R.logical_not" not in text and "R.equal" not in text
    got = autoplace.compile(mod, plan)(x.numpy(), ids.numpy())
    with torch.no_grad():
        for a, b in zip(got, model(x, ids)):
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-5)


class Split(torch.nn.Module):
    """A fused projection split three ways (strided slices, then squeezes), as encoders split
    q, k and v."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(1, 8, 3, 16).permute(2, 0, 1, 3).unbind(0)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def test_a_pytorch_call_whose_result_is_a_view_of_its_input_hands_back_a_copy():
    # A squeeze in PyTorch is a view of the slice TVM wrote; the VM reuses a dead slice's memory
    # for the next one, so a view handed back as is read the wrong slice (error ~6 here).
    torch.manual_seed(0)
    model, x = Split().eval(), torch.randn(1, 8, 16)
    mod = autoplace.from_torch(model, [x])
    g = OpGraph.from_relax(mod)
    plan = autoplace.place(g, [Device.cpu(0), Device.torch()],
                           [("op:squeeze", "torch"), ("*", "cpu0")])
    assert plan.assignment.count("torch") == 3
    with torch.no_grad():
        np.testing.assert_allclose(autoplace.compile(mod, plan)(x.numpy())[0], model(x).numpy(),
                                   rtol=1e-5, atol=1e-6)
    # any call's view, an importer fallback's too, comes back as a copy
    import tvm

    op = torch_bridge.TorchOp(lambda t: t[0], "view", (torch_bridge.Slot(0),), (),
                              (((4,), "float32"),), False, "v")
    a = tvm.runtime.tensor(np.arange(8, dtype="float32").reshape(2, 4))
    out = tvm.get_global_func(torch_bridge.register(op))(a)
    a.copyfrom(np.zeros((2, 4), "float32"))
    np.testing.assert_array_equal(out.numpy(), [0, 1, 2, 3])


def test_a_call_from_the_vm_checks_its_result_and_leaves_pytorch_as_it_was():
    import tvm

    def run(op, *arrays):
        return tvm.get_global_func(torch_bridge.register(op))(*map(tvm.runtime.tensor, arrays))

    x = np.arange(6, dtype="float32").reshape(2, 3)
    slot = torch_bridge.Slot
    # tensors as positional arguments, inside a list, or as a keyword: the same results
    for args, kwargs in (((slot(0), slot(1)), ()), (([slot(0), slot(1)],), ()),
                         ((slot(0),), (("other", slot(1)),))):
        target = torch.cat if isinstance(args[0], list) else torch.add
        op = torch_bridge.TorchOp(target, "t", args, kwargs, (((4, 3) if target is torch.cat
                                                                else (2, 3), "float32"),), False,
                                  "n")
        want = np.concatenate([x, x]) if target is torch.cat else x + x
        np.testing.assert_array_equal(run(op, x, x).numpy(), want)
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    wrong = torch_bridge.TorchOp(torch.ops.aten.relu.default, "aten.relu.default", (slot(0),),
                                 (), (((3, 2), "float32"),), False, "wrong")
    # a TorchOpError; through TVM's FFI the caller sees the RuntimeError it derives from
    with pytest.raises(RuntimeError, match=r"node 'wrong'\) gave \[\(\(2, 3\), "
                                            r"'torch.float32'\)\], the build expects"):
        run(wrong, x)
    raising = torch_bridge.TorchOp(torch.ops.aten.mm.default, "aten.mm.default",
                                   (slot(0), slot(0)), (), (((2, 2), "float32"),), False, "mm")
    with pytest.raises(RuntimeError, match=r"aten.mm.default \(node 'mm'.*raised"):
        run(raising, x)
    assert (torch.get_num_threads(), torch.is_grad_enabled()) == (threads, grad)


def test_a_weight_onednn_cannot_pack_runs_plain(monkeypatch):
    from autoplace.backend.torch_calls import Fastest, packed_call, with_constant_weight
    from autoplace.backend.torch_equivalents import equivalent

    attrs = {**CONV_ATTRS, "padding": [1, 1, 1, 1]}
    op = equivalent("nn.conv2d", attrs, [((1, 3, 8, 8), "float32"), ((4, 3, 3, 3), "float32")],
                    [((1, 4, 8, 8), "float32")], "c")
    w = np.random.default_rng(0).random((4, 3, 3, 3)).astype("float32")
    assert packed_call(op, "nn.conv2d", torch.from_numpy(w), (1, 3, 8, 8)) is not None

    def refuse(*a, **k):
        raise RuntimeError("oneDNN: unsupported")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_convolution_weight", refuse)
    assert packed_call(op, "nn.conv2d", torch.from_numpy(w), (1, 3, 8, 8)) is None
    held = with_constant_weight(op, "nn.conv2d", w, (1, 3, 8, 8))
    assert isinstance(held.target, Fastest) and len(held.target.variants) == 1
    x = torch.randn(1, 3, 8, 8)
    np.testing.assert_allclose(held.call([x]).numpy(), torch.nn.functional.conv2d(
        x, torch.from_numpy(w), padding=1).numpy(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------ PyTorch on a GPU
# What needs no GPU: where a torch:cuda device's tensors live and what copies it costs. Its
# builds and timings run in tests/test_cuda.py, on a machine with one.

def test_a_torch_device_on_a_gpu_shares_the_memory_of_that_gpus_tvm_device(convnet):
    from autoplace.annotate import vm_devices
    from autoplace.devices import Link

    cpu, gpu, tg, tc = Device.cpu(0), Device.cuda(0), Device.torch("cuda", 0), Device.torch()
    assert tg.torch_place == "cuda:0" and tc.torch_place == "cpu"
    assert tg.memory == gpu.memory != Device.cuda(1).memory and tc.memory == cpu.memory
    free = (0.0, np.inf)
    for a, b in ((tg, gpu), (gpu, tg), (tc, cpu), (cpu, tc)):
        assert (Link.default(a, b).alpha, Link.default(a, b).beta) == free
    pcie = Link.default(cpu, gpu)  # the same copy as TVM's GPU device makes
    for a, b in ((tg, cpu), (cpu, tg), (tg, tc), (tg, Device.torch("cuda", 1))):
        assert (Link.default(a, b).alpha, Link.default(a, b).beta) == (pcie.alpha, pcie.beta)

    # its ops run on the VM device of its memory: the plan's own, else one added for it
    g = OpGraph.from_relax(convnet[2])
    half = len(g.nodes) // 2
    for devs, want in (([cpu, gpu, tg], ["cpu0", "cuda0"]), ([cpu, tg], ["cpu0", "cuda0"]),
                       ([gpu, tg, tc], ["cuda0", "host"])):
        rest = [d.name for d in devs[1:]] * len(g.nodes)
        plan = autoplace.Plan.from_assignment(g, devs, [devs[0].name] * half
                                              + rest[:len(g.nodes) - half])
        vm, pos = vm_devices(plan)
        assert [d.name for d in vm] == want
        for d in devs:
            if d in plan.used_devices():
                assert vm[pos[d.name]].memory == d.memory


def test_a_torch_device_on_a_gpu_copies_as_its_gpu_does():
    # Measured links: a torch:cuda device's copies to and from the host are its GPU's.
    from autoplace.devices import Link
    from autoplace.predict.torch_costs import WithTorch

    class Base:
        def links(self, devices):
            names = {d.name for d in devices}
            assert names == {"cpu0", "cuda0"}  # the TVM devices only
            return {("cpu0", "cuda0"): Link("cpu0", "cuda0", 7e-6, 20e9),
                    ("cuda0", "cpu0"): Link("cuda0", "cpu0", 8e-6, 21e9)}

    devs = [Device.cpu(0), Device.cuda(0), Device.torch("cuda", 0), Device.torch()]
    links = WithTorch(Base(), {}).links(devs)
    assert links[("torch-cuda0", "cpu0")] == Link("torch-cuda0", "cpu0", 8e-6, 21e9)
    assert links[("cpu0", "torch-cuda0")] == Link("cpu0", "torch-cuda0", 7e-6, 20e9)
    assert links[("torch", "cuda0")] == Link("torch", "cuda0", 7e-6, 20e9)
    # none between devices of one memory: a hand-off, charged in each call
    assert not {("torch-cuda0", "cuda0"), ("cuda0", "torch-cuda0"), ("torch", "cpu0")} & set(links)


def test_a_torch_cost_model_times_one_place():
    g_dev = Device.torch("cuda", 0)
    g = OpGraph.from_relax(_tiny_mod())
    timings = time_torch_device(g, Device.torch(), handoff_s=0.0)
    with pytest.raises(ValueError, match="one TorchCostModel per torch device"):
        TorchCostModel(timings).predict(g, g_dev)


def _tiny_mod():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    return bb.get()


# -------------------------------------------------- a conv's or linear's tail in its PyTorch call

class Chains(torch.nn.Module):
    """conv + bias + relu, linear + bias + gelu, linear + bias + silu (as ``torch.export``
    writes it: x * sigmoid(x)), and a last linear (+ bias: a chain of two)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc, self.twice, self.out = (torch.nn.Linear(8, 16), torch.nn.Linear(16, 16),
                                         torch.nn.Linear(16, 4))

    def forward(self, x):
        y = torch.nn.functional.gelu(self.fc(torch.relu(self.conv(x)).mean((2, 3))))
        z = self.twice(y)
        return self.out(z * z.sigmoid())


@pytest.fixture(scope="module")
def chains():
    torch.manual_seed(0)
    model, x = Chains().eval(), torch.randn(1, 3, 8, 8)
    return model, x, autoplace.from_torch(model, [x])


def test_a_conv_or_linear_its_bias_and_activation_are_one_chain(chains):
    g = OpGraph.from_relax(chains[2])
    found = [[g.nodes[i].op_type for i in c] for c in fused_chains(g)]
    assert found == [["nn.conv2d", "add", "nn.relu"], ["matmul", "add", "nn.gelu"],
                     ["matmul", "add", "sigmoid", "multiply"], ["matmul", "add"]]
    assert [chain_activation(f[2:]) for f in found] == [
        "nn.relu", "nn.gelu", "nn.silu", None]
    from tvm import relax

    linear = _linear_graph
    assert fused_chains(linear()) == [(0, 1)]
    # a weight that is a parameter of the function (computed, for all the graph knows): none
    assert fused_chains(linear(weight_is_input=True)) == []
    # read twice, by other than x * sigmoid(x): the chain ends at the bias add
    assert fused_chains(linear(tail=lambda bb, y: relax.op.multiply(
        y, bb.emit(relax.op.nn.relu(y))))) == [(0, 1)]
    # x * sigmoid(x) with the sigmoid read again: not SiLU alone
    assert fused_chains(linear(tail=lambda bb, y: relax.op.add(
        relax.op.multiply(y, s := bb.emit(relax.op.sigmoid(y))), s))) == [(0, 1)]
    assert fused_chains(linear(tail=lambda bb, y: relax.op.multiply(
        bb.emit(relax.op.sigmoid(y)), y))) == [(0, 1, 2, 3)]


def _linear_graph(weight_is_input=False, tail=None):
    """The op graph of a linear (a matmul by an 8x16 weight, its bias add) on a 2x8 input, its
    weight a constant or a parameter, then ``tail(bb, y)`` of its output ``y``, if given."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 8], "float32"))
    w = relax.Var("w", relax.TensorType([8, 16], "float32"))
    weight = w if weight_is_input else relax.const(np.ones((8, 16), "float32"))
    with bb.function("main", [x, w] if weight_is_input else [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, weight))
            y = bb.emit(relax.op.add(y, relax.const(np.ones(16, "float32"))))
            out = bb.emit_output(tail(bb, y) if tail else y)
        bb.emit_func_output(out)
    return OpGraph.from_relax(bb.get())


def test_a_chain_placed_on_pytorch_runs_as_one_call_and_is_charged_so(chains):
    model, x, mod = chains
    res = autoplace.optimize(mod, [Device.cpu(0), Device.torch()], calibrate=False, db=None,
                             cost_model=RooflineCostModel(), baseline_guard=False,
                             pins=[("op:nn.conv2d", "torch"), ("op:matmul", "torch")])
    p, g = res.problem, res.graph
    chains_found = fused_chains(g)
    for g_id, chain in enumerate(chains_found):  # kept together, on PyTorch as the pins say
        assert (p.groups[list(chain)] == g_id).all()
        assert {res.plan.assignment[i] for i in chain} == {"torch"}
        torch_col = p.cost[list(chain), 1]
        assert torch_col[0] > 0 and (torch_col[1:] == 0).all()  # one call, at the anchor
    text = str(res.mod)
    assert text.count("autoplace.torch_op.") == len(chains_found)
    assert "R.nn.relu" not in text and "R.nn.gelu" not in text and "R.sigmoid" not in text
    with torch.no_grad():
        np.testing.assert_allclose(res.compile(trial=False)(x.numpy())[0], model(x).numpy(),
                                   rtol=1e-5, atol=1e-6)
    # explain() moves a chain's op with its chain: each reason speaks of the whole group
    explained = res.explain().nodes
    for chain in chains_found:
        for i in chain:
            reason = explained[i].reason
            assert f"with its group ({len(chain)} ops)" in reason or "pinned" in reason, reason
    # the call is what a chain costs as one: timed once per chain of workloads
    timings = res.predictor.models["torch"].timings
    first = chains_found[0]
    assert p.cost[first[0], 1] == pytest.approx(timings.chain_s(g, first) + timings.handoff_s
                                                + timings.in_sequence_s)


class HardActivations(torch.nn.Module):
    """conv + batch norm + hardswish, then a squeeze-and-excitation gate: a 1x1 conv + bias +
    hardsigmoid scaling the data; a linear + hardswish. ``torch.export`` writes both
    activations as adds, clips and a divide."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.norm = torch.nn.BatchNorm2d(8).eval()
        self.gate = torch.nn.Conv2d(8, 8, 1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.norm(self.conv(x)))
        y = y * torch.nn.functional.hardsigmoid(self.gate(y.mean((2, 3), keepdim=True)))
        return torch.nn.functional.hardswish(self.fc(y.mean((2, 3))))


def test_hardswish_and_hardsigmoid_as_export_writes_them_join_their_chains():
    torch.manual_seed(0)
    model, x = HardActivations().eval(), 3 * torch.randn(1, 3, 8, 8)
    mod = autoplace.from_torch(model, [x])
    g = OpGraph.from_relax(mod)
    chains = fused_chains(g)
    types = [tuple(g.nodes[i].op_type for i in c[2:]) for c in chains]
    assert [chain_activation(t) for t in types] == [
        "hardswish", "hardsigmoid", "hardswish"], types
    res = autoplace.optimize(mod, [Device.cpu(0), Device.torch()], calibrate=False, db=None,
                             cost_model=RooflineCostModel(), baseline_guard=False,
                             pins=[("op:nn.conv2d", "torch"), ("op:matmul", "torch")])
    text = str(res.mod)
    assert text.count("autoplace.torch_op.") == 3 and "R.clip" not in text
    with torch.no_grad():
        np.testing.assert_allclose(res.compile(trial=False)(x.numpy())[0], model(x).numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_a_composite_activation_is_matched_by_its_constants_not_only_its_ops():
    from tvm import relax

    def graph(add=3.0, hi=6.0, div=6.0):  # a linear, then x * clip(x + add, 0, hi) / div
        def hardswish(bb, y):
            r = bb.emit(relax.op.add(y, relax.const(add, "float32")))
            r = bb.emit(relax.op.clip(r, 0, hi))
            r = bb.emit(relax.op.multiply(y, r))
            return relax.op.divide(r, relax.const(div, "float32"))

        return _linear_graph(tail=hardswish)

    assert fused_chains(graph()) == [(0, 1, 2, 3, 4, 5)]
    for other in (dict(add=1.0), dict(hi=5.0), dict(div=3.0)):  # not hardswish: no activation
        assert fused_chains(graph(**other)) == [(0, 1)], other


def test_a_chain_whose_bias_has_its_outputs_shape_is_timed():
    """A squeeze-and-excitation block's conv gives (1, C, 1, 1), its bias's own shape."""
    from autoplace.profile.measure import TimingPolicy
    from autoplace.profile.torch_runner import time_fused_chain

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 4, 1), torch.nn.SiLU()).eval()
    g = OpGraph.from_relax(autoplace.from_torch(model, [torch.randn(1, 16, 1, 1)]))
    (chain,) = fused_chains(g)
    assert [g.nodes[i].op_type for i in chain] == ["nn.conv2d", "add", "sigmoid", "multiply"]
    t0 = time.perf_counter()
    timing = time_fused_chain([g.nodes[i] for i in chain], TimingPolicy(budget_s=0.2))
    took = time.perf_counter() - t0
    # seconds of one call: all the calls timed fit in the seconds the timing took (a figure in
    # ms is 1000 times over), on any host at any load
    assert 0 < timing.min_s <= timing.median_s
    assert timing.min_s * timing.number * timing.repeats <= took


def test_a_chain_that_cannot_be_timed_as_one_call_is_charged_as_its_ops(chains, monkeypatch,
                                                                          caplog, tmp_path):
    from autoplace.profile import torch_timings

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))  # no chain kept by other tests

    def fails(*_args, **_kwargs):
        raise RuntimeError("refused")

    monkeypatch.setattr(torch_timings, "time_fused_chain", fails)
    model, x, mod = chains
    res = autoplace.optimize(mod, [Device.cpu(0), Device.torch()], calibrate=False, db=None,
                             cost_model=RooflineCostModel(), baseline_guard=False)
    p, g = res.problem, res.graph
    assert (p.groups < 0).all()  # no chain kept together
    for chain in fused_chains(g):
        assert np.isfinite(p.cost[list(chain), 1]).all() and (p.cost[list(chain), 1] > 0).all()
    assert "could not time the chain nn.conv2d[1, 3, 8, 8]+add" in caplog.text
    assert "RuntimeError('refused')" in caplog.text
    assert "chain(s) of a conv or linear" not in res.summary()


def test_calls_and_chains_timed_for_one_model_are_kept_for_the_next(chains, monkeypatch,
                                                                   tmp_path):
    from autoplace.profile import torch_runner, torch_timings

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    _, _, mod = chains
    g = OpGraph.from_relax(mod)
    whole = fused_chains(g)
    first = time_torch_device(g, Device.torch(), handoff_s=5e-6, chains=whole)
    assert not first.kept and first.chains
    timed = []
    for name in ("time_torch_call", "time_fused_chain", "time_in_sequence"):
        monkeypatch.setattr(torch_timings, name, lambda *a, **k: timed.append(a) or 1 / 0)
    again = time_torch_device(g, Device.torch(), handoff_s=5e-6, chains=whole)
    assert not timed and again.calls == first.calls and again.chains == first.chains
    assert again.in_sequence_s == first.in_sequence_s  # the same calls in the same order
    assert "timed on this host for an earlier model" in TorchCostModel(again).describe(g)
    for f in torch_timings.kept_dir().glob("*.json"):
        f.write_text("[")  # damaged: timed again
    monkeypatch.setattr(torch_timings, "time_fused_chain", torch_runner.time_fused_chain)
    monkeypatch.setattr(torch_timings, "time_torch_call", torch_runner.time_torch_call)
    monkeypatch.setattr(torch_timings, "time_in_sequence", torch_runner.time_in_sequence)
    assert not time_torch_device(g, Device.torch(), handoff_s=5e-6, chains=whole).kept


def test_a_chain_whose_anchor_alone_loses_to_another_device_is_not_timed_whole(chains,
                                                                              monkeypatch,
                                                                              tmp_path):
    from autoplace.profile import torch_timings

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    _, _, mod = chains
    g = OpGraph.from_relax(mod)
    whole = fused_chains(g)
    timed = []
    real = torch_timings.time_fused_chain
    monkeypatch.setattr(torch_timings, "time_fused_chain",
                        lambda nodes, *a, **k: timed.append(nodes) or real(nodes, *a, **k))
    others = np.full(len(g.nodes), 1e-9)  # another device takes next to nothing for every op
    out = time_torch_device(g, Device.torch(), handoff_s=5e-6, chains=whole, others=others)
    assert not timed and not out.chains and out.unscreened == len(whole)
    assert f"{len(whole)} chain(s) not timed as one call" in TorchCostModel(out).describe(g)
    out = time_torch_device(g, Device.torch(), handoff_s=5e-6, chains=whole,
                            others=np.full(len(g.nodes), 1.0))  # a second a node: timed
    assert len(timed) == len(whole) and out.unscreened == 0


def test_pins_that_split_a_chain_leave_its_ops_calls_of_their_own(chains):
    model, x, mod = chains
    res = autoplace.optimize(mod, [Device.cpu(0), Device.torch()], calibrate=False, db=None,
                             cost_model=RooflineCostModel(), baseline_guard=False,
                             pins=[("op:nn.conv2d", "torch"), ("op:nn.relu", "cpu0")])
    g = res.graph
    conv_chain = fused_chains(g)[0]
    assert (res.problem.groups[list(conv_chain)] < 0).all()
    assert res.plan.assignment[conv_chain[0]] == "torch"
    with torch.no_grad():
        np.testing.assert_allclose(res.compile(trial=False)(x.numpy())[0], model(x).numpy(),
                                   rtol=1e-5, atol=1e-6)


class ConvNorm(torch.nn.Module):
    """conv + batch norm + relu; a depthwise conv + batch norm read twice (silu as x *
    sigmoid(x)), then a residual add."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False, groups=8)
        self.b2 = torch.nn.BatchNorm2d(8)
        for b in (self.b1, self.b2):  # statistics a trained model would have, not 0 and 1
            b.running_mean.uniform_(-1, 1)
            b.running_var.uniform_(0.5, 2)
            b.weight.data.uniform_(0.5, 2)
            b.bias.data.uniform_(-1, 1)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        z = self.b2(self.c2(y))
        return z * torch.sigmoid(z) + y


def test_a_convs_batch_norm_is_folded_into_its_call():
    torch.manual_seed(0)
    model, x = ConvNorm().eval(), torch.randn(1, 3, 8, 8)
    mod = autoplace.from_torch(model, [x])
    g = OpGraph.from_relax(mod)
    assert [[g.nodes[i].op_type for i in c] for c in fused_chains(g)] == [
        ["nn.conv2d", "nn.batch_norm", "nn.relu"],
        ["nn.conv2d", "nn.batch_norm", "sigmoid", "multiply"]]
    res = autoplace.optimize(mod, [Device.cpu(0), Device.torch()], calibrate=False, db=None,
                             cost_model=RooflineCostModel(), baseline_guard=False,
                             pins=[("op:nn.conv2d", "torch")])
    text = str(res.mod)
    assert text.count("autoplace.torch_op.") == 2 and "R.nn.batch_norm" not in text
    assert "R.sigmoid" not in text  # x * sigmoid(x) in the second conv's call
    with torch.no_grad():
        np.testing.assert_allclose(res.compile(trial=False)(x.numpy())[0], model(x).numpy(),
                                   rtol=1e-4, atol=1e-5)
    assert "2 chain(s) of a conv or linear" in res.summary()
    # the fold itself: inference's batch norm of the conv's output
    w, gamma, beta = np.ones((2, 1, 1, 1)), np.array([2.0, 0.5]), np.array([1.0, -1.0])
    mean, var = np.array([0.5, 1.0]), np.array([3.0, 0.0])
    fw, fb = fold_batch_norm(w, np.array([1.0, 2.0]), gamma, beta, mean, var, 1.0)
    np.testing.assert_allclose(fw.reshape(-1), [1.0, 0.5])
    np.testing.assert_allclose(fb, [(1.0 - 0.5) * 1.0 + 1.0, (2.0 - 1.0) * 0.5 - 1.0])


class _Catted(torch.nn.Module):
    """A cat of an empty 1-d tensor with a 4-d one, which PyTorch takes (a key cache before
    its first entry, as Hugging Face's GPT-2 writes it) and TVM's importer refuses."""

    def forward(self, x):
        return torch.cat([x.new_zeros(0), x * 2], dim=-2) + 1


class _FourierMixing(torch.nn.Module):
    """An FNet block's token mixing: the real part of a 2-d FFT, through complex tensors."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        mixed = torch.fft.fft2(x).real
        return self.proj(torch.nn.functional.layer_norm(x + mixed, (16,)))


@pytest.mark.parametrize("model, why", [
    (_Catted, "the importer failed on aten.cat: Concat expects all input tensors to have same"),
    (_FourierMixing, "aten._fft_c2c"),
])
def test_an_op_tvm_cannot_import_or_hold_runs_in_pytorch_and_says_why(model, why):
    model = model().eval()
    x = torch.randn(1, 2, 8, 16)
    mod = autoplace.from_torch(model, [x])
    calls = [n for n in OpGraph.from_relax(mod).nodes if n.is_torch]
    assert calls and all(why in dict(n.attrs)["why"] for n in calls)
    res = autoplace.optimize(mod, [Device.cpu(0)], cost_model=RooflineCostModel(),
                             calibrate=False, db=None)
    assert why in res.summary()
    run = res.compile(trial=False)
    y = torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        np.testing.assert_allclose(run(y.numpy())[0], model(y).numpy(), rtol=1e-5, atol=1e-5)


def test_the_ops_of_complex_numbers_are_one_pytorch_call_per_connected_group():
    class TwoMixings(torch.nn.Module):
        def forward(self, x):
            a = torch.fft.fft(x, dim=-1).real
            b = torch.fft.fft(torch.relu(a), dim=-2).imag  # a second group, after a real op
            return a + b

    mod = autoplace.from_torch(TwoMixings(), [torch.randn(4, 8)])
    g = OpGraph.from_relax(mod)
    groups = [n for n in g.nodes if n.is_torch]
    assert len(groups) == 2 and all(n.op_type.startswith("torch.complex:") for n in groups)
    assert any(n.op_type == "nn.relu" for n in g.nodes)  # the real op between stays TVM's
    run = autoplace.optimize(mod, [Device.cpu(0)], cost_model=RooflineCostModel(),
                             calibrate=False, db=None).compile(trial=False)
    y = torch.randn(4, 8)
    np.testing.assert_allclose(run(y.numpy())[0], TwoMixings()(y).numpy(), rtol=1e-5, atol=1e-5)


def test_complex_groups_joined_through_a_real_op_are_one_call():
    class Joined(torch.nn.Module):
        def forward(self, x):
            a = torch.fft.fft(x)
            r = torch.relu(a.real)  # real, between the two FFTs: a path out of a group and back
            return torch.view_as_real(torch.fft.fft(r) * a).sum(-1) + r

    mod = autoplace.from_torch(Joined(), [torch.randn(4, 8)])
    [call] = [n for n in OpGraph.from_relax(mod).nodes if n.is_torch]
    assert "relu" in call.op_type
    run = autoplace.optimize(mod, [Device.cpu(0)], cost_model=RooflineCostModel(),
                             calibrate=False, db=None).compile(trial=False)
    y = torch.randn(4, 8)
    np.testing.assert_allclose(run(y.numpy())[0], Joined()(y).numpy(), rtol=1e-5, atol=1e-5)


def test_the_hand_off_is_charged_as_a_model_makes_it_and_kept_for_the_host(convnet,
                                                                          monkeypatch, tmp_path):
    # A call after an op that touched many bytes finds PyTorch's code and state out of the
    # caches: each node's hand-off is measured after the bytes of the op before it, once per
    # power of two and host; below WARM_BYTES the warm hand-off is charged.
    from autoplace.predict.torch_costs import TorchCostModel
    from autoplace.profile import torch_timings

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    measured = []

    def handoff(strict=False, place="cpu", between_bytes=0):
        measured.append(between_bytes)
        return 1e-6 + between_bytes * 1e-11  # 4 MB: 43 us

    monkeypatch.setattr(torch_timings, "measure_handoff", handoff)
    g = OpGraph.from_relax(convnet[2])
    n = len(g.nodes)
    between = [(3 << 20) if i % 2 else 100 for i in range(n)]
    between[-1] = 5 << 20
    first = time_torch_device(g, Device.torch(), between=between)
    assert first.handoff_s == 1e-6 and measured[0] == 0  # the warm hand-off, measured here
    runs = [Device.torch().can_run(node.op_type) for node in g.nodes]
    sizes = {4 << 20 if between[i] == 3 << 20 else 8 << 20  # rounded up to a power of two
             for i in range(n) if runs[i] and between[i] > 100}
    assert sorted(measured[1:]) == sorted(sizes)  # once per power of two
    want = [1e-6 + (1 << (b - 1).bit_length()) * 1e-11 if run and b > 100 else 1e-6
            for b, run in zip(between, runs)]
    np.testing.assert_allclose(first.handoffs, want)
    assert "more where the op before" in TorchCostModel(first).describe(g)
    cost = TorchCostModel(first).predict(g, Device.torch())
    for i in (i for i in range(n) if runs[i]):
        key = g.nodes[i].workload_key
        assert cost[i] == pytest.approx(first.calls[key] + want[i] + first.in_sequence_s)
    again = time_torch_device(g, Device.torch(), between=between)
    assert again.handoffs == first.handoffs and len(measured) == len(sizes) + 2  # kept
    # a profile's hand-off (measured back to back) counts where it is the larger
    prof = _profile_of(first)
    monkeypatch.setattr(torch_timings, "_stored_handoff", lambda p, c: 9e-5)
    high = time_torch_device(g, Device.torch(), between=between, profile=prof)
    assert high.handoff_s == 9e-5 and set(high.handoffs) == {9e-5}
    monkeypatch.setattr(torch_timings, "_stored_handoff", lambda p, c: 1e-6)
    low = time_torch_device(g, Device.torch(), between=between, profile=prof)
    np.testing.assert_allclose(low.handoffs, want)


def test_a_hand_off_after_fewer_bytes_is_charged_no_more_than_one_after_more(convnet,
                                                                             monkeypatch,
                                                                             tmp_path):
    # a moment of another process's work inflates one power's figure: the figures a model needs
    # are made monotone in the bytes, each power taking the least of it and every larger one
    from autoplace.profile import torch_timings

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    figures = {0: 6e-6, 1 << 17: 15e-6, 1 << 18: 19e-6, 1 << 19: 8.7e-6, 1 << 20: 24e-6}
    monkeypatch.setattr(torch_timings, "measure_handoff",
                        lambda strict=False, place="cpu", between_bytes=0: figures[between_bytes])
    g = OpGraph.from_relax(convnet[2])
    runs = [i for i, node in enumerate(g.nodes) if Device.torch().can_run(node.op_type)]
    assert len(runs) >= 4
    between = [100] * len(g.nodes)
    for i, size in zip(runs, (1 << 17, 1 << 18, 1 << 19, 1 << 20)):
        between[i] = size
    got = time_torch_device(g, Device.torch(), between=between).handoffs
    assert [got[i] for i in runs[:4]] == pytest.approx([8.7e-6, 8.7e-6, 8.7e-6, 24e-6])
    assert all(got[i] == pytest.approx(6e-6) for i in runs[4:])  # warm: below WARM_BYTES


def test_pytorch_calls_from_the_vm_run_at_the_threads_they_are_priced_at(monkeypatch):
    # A build calls PyTorch at the threads set around its call (the plan's), at one on a
    # thread given a share of the cores, else at PyTorch's own count; PyTorch's count is left
    # as it was each time.
    import threading

    import tvm

    from autoplace.backend import calls_at, call_threads, limit_tvm_threads, process_cpus
    from autoplace.devices import runtime_threads, torch_threads

    seen = []

    def probe(t):
        seen.append(torch.get_num_threads())
        return t + 1

    op = torch_bridge.TorchOp(probe, "probe", (torch_bridge.Slot(0),), (),
                              (((2, 3), "float32"),), False, "probe")
    fn = tvm.get_global_func(torch_bridge.register(op))
    a = tvm.runtime.tensor(np.zeros((2, 3), "float32"))
    own = torch.get_num_threads()
    fn(a)
    with calls_at(3):
        assert call_threads() == 3
        np.testing.assert_array_equal(fn(a).numpy(), np.ones((2, 3)))
    assert call_threads() is None

    def worker():
        limit_tvm_threads(1, process_cpus())
        fn(a)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [own, 3, 1] and torch.get_num_threads() == own

    # one CPU device: PyTorch's count; several share the cores, or an ORT device's threads
    # need them next: one
    assert torch_threads([Device.cpu(0), Device.torch()]) == own
    assert torch_threads([Device.cpu(0), Device.cpu(1), Device.torch()]) == 1
    assert torch_threads([Device.cpu(0), Device.torch(), Device.onnxruntime()]) == 1
    assert runtime_threads([Device.cpu(0), Device.torch(), Device.onnxruntime()]) == own

    # a compiled model's calls run inside calls_at(the plan's threads)
    import sys

    compile_mod = sys.modules["autoplace.run.compile"]  # autoplace.run.compile: the function
    given = []
    real = compile_mod.calls_at

    def spy(threads):
        given.append(threads)
        return real(threads)

    monkeypatch.setattr(compile_mod, "calls_at", spy)
    torch.manual_seed(0)
    model, x = Split().eval(), torch.randn(1, 8, 16)
    mod = autoplace.from_torch(model, [x])
    # an ORT device the plan puts nothing on does not take PyTorch's threads
    for devices in ([Device.cpu(0), Device.torch()],
                    [Device.cpu(0), Device.torch(), Device.onnxruntime()]):
        plan = autoplace.place(OpGraph.from_relax(mod), devices,
                               [("op:squeeze", "torch"), ("*", "cpu0")])
        with torch.no_grad():
            np.testing.assert_allclose(autoplace.compile(mod, plan)(x.numpy())[0],
                                       model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert given == [own, own]
