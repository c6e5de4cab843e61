"""ONNX Runtime as a placement target: runs of ops placed on it are exported as one ONNX model
and called from the VM as one ORT session, priced as ORT's profiler splits them (issue 52)."""

import sys
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402

import autoplace  # noqa: E402
from autoplace import Device, RooflineCostModel  # noqa: E402
from autoplace.backend import ort_profiling, ort_segments  # noqa: E402
from autoplace.graph import OpGraph  # noqa: E402
from autoplace.graph.segments import cut, export  # noqa: E402
from autoplace.plan import Plan  # noqa: E402
from autoplace.predict.ort_costs import OrtCostModel  # noqa: E402
from autoplace.profile.ort_timings import time_ort_device  # noqa: E402

DEVICES = [Device.cpu(0), Device.torch(), Device.onnxruntime()]


class Branchy(torch.nn.Module):
    """conv-bn-relu, a pool, then two branches joined: segments with several inputs/outputs."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        y = torch.nn.functional.max_pool2d(y, 2)
        return torch.relu(self.c2(y)) + torch.sigmoid(self.c3(y))


@pytest.fixture(scope="module")
def branchy():
    torch.manual_seed(0)
    model = Branchy().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 16, 16)
    mod = autoplace.from_torch(model, (x,))
    return model, x, mod, OpGraph.from_relax(mod)


def _run(mod, plan, x):
    out = autoplace.compile(mod, plan)(x.numpy())
    return np.asarray(out[0] if isinstance(out, (list, tuple)) else out)


def _want(model, x):
    with torch.no_grad():
        return model(x).numpy()


def _one_segment(model, x):
    """``model`` imported on ``x``, its op graph, and every op of it as one exported segment."""
    mod = autoplace.from_torch(model, (x,))
    graph = OpGraph.from_relax(mod)
    span, = cut(mod["main"], [True] * len(graph.nodes))
    return mod, graph, export(mod, span)


def test_ort_device_specs():
    d = Device.from_spec("ort:cpu")
    assert (d.name, d.kind, d.runtime, d.spec) == ("ort", "ort", "ort", "ort:cpu")
    assert d.memory == Device.cpu(0).memory  # shares the host's memory with TVM's CPU
    assert d.can_run("nn.conv2d") and not d.can_run("torch.nonzero")
    assert not d.can_run("nn.conv3d")
    with pytest.raises(ValueError, match="not built yet"):
        Device.from_spec("ort:cuda:0")
    with pytest.raises(ValueError, match="no TVM target"):
        d.tvm_target()


def test_segments_are_maximal_runs_with_their_interface(branchy):
    _, _, mod, graph = branchy
    pool = next(n.index for n in graph.nodes if n.op_type == "nn.max_pool2d")
    on = [n.index != pool for n in graph.nodes]
    spans = cut(mod["main"], on)
    assert len(spans) == 2
    assert spans[0].nodes == tuple(range(pool)) and spans[1].nodes[0] == pool + 1
    assert set(spans[0].nodes) | set(spans[1].nodes) | {pool} == set(range(len(graph.nodes)))
    # the first reads the model's input and gives what the pool reads; the second reads the
    # pool's output (twice: one input) and gives the model's output
    assert [v.name for v in spans[0].inputs] == [mod["main"].params[0].name]
    assert len(spans[0].outputs) == 1 and len(spans[1].inputs) == 1
    assert len(spans[1].outputs) == 1


def test_an_exported_segment_computes_its_ops_and_knows_their_onnx_nodes(branchy):
    model, x, mod, graph = branchy
    span, = cut(mod["main"], [True] * len(graph.nodes))
    seg = export(mod, span)
    got = seg.session().run(None, {"in0": x.numpy()})[0]
    np.testing.assert_allclose(got, _want(model, x), rtol=1e-4, atol=1e-5)
    convs = [n.name for n in graph.nodes if n.op_type == "nn.conv2d"]
    for name in convs:
        assert any(o.endswith("/Conv") for o in seg.onnx_nodes[name])
        assert all(ort_segments.op_of(o, seg.ops) == name for o in seg.onnx_nodes[name])


def test_a_segment_of_one_module_is_exported_once(branchy):
    model, x, mod, graph = branchy
    span, = cut(mod["main"], [True] * len(graph.nodes))
    assert export(mod, span) is export(mod, span)  # a build annotating twice exports once
    other = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    assert export(other, span) is not export(mod, span)


def test_profile_splits_the_segment_among_its_ops(branchy):
    _, _, mod, graph = branchy
    span, = cut(mod["main"], [True] * len(graph.nodes))
    seg = export(mod, span)
    times = ort_profiling.profile(seg, runs=5, weights={n.name: n.flops for n in graph.nodes})
    assert times.whole_s > 0 and all(v >= 0 for v in times.ops.values())
    assert sum(times.ops.values()) <= times.whole_s * 1.5  # the nodes fit in the call
    convs = [n.name for n in graph.nodes if n.op_type == "nn.conv2d"]
    assert all(times.ops[c] > 0 for c in convs)  # fused with their tails, shared back to them


def test_nodes_ort_fuses_under_names_of_their_own_and_its_executor_are_charged_to_ops():
    # ORT fuses a GELU into a "Gelu" node and a residual add with its layer norm into a
    # "SkipLayerNormalization" named after no op; each is the op's whose output it gives, and
    # the call's time beyond its nodes is shared among the ops: the ops add up to the call.
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.ln = torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)

        def forward(self, x):
            return self.ln(torch.nn.functional.gelu(self.fc(x)) + x)

    torch.manual_seed(0)
    mod = autoplace.from_torch(Block().eval(), (torch.randn(1, 8, 32),))
    graph = OpGraph.from_relax(mod)
    span, = cut(mod["main"], [True] * len(graph.nodes))
    times = ort_profiling.profile(export(mod, span), level="all", runs=5)
    assert sum(times.ops.values()) == pytest.approx(times.whole_s) and times.other_s > 0
    assert times.added_s == 0.0  # no node left without an op
    norm = next(n.name for n in graph.nodes if n.op_type == "nn.layer_norm")
    gelu = next(n.name for n in graph.nodes if n.op_type == "nn.gelu")
    assert times.ops[norm] > 0 and times.ops[gelu] > 0



def test_hard_swish_as_torch_export_splits_it_is_one_onnx_node_again(monkeypatch):
    # torch.export writes hardswish and hardsigmoid as add, two clips, a multiply and a divide;
    # the segment gives ORT one HardSwish / HardSigmoid (which it fuses into the conv before it),
    # and each op it replaced knows that node as its own.
    pytest.importorskip("onnxscript")

    class Mobile(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = torch.nn.functional.hardswish(self.c1(x))
            return y * torch.nn.functional.hardsigmoid(self.c2(y))

    torch.manual_seed(0)
    model, x = Mobile().eval(), torch.randn(1, 3, 12, 12)
    _, graph, seg = _one_segment(model, x)
    import onnx

    kinds = [n.op_type for n in onnx.load_from_string(seg.onnx).graph.node]
    assert kinds.count("HardSwish") == 1 and kinds.count("HardSigmoid") == 1
    assert "Clip" not in kinds and "Div" not in kinds
    got = seg.session().run(None, {"in0": x.numpy()})[0]
    np.testing.assert_allclose(got, _want(model, x), rtol=1e-4, atol=1e-5)
    tails = [n.name for n in graph.nodes if n.op_type in ("add", "clip", "maximum", "minimum",
                                                         "divide")]
    assert tails and all(seg.onnx_nodes[t] for t in tails)  # each op has its node(s)
    for t in tails:
        assert all(ort_segments.op_of(o, seg.ops) for o in seg.onnx_nodes[t])
    times = ort_profiling.profile(seg, runs=3)
    assert all(times.ops[t] > 0 for t in tails)  # the node's time shared among its ops

    # without onnxscript, the segment is ORT's to run as exported
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    plain, replaced = ort_segments.refuse(seg.onnx)
    assert plain == seg.onnx and replaced == {}


def test_a_mean_over_every_spatial_axis_is_a_global_average_pool_again():
    # torch.export writes adaptive_avg_pool2d(x, 1) as a mean over the last two axes; the
    # segment gives ORT the GlobalAveragePool it was (which keeps the convs' blocked layout),
    # under the mean's own scope. A mean over one spatial axis stays a mean, and so does one
    # over the last axis of a rank-3 tensor (a norm's, which ORT's norm fusions look for).
    class Squeeze(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 1)

        def forward(self, x):
            y = torch.relu(self.c1(x))
            s = torch.sigmoid(self.c2(torch.nn.functional.adaptive_avg_pool2d(y, 1)))
            flat = y.flatten(2).mean(-1, keepdim=True).unsqueeze(-1)
            return y * s + y.mean(dim=3, keepdim=True) + flat

    import onnx

    torch.manual_seed(0)
    model, x = Squeeze().eval(), torch.randn(1, 3, 12, 12)
    _, graph, seg = _one_segment(model, x)
    nodes = {n.name: n.op_type for n in onnx.load_from_string(seg.onnx).graph.node}
    means = [n.name for n in graph.nodes if n.op_type == "mean"]
    assert len(means) == 3
    kinds = [{nodes[o] for o in seg.onnx_nodes[m]} for m in means]
    assert kinds.count({"GlobalAveragePool"}) == 1 and kinds.count({"ReduceMean"}) == 2
    got = seg.session().run(None, {"in0": x.numpy()})[0]
    np.testing.assert_allclose(got, _want(model, x), rtol=1e-4, atol=1e-5)


def test_a_mean_whose_axes_are_an_input_is_a_global_average_pool_too():
    # from opset 18 a ReduceMean takes its axes as an input (a segment exported at opset 18,
    # for an op added then): read from the initializer, the node becomes the pool as well
    import onnx
    from onnx import TensorProto, helper

    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [-1, -2])
    node = helper.make_node("ReduceMean", ["in0", "axes"], ["out0"], name="/op_lv/ReduceMean")
    graph = helper.make_graph(
        [node], "m", [helper.make_tensor_value_info("in0", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [1, 4, 1, 1])], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    pooled, _ = ort_segments.refuse(model.SerializeToString())
    nodes = onnx.load_from_string(pooled).graph.node
    assert [(n.op_type, n.name, list(n.input)) for n in nodes] == [
        ("GlobalAveragePool", "/op_lv/ReduceMean", ["in0"])]
    x = np.random.default_rng(0).standard_normal((1, 4, 5, 5)).astype("float32")
    got = ort_segments.session(pooled, 1, "all").run(None, {"in0": x})[0]
    np.testing.assert_allclose(got, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("held", ["initializer", "constant"])
def test_the_shapes_a_pool_needs_are_inferred_without_the_weights(held, monkeypatch):
    # the mean reads a conv whose weight is large (an initializer, or a Constant node as the
    # exporter writes some): shape inference runs on the graph with the weight as an input of
    # its type and shape, and the segment keeps the weight itself
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 8, 3, 3)).astype("float32")
    assert w.size > ort_segments._WEIGHT_ELEMENTS
    nodes = [helper.make_node("Conv", ["in0", "w"], ["y"], name="/op_c/Conv"),
             helper.make_node("ReduceMean", ["y"], ["out0"], axes=[2, 3], keepdims=1,
                              name="/op_m/ReduceMean")]
    weights = [numpy_helper.from_array(w, "w")]
    if held == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=weights.pop()))
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("in0", TensorProto.FLOAT, [1, 8, 9, 9])],
        [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [1, 64, 1, 1])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    infer, seen = onnx.shape_inference.infer_shapes, []

    def spy(m, *a, **k):  # the largest tensor shape inference is given
        seen.append(max([0] + [t.ByteSize() for t in m.graph.initializer]
                        + [n.ByteSize() for n in m.graph.node]))
        return infer(m, *a, **k)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy)
    pooled, _ = ort_segments.refuse(model.SerializeToString())
    assert seen and max(seen) < w.nbytes / 4
    got = onnx.load_from_string(pooled).graph
    kinds = [n.op_type for n in got.node]
    assert kinds[-2:] == ["Conv", "GlobalAveragePool"]
    kept = got.initializer[0] if held == "initializer" else got.node[0].attribute[0].t
    np.testing.assert_array_equal(numpy_helper.to_array(kept), w)
    x = rng.standard_normal((1, 8, 9, 9)).astype("float32")
    want = ort_segments.session(model.SerializeToString(), 1, "all").run(None, {"in0": x})[0]
    out = ort_segments.session(pooled, 1, "all").run(None, {"in0": x})[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_a_segment_nothing_applies_to_is_handed_back_as_exported():
    # no mean, no clip: the exported bytes themselves (a large model's are not written again)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    _, _, seg = _one_segment(model, torch.randn(1, 3, 8, 8))
    out, replaced = ort_segments.refuse(seg.onnx)
    assert out is seg.onnx and replaced == {}


def test_a_plan_crossing_between_tvm_and_ort_matches_eager(branchy):
    model, x, mod, graph = branchy
    pool = next(n.index for n in graph.nodes if n.op_type == "nn.max_pool2d")
    assignment = ["ort"] * len(graph.nodes)
    assignment[pool] = "cpu0"
    plan = Plan.from_assignment(graph, DEVICES, assignment)
    np.testing.assert_allclose(_run(mod, plan, x), _want(model, x), rtol=1e-4, atol=1e-5)
    names = [n for n in autoplace.annotate(mod, plan).script().split('"')
             if n.startswith(ort_segments.PREFIX)]
    assert len(set(names)) == 2  # two segments, one call each


def test_optimize_over_three_runtimes_puts_a_segment_on_ort_and_matches_eager(branchy):
    model, x, mod, graph = branchy
    # TVM's CPU slow (roofline costs) and no conv on PyTorch: the convs must go to ORT
    devices = [Device.cpu(0, peak_flops=1e6), Device.torch(unsupported_ops={"nn.conv2d"}),
               Device.onnxruntime()]
    res = autoplace.optimize(mod, devices, cost_model=RooflineCostModel(), calibrate=False,
                             db=None, pins=[("op:nn.max_pool2d", "cpu0")])
    assert "ort" in res.plan.assignment and res.plan.assignment[
        next(n.index for n in graph.nodes if n.op_type == "nn.max_pool2d")] == "cpu0"
    assert "ONNX Runtime segment" in res.summary()
    np.testing.assert_allclose(_run(mod, res.plan, x), _want(model, x), rtol=1e-4, atol=1e-5)
    # the level the segments were priced at travels with the plan, through its JSON too
    timings = res.predictor.models["ort"].timings
    assert res.plan.ort_levels == (("ort", timings.level),)
    assert res.plan.ort_threads == (("ort", timings.session_threads),)
    again = Plan.from_json(res.plan.to_json())
    assert again.ort_levels == res.plan.ort_levels
    assert again.ort_threads == res.plan.ort_threads


def test_a_build_gives_ort_segments_the_plans_level_and_measures_one_it_lacks(branchy,
                                                                              monkeypatch):
    model, x, mod, graph = branchy
    plan = Plan.from_assignment(graph, DEVICES, ["ort"] * len(graph.nodes),
                                ort_levels=(("ort", "basic"),))
    measured, registered = [], []
    real_variant, real_register = ort_profiling.fastest_variant, ort_segments.register
    monkeypatch.setattr(ort_profiling, "fastest_variant",
                        lambda *a, **k: measured.append(1) or real_variant(*a, **k))
    monkeypatch.setattr(ort_segments, "register",
                        lambda seg, threads, level: registered.append((level, threads))
                        or real_register(seg, threads, level))
    np.testing.assert_allclose(_run(mod, plan, x), _want(model, x), rtol=1e-4, atol=1e-5)
    assert [lv for lv, _ in registered] == ["basic"] and not measured
    autoplace.annotate(mod, Plan.from_assignment(graph, DEVICES, ["ort"] * len(graph.nodes)))
    assert measured and ort_segments.level_parts(registered[-1][0])[0] in ort_segments.LEVELS
    # the plan's thread count for the device is what its sessions get, level given or not
    for levels in ((("ort", "extended"),), ()):
        autoplace.annotate(mod, Plan.from_assignment(graph, DEVICES, ["ort"] * len(graph.nodes),
                                                     ort_levels=levels,
                                                     ort_threads=(("ort", 3),)))
        assert registered[-1][1] == 3
    with pytest.raises(autoplace.plan.PlanError, match="ort_levels"):
        Plan.from_assignment(graph, DEVICES, ["ort"] * len(graph.nodes),
                             ort_levels=(("cpu0", "all"),))
    for bad in ((("cpu0", 1),), (("ort", 0),), (("ort", True),)):
        with pytest.raises(autoplace.plan.PlanError, match="ort_threads"):
            Plan.from_assignment(graph, DEVICES, ["ort"] * len(graph.nodes), ort_threads=bad)


def test_a_build_sets_pytorch_threads_only_where_it_makes_pytorch_calls(branchy, monkeypatch):
    import importlib

    compiled = importlib.import_module("autoplace.run.compile")  # the module, not the function
    model, x, mod, graph = branchy
    n = len(graph.nodes)
    set_for = []
    real = compiled.calls_at
    monkeypatch.setattr(compiled, "calls_at", lambda c: set_for.append(c) or real(c))
    for where in (["ort"] * n, ["cpu0"] * n):  # no PyTorch call: nothing to set for one
        plan = Plan.from_assignment(graph, DEVICES, where)
        assert compiled.pytorch_call_threads(plan) is None
        np.testing.assert_allclose(_run(mod, plan, x), _want(model, x), rtol=1e-4, atol=1e-5)
    assert set_for == []
    first = ["torch"] + ["ort"] * (n - 1)  # a PyTorch call beside ORT: on one thread
    plan = Plan.from_assignment(graph, DEVICES, first)
    assert compiled.pytorch_call_threads(plan) == 1
    np.testing.assert_allclose(_run(mod, plan, x), _want(model, x), rtol=1e-4, atol=1e-5)
    assert set_for == [1]


def test_ort_costs_come_from_the_profile_and_crossing_is_charged_on_links(branchy):
    _, _, mod, graph = branchy
    ort = Device.onnxruntime()
    timings = time_ort_device(mod, graph, ort, runs=5)
    level, _ = ort_segments.level_parts(timings.level)
    assert level in ("all", "extended")
    # both levels, then the fusions ORT made at the faster one, each disabled
    assert {("all", 1), ("extended", 1)} <= set(timings.variants_s)
    assert {ort_segments.level_parts(lv)[0] for lv, _ in timings.variants_s
            if lv not in ("all", "extended")} <= {level}
    assert timings.session_threads == 1
    assert timings.edge_s > 0 and timings.segments == 1
    cost = OrtCostModel(timings).predict(graph, ort)
    assert np.isfinite(cost).all() and cost.sum() > 0
    assert np.isinf(OrtCostModel(timings).predict(graph, Device.cpu(0))).all()
    from autoplace.predict.torch_costs import WithTorch

    model = WithTorch(RooflineCostModel(), {"ort": OrtCostModel(timings)})
    found = model.links([Device.cpu(0), ort])
    assert found[("cpu0", "ort")].alpha == pytest.approx(timings.edge_s)
    assert found[("ort", "cpu0")].alpha == pytest.approx(timings.edge_s)
    # the reorders at a segment's edges grow with the tensor: per byte, from the profile
    assert timings.edge_byte_s >= 0 and found[("ort", "cpu0")].time(1 << 20) == pytest.approx(
        timings.edge_s + (1 << 20) * timings.edge_byte_s)


def test_an_unaligned_input_only_ort_reads_is_not_copied_and_one_tvm_reads_is(branchy,
                                                                             monkeypatch):
    from autoplace.pytorch import module as module_mod

    model, x, mod, graph = branchy
    odd = torch.randn(x.numel() + 1)[1:].view(x.shape)  # 4 bytes off 64-byte alignment
    assert odd.data_ptr() % 64
    copied = []
    real = module_mod._into_slot
    monkeypatch.setattr(module_mod, "_into_slot",
                        lambda slot, t: copied.append(1) or real(slot, t))
    n = len(graph.nodes)
    for where, only_ort in ((["ort"] * n, True), (["cpu0"] + ["ort"] * (n - 1), False)):
        build = autoplace.compile(mod, Plan.from_assignment(graph, DEVICES, where))
        assert build.runtime_inputs == (only_ort,)
        m = module_mod.AutoplaceModule(build, [module_mod.TensorSpec.of(x)])
        copied.clear()
        for _ in range(2):
            np.testing.assert_allclose(m.run_flat([odd])[0].numpy(), _want(model, odd),
                                       rtol=1e-4, atol=1e-5)
        assert bool(copied) != only_ort


def test_runtime_only_inputs_are_those_every_use_of_which_is_another_runtimes_call():
    from tvm import relax

    from autoplace.run.compile import runtime_only

    ty = relax.TensorType((4,), "float32")
    bb = relax.BlockBuilder()
    a, b, c, d = (relax.Var(n, ty) for n in "abcd")
    with bb.function("main", [a, b, c, d]):
        with bb.dataflow():
            ort = bb.emit(relax.op.call_pure_packed(f"{ort_segments.PREFIX}x_1_all", a, b,
                                                    ty_args=ty))
            tvm_op = bb.emit(relax.op.add(b, ort))  # b also read by a TVM kernel
            other = bb.emit(relax.op.call_pure_packed("some.function", c, ty_args=ty))
            out = bb.emit_output(relax.Tuple([tvm_op, other, d]))  # d returned as it is
        bb.emit_func_output(out)
    assert runtime_only(bb.get()["main"], 4) == (True, False, False, False)


def test_levels_far_behind_are_timed_no_more(monkeypatch):
    import time

    # A clock that moves only when a session runs: each call takes its session's cost.
    clock, calls = [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    class Timed:
        def __init__(self, k, cost):
            self.k, self.cost = k, cost

        def get_inputs(self):
            return []

        def run(self, names, feed):
            calls.append(self.k)
            clock[0] += self.cost

    sessions = [Timed(0, 1e-3), Timed(1, 1.2e-3), Timed(2, 2e-3)]
    walls = ort_profiling._walls_in_turn(sessions, [], runs=10, warm=0,
                                        drop_above={2: 1.5, 3: 1.05})
    # Two rounds of all three, then the one at 2x the fastest is out; after the third the
    # one at 1.2x too, and with the fastest alone left the rounds end.
    assert [len(w) for w in walls] == [3, 3, 2]
    assert walls[2] == pytest.approx([2e-3, 2e-3])
    walls = ort_profiling._walls_in_turn(sessions, [], runs=10, warm=0)  # none dropped
    assert [len(w) for w in walls] == [10, 10, 10]


def test_the_largest_segment_is_profiled_once_at_the_level_chosen(branchy, monkeypatch,
                                                                   tmp_path):
    from autoplace.profile import ort_timings

    model, x, mod, graph = branchy
    made, real = [], ort_segments.session

    def counted(onnx, threads, level, profile_prefix=None, *args, **kwargs):
        made.append((level, profile_prefix is not None))
        return real(onnx, threads, level, profile_prefix, *args, **kwargs)

    for where in (ort_segments, ort_profiling):  # a segment's own sessions, and others
        monkeypatch.setattr(where, "session", counted)
    monkeypatch.setattr(ort_profiling, "slower_fusions", lambda *a, **k: ((), {}))
    monkeypatch.setattr(ort_timings, "host_call", lambda threads, between: 1e-5)
    timings = time_ort_device(mod, graph, Device.onnxruntime(), runs=3, db=tmp_path / "p.db")
    assert timings.segments == 1
    # The two levels timed in turn, then the one chosen under ORT's profiler: what the
    # segment's profile reads (its nodes' times, and its whole call in the session that ran
    # at that level), nothing made again for it.
    assert sorted(made) == sorted([("all", False), ("extended", False), (timings.level, True)])
    assert all(np.isfinite(timings.ops[i]) and timings.ops[i] >= 0 for i in range(len(graph)))
    # What the device charges still runs: a plan of every op on it matches the model.
    plan = Plan.from_assignment(graph, DEVICES, ["ort"] * len(graph.nodes))
    np.testing.assert_allclose(_run(mod, plan, x), _want(model, x), rtol=1e-4, atol=1e-5)


def test_fastest_variant_times_each_level_at_the_threads_given_and_at_one(branchy,
                                                                         monkeypatch):
    _, _, mod, graph = branchy
    span, = cut(mod["main"], [True] * len(graph.nodes))
    seg = export(mod, span)
    assert ort_profiling.thread_options(1) == (1,)
    assert ort_profiling.thread_options(4) == (4, 1)
    extended = ort_segments.session(seg.onnx, 1, "extended").get_session_options() \
        .graph_optimization_level

    def walls(sessions, feeds, runs, warm=2, **_):  # ORT_ENABLE_EXTENDED on one thread fastest
        for s in sessions:  # each called (a profile reads its nodes), each timed as told
            s.run(None, dict(zip([i.name for i in s.get_inputs()], feeds)))
        opts = [s.get_session_options() for s in sessions]
        return [[1e-3 if (o.intra_op_num_threads, o.graph_optimization_level) == (1, extended)
                 else 2e-3] * 3 for o in opts]

    monkeypatch.setattr(ort_profiling, "_walls_in_turn", walls)
    level, threads, times = ort_profiling.fastest_variant(seg, 2, runs=3)
    assert (level, threads) == ("extended", 1)
    levels = {("all", 2): 2e-3, ("all", 1): 2e-3, ("extended", 2): 2e-3, ("extended", 1): 1e-3}
    assert {k: times[k] for k in levels} == levels
    # then, at that level and count, the fusions ORT made there, each disabled (no faster here)
    assert {lv for lv, t in times if (lv, t) not in levels} == {"extended-ConvActivationFusion"}


@pytest.fixture(scope="module")
def skip_norm():
    from torch_models import skip_norm

    model, x = skip_norm()
    return model, x, *_one_segment(model, x)


def test_a_level_names_the_fusions_it_disables_and_ort_runs_without_them(skip_norm, tmp_path):
    model, x, mod, graph, seg = skip_norm
    assert ort_segments.level_parts("ORT_ENABLE_ALL") == ("all", ())
    assert ort_segments.level_parts("extended-SkipLayerNormFusion") == (
        "extended", ("SkipLayerNormFusion",))
    assert ort_segments.level_text("all-SkipLayerNormFusion-MatMulAddFusion") == (
        "all without SkipLayerNormFusion, MatMulAddFusion")
    for bad, says in (("fast", "one of"), ("all-NoSuchFusion", "NoSuchFusion")):
        with pytest.raises(ValueError, match=says):
            ort_segments.level_parts(bad)
    kinds = {}
    for level in ("extended", "extended-SkipLayerNormFusion"):
        path = str(tmp_path / f"{level}.onnx")
        sess = ort_segments.session(seg.onnx, 1, level, optimized=path)
        kinds[level] = ort_profiling._node_kinds(path)
        got, = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
        np.testing.assert_allclose(got, _want(model, x), rtol=1e-4, atol=1e-5)
    assert kinds["extended"]["com.microsoft:SkipLayerNormalization"] == 1
    assert kinds["extended-SkipLayerNormFusion"]["com.microsoft:SkipLayerNormalization"] == 0
    # a plan carries such a level, through its JSON too, and its build runs the segment so
    plan = Plan.from_assignment(graph, DEVICES, ["ort"] * len(graph.nodes),
                                ort_levels=(("ort", "extended-SkipLayerNormFusion"),))
    assert Plan.from_json(plan.to_json()).ort_levels == plan.ort_levels
    np.testing.assert_allclose(_run(mod, plan, x), _want(model, x), rtol=1e-4, atol=1e-5)
    assert [n.endswith("_extended-SkipLayerNormFusion")
            for n in ort_segments.called(autoplace.annotate(mod, plan))] == [True]
    with pytest.raises(autoplace.plan.PlanError, match="ort_levels"):
        Plan.from_assignment(graph, DEVICES, ["ort"] * len(graph.nodes),
                             ort_levels=(("ort", "extended-NoSuchFusion"),))


@pytest.mark.parametrize("without, disabled", [(0.9, True), (0.99, False), (1.5, False)])
def test_a_fusion_stays_disabled_only_where_the_segment_runs_faster_without_it(
        skip_norm, monkeypatch, without, disabled):
    seg = skip_norm[-1]
    real = ort_segments.session

    def tagged(model, threads, level, *args, **kwargs):  # each session knows its level
        sess = real(model, threads, level, *args, **kwargs)
        sess.autoplace_level = level
        sess.autoplace_profiled = bool(args and args[0] or kwargs.get("profile_prefix"))
        return sess

    def walls(sessions, feeds, runs, warm=2):  # 'extended' the fastest; without the fusion: x
        def seconds(level):
            base = 1e-3 if level.startswith("extended") else 2e-3
            return base * (without if "SkipLayerNormFusion" in level else 1.0)
        for s in sessions:  # each called (a profile reads its nodes), each timed as told
            s.run(None, dict(zip([i.name for i in s.get_inputs()], feeds)))
        return [[seconds(s.autoplace_level)] * 3 for s in sessions]

    rounds = []  # the sessions timed in turn, each time (not the profiled one's calls)

    def in_turn(sessions, feeds, runs, warm=2, **_):
        if not sessions[0].autoplace_profiled:
            rounds.append([s.autoplace_level for s in sessions])
        return walls(sessions, feeds, runs)

    for where in (ort_segments, ort_profiling):  # a segment's own sessions, and others
        monkeypatch.setattr(where, "session", tagged)
    monkeypatch.setattr(ort_profiling, "_walls_in_turn", in_turn)
    level, threads, times = ort_profiling.fastest_variant(seg, 1, runs=3)
    assert times[("extended-SkipLayerNormFusion", 1)] == pytest.approx(without * 1e-3)
    assert level == ("extended-SkipLayerNormFusion" if disabled else "extended")
    assert threads == 1
    # the levels, then one call of each fusion's variant (the linear's Gemm is one too) after
    # the level's, then those whose first call was not far slower timed in turn with it
    assert rounds[1][0] == "extended" and "extended-SkipLayerNormFusion" in rounds[1]
    assert rounds[2][0] == "extended"
    assert ("extended-SkipLayerNormFusion" in rounds[2]) == (
        without <= 1 + ort_profiling.EARLY_DROP)


@pytest.mark.parametrize("share, tried", [(0.02, False), (0.5, True)])
def test_a_fusion_is_tried_only_where_its_nodes_take_enough_of_the_call_to_win(
        skip_norm, monkeypatch, share, tried):
    # without its fused nodes, at most their time is saved: under the margin, nothing to win
    monkeypatch.setattr(ort_profiling, "_kind_shares", lambda *a: {
        "com.microsoft:SkipLayerNormalization": share, "ai.onnx:MatMul": 1 - share})
    feeds = ort_segments.random_inputs(skip_norm[-1].inputs)
    _, times = ort_profiling.slower_fusions(skip_norm[-1].onnx, "extended", 1, feeds, runs=3)
    assert ("extended-SkipLayerNormFusion" in times) == tried


def test_segments_are_priced_and_stored_at_the_threads_that_ran_fastest(branchy, tmp_path,
                                                                         monkeypatch):
    from autoplace.profile import ProfileStore, ort_timings
    from autoplace.profile.measurements import OverheadFit

    _, _, mod, graph = branchy
    ort, db = Device.onnxruntime(), tmp_path / "prof.db"
    times = {("all", 2): 3e-4, ("all", 1): 2e-4, ("extended", 2): 4e-4, ("extended", 1): 5e-4}
    monkeypatch.setattr(ort_profiling, "fastest_variant", lambda seg, threads, runs, **_: (
        "all", 1, {k: v for k, v in times.items() if k[1] in (threads, 1)}))
    profiled, called = [], []
    real_profile = ort_profiling.profile
    monkeypatch.setattr(ort_profiling, "profile", lambda seg, threads, *a, **k: (
        profiled.append(threads) or real_profile(seg, threads, *a, **k)))
    monkeypatch.setattr(ort_timings, "host_call",
                        lambda threads, between: called.append(threads) or 1e-5)
    first = time_ort_device(mod, graph, ort, threads=2, runs=3, db=db)
    assert (first.threads, first.session_threads, first.level) == (2, 1, "all")
    assert set(profiled) == {1} and called == [1]
    assert "at 1 intra-op thread(s)" in OrtCostModel(first).describe(graph)
    again = time_ort_device(mod, graph, ort, threads=2, runs=3, db=db)
    assert again.stored and again.session_threads == 1 and again.variants_s == times
    # a store written before the thread count was measured: its levels, at the threads given
    with ProfileStore(db) as store:
        fp = next(d.fingerprint for d in store.devices() if d.info["kind"] == "ort")
        edge, = [f for f in store.overheads(fp) if f.kind == "ort_edge"]
        old = {k: v for k, v in edge.detail.items() if k not in ("run_threads", "variants_s")}
        store.put_overhead(OverheadFit(fp, "", "ort_edge", edge.seconds,
                                       {**old, "levels_s": {"all": 3e-4, "extended": 4e-4}},
                                       edge.measured_at))
        before = ort_timings.stored(store, graph, ort, 2)
    assert before.session_threads == 2
    assert before.variants_s == {("all", 2): 3e-4, ("extended", 2): 4e-4}


def test_an_ort_error_at_run_time_names_the_segments_ops(branchy):
    _, _, mod, graph = branchy
    span, = cut(mod["main"], [True] * len(graph.nodes))
    seg = export(mod, span)
    fn = tvm.get_global_func(ort_segments.register(seg))
    wrong = tvm.runtime.tensor(np.zeros((1, 3, 4, 4), "float32"))  # not the segment's shape
    with pytest.raises(Exception, match=r"ONNX Runtime segment of .*lv"):
        fn(wrong)


def test_an_op_without_a_pytorch_equivalent_is_left_to_the_other_devices():
    class Gather(torch.nn.Module):
        def forward(self, x, i):
            return torch.relu(x).gather(1, i) * 2.0

    x, i = torch.randn(6, 4), torch.tensor([[0, 3], [2, 2], [1, 0], [3, 1], [0, 0], [2, 1]])
    mod = autoplace.from_torch(Gather().eval(), (x, i))
    graph = OpGraph.from_relax(mod)
    timings = time_ort_device(mod, graph, Device.onnxruntime(), runs=3)
    gather = [n.index for n in graph.nodes if n.op_type == "gather_elements"]
    assert gather and all(np.isinf(timings.ops[t]) for t in gather)
    assert all("no such op" in timings.why[t] for t in gather)
    res = autoplace.optimize(mod, [Device.cpu(0), Device.onnxruntime()],
                             cost_model=RooflineCostModel(), calibrate=False, db=None)
    assert all(res.plan.assignment[t] == "cpu0" for t in gather)
    out = autoplace.compile(mod, res.plan)(x.numpy(), i.numpy())
    got = np.asarray(out[0] if isinstance(out, (list, tuple)) else out)
    np.testing.assert_allclose(got, (torch.relu(x).gather(1, i) * 2.0).numpy(), rtol=1e-5)


def test_ort_device_without_onnxruntime_is_one_line_and_exit_2(monkeypatch, capsys):
    from autoplace.cli import main

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises
    assert main(["optimize", "--model", "zoo:mlp", "--device", "cpu:0",
                 "--device", "ort:cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'autoplace[ort]'" in err[0]


def test_ort_costs_and_edge_are_stored_in_the_profile_and_read_back(branchy, tmp_path,
                                                                     monkeypatch):
    from autoplace.profile import ProfileStore
    from autoplace.profile import ort_timings

    _, _, mod, graph = branchy
    db = tmp_path / "prof.db"
    ort = Device.onnxruntime()
    first = time_ort_device(mod, graph, ort, runs=3, db=db)
    assert not first.stored
    with ProfileStore(db, readonly=True) as store:
        fp = next(d.fingerprint for d in store.devices() if d.info["kind"] == "ort")
        edge, = [f for f in store.overheads(fp) if f.kind == "ort_edge"]
        assert edge.seconds == pytest.approx(first.edge_s)
        assert edge.detail["level"] == first.level
        rows = store.measurements(fp, schedule=f"ort:{first.level}")
        assert {m.workload for m in rows} == set(graph.workloads())
        assert not store.measurements(fp)  # not among the default schedule's rows

    def timed(*args, **kwargs):
        raise AssertionError("timed again although the store holds every op")

    monkeypatch.setattr(ort_timings, "_timed", timed)
    again = time_ort_device(mod, graph, ort, runs=3, db=db)
    assert again.stored and again.edge_s == pytest.approx(first.edge_s)
    assert again.edge_byte_s == pytest.approx(first.edge_byte_s)
    for i, s in first.ops.items():  # each op: its workload's mean in context
        same = graph.workloads()[graph.nodes[i].workload_key]
        assert again.ops[i] == pytest.approx(np.mean([first.ops[k] for k in same]))
    assert again.between_bytes == first.between_bytes == ort_timings.between_bytes(graph) > 0
    # a model whose ops touch ten times the bytes between two calls: its call is timed again
    monkeypatch.setattr(ort_timings, "between_bytes", lambda g: 10 * first.between_bytes)
    with ProfileStore(db, readonly=True) as store:
        assert ort_timings.stored(store, graph, ort) is None


def test_the_same_graph_again_reads_what_this_host_timed_of_it(branchy, tmp_path, monkeypatch):
    """Without a store, a graph's timings are kept in the host's cache: the same graph again
    (the same model in another process) times nothing; another graph, or a file that cannot be
    read, is timed."""
    from autoplace.profile import ort_timings

    _, _, mod, graph = branchy
    ort = Device.onnxruntime()
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    first = time_ort_device(mod, graph, ort, runs=3)
    assert not first.kept
    timed, real = [], ort_timings._timed
    monkeypatch.setattr(ort_timings, "_timed", lambda *a: timed.append(1) or real(*a))
    again = time_ort_device(mod, graph, ort, runs=3)
    assert again.kept and not timed and "earlier run" in OrtCostModel(again).describe(graph)
    assert again == replace(first, kept=True)
    time_ort_device(mod, graph, ort, threads=2, runs=3)  # other threads: timed
    assert len(timed) == 1
    for f in ort_timings.kept_dir().glob("*.json"):
        f.write_text("{not json")
    assert not time_ort_device(mod, graph, ort, runs=3).kept and len(timed) == 2


def test_a_saved_module_with_ort_segments_loads_and_runs_in_a_new_process(branchy, tmp_path):
    import subprocess
    import textwrap

    model, x, _, _ = branchy
    m = autoplace.optimize_module(model, (x,), [Device.cpu(0, peak_flops=1e6),
                                                Device.onnxruntime()],
                                  cost_model=RooflineCostModel(), calibrate=False, db=None,
                                  eager_fallback=False)
    assert "ort" in m.plan.assignment and m.runs == "build"
    path = tmp_path / "m.apmod"
    m.save(path)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "want.npy", _want(model, x))
    script = textwrap.dedent(f"""
        import numpy as np, torch, autoplace
        m = autoplace.load_module({str(path)!r})
        x = torch.from_numpy(np.load({str(tmp_path / 'x.npy')!r}))
        got = m(x).numpy()
        np.testing.assert_allclose(got, np.load({str(tmp_path / 'want.npy')!r}), rtol=1e-4,
                                   atol=1e-5)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_a_concat_runs_inside_an_ort_segment_not_on_the_torch_device():
    class Fire(torch.nn.Module):  # squeeze, then two expands concatenated (SqueezeNet's block)
        def __init__(self):
            super().__init__()
            self.s = torch.nn.Conv2d(8, 4, 1)
            self.e1, self.e3 = torch.nn.Conv2d(4, 8, 1), torch.nn.Conv2d(4, 8, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.s(x))
            return torch.cat([torch.relu(self.e1(y)), torch.relu(self.e3(y))], 1)

    torch.manual_seed(0)
    model, x = Fire().eval(), torch.randn(1, 8, 12, 12)
    mod = autoplace.from_torch(model, (x,))
    graph = OpGraph.from_relax(mod)
    assert Device.onnxruntime().can_run("concat") and not Device.torch().can_run("concat")
    timings = time_ort_device(mod, graph, Device.onnxruntime(), runs=3)
    assert timings.segments == 1 and all(np.isfinite(list(timings.ops.values())))
    plan = Plan.from_assignment(graph, [Device.cpu(0), Device.onnxruntime()],
                                ["ort"] * len(graph.nodes))
    np.testing.assert_allclose(_run(mod, plan, x), _want(model, x), rtol=1e-4, atol=1e-5)


