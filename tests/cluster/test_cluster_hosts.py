"""Devices on hosts: the spec and JSON forms, and the hosts and devices of a running cluster."""

import math

import pytest

import autoplace
from autoplace.devices import Device, Link
from autoplace.plan import Plan


def test_host_spec_round_trips():
    d = Device.from_spec("node-1/cpu:0")
    assert (d.name, d.host, d.spec) == ("node-1-cpu0", "node-1", "node-1/cpu:0")
    assert Device.from_spec(d.spec) == d
    g = Device.from_spec("gpu.box/cpu:1:generic")
    assert (g.target, g.host, g.spec) == ("llvm", "gpu.box", "gpu.box/cpu:1:generic")
    assert Device.from_spec("n/torch:cuda:1").name == "n-torch-cuda1"
    assert Device.cuda(0, host="n").name == "n-cuda0"
    with pytest.raises(ValueError, match="host"):
        Device.from_spec("bad host/cpu:0")
    with pytest.raises(ValueError, match="host"):
        Device.cpu(0, host="a/b")


def test_no_host_is_this_host_and_json_as_before():
    d = Device.cpu(0)
    assert d.host is None and d.spec == "cpu:0" and "host" not in d.to_dict()
    # A device written before hosts existed reads back as this host's.
    old = {k: v for k, v in d.to_dict().items()}
    assert Device.from_dict(old) == d
    h = Device.cpu(0, host="beta")
    assert h.to_dict()["host"] == "beta" and Device.from_dict(h.to_dict()) == h


def test_plan_shows_and_keeps_hosts():
    a, b = Device.cpu(0, host="alpha"), Device.cpu(0, name="fast", host="beta")
    g = autoplace.OpGraph.from_relax(_two_ops())
    plan = Plan.from_assignment(g, [a, b], ["alpha-cpu0", "fast"], stages=(0, 1),
                                objective="throughput")
    assert Plan.from_json(plan.to_json()) == plan
    text = str(plan)
    assert "alpha-cpu0 stage 0" in text and "fast@beta stage 1" in text


def test_cross_host_link_defaults_to_a_network():
    a, b, c = Device.cpu(0, host="alpha"), Device.cpu(0, host="beta"), Device.cpu(1, host="alpha")
    net, local = Link.default(a, b), Link.default(a, c)
    # 1 MB: the network's 200 us + 0.8 ms; a memory copy's 5 us + 0.2 ms.
    assert math.isclose(net.time(1e6), 200e-6 + 1e6 / 1.25e9)
    assert net.time(1e6) > 3 * local.time(1e6)


def test_ray_missing_is_one_line(without_ray):
    from autoplace.cluster import ClusterError, cluster_devices

    with pytest.raises(ClusterError) as e:
        cluster_devices()
    assert str(e.value) == "Ray is not installed: pip install 'autoplace[cluster]'"
    assert "\n" not in str(e.value)


def test_cluster_lists_hosts_and_devices(ray_cluster):
    from autoplace.cluster import cluster_devices, hosts

    found = hosts()
    assert [h.name for h in found] == ["alpha", "beta"]
    assert all(h.cpus == 1 for h in found) and len({h.node_id for h in found}) == 2
    assert [d.spec for d in cluster_devices()] == ["alpha/cpu:0", "beta/cpu:0"]


def test_missing_host_named_before_build(ray_cluster, monkeypatch):
    from autoplace.cluster import ClusterError, RayPipeline
    from autoplace.cluster import pipeline as cp

    def no_split(*a, **k):
        raise AssertionError("split before the hosts were checked")

    monkeypatch.setattr(cp, "split", no_split)
    a, z = Device.cpu(0, host="alpha"), Device.cpu(0, host="zeta")
    g = autoplace.OpGraph.from_relax(_two_ops())
    plan = Plan.from_assignment(g, [a, z], [a.name, z.name], stages=(0, 1), objective="throughput")
    with pytest.raises(ClusterError) as e:
        RayPipeline.from_plan(_two_ops(), plan)
    assert "'zeta'" in str(e.value) and "alpha, beta" in str(e.value)
    assert "\n" not in str(e.value)


def _two_ops():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Two:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                a = R.nn.relu(x)
                b = R.exp(a)
                R.output(b)
            return b

    return Two


def test_the_local_pipeline_refuses_a_plan_on_other_hosts():
    from autoplace.run import Pipeline

    a, b = Device.cpu(0), Device.cpu(1, host="beta")
    g = autoplace.OpGraph.from_relax(_two_ops())
    plan = Plan.from_assignment(g, [a, b], [a.name, b.name], stages=(0, 1), objective="throughput")
    with pytest.raises(ValueError, match="host 'beta'.*RayPipeline"):
        Pipeline.from_plan(_two_ops(), plan)
