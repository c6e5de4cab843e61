"""The SQLite profile store: round trips, bad files left untouched, JSON export/import, links fit."""

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from autoplace.profile import (DeviceProfile, LinkFit, Measurement, OverheadFit, ProfileStore,
                               ProfileStoreError, fit_link, shipped_dir)
from autoplace.profile.measurements import SCHEMA_VERSION


class _Node:
    def __init__(self, key, op="add"):
        self.workload_key, self.op_type = key, op
        self.flops, self.bytes_read, self.bytes_written, self.param_bytes = 10.0, 8, 4, 0


def _filled(path):
    store = ProfileStore(path)
    store.add_device("fp0", "cpu:0", {"kind": "cpu", "hardware": "test"})
    store.add_workloads([_Node("k1"), _Node("k2"), _Node("k1")], model="m")
    store.put(Measurement("k1", "fp0", "ok", 1e-5, 9e-6, 1.1e-5, 0.01, 5, 100))
    store.put(Measurement("k2", "fp0", "unsupported", error="build failed: no"))
    store.put_link(LinkFit("fp0", "fp0", 1e-6, 1e10, 0.99, ((4096, 2e-6), (8192, 3e-6))))
    store.put_overhead(OverheadFit("fp0", "", "stage", 4.5e-5, {"method": "test"}))
    return store


def test_round_trip_and_pending(tmp_path):
    store = _filled(tmp_path / "p.db")
    assert store.pending(["k1", "k2", "k3", "k3"], "fp0") == ["k3"]
    assert store.workload_models() == {"k1": {"m": 2}, "k2": {"m": 1}}
    [ok] = [m for m in store.measurements("fp0") if m.ok]
    assert (ok.median_s, ok.repeats, ok.number) == (1e-5, 5, 100) and ok.measured_at
    assert store.counts() == {"devices": 1, "workloads": 2, "measurements": 2, "unsupported": 1,
                              "links": 1, "overheads": 1}
    store.close()
    # Reopening sees the same data (nothing is cached in the object).
    assert ProfileStore(tmp_path / "p.db").counts()["measurements"] == 2


def test_export_import_round_trip(tmp_path):
    data = _filled(tmp_path / "a.db").export_profile("cpu:0")
    json.loads(json.dumps(data))  # strict JSON
    other = ProfileStore(tmp_path / "b.db")
    assert other.import_profile(data) == 2
    assert other.import_profile(data) == 0  # nothing new, nothing overwritten
    assert other.export_profile("fp0") == data
    prof = DeviceProfile.from_export(data)
    assert prof.latency_s == {"k1": 9e-6}  # the fastest repeat, not the median
    assert "build failed" in prof.unsupported["k2"]
    assert prof.link().beta_bps == 1e10 and prof.kind == "cpu"


def test_a_measurement_without_schedule_is_imported_as_default(tmp_path):
    data = _filled(tmp_path / "a.db").export_profile("cpu:0")
    for m in data["measurements"]:
        m.pop("schedule", None)
    other = ProfileStore(tmp_path / "b.db")
    assert other.import_profile(data) == 2
    assert {m.schedule for m in other.measurements(schedule=None)} == {"default"}


def test_import_keeps_existing_measurements(tmp_path):
    store = _filled(tmp_path / "a.db")
    data = store.export_profile("cpu:0")
    data["measurements"][0]["median_s"] = 1.0
    store.import_profile(data)
    assert [m.median_s for m in store.measurements("fp0") if m.ok] == [1e-5]


def test_passes_keep_the_fastest_occasion_and_count_every_one(tmp_path):
    store = _filled(tmp_path / "p.db")
    assert store.pending(["k1", "k2"], "fp0", passes=2) == ["k1"]  # a failure is not retried
    slower = Measurement("k1", "fp0", "ok", 3e-5, 2e-5, 3e-5, 0.01, 5, 100)
    faster = Measurement("k1", "fp0", "ok", 6e-6, 5e-6, 6e-6, 0.01, 5, 200)
    assert store.measurements("fp0")[0].occasion_spread is None  # one pass: no spread yet
    assert (store.add_pass(slower).min_s, store.add_pass(slower).passes) == (9e-6, 3)
    kept = store.add_pass(faster)
    assert (kept.median_s, kept.min_s, kept.number, kept.passes) == (6e-6, 5e-6, 200, 4)
    assert kept.slowest_s == 2e-5 and kept.occasion_spread == pytest.approx(3.0)
    failed = store.add_pass(Measurement("k1", "fp0", "unsupported", error="flaky"))
    assert failed.ok and failed.min_s == 5e-6  # one failure does not undo a success
    assert store.pending(["k1"], "fp0", passes=4) == []
    assert store.pending(["k1"], "fp0", passes=5) == ["k1"]
    [row] = [m for m in store.measurements("fp0") if m.ok]
    assert row == kept and DeviceProfile.from_store(store, "fp0").latency_s == {"k1": 5e-6}