def test_a_split_is_one_onnx_split_in_a_segment():
    class Shuffle(torch.nn.Module):  # ShuffleNet's unit: halves of unequal work, shuffled
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(4, 4, 1)

        def forward(self, x):
            a, b = x.chunk(2, dim=1)
            y = torch.cat([a, torch.relu(self.c(b))], 1)
            return y.view(1, 2, 4, 6, 6).transpose(1, 2).reshape(1, 8, 6, 6)

    torch.manual_seed(0)
    model, x = Shuffle().eval(), torch.randn(1, 8, 6, 6)
    mod = autoplace.from_torch(model, (x,))
    graph = OpGraph.from_relax(mod)
    assert any(n.op_type == "split" for n in graph.nodes)
    span, = cut(mod["main"], [True] * len(graph.nodes))
    seg = export(mod, span)
    import onnx

    kinds = [n.op_type for n in onnx.load_from_string(seg.onnx).graph.node]
    assert kinds.count("Split") == 1 and "Loop" not in kinds
    np.testing.assert_allclose(seg.session().run(None, {"in0": x.numpy()})[0], _want(model, x),
                               rtol=1e-5, atol=1e-6)


def test_a_calibration_need_not_time_the_ops_a_runtime_device_wins_by_far(branchy):
    from autoplace.pricing import price, tvm_loses
    from autoplace.profile.ort_timings import OrtTimings

    _, _, mod, graph = branchy
    rough = price(mod, graph, [Device.cpu(0)], "latency", RooflineCostModel(), None, "main",
                  False, None)
    on_tvm = rough.cost[:, 0]
    by_far = {n.workload_key for n in graph.nodes if n.op_type == "nn.conv2d"}
    # ORT runs the convs at a tenth of TVM's cost, everything else at twice it
    ops = {n.index: on_tvm[n.index] / 10 if n.workload_key in by_far else 2 * on_tvm[n.index]
           + 1e-6 for n in graph.nodes}
    ort = Device.onnxruntime()
    model = OrtCostModel(OrtTimings(ops, edge_s=0.0, level="all"))
    assert tvm_loses(graph, rough, [ort], {ort.name: model}) == by_far
    # TVM's costs a margin off would still lose to a tenth of them, not to a half
    assert tvm_loses(graph, rough, [ort], {ort.name: model}, margin=20.0) == frozenset()


