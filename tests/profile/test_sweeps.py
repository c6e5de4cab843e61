"""Shape sweeps: distinct one-op modules around real-model shapes that build and run on the CPU."""

import numpy as np
import pytest

from autoplace.graph import OpGraph
from autoplace.profile.sweeps import FAMILY_HELP, from_specs, sweep, sweep_families, sweep_names

OPS = sweep_names()


def _only_call(mod):
    """The single op call of ``mod``'s main, after checking the module's shape."""
    from tvm import ir, relax

    func = mod["main"]
    (block,) = func.body.blocks
    assert isinstance(block, relax.DataflowBlock)
    (binding,) = block.bindings
    call = binding.value
    assert isinstance(call, relax.Call) and isinstance(call.op, ir.Op)
    return func, call


def _run(mod, op, rng):
    import tvm
    from tvm import relax

    from autoplace.backend import lowering_pipeline

    ex = tvm.compile(mod, target="llvm",
                     relax_pipeline=lowering_pipeline(gpu=False, multi_device=False))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32")
            for p in mod["main"].params]
    if op == "nn.batch_norm":
        args[-1] = np.abs(args[-1])  # a variance: random normal inputs would give NaN
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    outs = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
    return args, [o.numpy() for o in outs]


def test_names_cover_cnns_and_transformers():
    assert {"nn.conv2d", "matmul", "add", "nn.relu", "nn.softmax", "nn.layer_norm"} <= set(OPS)


@pytest.mark.parametrize("op", OPS)
def test_n_distinct_one_op_workloads_with_all_parameter_inputs(op):
    from tvm import relax

    out = sweep(op, 32)
    assert len(out) == 32
    assert len({name for name, _ in out}) == 32
    keys = set()
    for name, mod in out:
        func, call = _only_call(mod)
        args = [f for a in call.args for f in (a.fields if isinstance(a, relax.Tuple) else [a])]
        assert [a.same_as(p) for a, p in zip(args, func.params)] == [True] * len(func.params)
        assert len(args) == len(func.params)  # every tensor read is a parameter: no constants
        assert all(p.ty.dtype == "float32" for p in func.params)
        node, = OpGraph.from_relax(mod).nodes  # raises on symbolic shapes
        assert node.op_type == op
        assert node.flops <= 3e8
        keys.add(node.workload_key)
    assert len(keys) == 32


def test_same_seed_same_sweep_other_seed_other_sweep():
    import tvm

    a = sweep("nn.conv2d", 8, rng=np.random.default_rng(7))
    b = sweep("nn.conv2d", 8, rng=np.random.default_rng(7))
    assert [n for n, _ in a] == [n for n, _ in b]
    for (_, ma), (_, mb) in zip(a, b):
        tvm.ir.assert_structural_equal(ma, mb)
    assert [n for n, _ in sweep("nn.conv2d", 8)] == [n for n, _ in sweep("nn.conv2d", 8)]
    assert [n for n, _ in sweep("nn.conv2d", 8, rng=np.random.default_rng(8))] != [n for n, _ in a]


def test_unknown_op_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"nn\.conv2d.*matmul"):
        sweep("nn.conv3d")
    with pytest.raises(ValueError, match="full, small, batch"):
        sweep("nn.conv2d", family="tiny")


@pytest.mark.parametrize("op", OPS)
def test_the_small_family_samples_small_models_layers(op):
    """Small-model seeds give other workloads than the full-size ones, with fewer channels."""
    small = {OpGraph.from_relax(m).nodes[0].workload_key for _, m in sweep(op, 12, family="small")}
    full = {OpGraph.from_relax(m).nodes[0].workload_key for _, m in sweep(op, 12)}
    assert len(small) == 12 and small != full
    if op == "nn.conv2d":
        convs = [_only_call(m)[1] for _, m in sweep(op, 32, family="small")]
        assert np.median([int(c.args[0].ty.shape.values[1]) for c in convs]) <= 64
        assert max(int(c.args[0].ty.shape.values[2]) for c in convs) <= 96


