"""``autoplace cluster`` and ``--device HOST/cpu:0``."""

import functools
import json

import pytest

from autoplace.cli import main
from autoplace.cli.options import devices


def test_device_option_takes_a_host():
    # A host's device is not looked for on this machine: the cluster has it.
    devs = devices(["alpha/cpu:0", "beta/cpu:0", "cpu:0"])
    assert [(d.name, d.host) for d in devs] == [("alpha-cpu0", "alpha"), ("beta-cpu0", "beta"),
                                                ("cpu0", None)]


def test_cluster_without_ray_is_one_line(without_ray, capsys):
    assert main(["cluster"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("autoplace cluster: error: Ray is not installed: "
                   "pip install 'autoplace[cluster]'")


@pytest.mark.slow
def test_cluster_lists_hosts(ray_cluster, capsys, tmp_path):
    assert main(["cluster", "--address", ray_cluster.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["host", "address", "cpus"]
    assert [ln.split()[0] for ln in lines[1:]] == ["alpha", "beta"]
    assert lines[1].split()[-1] == "alpha/cpu:0"
    assert main(["cluster", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [h["devices"] for h in out["hosts"]] == [["alpha/cpu:0"], ["beta/cpu:0"]]
    assert out["devices"][1]["host"] == "beta" and out["links"] == out["calls"] == []


@pytest.mark.slow
def test_cluster_measures_links_into_a_store(ray_cluster, capsys, tmp_path, monkeypatch):
    # The command's own measurements, at fewer sizes and calls than its defaults: the
    # measurements themselves are tested at their modules (test_cluster_links, _calls, _objects).
    from autoplace.cluster import calls, links, objects

    for module, name, small in [(links, "measure_host_links", dict(sizes=(4096, 2**20),
                                                                   repeats=3)),
                                (calls, "measure_call_overheads", dict(calls=40)),
                                (objects, "measure_object_costs", dict(count=20))]:
        monkeypatch.setattr(module, name, functools.partial(getattr(module, name), **small))
    db = str(tmp_path / "prof.db")
    assert main(["cluster", "--measure-links", "--db", db]) == 0
    out = capsys.readouterr().out.splitlines()
    links = [ln for ln in out if ln.startswith("link ")]
    assert [ln.split(":")[0] for ln in links] == ["link alpha -> beta", "link beta -> alpha"]
    calls = [ln.split(":")[0] for ln in out if ln.startswith("call ")]
    assert calls == ["call of an actor on alpha", "call of an actor on beta"]
    from autoplace.profile import ProfileStore

    with ProfileStore(db) as store:
        # Per host its call, stage and segment; per pair of ends (this process, alpha, beta)
        # what a tensor costs through the object store.
        assert len(store.links()) == 2 and len(store.overheads()) == 6 + 8
