"""Each host's devices profiled on that host: the per-op campaign timed by an actor on the host's
node, stored under a fingerprint that names the host, resumed like a local campaign, and charged
by optimize to that host's device."""

import pytest

import autoplace
from autoplace.cluster import (ClusterError, host_cost_model, host_profiles, hosts,
                               profile_on_hosts)
from autoplace.devices import Device
from autoplace.profile import LocalRunner, ProfileStore, TimingPolicy, fingerprint
from cluster_models import chain  # noqa: E402

BETA = Device.cpu(0, host="beta")
FAST = TimingPolicy(min_repeat_ms=1.0, min_repeats=3, max_repeats=5, round_size=3, budget_s=0.5)


@pytest.mark.slow
def test_a_hosts_ops_are_timed_there_and_charged(ray_cluster, tmp_path):
    path = tmp_path / "prof.db"
    with ProfileStore(path) as store:
        report = profile_on_hosts(chain(), store, ["beta/cpu:0"], policy=FAST, progress=False)
        (dev,) = report.devices
        assert (dev.spec, dev.error, dev.measured, dev.unsupported) == ("beta/cpu:0", None, 2, 0)
        rec = store.device("beta/cpu:0")
        # Timed by an actor on beta's node, with beta's one CPU; the fingerprint names the host,
        # so it is not this process's CPU's, though both are this machine's.
        beta = next(h for h in hosts() if h.name == "beta")
        assert rec.info["ray_node"] == beta.node_id and rec.info["remote"] == "ray:beta"
        assert rec.info["threads"] == 1 and rec.fingerprint == dev.fingerprint
        assert rec.fingerprint == fingerprint(rec.info)
        assert rec.fingerprint != fingerprint(LocalRunner(Device.cpu(0)).info())
        timed = {m.workload: m.latency_s for m in store.measurements(rec.fingerprint)}
        assert len(timed) == 2 and all(0 < s < 0.1 for s in timed.values())
        # Resumed: what the store holds is not timed again.
        again = profile_on_hosts(chain(), store, [BETA], policy=FAST, progress=False)
        assert (again.devices[0].pending, again.devices[0].measured) == (0, 0)

    with ProfileStore(path) as store:
        model = host_cost_model([BETA], store)
        res = autoplace.optimize(chain(), [BETA], cost_model=model, calibrate=False, db=None)
        assert res.plan.cost_sources == ("measured", "measured")
        # Its profile is beta's, not one of this machine's measured on other settings.
        assert res.profiles_note == (f"profile: beta-cpu0 <- {rec.info['hardware']} "
                                     f"(beta/cpu:0, {rec.fingerprint})",)
        g = autoplace.OpGraph.from_relax(chain())
        assert list(model.predict(g, BETA)) == [timed[n.workload_key] for n in g.nodes]
        # Another CPU device of beta is beta's CPU: the same profile. A device recorded under
        # beta's spec but timed on this machine (no remote) is not beta's.
        store.add_device("0123456789abcdef", "beta/cpu:0", {"kind": "cpu", "remote": None})
        got = host_profiles([BETA, Device.cpu(1, host="beta")], store)
        assert {p.fingerprint for p in got.values()} == {rec.fingerprint}
        with pytest.raises(ClusterError, match=r"no profile of alpha/cpu:0 .*--device alpha/cpu:0"):
            host_cost_model([Device.cpu(0, host="alpha"), BETA], store)


@pytest.mark.slow
def test_a_host_the_cluster_lacks_is_named_before_anything_runs(ray_cluster, tmp_path):
    with ProfileStore(tmp_path / "prof.db") as store:
        with pytest.raises(ClusterError, match=r"^no host 'gamma' in the cluster \(its hosts: "
                                               r"alpha, beta\)$"):
            profile_on_hosts(chain(), store, ["beta/cpu:0", "gamma/cpu:0"], progress=False)
        with pytest.raises(ValueError, match="'cpu0' is of no host"):
            profile_on_hosts(chain(), store, [Device.cpu(0)], progress=False)
        assert store.devices() == [] and store.measurements() == []


@pytest.mark.slow
def test_cli_profiles_a_hosts_device_there(ray_cluster, tmp_path, capsys):
    import json

    from autoplace.cli import main

    db = str(tmp_path / "prof.db")
    quick = ["--cv", "0.5", "--budget", "0.2"]
    assert main(["profile", "--model", "zoo:mlp", "--device", "beta/cpu:0", "--db", db,
                 *quick]) == 0
    out = capsys.readouterr().out.splitlines()
    # zoo:mlp has three workloads (matmul, add, relu), all timed on beta.
    assert out[0].startswith("1 models,") and "3 distinct workloads" in out[0]
    row = next(ln.split() for ln in out if ln.startswith("beta/cpu:0"))
    assert row[2:6] == ["3", "3", "0", "0"]  # pending, measured, unsupported, skipped
    # autoplace cluster --profile: every host's device by default; beta's is done already.
    assert main(["cluster", "--profile", "--model", "zoo:mlp", "--db", db, "--json"]) == 0
    got = {d["spec"]: (d["pending"], d["measured"], d["error"])
           for d in json.loads(capsys.readouterr().out)["devices"]}
    assert got["beta/cpu:0"] == (0, 0, None) and got["alpha/cpu:0"][1:] == (3, None)
    with ProfileStore(db) as store:
        assert {d.info["remote"] for d in store.devices()} == {"ray:alpha", "ray:beta"}
    # A host the cluster lacks: one line naming it, nothing timed.
    db2 = str(tmp_path / "other.db")
    assert main(["profile", "--model", "zoo:mlp", "--device", "gamma/cpu:0", "--db", db2]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("autoplace profile: error: no host 'gamma' in the cluster (its hosts: "
                   "alpha, beta)")
    with ProfileStore(db2) as store:
        assert store.devices() == []


@pytest.mark.slow
def test_a_dead_profiling_actor_is_the_device_unavailable(ray_cluster):
    import ray

    from autoplace.cluster import RayRunner
    from autoplace.profile import DeviceUnavailable

    beta = next(h for h in hosts() if h.name == "beta")
    with pytest.raises(ValueError, match="'alpha-cpu0' is on host 'alpha', not 'beta'"):
        RayRunner(Device.cpu(0, host="alpha"), beta)
    runner = RayRunner(BETA, beta)
    assert runner.info()["remote"] == "ray:beta"
    ray.kill(runner._actor)  # as when its node dies: the campaign reports the device, goes on
    with pytest.raises(DeviceUnavailable, match=r"^beta/cpu:0: the profiling actor on host "
                                                r"'beta' died"):
        runner.measure(chain(), FAST)
    runner.close()