def test_the_ort_call_figure_is_kept_per_host_and_working_set(monkeypatch, tmp_path):
    from autoplace.profile import ort_timings

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(ort_timings, "measure_call",
                        lambda threads, between_bytes: calls.append(between_bytes) or 9e-6)
    assert ort_timings.host_call(1, 3 << 20) == 9e-6 and calls == [3 << 20]
    assert ort_timings.host_call(1, 3 << 20) == 9e-6 and len(calls) == 1  # read back
    ort_timings.host_call(1, 1 << 24)  # a working set 5x larger: measured again
    ort_timings.host_call(2, 3 << 20)  # another thread count too
    assert len(calls) == 3
    for f in tmp_path.rglob("ort_call-*.json"):
        f.write_text("{")  # damaged: measured again, with a warning
    ort_timings.host_call(1, 3 << 20)
    assert len(calls) == 4


def test_the_ort_call_is_measured_from_the_vm_on_segments_of_one_node(caplog):
    from autoplace.profile import ort_timings

    seg = ort_timings._one_node("Sigmoid", (4, 8))
    x = np.linspace(-3, 3, 32, dtype="float32").reshape(4, 8)
    sess = seg.session()
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x)), rtol=1e-5)
    assert set(ort_profiling.profile(seg, runs=3).ops) == {"sigmoid"}  # its node is the op's
    with caplog.at_level("WARNING"):
        seconds = ort_timings.measure_call(1, calls=2, between_bytes=1 << 20, rounds=1)
    if "could not measure" in caplog.text:  # a busy machine: the call no slower than its nodes
        assert "its nodes" in caplog.text and seconds == ort_timings.DEFAULT_CALL_S
    else:
        assert 0.0 < seconds < 0.1


