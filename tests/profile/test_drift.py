"""A device that no longer runs as fast as when a store measured it adds nothing to that store.

The stores here are measured for real on this machine's CPU; an earlier, faster occasion is
made by dating their rows two days back and dividing their latencies.
"""

import json
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from autoplace import zoo
from autoplace.profile import Measurement, ProfileStore, TimingPolicy, run_campaign
from autoplace.profile.drift import DriftError, anchors

FAST = TimingPolicy(min_repeat_ms=1, min_repeats=2, max_repeats=3, round_size=2, budget_s=0.3)
TWO_DAYS_AGO = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - 2 * 86400))


def _measured_earlier(path, speedup: float) -> ProfileStore:
    """A store of ``mlp`` measured now, then dated two days back as ``speedup`` times faster."""
    store = ProfileStore(path)
    run_campaign([("mlp", zoo.load("mlp").mod)], ["cpu:0"], store, policy=FAST, progress=False,
                 links=False)
    for m in store.measurements():
        store.put(replace(m, measured_at=TWO_DAYS_AGO, min_s=m.min_s / speedup,
                          median_s=m.median_s / speedup, mean_s=m.mean_s / speedup))
    return store


# Drifts far beyond what a host's load makes of the same ops timed seconds apart (the rows are
# timed here, then divided): a 20x drift is far past a 15 % tolerance, and a steady device's
# ratio stays within the 5x either way allowed it.
DRIFTED, STEADY = 20.0, 4.0


def test_a_drifted_device_measures_nothing_and_says_why(tmp_path):
    store = _measured_earlier(tmp_path / "p.db", speedup=DRIFTED)
    before = store.measurements()
    with pytest.raises(DriftError,
                       match=r"median \d+\.\d\dx as long on 3 workloads.*--allow-drift"):
        run_campaign([("cnn", zoo.load("branchy_cnn").mod)], ["cpu:0"], store, policy=FAST,
                     progress=False, drift_tolerance=0.15)
    assert store.measurements() == before and store.links() == []
    rep = run_campaign([("cnn", zoo.load("branchy_cnn").mod)], ["cpu:0"], store, policy=FAST,
                       progress=False, links=False)  # no tolerance: the caller's choice
    assert rep.devices[0].measured == 9 and rep.devices[0].drift is None


def test_a_steady_device_is_checked_and_goes_on(tmp_path):
    store = _measured_earlier(tmp_path / "p.db", speedup=1.0)
    rep = run_campaign([("cnn", zoo.load("branchy_cnn").mod)], ["cpu:0"], store, policy=FAST,
                       progress=False, links=False, drift_tolerance=STEADY)
    (dev,) = rep.devices
    assert dev.measured == 9 and 1 / (1 + STEADY) < dev.drift < 1 + STEADY
    assert "timed again, take a median" in rep.table()


def test_this_occasions_rows_and_more_passes_are_not_checked(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    run_campaign([("mlp", zoo.load("mlp").mod)], ["cpu:0"], store, policy=FAST, progress=False,
                 links=False)
    rep = run_campaign([("cnn", zoo.load("branchy_cnn").mod)], ["cpu:0"], store, policy=FAST,
                       progress=False, links=False, drift_tolerance=0.0)  # rows an hour old
    assert rep.devices[0].drift is None and rep.devices[0].measured == 9
    old = _measured_earlier(tmp_path / "q.db", speedup=3.0)
    rep = run_campaign([("mlp", zoo.load("mlp").mod)], ["cpu:0"], old, policy=FAST,
                       progress=False, links=False, passes=2, drift_tolerance=0.0)
    assert rep.devices[0].drift is None and rep.devices[0].measured == 3  # pass 2, fastest kept


def test_the_cli_refuses_a_drifted_store_unless_allowed(tmp_path):
    db = tmp_path / "p.db"
    _measured_earlier(db, speedup=DRIFTED).close()
    args = [sys.executable, "-m", "autoplace", "profile", "--model", "zoo:branchy_cnn",
            "--db", str(db), "--no-links", "--no-overheads", "--budget", "0.3", "--json"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "--allow-drift" in p.stderr and "Nothing was measured" in p.stderr
    p = subprocess.run([*args, "--allow-drift"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["devices"][0]["measured"] == 9


def test_anchors_spread_over_latencies_skip_fresh_rows_and_keys_that_do_not_rebuild():
    def relu(n, latency, when=TWO_DAYS_AGO):
        key = json.dumps(["relax.nn.relu", [[[1, n], "float32"]], {}, []])
        return Measurement(key, "fp", "ok", latency, latency, latency, measured_at=when)

    rows = [relu(n, n * 1e-6) for n in range(1, 41)]
    rows.append(Measurement('["relax.no_such_op",[[[4],"float32"]],{},[]]', "fp", "ok", 8.5e-6,
                            8.5e-6, 8.5e-6, measured_at=TWO_DAYS_AGO))  # 9th: relu9 instead
    rows.append(relu(999, 1.0, when=time.strftime("%Y-%m-%dT%H:%M:%S%z")))  # this occasion's
    rows.append(Measurement(rows[0].workload, "fp", "unsupported", measured_at=TWO_DAYS_AGO))
    picked = anchors(rows, 5)
    assert [round(m.latency_s * 1e6) for m, _ in picked] == [1, 9, 16, 24, 32]
    assert anchors(rows, 5, older_than_s=3 * 86400) == []
