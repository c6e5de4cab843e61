"""Adapting a learned model to a machine it was not trained on (``autoplace profile --quick``):
the calibration on the shipped CPU profile's real rows, the workloads chosen, the saved model, and
the command line end to end."""

import json
import subprocess
import sys

import numpy as np
import pytest

import autoplace
from autoplace import zoo
from autoplace.predict import XGBCostModel, load_cost_model, profile_rows
from autoplace.predict.adapt import AdaptedCostModel, adapt, choose_workloads, op_class
from autoplace.profile import ProfileStore, shipped_dir
from autoplace.profile.profiles import load_profile_json

# How much faster "the new machine" runs each class of op than the profiled one: unequal, as a
# wider vector unit speeds up convs and matmuls more than copies.
FACTOR = {"conv": 0.45, "matmul": 0.6, "elementwise": 0.9, "layout": 0.9, "norm": 0.8,
          "pool": 0.8, "reduce": 0.8, "softmax": 0.8}


@pytest.fixture(scope="module")
def shipped_rows(tmp_path_factory):
    with ProfileStore(tmp_path_factory.mktemp("ship") / "ship.db") as store:
        store.import_profile(load_profile_json(shipped_dir() / "amd-epyc-cpu-1thread.json"))
        return profile_rows(store)


@pytest.fixture(scope="module")
def base(shipped_rows):
    return XGBCostModel(rounds=120, tir=False).fit(shipped_rows)


def _new_machine(rows):
    return [{**r, "device": "f00dfeedf00dfeed", "device_name": "cpu:0:new",
             "latency_s": r["latency_s"] * FACTOR[op_class(r["op_type"])]} for r in rows]


def test_adaptation_learns_how_the_new_machine_differs_per_class(base, shipped_rows):
    new = _new_machine(shipped_rows)
    rng = np.random.default_rng(0)
    pick = rng.permutation(len(new))
    fit_on, held = [new[i] for i in pick[:40]], [new[i] for i in pick[40:]]
    model = adapt(base, fit_on)
    truth = np.array([r["latency_s"] for r in held])
    base_fp = next(iter(base.devices_))  # the profiled machine: what the base model predicts
    before = np.median(np.abs(base.predict_workloads(held, base_fp) / truth - 1))
    after = np.median(np.abs(model.predict_workloads(held) / truth - 1))
    assert before > 0.3 and after < 0.12, (before, after)
    cal = model.calibration
    assert cal["rows"] == 40 and cal["after"] < cal["before"]
    # The band moves with the point and stays ordered.
    q = model.quantiles(held[:50])
    assert np.all(np.diff(q, axis=1) >= 0)
    assert np.median(q[:, 1] / model.predict_workloads(held[:50])) == pytest.approx(1, rel=0.3)


def test_an_adapted_model_predicts_only_its_device_and_survives_save_and_load(base, shipped_rows,
                                                                           tmp_path):
    base_path = tmp_path / "base.json"
    base.save(base_path)
    model = adapt(base, _new_machine(shipped_rows[:30]), base_path=str(base_path))
    graph = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)
    dev = autoplace.Device.cpu(0)  # the only CPU it knows: taken as the adapted one
    model.save(tmp_path / "adapted.json")
    again = load_cost_model(tmp_path / "adapted.json")
    assert isinstance(again, AdaptedCostModel)
    np.testing.assert_allclose(again.predict(graph, dev), model.predict(graph, dev), rtol=1e-6)
    with pytest.raises(ValueError, match="adapted to 'cpu:0:new'"):
        model.predict(graph, "another-fingerprint")
    base_path.unlink()
    with pytest.raises(ValueError, match="not there: adapt again"):
        load_cost_model(tmp_path / "adapted.json")


def test_adapt_refuses_what_it_cannot_fit(base, shipped_rows):
    with pytest.raises(ValueError, match="at least 3"):
        adapt(base, _new_machine(shipped_rows[:2]))
    with pytest.raises(ValueError, match="rows of one device"):
        adapt(base, shipped_rows[:5] + _new_machine(shipped_rows[:5]))


def test_chosen_workloads_cover_every_op_type_heaviest_first(base):
    graphs = [autoplace.OpGraph.from_relax(zoo.load(n).mod) for n in ("branchy_cnn", "mlp")]
    every = {n.workload_key: n.op_type for g in graphs for n in g.nodes}
    chosen = choose_workloads(graphs, base, count=len(set(every.values())))
    assert {every[k] for k in chosen} == set(every.values())  # one of each op type
    assert {op_class(every[k]) for k in chosen} == {op_class(t) for t in every.values()}
    assert len(choose_workloads(graphs, base, count=3)) == 3
    assert set(choose_workloads(graphs, base, count=1000)) == set(every)
    free = frozenset(list(every)[:2])  # as if the build ran no kernel for them
    assert set(choose_workloads(graphs, base, count=1000, skip=free)) == set(every) - free


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autoplace", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_quick_profile_adapts_the_shipped_model_and_optimize_uses_it(tmp_path):
    db = tmp_path / "new.db"
    # cpu:0:native: a build no shipped profile or tuning record describes, a new machine.
    r = _cli("profile", "--quick", "--model", "zoo:branchy_cnn", "--device", "cpu:0:native",
             "--db", str(db), "--quick-count", "6", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["chosen"] == 6 and 3 <= rep["measured"] <= 6
    assert rep["adapted"] == f"{db}.adapted.json"
    model = load_cost_model(rep["adapted"])
    assert model.calibration["rows"] == rep["measured"]
    r = _cli("optimize", "--model", "zoo:branchy_cnn", "--device", "cpu:0:native",
             "--cost-model", rep["adapted"], "--no-guard", "--json")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)["plan"]["cost_sources"]) == {"learned"}
    r = _cli("profile", "--quick", "--db", str(db))
    assert r.returncode == 2 and "pass --model" in r.stderr
