"""Multi-device builds run and give the single-device results, for every placement tried."""

import itertools

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import autoplace
from autoplace import zoo
from autoplace.annotate import annotate_lifted


# Same-shape tensors that die early: StaticPlanBlockMemory reuses a's storage (device a) for d.
@I.ir_module
class Reuse:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.exp(a)
            c = R.nn.relu(b)
            d = R.add(c, c)
            e = R.multiply(d, d)
            R.output(e)
        return e


REUSE_PLAN = ["a", "a", "b", "b", "b"]


def _reuse_expected(x):
    c = np.maximum(np.exp(np.maximum(x, 0)), 0)
    return (c + c) * (c + c)


def test_buffer_reuse_across_devices_runs(devs, rng):
    g = autoplace.OpGraph.from_relax(Reuse)
    x = rng.standard_normal((64, 64)).astype("float32")
    out = autoplace.compile(Reuse, autoplace.Plan.from_assignment(g, devs, REUSE_PLAN))(x)
    np.testing.assert_allclose(out[0], _reuse_expected(x), rtol=1e-5)


def test_stock_memory_planning_still_mixes_devices(devs, rng):
    """Documents the TVM 0.27 bug the lowering pipeline works around; fails once TVM fixes it."""
    g = autoplace.OpGraph.from_relax(Reuse)
    plan = autoplace.Plan.from_assignment(g, devs, REUSE_PLAN)
    mod, _ = annotate_lifted(Reuse, plan)
    ex = tvm.compile(mod, target=None, relax_pipeline=tvm.transform.Sequential(
        [relax.transform.RealizeVDevice(), relax.get_pipeline("default")]))
    vm = relax.VirtualMachine(ex, [tvm.cpu(0), tvm.cpu(1)])
    x = tvm.runtime.tensor(rng.standard_normal((64, 64)).astype("float32"), tvm.cpu(0))
    with pytest.raises(Exception, match="Mismatched"):
        vm["main"](x)


# BERT's position ids: an op without tensor inputs (arange) plus a constant offset, then an
# embedding lookup. The build folds arange + offset into a new constant, which the VM loads onto
# the first device whatever kernel takes it.
@I.ir_module
class PositionIds:
    @R.function
    def main(x: R.Tensor((1, 8, 16), "float32"), table: R.Tensor((64, 16), "float32")):
        with R.dataflow():
            pos = R.arange(0, 8, 1, dtype="int64")
            shifted = R.add(pos, R.const(2, "int64"))
            emb = R.take(table, shifted, axis=0)
            out = R.add(x, emb)
            R.output(out)
        return out


def check_every_position_id_placement(devs, rng, run) -> None:
    """Every two-device placement of the position-id pattern, run by ``run(mod, plan, *inputs)``
    (the first output), gives the single-device result."""
    x = rng.standard_normal((1, 8, 16)).astype("float32")
    table = rng.standard_normal((64, 16)).astype("float32")
    expected = x + table[np.arange(8) + 2]
    graph = autoplace.OpGraph.from_relax(PositionIds)
    for bits in itertools.product(range(2), repeat=len(graph.nodes)):
        plan = autoplace.Plan.from_assignment(graph, devs, [devs[b].name for b in bits])
        np.testing.assert_allclose(run(PositionIds, plan, x, table), expected, rtol=1e-6,
                                   err_msg=str(bits))


def test_folded_constants_of_ops_without_inputs_reach_their_device(devs, rng):
    """Every placement of the position-id pattern runs and gives the single-device result."""
    check_every_position_id_placement(
        devs, rng, lambda mod, plan, *xs: autoplace.compile(mod, plan)(*xs)[0])


