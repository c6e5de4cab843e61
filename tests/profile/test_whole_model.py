"""Whole-model timing, fused-group mapping and the per-op vs per-group check (Relax-native zoo)."""

import math
from collections import Counter

import numpy as np
import pytest

import autoplace
from autoplace.graph import OpGraph
from autoplace.profile import LocalRunner, TimingPolicy, single_op_modules
from autoplace.graph.fusion import fused_groups
from autoplace.profile.whole_model import GROUP_RULES, FusionCheck, ModelTiming, check, time_model

CPU = autoplace.Device.cpu(0)


def one_op_seconds(mod) -> dict[str, float]:
    """Median seconds of each workload of ``mod`` built alone, with the profiler's own parts."""
    fast = TimingPolicy(min_repeat_ms=5, min_repeats=3, max_repeats=3, round_size=3)
    runner = LocalRunner(CPU)
    return {k: runner.measure(one, fast).min_s for k, one in single_op_modules(mod).items()}


@pytest.fixture(scope="module")
def mlp():
    return autoplace.zoo.load("mlp")


@pytest.fixture(scope="module")
def mlp_timing(mlp):
    return time_model(mlp.mod, CPU, mlp.inputs, repeat=5)


def test_time_model_positive_and_consistent(mlp_timing):
    t = mlp_timing
    assert isinstance(t, ModelTiming) and t.device == "cpu0"
    assert 0 < t.min <= t.median and t.cv >= 0 and t.builtin_seconds >= 0
    assert t.kernels and all(k.seconds > 0 and k.calls > 0 for k in t.kernels)
    # kernels run inside the model: their sum cannot be far above the whole (noise allowed)
    assert t.kernel_seconds < 5 * t.median
    assert t.to_dict()["kernel_seconds"] == pytest.approx(t.kernel_seconds)


def test_random_inputs_when_none():
    m = autoplace.zoo.load("weights_as_inputs")
    t = time_model(m.mod, CPU, repeat=2, instrumented_runs=2)
    assert t.median > 0 and sum(k.calls for k in t.kernels) == 2


@pytest.mark.parametrize("name", ["mlp", "branchy_cnn"])
def test_instrument_and_groups_cover_every_kernel(name):
    m = autoplace.zoo.load(name)
    graph = OpGraph.from_relax(m.mod)
    groups = fused_groups(m.mod)
    timing = time_model(m.mod, CPU, m.inputs, repeat=3, instrumented_runs=2)
    # every kernel call the VM makes is one group, and vice versa
    assert Counter(n for n, _ in groups) == {k.name: k.calls for k in timing.kernels}
    nodes = [i for _, ns in groups for i in ns]
    assert len(nodes) == len(set(nodes))  # each node in at most one kernel
    assert set(nodes) == set(range(len(graph)))  # these models have no kernel-less ops
    assert all(ns for _, ns in groups)


def test_fused_groups_mlp_structure(mlp):
    groups = fused_groups(mlp.mod)
    assert groups == [("fused_matmul_add_relu", (3 * k, 3 * k + 1, 3 * k + 2)) for k in range(4)]


def test_fused_groups_skip_folded_and_view_ops():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    w = relax.const(np.ones((8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w))  # folded into a constant
            h = bb.emit(relax.op.matmul(x, wt))
            r = bb.emit(relax.op.reshape(h, (32,)))  # becomes a view
            out = bb.emit_output(relax.op.nn.relu(r))
        bb.emit_func_output(out)
    groups = fused_groups(bb.get())
    nodes = [i for _, ns in groups for i in ns]
    assert 0 not in nodes and 1 in nodes and 3 in nodes and len(nodes) == len(set(nodes))


def test_check_on_mlp_gives_finite_errors(mlp, mlp_timing):
    op_seconds = one_op_seconds(mlp.mod)
    res = check(mlp.mod, CPU, op_seconds, timing=mlp_timing)
    assert isinstance(res, FusionCheck) and res.kernels == 4 and res.nodes == 12
    assert res.nodes_without_kernel == ()
    assert res.op_sum > 0 and math.isfinite(res.op_sum_error) and math.isfinite(res.kernel_sum_error)
    assert [e.rule for e in res.group_estimates] == list(GROUP_RULES)
    for e in res.group_estimates:
        assert e.seconds > 0 and math.isfinite(e.error) and math.isfinite(e.median_group_error)
    assert res.estimate("sum").seconds == pytest.approx(res.op_sum)
    assert res.to_dict()["timing"]["min"] == res.measured  # the statistic profiles keep


def test_check_rejects_missing_workloads(mlp, mlp_timing):
    with pytest.raises(KeyError, match="lacks"):
        check(mlp.mod, CPU, {}, timing=mlp_timing)