def test_an_ort_call_measured_no_slower_than_its_nodes_is_charged_the_default(monkeypatch,
                                                                             caplog):
    from autoplace.profile import cold_calls, ort_timings

    monkeypatch.setattr(cold_calls, "cold_call_seconds", lambda *a, **k: 1e-9)
    with caplog.at_level("WARNING"):
        seconds = ort_timings.measure_call(1, calls=2, rounds=1)
    assert seconds == ort_timings.DEFAULT_CALL_S
    assert "could not measure" in caplog.text and "its nodes" in caplog.text


def test_an_ort_output_is_adopted_where_tvm_takes_its_memory_and_copied_where_not():
    adopted = ort_segments._adopted
    base = ort_segments.aligned_empty((65,), "float32")
    base[:] = np.arange(65)
    kept = adopted(base[:64].reshape(8, 8), (8, 8), np.dtype("float32"), "relu")
    assert np.from_dlpack(kept).ctypes.data == base.ctypes.data  # adopted, not copied
    for given in (base[1:].reshape(8, 8),  # 4 bytes off alignment
                  np.arange(64, dtype="float64").reshape(8, 8)):  # another dtype: cast
        got = np.from_dlpack(adopted(given, (8, 8), np.dtype("float32"), "relu"))
        assert got.dtype == np.float32 and got.ctypes.data % 64 == 0
        np.testing.assert_array_equal(got, given.astype("float32"))
    strided = base[:64].reshape(8, 8)[:, ::2]  # not contiguous
    got = np.from_dlpack(adopted(strided, (8, 4), np.dtype("float32"), "relu"))
    np.testing.assert_array_equal(got, strided)
    with pytest.raises(ort_segments.OrtSegmentError, match="relu gave an output of shape"):
        adopted(base[:64], (8, 8), np.dtype("float32"), "relu")