def test_ops_of_constants_only_are_computed_at_build_not_on_every_call(devs, rng):
    """A weight's transpose (an op whose every input is a constant) is folded into the constant
    the build uploads, as the unlifted lowering folds it: on every placement the build runs the
    matmul kernel alone, with the outputs of numpy."""
    w = rng.standard_normal((16, 8)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(relax.const(w)))
            out = bb.emit_output(relax.op.matmul(x, t))
        bb.emit_func_output(out)
    mod = bb.get()
    graph = autoplace.OpGraph.from_relax(mod)
    xs = rng.standard_normal((4, 8)).astype("float32")
    for names in itertools.product([d.name for d in devs], repeat=len(graph.nodes)):
        run = autoplace.compile(mod, autoplace.Plan.from_assignment(graph, devs, list(names)))
        assert run.kernels == {"tuned": 0, "default": 1}, names
        np.testing.assert_allclose(run(xs)[0], xs @ w.T, rtol=1e-5, atol=1e-5)


def test_wrong_number_of_inputs_is_a_clear_error(devs):
    g = autoplace.OpGraph.from_relax(Reuse)
    run = autoplace.compile(Reuse, autoplace.Plan.from_assignment(g, devs, ["a"] * 5))
    with pytest.raises(TypeError, match=r"expected 1 inputs \(x\), got 2"):
        run(np.zeros((64, 64), "float32"), np.zeros(1))


def _check_placements(model, devs, rng, n_random=1):
    g = autoplace.OpGraph.from_relax(model.mod)
    n = len(g.nodes)
    ref = autoplace.compile(model.mod, autoplace.Plan.from_assignment(g, devs, ["a"] * n))(*model.inputs)
    plans = [["b"] * n, [devs[i % 2].name for i in range(n)]]
    plans += [[devs[j].name for j in rng.integers(0, 2, n)] for _ in range(n_random)]
    plans.append(list(autoplace.optimize(model.mod, devs, time_limit=5).plan.assignment))
    for assignment in plans:
        out = autoplace.compile(model.mod, autoplace.Plan.from_assignment(g, devs, assignment))(
            *model.inputs)
        assert len(out) == len(ref)
        for o, r in zip(out, ref):
            np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6 * np.abs(r).max())
    return ref


@pytest.mark.parametrize("name", zoo.names(include_torch=False))
def test_relax_zoo_numerics_under_placements(name, devs, rng):
    _check_placements(zoo.load(name), devs, rng, n_random=2)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "mobilenet", "inception", "transformer"])
def test_torch_zoo_numerics_under_placements(name, devs, rng):
    pytest.importorskip("torch")
    _check_placements(zoo.load(name), devs, rng)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bits=st.lists(st.integers(0, 1), min_size=10, max_size=10))
def test_random_plans_match_single_device(bits, devs):
    model = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(model.mod)
    ref = autoplace.compile(model.mod, autoplace.place(g, devs, [("*", "a")]))(*model.inputs)
    plan = autoplace.Plan.from_assignment(g, devs, [devs[b].name for b in bits])
    out = autoplace.compile(model.mod, plan)(*model.inputs)
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_tvm_matches_torch_on_resnet():
    torch = pytest.importorskip("torch")
    from autoplace.zoo import torch_models

    model, shapes = torch_models.resnet(0)
    x = np.random.default_rng(1).standard_normal(shapes[0]).astype("float32")
    mod = autoplace.frontends.from_torch(model, [x])
    g = autoplace.OpGraph.from_relax(mod)
    devs = [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]
    out = autoplace.compile(mod, autoplace.Plan.from_assignment(
        g, devs, [devs[i % 2].name for i in range(len(g))]))(x)[0]
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    assert np.abs(expected).max() > 0.05  # outputs are O(1), so the comparison means something
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_onnx_file_entry_point(tmp_path, devs):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from autoplace.zoo import torch_models

    model, shapes = torch_models.mobilenet(0)
    path = tmp_path / "mobilenet.onnx"
    torch.onnx.export(model, (torch.zeros(shapes[0]),), str(path), dynamo=False)
    m = zoo.from_spec(str(path))
    res = autoplace.optimize(m.mod, devs, time_limit=2)
    out = res.compile()(*m.inputs)[0]
    with torch.no_grad():
        expected = model(torch.from_numpy(m.inputs[0])).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_bad_onnx_file_is_a_clear_error(tmp_path):
    pytest.importorskip("onnx")
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(ValueError, match="not a valid ONNX model"):
        autoplace.frontends.from_onnx(bad)
    with pytest.raises(FileNotFoundError):
        autoplace.frontends.from_onnx(tmp_path / "missing.onnx")


