"""Learned cost models on a small real profile of this CPU: the fit/predict/save/load contract of
every cost model, what the learned model flags as extrapolated, evaluate's report, and that it
beats the (fitted) roofline on shapes it never saw."""

import argparse
import json

import numpy as np
import pytest

import autoplace
from autoplace import zoo
from autoplace.predict import (MeasuredCostModel, NearestNeighborCostModel, NotFittedError,
                               RooflineCostModel, XGBCostModel, features, load_cost_model,
                               profile_rows)
from autoplace.predict.evaluate import METRICS, SPLITS, evaluate, format_table
from autoplace.predict.features import FEATURE_NAMES
from autoplace.predict.instructions import InstructionModel
from autoplace.predict.llvm_ir import EXECUTED_COUNT_NAMES
from autoplace.profile import DeviceProfile, ProfileStore, TimingPolicy, run_campaign
from autoplace.profile.sweeps import sweep

FAST = TimingPolicy(min_repeat_ms=1, min_repeats=2, max_repeats=3, round_size=2, budget_s=0.3)
SMALL = lambda: XGBCostModel(rounds=150)  # noqa: E731  (fewer trees: the test data is small)


#: The device of these tests' store: generic x86-64 builds, the target the roofline's default
#: peaks and the shipped model's rows describe (a native build is another device).
CPU = autoplace.Device.cpu(0, target="llvm")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    models = [(f"zoo:{n}", zoo.load(n).mod) for n in ("mlp", "branchy_cnn")]
    for op in ("nn.conv2d", "matmul", "add", "nn.relu"):
        models += [(f"sweep:{name}", mod) for name, mod in sweep(op, 8, max_flops=2e7)]
    s = ProfileStore(tmp_path_factory.mktemp("prof") / "p.db")
    run_campaign(models, ["cpu:0:generic"], s, policy=FAST, progress=False, links=False)
    yield s
    s.close()


@pytest.fixture(scope="module")
def rows(store):
    return profile_rows(store)


def _gelu_module():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(relax.op.nn.gelu(y))
        bb.emit_func_output(out)
    return bb.get()


def test_features_agree_for_node_and_store_row(rows):
    graph = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)
    node = graph.nodes[0]
    [row] = [r for r in rows if r["key"] == node.workload_key]
    dev = {"threads": 1, "peak_flops": 4e9, "mem_bandwidth": 1e10}
    x_node, names = features(node, dev)
    x_row, _ = features(row, dev)
    assert names == FEATURE_NAMES and x_node.shape == (len(FEATURE_NAMES),)
    np.testing.assert_array_equal(x_node, x_row)
    assert x_node[names.index(f"op={node.op_type}")] == 1.0
    # Without a device, the device descriptors are missing, not made up.
    assert np.isnan(features(node)[0][names.index("log10_peak_flops")])


def test_row_stride_features_see_powers_of_two():
    """Untuned matmuls walk the weight by columns: a row of 3072 floats (12 KiB, 2^12 * 3) is a
    stride that lands on few cache sets, a row of 576 (2^8 * 9 bytes) is not."""
    def key(n):
        return json.dumps(["relax.matmul", [[[64, 256], "float32"], [[256, n], "float32"]], {}, []])

    names = FEATURE_NAMES
    x = {n: features({"key": key(n), "flops": 1.0, "bytes_read": 1, "bytes_written": 1})[0]
         for n in (3072, 576, 1000)}
    assert [x[n][names.index("in1_row_pow2")] for n in (3072, 576, 1000)] == [12, 8, 5]
    assert x[3072][names.index("in0_row_pow2")] == 10  # 256 floats: 1 KiB


