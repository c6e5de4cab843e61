"""Tuning a device reached through a TVM RPC tracker (a real tracker and server on loopback):
MetaSchedule's RPC runner runs the candidates there, the records are filed under the remote's
fingerprint, its tuned kernel is timed there into the store, and a second run has nothing to do.
A tracker that cannot be reached or a key that no server has fails before anything is tuned,
in one line."""

import json
import re

import pytest
from rpc_cluster import HOST, free_port

import autoplace
from autoplace.cli import main
from autoplace.profile import DeviceUnavailable, ProfileStore, fingerprint
from autoplace.profile.remote import RPCRunner
from autoplace.tuning import records_root

TRIALS = 2

pytestmark = pytest.mark.slow


def _matmul(reduce: bool = False):
    """x @ w, (8, 16) x (16, 8): one small kernel; with ``reduce`` its row sums, a second."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            out = bb.emit_output(relax.op.sum(y, axis=[1]) if reduce else y)
        bb.emit_func_output(out)
    return bb.get()


def _sessions(cluster, key) -> int:
    """Sessions the server ``key`` has served (its log has a line per connection)."""
    return (cluster.logdir / f"{key}.log").read_text().count("connected from")


@pytest.fixture(scope="module")
def tuned(cluster, tmp_path_factory):
    """The matmul tuned on the remote ``main`` with TRIALS trials: (spec, store, report, the
    server's sessions during the campaign)."""
    spec = cluster.ensure("main")
    db = tmp_path_factory.mktemp("tuning-rpc") / "prof.db"
    before = _sessions(cluster, "main")
    report = autoplace.tune(_matmul(), [spec], db, trials=TRIALS, trials_per_iter=TRIALS,
                            progress=False)
    return spec, db, report, _sessions(cluster, "main") - before


def test_records_are_filed_under_the_remotes_fingerprint(cluster, tuned):
    spec, db, report, _ = tuned
    runner = RPCRunner("main", HOST, cluster.port)
    info = runner.info()
    runner.close()
    fp = fingerprint(info)
    assert report.databases == {spec: str(records_root(db) / fp)}
    [kernel] = report.kernels
    assert kernel.device == spec and kernel.tuned_now >= TRIALS and kernel.valid >= 1
    assert [p.name for p in records_root(db).iterdir()] == [fp]  # nothing filed for this host
    about = json.loads((records_root(db) / fp / "device.json").read_text())
    assert about["device"] == {"spec": spec} and about["info"]["remote"] == "main"


def test_candidates_and_the_tuned_kernel_run_on_the_remote(tuned):
    spec, db, report, sessions = tuned
    # Two to ask what the device is (before the campaign, before the kernel), one to time the
    # default kernel (what the campaign orders kernels by), one per candidate (MetaSchedule's
    # RPC runner: the local one would open none), one to time the tuned kernel.
    assert sessions == 2 + 1 + TRIALS + 1
    assert report.kernels[0].default_s > 0
    assert report.timed == 1
    with ProfileStore(db) as store:
        [row] = [m for m in store.measurements(schedule=None) if m.schedule.startswith("tuned:")]
        [device] = store.devices()
    assert row.ok and row.latency_s > 0
    assert row.device == device.fingerprint and device.name == spec


def test_a_second_run_has_nothing_pending(cluster, tuned):
    spec, db, _, _ = tuned
    dry = autoplace.tune(_matmul(), [spec], db, trials=TRIALS, dry_run=True)
    assert dry.pending == 0 and dry.kernels[0].recorded >= TRIALS
    again = autoplace.tune(_matmul(), [spec], db, trials=TRIALS, progress=False)
    assert again.pending == 0 and again.timed == 0
    assert sum(k.tuned_now for k in again.kernels) == 0


def test_an_unreachable_tracker_is_one_line_and_nothing_is_written(tmp_path, capsys):
    dead = free_port()
    db = tmp_path / "prof.db"
    code = main(["tune", "--model", "zoo:mlp", "--device", f"rpc:x@{HOST}:{dead}", "--db",
                 str(db), "--trials", "1", "--rpc-timeout", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"cannot reach the RPC tracker {HOST}:{dead}" in err and "rpc_tracker" in err
    assert not records_root(db).exists() and not db.exists()


def test_an_unknown_key_says_which_keys_the_tracker_has(cluster, tmp_path):
    with pytest.raises(DeviceUnavailable, match="no RPC server is registered under key 'nope'"):
        autoplace.tune(_matmul(), [cluster.spec("nope")], tmp_path / "prof.db", trials=TRIALS,
                       runner_kwargs={"rpc_timeout_s": 5})
    assert not records_root(tmp_path / "prof.db").exists()


def test_a_remote_lost_between_kernels_stops_the_campaign_and_it_resumes(cluster, tmp_path,
                                                                         monkeypatch):
    from autoplace.tuning import tuner

    spec, db = cluster.ensure("flaky"), tmp_path / "prof.db"
    tune_one = tuner.tune_one

    def then_kill(*args):
        tune_one(*args)
        cluster.kill("flaky")

    monkeypatch.setattr(tuner, "tune_one", then_kill)
    # The tracker has dropped the server ("no RPC server is registered under key 'flaky'"), or
    # sends one that is gone: either way one line naming the device.
    with pytest.raises(DeviceUnavailable, match=re.escape(f"{spec}: ")):
        autoplace.tune(_matmul(reduce=True), [spec], db, trials=1, progress=False,
                       runner_kwargs={"rpc_timeout_s": 5})
    monkeypatch.undo()
    cluster.ensure("flaky")
    status = autoplace.tune(_matmul(reduce=True), [spec], db, trials=1, dry_run=True)
    # The matmul (most FLOPs, first) was tuned; the sum was not tried, so nothing marks it failed.
    assert sorted(k.recorded for k in status.kernels) == [0, 1] and status.pending == 1
    assert not any(k.failed for k in status.kernels)
