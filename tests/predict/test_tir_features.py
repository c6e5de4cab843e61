"""TVM's per-store features of a workload's lowered TIR and the counts of what LLVM compiled it to:
rebuilt from the workload key alone, equal for a graph node and its store row, and kept or left
out by the learned model's ``tir`` setting."""

import json
import math

import numpy as np
import pytest

import autoplace
from autoplace import zoo
from autoplace.predict import XGBCostModel, load_cost_model
from autoplace.predict.features import (CACHE_FEATURE_NAMES, CODE_FEATURE_NAMES, FEATURE_NAMES,
                                        TIR_FEATURE_NAMES, cache_features, code_features,
                                        tir_features)

RELU = '["relax.nn.relu",[[[1,64,56,56],"float32"]],{},[]]'
RESHAPE = '["relax.reshape",[[[1,32,1,1],"float32"]],{},["R.shape([1, 32])"]]'
CLIP = '["relax.clip",[[[1,8,4,4],"float32"]],{},["T.float64(0.0)","T.float64(6.0)"]]'
CONCAT = '["relax.concat",[[[1,8,4,4],"float32"],[[1,8,4,4],"float32"]],{"axis":1},[]]'
# The key of a strided_slice does not carry its axes and bounds: it cannot be rebuilt.
SLICE = '["relax.strided_slice",[[[3,1,4,32,16],"float32"]],{"assume_inbound":false},[]]'
LLVM = str(autoplace.Device.cpu(0).tvm_target())
FLOAT_CMP = 4  # per_store_feature.cc, group 1: float_mad, float_addsub, float_mul, float_divmod, float_cmp


def test_relu_counts_one_comparison_per_element():
    [x] = tir_features([{"key": RELU}])
    assert x.shape == (len(TIR_FEATURE_NAMES),) and np.isfinite(x).all()
    # relu is max(x, 0): one float comparison per element, 1*64*56*56 = 200704, log2(1 + n).
    assert x[FLOAT_CMP] == pytest.approx(math.log2(1 + 200704), rel=1e-6)


def test_ops_with_extra_arguments_rebuild_and_unbuildable_keys_are_nan():
    x = tir_features([{"key": k} for k in (RESHAPE, CLIP, CONCAT, SLICE, CLIP)])
    assert np.isfinite(x[:3]).all()
    assert np.isnan(x[3]).all()
    np.testing.assert_array_equal(x[1], x[4])  # the same key, the same features
    assert tir_features([]).shape == (0, len(TIR_FEATURE_NAMES))


def test_features_describe_the_kernel_each_target_builds():
    """A CPU build lowers GELU with a fast ``erf`` (no transcendental call), a GPU with TVM's: the
    features of each target describe its own kernel; a ReLU's are the same on both."""
    gelu = '["relax.nn.gelu",[[[128,1024],"float32"]],{},[]]'
    cpu, gpu, relu_cpu, relu_gpu = tir_features(
        [{"key": k} for k in (gelu, gelu, RELU, RELU)], targets=[LLVM, "cuda", LLVM, "cuda"])
    assert not np.array_equal(cpu, gpu)
    np.testing.assert_array_equal(relu_cpu, relu_gpu)


def test_node_and_store_row_agree():
    graph = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)
    rows = [{"key": n.workload_key} for n in graph.nodes]
    np.testing.assert_array_equal(tir_features(graph.nodes), tir_features(rows))


def _matmul(m, k, n):
    return json.dumps(["relax.matmul", [[[m, k], "float32"], [[k, n], "float32"]],
                       {"out_dtype": "void"}, []])


def test_llvm_vectorises_a_short_reduction_and_not_a_long_one():
    # LLVM unrolls the 32-long k loop and vectorises across columns (6.6 GFLOP/s measured on
    # this project's CPU); at k=64 it keeps scalar code (2.2 GFLOP/s).
    short, long_ = code_features([{"key": _matmul(4, 32, 32)}, {"key": _matmul(4, 64, 32)}], LLVM)
    share = CODE_FEATURE_NAMES.index("code_vector_share")
    assert short[share] == 1.0 and long_[share] == 0.0
    assert np.isfinite(short).all() and np.isfinite(long_).all()


@pytest.mark.parametrize("compute,names", [(code_features, CODE_FEATURE_NAMES),
                                           (cache_features, CACHE_FEATURE_NAMES)])
def test_code_and_cache_features_need_an_llvm_target_and_a_rebuildable_key(compute, names):
    x = compute([{"key": RELU}, {"key": SLICE}], LLVM)
    assert np.isfinite(x[0]).all() and np.isnan(x[1]).all()
    assert np.isnan(compute([{"key": RELU}], [None])).all()
    assert np.isnan(compute([{"key": RELU}], "cuda")).all()
    assert compute([], LLVM).shape == (0, len(names))


def test_the_model_compiles_for_the_target_its_device_was_profiled_with(tmp_path):
    rows = [{**r, "target": LLVM} for r in _rows()]
    XGBCostModel(rounds=5).fit(rows).save(tmp_path / "m.json")
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["devices"]["fp0"]["target"] == LLVM
    lines = saved["feature_names"].index("code_lines")
    assert saved["feature_min"][lines] is not None  # finite: the code was counted


def _rows():
    """Twenty relus and adds of growing size on one device, 1 ns per element plus 1 us."""
    dev = {"device": "fp0", "device_name": "cpu:0", "device_kind": "cpu", "threads": 1}
    rows = []
    for i in range(10):
        n = 2 ** (8 + i)
        for op, k in (("nn.relu", 1), ("add", 2)):
            inputs = [[[1, n], "float32"]] * k
            rows.append({**dev, "key": json.dumps([f"relax.{op}", inputs, {}, []]), "op_type": op,
                         "flops": float(n), "bytes_read": 4 * n * k, "bytes_written": 4 * n,
                         "latency_s": 1e-6 + n * 1e-9 * k})
    return rows


@pytest.mark.parametrize("tir", [True, False])
def test_tir_setting_round_trips(tir, tmp_path):
    rows = _rows()
    model = XGBCostModel(rounds=20, tir=tir).fit(rows)
    model.save(tmp_path / "m.json")
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["feature_names"] == [
        *FEATURE_NAMES,
        *((*TIR_FEATURE_NAMES, *CODE_FEATURE_NAMES, *CACHE_FEATURE_NAMES) if tir else ())]
    loaded = load_cost_model(tmp_path / "m.json")
    assert loaded.tir is tir
    np.testing.assert_allclose(loaded.predict_workloads(rows), model.predict_workloads(rows))