def test_the_reduction_walk_counts_lines_per_cache_set():
    """Untuned kernels reduce along a strided walk: B's column in a matmul, the channels of an
    NCHW conv. A 1 KiB stride puts 64 reads on 4 of the 64 sets (16 lines each, past 8 ways);
    a stride off the line size spreads them."""
    def f(op, inputs, attrs=None):
        key = json.dumps([op, [[s, "float32"] for s in inputs], attrs or {}, []])
        x = features({"key": key, "flops": 1.0, "bytes_read": 1, "bytes_written": 1})[0]
        return x[FEATURE_NAMES.index("log2_walk_lines_per_set")]

    assert f("relax.matmul", [[32, 64], [64, 256]]) == 4.0  # 64 reads, 1 KiB apart: 4 sets
    assert f("relax.matmul", [[32, 64], [64, 192]]) == 2.0  # 768 B: 16 sets
    assert f("relax.matmul", [[32, 64], [64, 100]]) == 0.0  # 400 B: off the line size
    conv = {"padding": [0, 0, 0, 0], "groups": 1, "data_layout": "NCHW"}
    assert f("relax.nn.conv2d", [[1, 64, 16, 16], [16, 64, 1, 1]], conv) == 4.0  # 1 KiB planes
    assert f("relax.nn.conv2d", [[1, 16, 16, 16], [64, 16, 1, 1]], conv) == 2.0
    padded = {**conv, "padding": [1, 1, 1, 1]}  # 18x18 planes: 1296 B, off the line size
    assert f("relax.nn.conv2d", [[1, 64, 16, 16], [16, 64, 3, 3]], padded) == 0.0
    depthwise = {**conv, "groups": 64}  # one channel per group: no walk
    assert f("relax.nn.conv2d", [[1, 64, 16, 16], [64, 1, 1, 1]], depthwise) == 0.0
    assert f("relax.add", [[1, 64, 16, 16], [1, 64, 16, 16]]) == 0.0


@pytest.mark.parametrize("make", [lambda: RooflineCostModel(), SMALL,
                                  lambda: NearestNeighborCostModel(k=2)],
                         ids=["roofline", "xgboost", "nearest"])
def test_cost_model_contract(make, rows, tmp_path):
    graph = autoplace.OpGraph.from_relax(zoo.load("branchy_cnn").mod)
    dev = CPU
    if not isinstance(make(), RooflineCostModel):  # the roofline is ready unfitted, by design
        with pytest.raises(NotFittedError):
            make().predict(graph, dev)
    model = make().fit(rows)
    assert model.fit(rows) is model
    pred = model.predict(graph, dev)
    assert pred.shape == (len(graph.nodes),) and np.all(np.isfinite(pred) & (pred > 0))
    model.save(tmp_path / "m.json")
    again = load_cost_model(tmp_path / "m.json")
    assert type(again) is type(model)
    np.testing.assert_array_equal(again.predict(graph, dev), pred)
    np.testing.assert_array_equal(again.predict_workloads(rows), model.predict_workloads(rows))
    assert autoplace.load_cost_model(tmp_path / "m.json").predict(graph, dev).shape == pred.shape


def test_a_model_saved_in_the_old_format_asks_to_be_trained_again(rows, tmp_path):
    SMALL().fit(rows).save(tmp_path / "m.json")
    d = json.loads((tmp_path / "m.json").read_text())
    del d["point_booster"]
    (tmp_path / "old.json").write_text(json.dumps({**d, "format_version": 1}))
    with pytest.raises(ValueError, match="older autoplace.*autoplace train"):
        load_cost_model(tmp_path / "old.json")


def test_fitted_roofline_learns_peaks_and_keeps_its_default(rows):
    graph = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)
    dev = CPU
    fitted = RooflineCostModel().fit(rows)
    [peaks] = fitted.devices_.values()
    # Finite and positive; not physical: the grid reaches 4x the fastest rate the rows achieved,
    # and this store's small ops (in cache, their time mostly the launch) reach 10 TB/s on a
    # fast host.
    assert 1e6 < peaks["peak_flops"] < 1e15 and 1e6 < peaks["mem_bandwidth"] < 1e15
    assert not np.allclose(fitted.predict(graph, dev), RooflineCostModel().predict(graph, dev))
    # The default (unfitted) behaviour is unchanged: the device's own peaks.
    n = graph.nodes[0]
    expect = max(n.flops / dev.peak_flops, (n.bytes_read + n.bytes_written) / dev.mem_bandwidth)
    assert RooflineCostModel().predict(graph, dev)[0] == pytest.approx(expect + 2e-6)


def test_instruction_model_recovers_a_linear_cost_and_knows_its_devices(rows):
    x = InstructionModel._design(rows, [r["target"] for r in rows])
    assert np.isfinite(x).all()  # every op of this store compiles for the CPU
    # Latencies that are exactly 1 ns per instruction, 0.1 ns per copied byte and 2 us per call.
    truth = np.zeros(x.shape[1])
    truth[[EXECUTED_COUNT_NAMES.index("instructions"), EXECUTED_COUNT_NAMES.index("copied_bytes"),
           -1]] = 1e-9, 1e-10, 2e-6
    exact = [{**r, "latency_s": float(t)} for r, t in zip(rows, x @ truth)]
    model = InstructionModel().fit(exact)
    fps, targets = [r["device"] for r in rows], [r["target"] for r in rows]
    np.testing.assert_allclose(model.predict(rows, fps, targets), x @ truth, rtol=1e-6)
    again = InstructionModel.from_dict(json.loads(json.dumps(model.to_dict())))
    np.testing.assert_array_equal(again.predict(rows, fps, targets),
                                  model.predict(rows, fps, targets))
    assert np.isnan(model.predict(rows[:2], [None, "no-such-device"], targets[:2])).all()
    assert np.isnan(model.predict(rows[:1], fps[:1], ["cuda"])).all()  # no counts on a GPU


