"""The op graph: nodes, edges, FLOPs, bytes, workload keys, and clear errors for what it cannot hold."""

import pytest
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import autoplace
from autoplace.graph import UnsupportedModelError, count_flops


@I.ir_module
class Diamond:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.nn.relu(a)
            c = R.nn.relu(a)
            d = R.add(b, c)
            e = R.matmul(d, w)
            R.output(e)
        return e


def test_nodes_edges_and_costs():
    g = autoplace.OpGraph.from_relax(Diamond)
    assert [n.name for n in g.nodes] == ["a", "b", "c", "d", "e"]
    assert [n.op_type for n in g.nodes] == ["matmul", "nn.relu", "nn.relu", "add", "matmul"]
    # 4x8 @ 8x8: 2 * 4 * 8 * 8 = 512 FLOPs; relu/add one per element: 32.
    assert [n.flops for n in g.nodes] == [512, 32, 32, 32, 512]
    # Every intermediate tensor is 4x8 float32 = 128 bytes.
    assert {(e.src, e.dst, e.nbytes) for e in g.edges} == {
        (0, 1, 128), (0, 2, 128), (1, 3, 128), (2, 3, 128), (3, 4, 128)}
    # w (8x8 float32 = 256 bytes) is a weight (num_input = 1): parameter bytes of both matmuls.
    assert [n.param_bytes for n in g.nodes] == [256, 0, 0, 0, 256]
    assert g.nodes[0].bytes_read == 128 + 256 and g.nodes[0].bytes_written == 128
    assert g.outputs == (4,)
    assert [(i.name, i.is_weight, i.consumers) for i in g.inputs] == [
        ("x", False, (0,)), ("w", True, (0, 4))]


def test_identical_ops_share_a_workload_key():
    g = autoplace.OpGraph.from_relax(Diamond)
    groups = g.workloads()
    assert sorted(map(sorted, groups.values())) == [[0, 4], [1, 2], [3]]
    assert g.nodes[0].workload_key != g.nodes[1].workload_key


def test_graph_is_immutable():
    g = autoplace.OpGraph.from_relax(Diamond)
    with pytest.raises(AttributeError):
        g.nodes[0].name = "other"


def test_to_networkx_is_a_dag_in_topological_order():
    import networkx as nx

    g = autoplace.OpGraph.from_relax(Diamond).to_networkx()
    assert nx.is_directed_acyclic_graph(g)
    assert all(u < v for u, v in g.edges)


@I.ir_module
class Dynamic:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32")):
        with R.dataflow():
            y = R.nn.relu(x)
            R.output(y)
        return y


@I.ir_module
class TwoFunctions:
    @R.function
    def helper(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        return x

    @R.function
    def main(x: R.Tensor((4,), "float32")):
        cls = TwoFunctions
        y = cls.helper(x)
        return y


@I.ir_module
class WithIf:
    @R.function
    def main(c: R.Tensor((), "bool"), x: R.Tensor((4,), "float32")):
        if c:
            y = R.nn.relu(x)
        else:
            y = x
        return y


@I.ir_module
class Lowered:
    @T.prim_func(private=True)
    def relu(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        for i in range(4):
            y[i] = T.max(x[i], T.float32(0))

    @R.function
    def main(x: R.Tensor((4,), "float32")):
        cls = Lowered
        y = R.call_tir(cls.relu, (x,), out_ty=R.Tensor((4,), "float32"))
        return y


@pytest.mark.parametrize("mod, words", [
    (Dynamic, ["symbolic", "static"]),
    (TwoFunctions, ["'y'", "other functions"]),
    (WithIf, ["control flow"]),
])
def test_unsupported_modules_say_what_and_where(mod, words):
    with pytest.raises(UnsupportedModelError) as e:
        autoplace.OpGraph.from_relax(mod)
    for w in words:
        assert w in str(e.value)


def test_call_tir_is_a_node_named_by_its_prim_func():
    # The ONNX frontend emits some call_tir itself; they are placed like any op.
    g = autoplace.OpGraph.from_relax(Lowered)
    assert [(n.op_type, n.extra_args) for n in g.nodes] == [("call_tir", ("relu",))]


def test_missing_function_lists_the_ones_there():
    with pytest.raises(UnsupportedModelError, match="no function 'forward'.*main"):
        autoplace.OpGraph.from_relax(Diamond, "forward")


@pytest.mark.parametrize("op, ins, outs, attrs, expected", [
    # 3x3 conv, 8 -> 16 channels, 10x10 output: 2 * (16*10*10) * (8*3*3) FLOPs.
    ("relax.nn.conv2d", [(1, 8, 10, 10), (16, 8, 3, 3)], [(1, 16, 10, 10)], {}, 2 * 1600 * 72),
    # Depthwise 3x3 on 8 channels (weight 8x1x3x3): 2 * 800 * 9.
    ("relax.nn.conv2d", [(1, 8, 10, 10), (8, 1, 3, 3)], [(1, 8, 10, 10)], {"groups": 8}, 2 * 800 * 9),
    # HWIO kernel layout: O is the last axis.
    ("relax.nn.conv2d", [(1, 10, 10, 8), (3, 3, 8, 16)], [(1, 10, 10, 16)],
     {"kernel_layout": "HWIO"}, 2 * 1600 * 72),
    ("relax.nn.max_pool2d", [(1, 8, 10, 10)], [(1, 8, 5, 5)], {"pool_size": [2, 2]}, 200 * 4),
    ("relax.sum", [(4, 8)], [(4,)], {}, 32),
    ("relax.nn.softmax", [(4, 8)], [(4, 8)], {}, 5 * 32),
    ("relax.reshape", [(4, 8)], [(32,)], {}, 0),
    ("relax.matmul", [(2, 4, 8), (8, 16)], [(2, 4, 16)], {}, 2 * 128 * 8),
])
def test_flop_counts(op, ins, outs, attrs, expected):
    assert count_flops(op, ins, outs, attrs) == expected
