"""A latency plan over hosts: priced as Ray actor calls, one input at a time (each segment waits
for its host's call), and run as such by ``compile()``."""

import numpy as np
import pytest

import autoplace
from autoplace.cluster.calls import HOW
from autoplace.cluster.links import host_fingerprint
from autoplace.devices import Device
from autoplace.profile import OverheadFit

HOSTS = [Device.cpu(0, host="alpha"), Device.cpu(0, host="beta")]


class _Costs:
    """Two branches of 30 ms from one input, joined by an add of 1 ms, on every device."""

    def predict(self, graph, device):
        return np.array([{"exp": 30e-3, "tanh": 30e-3}.get(n.op_type, 1e-3)
                         for n in graph.nodes])


def _branches():
    """x -> exp(x), tanh(x) -> their sum: two branches that can run side by side."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            b = bb.emit(relax.op.tanh(x))
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    return bb.get()


def _segments(call_s):
    return autoplace.cluster.host_overheads(HOSTS, [
        OverheadFit(host_fingerprint(h), "", "segment", call_s, {"how": HOW})
        for h in ("alpha", "beta")], "latency")


@pytest.mark.parametrize("call_s, split", [(2e-3, True), (40e-3, False)])
def test_a_latency_plan_over_hosts_pays_a_call_per_segment(call_s, split):
    # One host: one call, then 30 + 30 + 1 ms: 61 ms + call. The branches on the two hosts
    # side by side: a call on each (at once), 30 ms, the copy of 1 KiB to the add's host
    # (Link.default: 200 us + 1 KiB / 1.25 GB/s), the add's host's next segment (a call), 1 ms:
    # 2 calls + 31.2 ms. A 2 ms call: 35.2 ms against 63 ms, split. A 40 ms call: 111.2 ms
    # against 101 ms, one host.
    res = autoplace.optimize(_branches(), HOSTS, cost_model=_Costs(), check_devices=False,
                             calibrate=False, db=None, **_segments(call_s))
    d = res.delivery
    assert d.runner == "ray" and "Ray actor call" in str(d)
    assert (len(set(res.plan.assignment)) == 2) == split
    copy = 200e-6 + 16 * 16 * 4 / 1.25e9
    want = 2 * call_s + 31e-3 + copy if split else call_s + 61e-3
    assert res.predicted_latency_s == pytest.approx(want, rel=1e-6)
    # The one-host baselines are one call each.
    assert res.baselines["only alpha-cpu0"] == pytest.approx(call_s + 61e-3)


@pytest.mark.slow
def test_compile_runs_a_latency_plan_over_hosts(ray_cluster):
    import tvm
    from tvm import relax

    from autoplace.cluster import RayModel, hosts

    mod = _branches()
    res = autoplace.optimize(mod, HOSTS, cost_model=_Costs(), check_devices=False,
                             calibrate=False, db=None, **_segments(2e-3))
    assert res.mod is None and len(set(res.plan.assignment)) == 2
    xs = [np.random.default_rng(k).standard_normal((16, 16)).astype("float32")
          for k in range(3)]
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    with res.compile() as model:
        assert isinstance(model, RayModel) and model.num_inputs == 1
        node = {h.name: h.node_id for h in hosts()}
        assert set(model.pipe.actor_nodes()) == {node["alpha"], node["beta"]}
        # An actor per segment the delivery priced: exp, tanh, and the add that waits for both.
        assert len(model.pipe.placement) == res.delivery.segments == 3
        for x in xs:
            np.testing.assert_allclose(model(x)[0], vm["main"](tvm.runtime.tensor(x)).numpy(),
                                       rtol=1e-5, atol=1e-6)
