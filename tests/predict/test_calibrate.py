"""A CPU no shipped profile describes, or one that does not run as its profile says: the costs
are calibrated on first use from a few of the model's own workloads timed here, cached per host
and speed, and the next call times nothing."""

import json
import subprocess
import sys

import numpy as np
import pytest

import autoplace
from autoplace import Device, zoo
from autoplace.pricing.calibrate import ProfileCheck, calibrated, check_profile
from autoplace.profile import calibration_cache
from autoplace.profile import DeviceProfile, LocalRunner, fingerprint
from autoplace.profile.workload import module_from_key


@pytest.fixture
def new_host(monkeypatch, tmp_path):
    """This host as a user's: no shipped profile describes it, an empty cache."""
    monkeypatch.setenv("AUTOPLACE_SHIPPED_PROFILES", "0")
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_cpu_device_builds_for_this_hosts_cpu_by_default():
    import tvm

    cpu = tvm.target.codegen.llvm_get_system_cpu()
    assert Device.cpu(0).target == "native"
    assert Device.cpu(0).tvm_target().attrs["mcpu"] == cpu
    assert str(Device.from_spec("cpu:1").tvm_target()) == str(Device.cpu(1).tvm_target())
    generic = Device.from_spec("cpu:0:generic")
    assert generic.target == "llvm" and "mcpu" not in generic.tvm_target().attrs
    assert [d.spec for d in (Device.cpu(1), generic, Device.cuda(0))] == [
        "cpu:1", "cpu:0:generic", "cuda:0"]
    assert Device.cpu(0, target="llvm -num-cores 1").spec is None
    # The fingerprint a profile is matched by names the target: a generic profile is not this.
    infos = [LocalRunner(d).info() for d in (Device.cpu(0), generic)]
    assert fingerprint(infos[0]) != fingerprint(infos[1]) and cpu in infos[0]["target"]
    with pytest.raises(ValueError, match="target 'native' names a CPU"):
        Device("g", kind="cuda", target="native")


def test_a_model_on_a_new_host_gets_calibrated_costs_and_the_next_call_times_nothing(
        new_host, monkeypatch):
    m = zoo.load("branchy_cnn")
    devs = [Device.cpu(0, name="a"), Device.cpu(1, name="b")]
    res = autoplace.optimize(m.mod, devs)
    assert "a: calibrated on this machine from" in res.cost_model
    assert "b: calibrated as a" in res.cost_model
    # the ops timed here cost what they measured, any other what the adapted model predicts
    assert "measured" in res.plan.cost_sources
    assert set(res.plan.cost_sources) <= {"measured", "learned"}
    # and the overheads of running a plan were measured too
    assert "measured by its profile" in res.summary() and "call overhead:" in res.summary()
    assert "expected error: ±" in res.summary()
    # the adapted model's band reaches the guard: no cost counts as exact
    assert "no known spread" not in res.summary()
    entries = list(new_host.glob("*-*"))
    assert len(entries) == 1 and (entries[0] / "model.json").exists()
    timed = []
    real = LocalRunner.measure
    monkeypatch.setattr(LocalRunner, "measure",
                        lambda self, *a, **k: timed.append(1) or real(self, *a, **k))
    again = autoplace.optimize(m.mod, devs)
    assert timed == [] and "cached in" in again.cost_model
    np.testing.assert_allclose(again.problem.cost, res.problem.cost)
    # Without calibration: nothing is timed, roofline guesses as before.
    plain = autoplace.optimize(m.mod, devs, calibrate=False)
    assert plain.cost_model.startswith("roofline estimates") and timed == []


def test_a_profile_this_host_runs_at_a_quarter_of_its_times_is_noticed_and_calibrated(
        new_host, monkeypatch):
    m = zoo.load("branchy_cnn")
    dev = Device.cpu(0)
    graph = autoplace.OpGraph.from_relax(m.mod)
    info = LocalRunner(dev).info()
    runner = LocalRunner(dev)
    keys = list(dict.fromkeys(n.workload_key for n in graph.nodes))
    now = {}
    for k in keys:
        try:
            now[k] = runner.measure(module_from_key(k)).min_s
        except Exception:  # noqa: BLE001 - an op the key cannot rebuild is no anchor
            pass
    # A "profile of this host" that measured everything four times as long as it runs now:
    # far enough off that a VM's slower phase (up to 2x) between the two timings still shows it.
    slow = DeviceProfile("quarter-speed", fingerprint(info), info,
                         {k: 4 * t for k, t in now.items()}, {k: 0.02 for k in now}, {})
    check = check_profile(slow, dev, keys)
    assert check is not None and not check.agrees and check.ratio < 0.75
    assert "not as the profile says" in check.describe()
    monkeypatch.setattr("autoplace.profile.profiles.shipped_profile",
                        lambda fp, dirs=None: (slow, new_host / "quarter-speed.json")
                        if fp == slow.fingerprint else None)
    res = autoplace.optimize(m.mod, [dev])
    assert "calibrated instead" in res.cost_model and "calibrated on this machine" in res.cost_model
    assert res.predictor.profile_for(dev) is not slow
    # calibrate=False trusts the profile as shipped
    trusted = autoplace.optimize(m.mod, [dev], calibrate=False)
    assert trusted.cost_model.startswith("measured") and "measured" in trusted.plan.cost_sources


