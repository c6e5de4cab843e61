"""The annotation pass against hand-written expected TVMScript (before / plan / expected)."""

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import autoplace
from autoplace.annotate import annotate_lifted


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.nn.relu(a)
            c = R.add(a, b)
            d = R.multiply(a, c)
            R.output(d)
        return d


# Plan: a on device a; b, c on b; d on a.
# - x, w live on a (their first consumer, matmul a);
# - a crosses to b once, although b and c both read it on b;
# - c comes back to a for d; nothing else crosses.
@I.ir_module
class Expected:
    I.module_global_infos({"vdevice": [I.vdevice("llvm", 0), I.vdevice("llvm", 1)]})

    @R.function
    def main(x: R.Tensor((4, 8), "float32", "llvm:0"), w: R.Tensor((8, 8), "float32", "llvm:0")
             ) -> R.Tensor((4, 8), "float32", "llvm:0"):
        with R.dataflow():
            a: R.Tensor((4, 8), "float32", "llvm:0") = R.matmul(x, w)
            a_to_b: R.Tensor((4, 8), "float32", "llvm:1") = R.to_vdevice(a, "llvm:1")
            b: R.Tensor((4, 8), "float32", "llvm:1") = R.nn.relu(a_to_b)
            c: R.Tensor((4, 8), "float32", "llvm:1") = R.add(a_to_b, b)
            c_to_a: R.Tensor((4, 8), "float32", "llvm:0") = R.to_vdevice(c, "llvm:0")
            d: R.Tensor((4, 8), "float32", "llvm:0") = R.multiply(a, c_to_a)
            R.output(d)
        return d


def _plan(devs, assignment, mod=Before):
    g = autoplace.OpGraph.from_relax(mod)
    return autoplace.Plan.from_assignment(g, devs, assignment)


def test_annotate_matches_expected():
    # Expected names the generic target: a device's default, native, names this host's CPU.
    devs = [autoplace.Device.cpu(0, name="a", target="llvm"),
            autoplace.Device.cpu(1, name="b", target="llvm")]
    got = autoplace.annotate(Before, _plan(devs, ["a", "b", "b", "a"]))
    tvm.ir.assert_structural_equal(got, Expected)


def test_annotate_leaves_input_unchanged(devs):
    before_text = Before.script()
    autoplace.annotate(Before, _plan(devs, ["a", "b", "b", "a"]))
    assert Before.script() == before_text
    assert "vdevice" not in Before.script()


def test_annotated_module_is_a_realize_vdevice_fixed_point(devs):
    got = autoplace.annotate(Before, _plan(devs, ["b", "a", "b", "a"]))
    tvm.ir.assert_structural_equal(relax.transform.RealizeVDevice()(got), got)


def _to_vdevice_calls(mod):
    return [b for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and b.value.op.name == "relax.to_vdevice"]


def test_one_copy_per_tensor_and_destination(devs):
    # a is read by b, c (device b) and d (device a): one copy a -> b only.
    got = autoplace.annotate(Before, _plan(devs, ["a", "b", "b", "a"]))
    assert len(_to_vdevice_calls(got)) == 2  # a -> b, c -> a
    # All on one device: no copy at all.
    assert _to_vdevice_calls(autoplace.annotate(Before, _plan(devs, ["b"] * 4))) == []


@I.ir_module
class SharedWeight:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            h = R.matmul(x, w)
            k = R.add(h, R.const(np.ones((4,), "float32")))
            y = R.matmul(k, w)
            R.output(y)
        return y


def test_weight_copied_and_constant_placed_on_consumer(devs):
    got = autoplace.annotate(SharedWeight, _plan(devs, ["a", "b", "b"], SharedWeight))
    params = got["main"].params
    assert [int(p.ty.vdevice.vdevice_id) for p in params] == [0, 0]  # first consumer is on a
    copied = {b.value.args[0].name for b in _to_vdevice_calls(got)}
    assert copied == {"h", "w"}  # w goes to b once for y; h crosses for k
    add = [b for b in got["main"].body.blocks[0].bindings if b.var.name == "k"][0]
    assert int(add.value.args[1].ty.vdevice.vdevice_id) == 1  # constant lives with its consumer


def test_lifted_constants_become_trailing_parameters(devs):
    got, lifted = annotate_lifted(SharedWeight, _plan(devs, ["a", "b", "b"], SharedWeight))
    assert len(got["main"].params) == 3 and len(lifted) == 1
    assert lifted[0][1] == 1  # on device position 1 (b)
    np.testing.assert_array_equal(lifted[0][0].numpy(), np.ones(4, "float32"))


@I.ir_module
class MixedTuple:
    @R.function
    def main(x: R.Tensor((2, 4), "float32")):
        with R.dataflow():
            p = R.nn.relu(x)
            q = R.exp(x)
            t = (p, q)
            first = t[0]
            both = R.concat(t, axis=0)
            y = R.add(first, R.sum(both, axis=0))
            R.output(y)
        return y


def test_tuple_of_tensors_on_two_devices(devs, rng):
    # p on a, q on b, concat and add on b. x lives with p (its first consumer) and crosses for q.
    # t[0] is p itself: concat (field by field) and add share one copy of p to b.
    g = autoplace.OpGraph.from_relax(MixedTuple)
    assert [n.op_type for n in g.nodes] == ["nn.relu", "exp", "concat", "sum", "add"]
    plan = autoplace.Plan.from_assignment(g, devs, ["a", "b", "b", "b", "b"])
    got = autoplace.annotate(MixedTuple, plan)
    tvm.ir.assert_structural_equal(relax.transform.RealizeVDevice()(got), got)
    assert [b.value.args[0].name for b in _to_vdevice_calls(got)] == ["x", "p"]
    x = rng.standard_normal((2, 4)).astype("float32")
    p, q = np.maximum(x, 0), np.exp(x)
    expected = p + np.concatenate([p, q]).sum(axis=0)
    out = autoplace.compile(MixedTuple, plan)(x)[0]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_a_plan_of_tvm_devices_annotates_without_pytorch(monkeypatch):
    # PyTorch is an optional extra: a plan without a torch device never imports it, not even
    # for a linear (a matmul by a constant, its bias add), which a torch device would run as one
    # PyTorch call.
    import sys

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(np.ones((8, 16), "float32"))))
            out = bb.emit_output(relax.op.add(y, relax.const(np.ones(16, "float32"))))
        bb.emit_func_output(out)
    devs = [autoplace.Device.cpu(0, name="a", target="llvm")]
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    run = autoplace.compile(bb.get(), _plan(devs, ["a", "a"], bb.get()))
    np.testing.assert_allclose(run(np.ones((2, 8), "float32"))[0], np.full((2, 16), 9.0))