def test_quantiles_are_ordered_and_extrapolation_is_flagged(rows):
    model = SMALL().fit(rows)
    dev = CPU
    seen = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)  # measured: inside the data
    q = model.quantiles(seen, dev)
    assert q.shape == (len(seen.nodes), 3) and np.all(np.diff(q, axis=1) >= 0)
    # The point (squared-error booster) and the band (quantile booster) both fit the rows.
    y = np.array([r["latency_s"] for r in rows])
    assert np.median(np.abs(model.predict_workloads(rows) - y) / y) < 0.10
    band = model.quantiles(rows)
    assert np.mean((band[:, 0] <= y) & (y <= band[:, 2])) >= 0.5
    assert not model.extrapolated(seen, dev).any()
    unseen = autoplace.OpGraph.from_relax(_gelu_module())  # gelu never measured
    flags = model.extrapolated(unseen, dev)
    assert flags[[n.op_type == "nn.gelu" for n in unseen.nodes]].all()
    gpu = autoplace.Device.cuda(0)  # a device the model was never trained on
    assert model.extrapolated(seen, gpu).all()


def test_measured_model_falls_back_to_learned(store, rows):
    prof = DeviceProfile.from_store(store, "cpu:0:generic")
    learned = SMALL().fit(rows)
    model = MeasuredCostModel(prof, fallback=learned)
    graph = autoplace.OpGraph.from_relax(_gelu_module())  # relu: maybe measured; gelu: not
    dev = CPU
    src = model.sources(graph, dev)
    cost = model.predict(graph, dev)
    for n, s in zip(graph.nodes, src):
        assert s == ("measured" if n.workload_key in prof.latency_s else "learned")
        assert cost[n.index] == (prof.latency_s[n.workload_key] if s == "measured"
                                 else learned.predict(graph, dev)[n.index])
    assert "learned" in src
    _, sources = autoplace.node_costs(graph, [dev], model)
    assert set(sources) <= {"measured", "learned"}


def test_optimize_names_the_learned_costs_outside_the_training_data(store, rows):
    prof = DeviceProfile.from_store(store, "cpu:0:generic")
    model = MeasuredCostModel(prof, fallback=SMALL().fit(rows))
    mod = _gelu_module()  # gelu: an op type the store never measured
    res = autoplace.optimize(mod, [CPU], cost_model=model, db=None)
    gelu = [n.index for n in res.graph.nodes if n.op_type == "nn.gelu"]
    assert set(gelu) <= set(res.outside_training["cpu0"])
    (line,) = res.outside_note
    assert "op types it never saw: nn.gelu" in line and line in res.summary()
    # Measured costs are never flagged, and a model inside its data says nothing.
    assert all(res.plan.cost_sources[i] == "learned" for i in res.outside_training["cpu0"])
    seen = autoplace.optimize(zoo.load("mlp").mod, [CPU],
                              cost_model=SMALL().fit(rows), db=None)
    assert seen.outside_training == {} and seen.outside_note == ()


def test_each_device_gets_the_fallback_fitted_on_it(store, rows):
    """With one learned model per device (CPU and GPU profiles shipped side by side), each device
    falls back to its own; a device none was fitted on gets the roofline."""
    learned = SMALL().fit(rows)  # fitted on cpu:0 only
    model = MeasuredCostModel([], fallback=[learned])
    graph = autoplace.OpGraph.from_relax(_gelu_module())
    cpu, gpu = CPU, autoplace.Device.cuda(0)
    np.testing.assert_array_equal(model.predict(graph, cpu), learned.predict(graph, cpu))
    assert set(model.sources(graph, cpu)) == {"learned"}
    np.testing.assert_array_equal(model.predict(graph, gpu),
                                  autoplace.RooflineCostModel().predict(graph, gpu))
    assert set(model.sources(graph, gpu)) == {"roofline"}