def test_a_profile_check_agrees_within_its_tolerance():
    near = ProfileCheck("p", 1.2, 5, 0.25)
    assert near.agrees and "as the profile says" in near.describe()
    assert not ProfileCheck("p", 0.5, 5, 0.25).agrees
    assert not ProfileCheck("p", 1.3, 5, 0.25).agrees
    assert ProfileCheck("p", 1.3, 5, 0.4).agrees  # a noisy profile tolerates more


def test_a_host_of_another_speed_gets_its_own_cache_entry(new_host, monkeypatch):
    m = zoo.load("mlp")
    first = calibrated(Device.cpu(0), [("mlp", m.mod)], progress=False)
    assert first.timed > 0 and first.path is not None
    # The same host, its probe kernel now running 3x as long: another speed, another entry.
    probe = calibration_cache.speed_probe(Device.cpu(0))
    monkeypatch.setitem(calibration_cache._PROBED, ("cpu", 0, "native"), 3 * probe)
    other = calibrated(Device.cpu(0), [("mlp", m.mod)], progress=False)
    assert other.path != first.path and other.timed > 0
    # Within SAME_SPEED of the first: its entry again, nothing timed.
    monkeypatch.setitem(calibration_cache._PROBED, ("cpu", 0, "native"), 1.2 * probe)
    assert calibrated(Device.cpu(0), [("mlp", m.mod)], progress=False).path == first.path


def test_a_corrupt_or_unwritable_cache_warns_once_and_calibrates(new_host, monkeypatch, caplog,
                                                                 tmp_path):
    m = zoo.load("mlp")
    first = calibrated(Device.cpu(0), [("mlp", m.mod)], progress=False)
    (first.path / "meta.json").write_text("{not json")
    again = calibrated(Device.cpu(0), [("mlp", m.mod)], progress=False)
    assert again.timed > 0 and "unreadable" in caplog.text
    (again.path / "model.json").write_text("[]")
    caplog.clear()
    model = calibrated(Device.cpu(0), [("mlp", m.mod)], progress=False)
    assert model.rows == again.rows and "fitted again" in caplog.text
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(blocked / "cache"))
    caplog.clear()
    out = calibrated(Device.cpu(0), [("mlp", m.mod)], progress=False)
    assert out.path is None and out.timed > 0
    assert caplog.text.count("cannot write the calibration cache") == 1


def test_the_cli_calibrates_and_no_calibrate_gives_roofline(new_host):
    env = {**__import__("os").environ}

    def run(*extra):
        r = subprocess.run([sys.executable, "-m", "autoplace", "optimize", "--model", "zoo:mlp",
                            "--device", "cpu:0", "--json", *extra], capture_output=True,
                           text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    assert run()["cost_model"].startswith("cpu0: calibrated on this machine from")
    assert run("--no-calibrate")["cost_model"].startswith("roofline estimates")


def test_a_calibration_times_none_of_the_workloads_it_is_told_to_skip(new_host, monkeypatch):
    m = zoo.load("branchy_cnn")
    keys = {n.workload_key for n in autoplace.OpGraph.from_relax(m.mod).nodes}
    full = calibrated(Device.cpu(0), [("m", m.mod)], count=6, progress=False)
    timed = set(full.profile.latency_s)
    assert timed
    skipped = frozenset(sorted(timed)[: len(timed) // 2 + 1])
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(new_host.parent / "fresh"))  # a new entry
    cal = calibrated(Device.cpu(0), [("m", m.mod)], count=6, progress=False, skip=skipped)
    assert cal.profile.latency_s and not set(cal.profile.latency_s) & skipped
    assert set(cal.profile.latency_s) <= keys


def test_a_calibration_skipping_nearly_everything_still_times_enough_to_adapt(new_host):
    from autoplace.predict.adapt import MIN_ROWS

    m = zoo.load("branchy_cnn")
    keys = frozenset(n.workload_key for n in autoplace.OpGraph.from_relax(m.mod).nodes)
    cal = calibrated(Device.cpu(0), [("m", m.mod)], count=6, progress=False, skip=keys)
    assert cal.rows >= MIN_ROWS and set(cal.profile.latency_s) <= keys