def test_embeddings_powers_and_rotations_run_on_pytorch_and_in_ort_segments():
    # what decoders' embeddings, RMS norms and rotary positions import as: take, arange, power,
    # cos, sin, slices (and abs): each runs as its PyTorch call, alone or inside an ORT segment
    class Decoderish(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 16)

        def forward(self, ids):
            e = self.emb(ids) + torch.arange(16.0)
            halves = torch.sin(-e[:, 1:, 8:] * e[:, 1:, :8]).sum(-1, keepdim=True)
            return e[:, 1:].pow(2) + torch.cos(e[:, 1:]) * halves - e.abs()[:, ::2].sum()

    torch.manual_seed(0)
    model, ids = Decoderish().eval(), torch.tensor([[1, 7, 3, 3, 9]])
    mod = autoplace.from_torch(model, (ids,))
    graph = OpGraph.from_relax(mod)
    kinds = {n.op_type for n in graph.nodes}
    assert {"take", "arange", "power", "cos", "sin", "abs", "strided_slice"} <= kinds
    with torch.no_grad():
        want = model(ids).numpy()
    for dev in (Device.torch(), Device.onnxruntime()):
        on = [dev.name if dev.can_run(n.op_type) else "cpu0" for n in graph.nodes]
        assert on.count("cpu0") == (dev.kind == "torch")  # a call takes tensors: arange on TVM
        plan = Plan.from_assignment(graph, [Device.cpu(0), dev], on)
        out = autoplace.compile(mod, plan)(ids.numpy())
        got = np.asarray(out[0] if isinstance(out, (list, tuple)) else out)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_random_inputs_of_segments_and_torch_calls_are_arrays_also_without_dimensions():
    # A decoder's segment can take a 0-d mask or index: numpy makes those scalars, which
    # torch.from_numpy refuses (the export of gpt2's segments stopped on one).
    import torch

    from autoplace.backend.ort_segments import random_inputs

    specs = [((), "bool"), ((), "int64"), ((), "float32"), ((2, 3), "bool")]
    for (shape, dtype), a in zip(specs, random_inputs(specs)):
        t = torch.from_numpy(a)
        assert tuple(t.shape) == shape and str(a.dtype) == dtype
    # and those of the ops the torch device times alone
    from types import SimpleNamespace

    from autoplace.profile.torch_runner import random_torch_inputs

    node = SimpleNamespace(inputs=[SimpleNamespace(shape=s, dtype=d) for s, d in specs])
    got = random_torch_inputs(node, np.random.default_rng(0))
    assert [(tuple(t.shape), str(t.dtype)) for t in got] == [
        (s, f"torch.{d}") for s, d in specs]


def test_a_segment_with_an_op_onnx_added_after_opset_17_is_exported_at_that_opset():
    # PyTorch exports bitwise_and only at opset 18 (a decoder's masks): the segment is exported
    # at 18 rather than left to the other devices.
    class Masked(torch.nn.Module):
        def forward(self, x, y):
            return torch.where((x > 0) & (y > 0), x, y)

    x, y = torch.randn(2, 5), torch.randn(2, 5)
    mod = autoplace.from_torch(Masked(), (x, y))
    graph = OpGraph.from_relax(mod)
    assert "bitwise_and" in " ".join(n.op_type for n in graph.nodes)
    span, = cut(mod["main"], [True] * len(graph.nodes))
    seg = export(mod, span)
    import onnx

    assert {o.version for o in onnx.load_from_string(seg.onnx).opset_import if o.domain in
            ("", "ai.onnx")} == {18}
    got = seg.session().run(None, {"in0": x.numpy(), "in1": y.numpy()})[0]
    np.testing.assert_array_equal(got, torch.where((x > 0) & (y > 0), x, y).numpy())