def test_a_version_1_store_gains_the_passes_column(tmp_path):
    path = tmp_path / "v1.db"
    _filled(path).close()
    with sqlite3.connect(path) as db:  # what autoplace wrote before passes existed
        db.execute("ALTER TABLE measurements DROP COLUMN passes")
        db.execute("ALTER TABLE measurements DROP COLUMN slowest_s")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    store = ProfileStore(path)
    assert [m.passes for m in store.measurements("fp0")] == [1, 1]
    assert store.pending(["k1", "k3"], "fp0", passes=2) == ["k1", "k3"]
    data = store.export_profile("fp0")
    assert data["schema_version"] == SCHEMA_VERSION == 3
    data["schema_version"] = 1  # an export written before passes existed still imports
    for m in data["measurements"]:
        del m["passes"], m["slowest_s"]
    del data["overheads"]
    assert ProfileStore(tmp_path / "other.db").import_profile(data) == 2


def test_overheads_round_trip_through_the_store_and_json(tmp_path):
    store = _filled(tmp_path / "a.db")
    store.add_device("fp1", "cuda:0", {"kind": "cuda", "hardware": "gpu"})
    store.put_overhead(OverheadFit("fp0", "fp1", "segment", 6e-5, {"fit": {"per_segment_s": 6e-5}}))
    store.put_overhead(OverheadFit("fp1", "", "stage", 8e-5))  # another device's: not exported
    store.put_overhead(OverheadFit("fp0", "", "stage", 5e-5))  # replaces the first figure
    assert [(f.peer, f.kind, f.seconds) for f in store.overheads("fp0")] == [
        ("fp1", "segment", 6e-5), ("", "stage", 5e-5)]
    data = store.export_profile("cpu:0")
    json.loads(json.dumps(data))
    assert {d["name"] for d in data["other_devices"]} == {"cuda:0"}  # the pair's peer
    prof = DeviceProfile.from_export(data)
    assert prof.overhead("stage").seconds == 5e-5 and prof.overhead("segment") is None
    assert prof.overhead("segment", "fp1").detail == {"fit": {"per_segment_s": 6e-5}}
    other = ProfileStore(tmp_path / "b.db")
    assert other.import_profile(data) == 2
    assert other.export_profile("fp0") == data
    # Import keeps what a store holds: a figure measured there is not overwritten.
    data["overheads"][1]["seconds"] = 1.0
    other.import_profile(data)
    assert DeviceProfile.from_store(other, "fp0").overhead("stage").seconds == 5e-5


def test_a_version_2_store_and_export_gain_an_empty_overheads_table(tmp_path):
    path = tmp_path / "v2.db"
    _filled(path).close()
    with sqlite3.connect(path) as db:  # what autoplace wrote before overheads existed
        db.execute("DROP TABLE overheads")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    with ProfileStore(path, readonly=True) as store:  # read, not migrated
        assert store.overheads() == [] and store.counts()["measurements"] == 2
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == ("2",)  # a read-only open changes nothing
    store = ProfileStore(path)
    assert store.overheads() == [] and store.counts()["links"] == 1
    store.put_overhead(OverheadFit("fp0", "", "call", 1e-5))
    assert [f.kind for f in store.overheads()] == ["call"]
    data = store.export_profile("fp0")
    data["schema_version"] = 2  # an export written before overheads existed still imports
    del data["overheads"]
    other = ProfileStore(tmp_path / "other.db")
    assert other.import_profile(data) == 2 and other.overheads() == []
    assert DeviceProfile.from_export(data).overheads == ()


@pytest.mark.parametrize("bad", [
    {"kind": "warp"}, {"seconds": -1e-6}, {"seconds": float("nan")}, {"seconds": "fast"},
    {"seconds": float("inf")}, {"device": "fp9"}, {"detail": [1]}, {"peer": None},
    {"colour": "red"}])
def test_malformed_overheads_are_refused_and_nothing_is_imported(tmp_path, bad):
    data = _filled(tmp_path / "a.db").export_profile("cpu:0")
    data["overheads"][0].update(bad)
    store = ProfileStore(tmp_path / "b.db")
    with pytest.raises(ProfileStoreError, match="malformed.*nothing was imported"):
        store.import_profile(data)
    assert store.counts()["measurements"] == store.counts()["overheads"] == 0
    (tmp_path / "p.json").write_text(json.dumps(data))
    if bad != {"device": "fp9"}:  # a profile file reads only its own device's figures
        with pytest.raises(ProfileStoreError, match="malformed profile"):
            DeviceProfile.load(tmp_path / "p.json")
    with pytest.raises((ValueError, TypeError, sqlite3.IntegrityError)):  # fp9: no such device
        _filled(tmp_path / "c.db").put_overhead(OverheadFit(**data["overheads"][0]))


def test_not_a_database_is_left_untouched(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"these are not the bytes of an SQLite file" * 50)
    before = path.read_bytes()
    with pytest.raises(ProfileStoreError, match="not an autoplace profile store.*nothing was changed"):
        ProfileStore(path)
    assert path.read_bytes() == before