@pytest.mark.parametrize("op", ["matmul", "add", "nn.relu", "nn.layer_norm"])
def test_the_batch_family_runs_dense_layers_over_a_few_rows(op):
    """Every sample has 2..32 rows; an op type that no dense layer seeds is refused, naming the
    families to use instead."""
    rows = []
    for _, mod in sweep(op, 12, family="batch"):
        shape = [int(d) for d in _only_call(mod)[1].args[0].ty.shape.values]
        rows.append(shape[-2])
    assert len(rows) == 12 and 2 <= min(rows) and max(rows) <= 32
    with pytest.raises(ValueError, match="no nn.conv2d layers.*full, small, batch, narrow"):
        sweep("nn.conv2d", 4, family="batch")


def test_specs_name_op_count_and_family():
    assert sweep_families() == ["full", "small", "batch", "narrow"] == list(FAMILY_HELP)
    assert sweep_families("nn.conv2d") == ["full", "small"]
    got = from_specs(["nn.relu:3", "matmul:2:small", "mean"])
    assert len(got) == 3 + 2 + 32 and all(name.startswith("sweep:") for name, _ in got)
    assert [n for n, _ in got[3:5]] == [f"sweep:{n}" for n, _ in sweep("matmul", 2, family="small")]
    with pytest.raises(ValueError, match="OP\\[:N\\[:FAMILY\\]\\]"):
        from_specs(["matmul:many"])
    with pytest.raises(ValueError, match="bad sweep"):
        from_specs(["matmul:2:small:extra"])


def test_samples_stay_near_real_layers():
    convs = [_only_call(m)[1] for _, m in sweep("nn.conv2d", 32)]
    shapes = [[int(d) for d in c.args[1].ty.shape.values] for c in convs]  # (O, C/g, k, k)
    # Depthwise stays depthwise: groups equals the channels, one input channel per group.
    dw = [c for c, s in zip(convs, shapes) if int(c.attrs.groups) > 1]
    assert dw and all(int(c.attrs.groups) == int(c.args[0].ty.shape.values[1]) for c in dw)
    # Channels are the table's scaled to multiples of 8 (RGB stems keep 3); kernels are real ones.
    assert all(s[0] % 8 == 0 and (s[1] % 8 == 0 or s[1] in (1, 3)) for s in shapes)
    assert {s[2] for s in shapes} <= {1, 3, 5, 7}


def test_cost_cap_shrinks_samples():
    for op in ("nn.conv2d", "matmul"):
        assert all(OpGraph.from_relax(m).nodes[0].flops <= 2e7 for _, m in sweep(op, 16, max_flops=2e7))


def test_seen_nodes_seed_the_sweep():
    from autoplace import zoo

    nodes = OpGraph.from_relax(zoo.load("branchy_cnn").mod).nodes  # 16x16 images, 8 channels
    assert not any("_h16_" in n for n, _ in sweep("nn.conv2d", 32))
    assert any("_h16_" in n for n, _ in sweep("nn.conv2d", 32, seen=iter(nodes)))


@pytest.mark.parametrize("op", OPS)
def test_samples_build_and_run_on_the_cpu(op, rng):
    for _, mod in sweep(op, 2, rng=np.random.default_rng(3)):
        args, outs = _run(mod, op, rng)
        expected = [t.shape for t in OpGraph.from_relax(mod).nodes[0].outputs]
        assert [o.shape for o in outs] == expected
        assert all(np.isfinite(o).all() for o in outs)
        ref = {"matmul": lambda a, b: a @ b, "add": np.add, "nn.relu": lambda a: np.maximum(a, 0),
               "concat": lambda *a: np.concatenate(a, axis=1)}.get(op)
        if ref is not None:  # float32 sums of large terms: a tolerance on the output's scale
            want = ref(*args)
            np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