def test_evaluate_report_and_learned_beats_roofline_on_unseen_shapes(store):
    result = evaluate(store, seed=0, learned=SMALL)
    assert set(result) == {"device", "n_workloads", "noise_cv", "retest_workloads",
                           "retest_within_10", *SPLITS}
    assert (result["retest_workloads"], result["retest_within_10"]) == (0, None)  # one pass
    for split in SPLITS:
        extra = {"whole_model_error", "whole_model_roofline_error", "sum_of_ops_error",
                 "sum_of_ops_roofline_error", "models"} if split == "heldout_model" else set()
        assert set(result[split]) == {*METRICS, "n_test", "folds", *extra}
        r = result[split]
        assert r["folds"] >= 1 and 0 <= r["within_10"] <= r["within_25"] <= 1
    assert set(result["heldout_model"]["models"]) == {"zoo:mlp", "zoo:branchy_cnn"}
    assert result["heldout_model"]["whole_model_error"] is None  # nothing compiled was timed
    assert "whole-model error (leave one model out): not measured" in format_table(result)
    assert result["heldout_shapes"]["folds"] == 5  # draws of held-out shapes, averaged
    json.dumps(result, allow_nan=False)  # strict JSON
    # The roofline, even with peaks fitted to the data, is one line for every op type; the
    # learned model sees op type and shape. On held-out shapes it is clearly better.
    for split in ("random", "heldout_shapes"):
        assert result[split]["mape"] < result[split]["roofline_mape"], format_table(result)


def test_whole_model_error_is_against_the_compiled_model(store):
    """The whole-model error compares a model's predicted ops, charged as optimize charges them
    (ops its build runs no kernel for cost nothing), with the model compiled and timed whole; the
    sum-of-ops error the plain sum with its measured ops. Both are reported, each named."""
    from autoplace.predict.evaluate import compiled_times

    compiled, note = compiled_times(store)
    assert set(compiled) == {"zoo:mlp", "zoo:branchy_cnn"} and "timed" in note
    slow = {name: 10 * s for name, s in compiled.items()}  # not the measured ops: told apart
    result = evaluate(store, seed=0, learned=SMALL, compiled=slow)
    hm = result["heldout_model"]
    for name, m in hm["models"].items():
        assert m["compiled_s"] == slow[name]
        assert m["whole_model_error"] == pytest.approx(
            abs(m["charged_s"] - slow[name]) / slow[name])
        assert 0 < m["charged_s"] <= m["predicted_s"]
        assert m["sum_of_ops_error"] == pytest.approx(
            abs(m["predicted_s"] - m["ops_measured_s"]) / m["ops_measured_s"])
    table = format_table(result)
    assert "against the model compiled and timed whole" in table and "sum-of-ops error" in table


def test_evaluate_reports_the_noise_between_passes(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    models = [(f"zoo:{n}", zoo.load(n).mod) for n in ("mlp", "branchy_cnn")]
    run_campaign(models, ["cpu:0:generic"], store, policy=FAST, progress=False, links=False,
                 passes=2)
    spreads = [r["occasion_spread"] for r in profile_rows(store)]
    assert len(spreads) == 12 and all(s >= 0 for s in spreads)
    result = evaluate(store, seed=0, learned=SMALL)
    assert result["retest_workloads"] == 12
    assert result["retest_within_10"] == np.mean(np.array(spreads) <= 0.10)
    assert "noise between occasions" in format_table(result)


def test_cli_train_and_evaluate(store, tmp_path, capsys):
    from autoplace.cli.predict import register_cli

    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers(dest="command"))
    out = tmp_path / "m.json"
    args = parser.parse_args(["train", "--db", str(store.path), "--out", str(out)])
    assert args.func(args) == 0
    assert isinstance(load_cost_model(out), XGBCostModel)
    graph = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)
    assert load_cost_model(out).predict(graph, CPU).shape == (len(graph.nodes),)
    assert "wrote" in capsys.readouterr().out
    args = parser.parse_args(["evaluate", "--db", str(store.path), "--json"])
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert "2 models compiled whole and timed on cpu0" in out.err
    report = json.loads(out.out)  # the JSON scripts read, as the issue wrote it
    models = report["splits"]["heldout_model"]["models"]
    assert all(m["compiled_s"] > 0 for m in models.values())
    assert report["splits"]["heldout_model"]["whole_model_error"] is not None
    assert set(report["splits"]) == {"random", "heldout_shapes", "heldout_op_type",
                                     "heldout_model"}
    for m in report["splits"].values():
        assert {"mape", "median_ape", "within_10", "within_25", "roofline_mape"} <= set(m)
        assert 0 <= m["within_10"] <= m["within_25"] <= 1
    assert 0 < report["noise_cv"] < 1
