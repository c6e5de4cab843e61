"""RPCRunner against a real TVM RPC tracker and servers on loopback (subprocesses)."""

from __future__ import annotations

import math
import threading
import time

import pytest
from rpc_cluster import HOST, free_port

import autoplace
from autoplace.profile.campaign import run_campaign
from autoplace.profile.measure import DeviceUnavailable, TimingPolicy, fingerprint
from autoplace.profile.remote import RPCRunner
from autoplace.profile.store import ProfileStore
from autoplace.profile.workload import single_op_modules

pytest.importorskip("cloudpickle", reason="tvm.exec.rpc_tracker/rpc_server need cloudpickle")

FAST = TimingPolicy(min_repeat_ms=1, min_repeats=2, max_repeats=3, round_size=2, budget_s=0.5)


@pytest.fixture(scope="module")
def mlp():
    return autoplace.zoo.load("mlp").mod


def test_measure_and_info(cluster, mlp):
    runner = RPCRunner("main", HOST, cluster.port, timeout_s=20)
    assert runner.spec == cluster.ensure("main")
    mod = next(iter(single_op_modules(mlp).values()))
    t = runner.measure(mod, FAST)
    assert t.median_s > 0 and math.isfinite(t.median_s)
    info = runner.info()
    assert info["kind"] == "cpu" and info["remote"] == "main" and info["threads"] >= 1
    assert info["host"] == f"{HOST}:{cluster.port}" and info["hardware"]
    assert len(fingerprint(info)) == 16
    runner.close()


def test_campaign_on_rpc_and_local(cluster, mlp, tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    rep = run_campaign([("mlp", mlp)], [cluster.ensure("main"), "cpu:0"], store, links=False,
                       progress=False, policy=FAST)
    assert [d.error for d in rep.devices] == [None, None]
    assert [d.measured for d in rep.devices] == [rep.workloads] * 2
    assert store.counts()["measurements"] == 2 * rep.workloads


def test_unreachable_tracker(mlp, tmp_path):
    dead = free_port()
    t0 = time.monotonic()
    with pytest.raises(DeviceUnavailable, match=f"{HOST}:{dead}"):
        RPCRunner("x", HOST, dead, timeout_s=2).check()
    # a refused connection fails at once; TVM's own session retries it for 60 s
    assert time.monotonic() - t0 < 30
    rep = run_campaign([("mlp", mlp)], [f"rpc:x@{HOST}:{dead}", "cpu:0"],
                       ProfileStore(tmp_path / "p.db"), links=False, progress=False, policy=FAST,
                       runner_kwargs={"rpc_timeout_s": 2})
    rpc, cpu = rep.devices
    assert f"{HOST}:{dead}" in rpc.error and "tracker" in rpc.error
    assert cpu.error is None and cpu.measured == rep.workloads


def test_unknown_key_fails_fast(cluster):
    t0 = time.monotonic()
    with pytest.raises(DeviceUnavailable, match="no RPC server is registered under key 'nope'"):
        RPCRunner("nope", HOST, cluster.port, timeout_s=60).info()
    assert time.monotonic() - t0 < 30  # asked, not waited out its timeout


def test_busy_server_times_out(cluster):
    holder = RPCRunner("main", HOST, cluster.port, timeout_s=20)
    holder.info()  # holds the only server with this key
    t0 = time.monotonic()
    with pytest.raises(DeviceUnavailable, match="no RPC server with key 'main' became free"):
        RPCRunner("main", HOST, cluster.port, timeout_s=1).check()
    assert time.monotonic() - t0 < 30  # its 1 s timeout, where waiting on the holder is forever
    holder.close()


def test_server_killed_mid_campaign_then_resume(cluster, mlp, tmp_path):
    class KillAfterFirst(ProfileStore):
        """Kills the server right after the campaign's first measurement is committed."""

        def add_pass(self, m):
            stored = super().add_pass(m)
            if "main" in cluster.procs:
                cluster.kill("main")
            return stored

    devices = [cluster.ensure("main"), "cpu:0"]
    kw = dict(links=False, progress=False, policy=FAST, runner_kwargs={"rpc_timeout_s": 5})
    rep = run_campaign([("mlp", mlp)], devices, KillAfterFirst(tmp_path / "p.db"), **kw)
    rpc, cpu = rep.devices
    assert rpc.measured == 1 and "lost the RPC session" in rpc.error
    assert "after 1 measurements" in rpc.error
    assert cpu.error is None and cpu.measured == rep.workloads

    cluster.ensure("main")
    again = run_campaign([("mlp", mlp)], devices, ProfileStore(tmp_path / "p.db"), **kw)
    rpc2, cpu2 = again.devices
    assert rpc2.fingerprint == rpc.fingerprint and rpc2.error is None
    assert rpc2.pending == rpc2.measured == rep.workloads - 1
    assert cpu2.pending == cpu2.measured == 0


def test_server_killed_while_timing(cluster, mlp):
    cluster.ensure("main")
    runner = RPCRunner("main", HOST, cluster.port, timeout_s=5)
    mod = next(iter(single_op_modules(mlp).values()))
    slow = TimingPolicy(min_repeat_ms=20, min_repeats=1000, max_repeats=10**6, round_size=2,
                        budget_s=20)
    runner.check()
    started = runner._uploads  # a new upload marks that the timing run has begun
    errors = []

    def work():
        try:
            runner.measure(mod, slow)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=work)
    th.start()
    t0 = time.monotonic()
    while runner._uploads == started and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    time.sleep(0.5)
    cluster.kill("main")
    th.join(30)
    assert not th.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], DeviceUnavailable), errors
    assert "lost the RPC session" in str(errors[0]) and "rpc:main@" in str(errors[0])