def _kernels(mod):
    """{kernel name: target kind} after the lowering pipeline's target-attaching pass."""
    from autoplace.backend import lowering_pipeline

    passes = list(lowering_pipeline(gpu=True, multi_device=True).passes)
    names = [p.info.name for p in passes]
    lowered = tvm.transform.Sequential(passes[:names.index("AttachTargets") + 1])(mod)
    kinds = {gv.name_hint: f.attrs["target"].kind.name for gv, f in lowered.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)}
    calls = {}
    for block in lowered["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and getattr(v.op, "name", "").startswith("relax.call_tir"):
                calls[v.args[0].name_hint] = v.ty_args[0].vdevice.target.kind.name
    return kinds, calls


def test_cuda_plans_compile_without_a_gpu_each_kernel_for_its_device():
    """CPU+GPU builds need no GPU to compile: every kernel gets its device's target (one copy per
    target when both devices run the same kernel), and the executable carries a CUDA module."""
    m = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(m.mod)
    devs = [autoplace.Device.cpu(0), autoplace.Device.cuda(0)]
    alternating = [devs[k % 2].name for k in range(len(g.nodes))]
    for names, used in ((alternating, {"llvm", "cuda"}), ([devs[1].name] * len(g.nodes), {"cuda"})):
        plan = autoplace.Plan.from_assignment(g, devs, names)
        annotated, _ = annotate_lifted(m.mod, plan)
        kinds, calls = _kernels(annotated)
        assert all(kinds[k] == target for k, target in calls.items())
        assert set(calls.values()) == used
        ex = autoplace.run.build(annotated, plan)
        modules = [ex.mod]
        for mod in modules:
            modules.extend(mod.imports)
        assert "cuda" in {mod.kind for mod in modules}


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "int8", "bool"])
@pytest.mark.parametrize("shape", [(), (0, 3), (5, 7), (3, 64, 65)])
def test_to_tvm_and_to_numpy_copy_exactly_and_keep_nothing_shared(dtype, shape, rng):
    from autoplace.backend import to_numpy, to_tvm

    x = (rng.standard_normal(shape) * 10).astype(dtype)
    for src in (x, np.asfortranarray(x), x.reshape(-1)[1:].reshape(-1) if x.size > 1 else x):
        t = to_tvm(src, tvm.cpu(0))
        assert t.dtype == str(src.dtype) and tuple(t.shape) == src.shape
        before = np.array(src)
        if src.size:
            src.reshape(-1)[0] = src.reshape(-1)[-1]  # the tensor holds its own copy
        back = to_numpy(t)
        np.testing.assert_array_equal(back, before)
        if back.size:
            back.reshape(-1)[0] = 0  # and what comes back is the caller's to write
            np.testing.assert_array_equal(to_numpy(t), before)
        np.testing.assert_array_equal(to_numpy(to_tvm(before, tvm.cpu(1))), before)



@I.ir_module
class TwoGelus:
    @R.function
    def main(x: R.Tensor((16, 256), "float32")):
        with R.dataflow():
            a = R.nn.gelu(x)
            b = R.nn.gelu(R.multiply(a, R.const(2.0, "float32")))
            R.output(b)
        return b