def test_foreign_sqlite_database_is_left_untouched(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    before = path.read_bytes()
    with pytest.raises(ProfileStoreError, match="not an autoplace profile store.*users"):
        ProfileStore(path)
    assert path.read_bytes() == before


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    _filled(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(ProfileStoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
        ProfileStore(path)


def test_malformed_profiles_are_refused(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    with pytest.raises(ProfileStoreError, match="not an autoplace profile"):
        store.import_profile({"format": "something else"})
    data = _filled(tmp_path / "a.db").export_profile("cpu:0")
    del data["workloads"][0]["op_type"]
    with pytest.raises(ProfileStoreError, match="malformed.*nothing was imported"):
        store.import_profile(data)
    assert store.counts()["measurements"] == 0
    (tmp_path / "x.json").write_text("[1, 2")
    with pytest.raises(ProfileStoreError, match="cannot read profile"):
        DeviceProfile.load(tmp_path / "x.json")


def test_unknown_device_names_the_known_ones(tmp_path):
    with pytest.raises(ProfileStoreError, match=r"no device 'cuda:0'.*cpu:0 \(fp0\)"):
        _filled(tmp_path / "p.db").export_profile("cuda:0")


def test_fit_link_recovers_alpha_and_beta():
    sizes = np.array([4096 * 4**k for k in range(8)], dtype=float)
    points = list(zip(sizes.astype(int), 3e-6 + sizes / 8e9))
    alpha, beta, r2 = fit_link(points)
    assert alpha == pytest.approx(3e-6, rel=1e-6) and beta == pytest.approx(8e9, rel=1e-6)
    assert r2 == pytest.approx(1.0)
    # Noise that would make the latency negative is clipped: latency is never below zero.
    alpha, beta, _ = fit_link([(1000, 1e-7), (2000, 3e-7), (4000, 7e-7)])
    assert alpha == 0.0 and beta > 0
    with pytest.raises(ValueError, match="two sizes"):
        fit_link([(1000, 1e-6)])


def test_shipped_cpu_profile_covers_the_zoo():
    import autoplace
    from autoplace.profile.profiles import shipped_profile

    path = shipped_dir() / "amd-epyc-cpu-1thread.json"
    prof = DeviceProfile.load(path)
    assert prof.kind == "cpu" and prof.info["tvm"] == "0.27.0.post1"
    assert len(prof.latency_s) >= 400 and all(0 < t < 10 for t in prof.latency_s.values())
    for name in autoplace.zoo.names(include_torch=False):
        graph = autoplace.OpGraph.from_relax(autoplace.zoo.load(name).mod)
        assert {n.workload_key for n in graph.nodes} <= set(prof.latency_s), name
    found, where = shipped_profile(prof.fingerprint, dirs=[shipped_dir()])  # even where hidden
    assert where == path and found == prof
    assert shipped_profile("no-such-fingerprint") is None


SHIPPED = shipped_dir()


def test_the_shipped_profiles_are_found_in_the_package_wherever_the_caller_is(tmp_path,
                                                                              monkeypatch):
    import autoplace.profile

    monkeypatch.chdir(tmp_path)  # not the repository root: no relative path may matter
    assert SHIPPED == Path(autoplace.profile.__file__).resolve().parent / "shipped"
    names = {p.name for p in SHIPPED.iterdir()}
    assert {"amd-epyc-cpu-1thread.json", "amd-epyc-cpu-1thread.xgb.json",
            "nvidia-h100-sm90a.json", "README.md"} <= names
    assert DeviceProfile.load(SHIPPED / "amd-epyc-cpu-1thread.json").kind == "cpu"


@pytest.mark.parametrize("model_path", sorted(SHIPPED.glob("*.xgb.json")), ids=lambda p: p.name)
def test_every_shipped_cost_model_loads_and_fills_in_what_its_profile_lacks(model_path):
    """A learned model must be retrained whenever the features change: an old one no longer
    loads, and ``optimize`` on the machine it was shipped for would fail."""
    import autoplace
    from autoplace.predict import MeasuredCostModel, XGBCostModel, load_cost_model
    from autoplace.profile.sweeps import sweep

    prof = DeviceProfile.load(model_path.with_name(model_path.name.replace(".xgb", "")))
    learned = load_cost_model(model_path)
    assert isinstance(learned, XGBCostModel) and prof.fingerprint in learned.devices_
    # A conv2d shape that no campaign measured: the learned model answers, not the roofline.
    _, mod = sweep("nn.conv2d", 1, rng=np.random.default_rng(12345))[0]
    graph = autoplace.OpGraph.from_relax(mod)
    assert graph.nodes[0].workload_key not in prof.latency_s
    model = MeasuredCostModel(prof, fallback=learned)
    dev = autoplace.Device.from_spec(f"{prof.kind}:0")
    assert model.sources(graph, dev) == ["learned"]
    [t] = model.predict(graph, dev)
    p10, p50, p90 = learned.quantiles(graph, dev)[0]
    assert t == learned.predict(graph, dev)[0] and 0 < p10 <= p50 <= p90 < 10