def test_gelu_on_a_cpu_uses_the_fast_erf_and_matches_a_float64_gelu(devs, rng):
    """A CPU build lowers GELU with ``topi.fast_erf`` (arithmetic that vectorizes) instead of
    TVM's scalar ``erf``; a GPU kernel keeps TVM's. Outputs stay within float32 rounding of a
    float64 GELU, on one device and on two."""
    import math

    from autoplace.backend.lowering import legalize

    assert "T.erf(" not in legalize(TwoGelus, "llvm").script()
    assert "T.erf(" in legalize(TwoGelus, "cuda").script()
    assert "T.erf(" in legalize(TwoGelus).script()    # no target: TVM's own lowering
    g = autoplace.OpGraph.from_relax(TwoGelus)
    cpu_gpu = [autoplace.Device.cpu(0), autoplace.Device.cuda(0)]
    plan = autoplace.Plan.from_assignment(g, cpu_gpu, [d.name for d in cpu_gpu[:1] + cpu_gpu])
    lowered = autoplace.backend.fused_kernels(annotate_lifted(TwoGelus, plan)[0])
    erf_by_kind = {f.attrs["target"].kind.name: "T.erf(" in f.script()
                   for gv, f in lowered.functions.items() if "gelu" in gv.name_hint}
    assert erf_by_kind == {"llvm": False, "cuda": True}

    def gelu(v):
        return 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))

    x = (rng.standard_normal((16, 256)) * 3).astype("float32")
    want = gelu(2 * gelu(x.astype("float64")))
    for names in (["a"] * len(g.nodes), ["a", "b", "b"][:len(g.nodes)]):
        out = autoplace.compile(TwoGelus, autoplace.Plan.from_assignment(g, devs, names))(x)
        np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=5e-6)


def test_a_build_on_one_cpu_device_keeps_its_constants_and_others_lift_them(rng):
    """Constants passed on every call cost each call: one CPU device's build keeps them (TVM's
    VM loads them onto its first device, that one); a two-device build lifts them to parameters
    uploaded to their devices. Both give the same outputs."""
    m = zoo.load("mlp")
    graph = autoplace.OpGraph.from_relax(m.mod)
    cpu0, cpu1 = autoplace.Device.cpu(0), autoplace.Device.cpu(1)
    one = autoplace.compile(m.mod, autoplace.place(graph, [cpu1], [("*", "cpu1")]))
    half = len(graph.nodes) // 2
    two = autoplace.compile(m.mod, autoplace.Plan.from_assignment(
        graph, [cpu0, cpu1], ["cpu0"] * half + ["cpu1"] * (len(graph.nodes) - half)))
    assert one.lifted == () and len(two.lifted) > 0
    np.testing.assert_allclose(one(*m.inputs)[0], two(*m.inputs)[0], rtol=1e-5)


def test_a_compiled_model_copies_each_call_into_the_same_input_tensor_without_mixing_calls(rng):
    """Inputs are copied into tensors kept from call to call (no allocation per call); a result
    already returned does not change on the next call."""
    from autoplace.backend.tensors import InputSlot

    a, b = (rng.standard_normal((64, 64)).astype("float32") for _ in range(2))
    run = autoplace.compile(Reuse, autoplace.Plan.from_assignment(
        autoplace.OpGraph.from_relax(Reuse), [autoplace.Device.cpu(0)], ["cpu0"] * 5))
    first = run(a)[0]
    second = run(b)[0]
    np.testing.assert_allclose(first, _reuse_expected(a), rtol=1e-5)
    np.testing.assert_allclose(second, _reuse_expected(b), rtol=1e-5)
    for dev in (tvm.cpu(0), tvm.cpu(1)):
        slot = InputSlot(dev)
        t = slot.fill(a)
        assert slot.fill(b) is t and t.device == dev
        np.testing.assert_array_equal(t.numpy(), b)
        wider = slot.fill(np.ones((2, 3), "float64"))  # another shape and dtype: a new tensor
        assert wider is not t and wider.numpy().dtype == np.float64
