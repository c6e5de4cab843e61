"""A staged plan over two hosts of a real Ray cluster: outputs as the one-host build's, actors on
the hosts the plan names, streaming bounded and in order; a stage that fails and a node that
dies mid-stream are named."""

import time

import numpy as np
import pytest

import autoplace
from autoplace.devices import Device
from autoplace.plan import Plan

pytestmark = pytest.mark.slow


def _mlp():
    """x -> relu(x @ w1) = h -> tanh(h @ w2) = y -> y + h: three matmul-sized ops and a skip."""
    from tvm import relax

    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((64, 64)).astype("float32") / 8 for _ in range(2))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, relax.const(w1))))
            y = bb.emit(relax.op.tanh(relax.op.matmul(h, relax.const(w2))))
            out = bb.emit_output(relax.op.add(y, h))
        bb.emit_func_output(out)
    return bb.get()


def _one_host(mod, xs):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return [vm["main"](tvm.runtime.tensor(x)).numpy() for x in xs]


def _inputs(n, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((16, 64)).astype("float32") for _ in range(n)]


def _plan(mod, hosts, stages):
    """One stage per entry of ``stages`` (a stage number per node), stage k on ``hosts[k]``."""
    g = autoplace.OpGraph.from_relax(mod)
    devs = [Device.cpu(0, host=h) for h in dict.fromkeys(hosts)]
    return Plan.from_assignment(g, devs, [f"{hosts[s]}-cpu0" for s in stages],
                                stages=tuple(stages), objective="throughput")


def test_stages_on_two_hosts_match_one_host(ray_cluster):
    from autoplace.cluster import RayPipeline, hosts

    mod = _mlp()
    # matmul, relu | matmul, tanh | add: stage 2 reads h from stage 0, past stage 1.
    plan = _plan(mod, ["alpha", "beta", "alpha"], [0, 0, 1, 1, 2])
    xs = _inputs(20)
    with RayPipeline.from_plan(mod, plan, max_in_flight=4) as pipe:
        node = {h.name: h.node_id for h in hosts()}
        assert pipe.actor_nodes() == (node["alpha"], node["beta"], node["alpha"])
        assert [h.name for _, h in pipe.placement] == ["alpha", "beta", "alpha"]
        outs = pipe.run([x] for x in xs)
        assert pipe.stats.inputs == 20 and len(pipe.stats.busy_s) == 3
    want = _one_host(mod, xs)
    assert len(outs) == 20
    for got, w in zip(outs, want):
        np.testing.assert_allclose(got[0], w, rtol=1e-5, atol=1e-6)


def test_optimize_over_two_hosts_runs_its_pipeline_on_them(ray_cluster):
    # Both hosts' devices are cpu:0: a plan over hosts is one module per stage, built on its
    # host, so optimize writes no module (mod None) and .pipeline() runs it on the cluster.
    mod = _mlp()
    devs = [Device.cpu(0, host="alpha"), Device.cpu(0, host="beta")]
    res = autoplace.optimize(mod, devs, objective="throughput", check_devices=False,
                             cost_model=autoplace.RooflineCostModel(), baseline_guard=False,
                             pins=[("op:matmul#0", "alpha-cpu0"), ("op:tanh", "beta-cpu0")])
    assert {d.host for d in res.plan.used_devices()} == {"alpha", "beta"} and res.mod is None
    with pytest.raises(ValueError, match="other hosts"):
        res.compile()
    xs = _inputs(6, seed=3)
    with res.pipeline(max_in_flight=2) as pipe:
        assert {h.name for _, h in pipe.placement} == {"alpha", "beta"}
        outs = pipe.run([x] for x in xs)
    for got, want in zip(outs, _one_host(mod, xs)):
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


def test_stream_is_bounded_and_in_order(ray_cluster):
    from autoplace.cluster import RayPipeline

    mod = _mlp()
    plan = _plan(mod, ["alpha", "beta"], [0, 0, 1, 1, 1])
    xs = _inputs(30, seed=2)
    want = _one_host(mod, xs)
    read = []

    def feed():
        for k, x in enumerate(xs):
            read.append(k)
            yield [x]

    with RayPipeline.from_plan(mod, plan, max_in_flight=3) as pipe:
        for k, out in enumerate(pipe.stream(feed())):
            assert len(read) - k <= 3  # taken and not yet returned
            np.testing.assert_allclose(out[0], want[k], rtol=1e-5, atol=1e-6)
    assert k == 29


def test_stage_error_names_stage_host_and_input(ray_cluster):
    from autoplace.cluster import ClusterPipelineError, RayPipeline

    mod = _mlp()
    plan = _plan(mod, ["alpha", "beta"], [0, 0, 1, 1, 1])
    xs = _inputs(6, seed=3)
    xs[4] = np.zeros((16, 32), "float32")  # the wrong shape for stage 0's matmul
    with RayPipeline.from_plan(mod, plan, max_in_flight=2) as pipe:
        with pytest.raises(ClusterPipelineError) as e:
            pipe.run([x] for x in xs)
    err = e.value
    assert (err.stage, err.input_index, err.host) == (0, 4, "alpha")
    assert "stage 0" in str(err) and "alpha" in str(err) and "input 4" in str(err)
    assert len(err.results) == 4 and err.unprocessed[0] == 4
    for got, w in zip(err.results, _one_host(mod, xs[:4])):
        np.testing.assert_allclose(got[0], w, rtol=1e-5, atol=1e-6)


def test_node_dying_mid_stream_is_named_in_bounded_time(ray_cluster):
    from autoplace.cluster import HOST_LABEL, ClusterPipelineError, RayPipeline

    node = ray_cluster.add_node(num_cpus=1, object_store_memory=200 * 2**20,
                                labels={HOST_LABEL: "gamma"})
    ray_cluster.wait_for_nodes()
    mod = _mlp()
    plan = _plan(mod, ["alpha", "gamma"], [0, 0, 1, 1, 1])
    xs = _inputs(40, seed=4)
    want = _one_host(mod, xs)
    got, removed = [], False
    pipe = RayPipeline.from_plan(mod, plan, max_in_flight=4, stall_timeout_s=30)
    try:
        stream = pipe.stream([x] for x in xs)
        with pytest.raises(ClusterPipelineError) as e:
            for out in stream:
                got.append(out)
                if len(got) == 5:
                    ray_cluster.remove_node(node)
                    removed, t0 = True, time.monotonic()
        waited = time.monotonic() - t0
    finally:
        pipe.close()
        if not removed:  # the other tests of the session expect alpha and beta alone
            ray_cluster.remove_node(node)
    err = e.value
    assert waited < 45, f"the dead node was reported after {waited:.1f} s"
    assert (err.stage, err.host) == (1, "gamma") and "gamma" in str(err)
    assert len(err.results) == len(got) >= 5
    for out, w in zip(got, want):
        np.testing.assert_allclose(out[0], w, rtol=1e-5, atol=1e-6)
    # Every input taken has an output or is reported.
    assert err.unprocessed[0] == len(got) and err.input_index == len(got)
    assert list(err.unprocessed) == list(range(len(got), len(got) + len(err.unprocessed)))


def test_torch_tensors_in_torch_tensors_out(ray_cluster):
    torch = pytest.importorskip("torch")
    from autoplace.cluster import RayPipeline

    mod = _mlp()
    plan = _plan(mod, ["beta", "alpha"], [0, 0, 0, 1, 1])
    xs = _inputs(3, seed=5)
    with RayPipeline.from_plan(mod, plan) as pipe:
        outs = pipe.run([torch.from_numpy(x)] for x in xs)
    for got, w in zip(outs, _one_host(mod, xs)):
        assert isinstance(got[0], torch.Tensor)
        np.testing.assert_allclose(got[0].numpy(), w, rtol=1e-5, atol=1e-6)


def test_a_device_of_no_host_runs_on_the_drivers_node(ray_cluster):
    from autoplace.cluster import RayPipeline

    mod = _mlp()
    g = autoplace.OpGraph.from_relax(mod)
    here, beta = Device.cpu(0), Device.cpu(0, host="beta")
    plan = Plan.from_assignment(g, [here, beta], ["cpu0"] * 2 + ["beta-cpu0"] * 3,
                                stages=(0, 0, 1, 1, 1), objective="throughput")
    xs = _inputs(4, seed=6)
    with RayPipeline.from_plan(mod, plan) as pipe:
        # The driver connected to the head node, alpha.
        assert [h.name for _, h in pipe.placement] == ["alpha", "beta"]
        outs = pipe.run([x] for x in xs)
    for got, w in zip(outs, _one_host(mod, xs)):
        np.testing.assert_allclose(got[0], w, rtol=1e-5, atol=1e-6)


def test_replicas_on_two_hosts(ray_cluster):
    from autoplace.cluster import ClusterPipelineError, RayPipeline

    mod = _mlp()
    g = autoplace.OpGraph.from_relax(mod)
    a, b = Device.cpu(0, host="alpha"), Device.cpu(0, host="beta")
    plan = Plan.from_assignment(g, [a, b], [a.name] * 5, stages=(0,) * 5,
                                objective="throughput", replicas=(a.name, b.name))
    xs = _inputs(24, seed=7)
    with RayPipeline.from_plan(mod, plan, max_in_flight=4) as pipe:
        assert [h.name for _, h in pipe.placement] == ["alpha", "beta"]
        outs = pipe.run([x] for x in xs)
        # Both replicas took inputs (each input goes to the one with fewer in flight).
        assert pipe.stats.workers == "replicas" and all(b > 0 for b in pipe.stats.busy_s)
        bad = xs[:3] + [np.zeros((16, 32), "float32")]
        with pytest.raises(ClusterPipelineError) as e:
            pipe.run([x] for x in bad)
    for got, w in zip(outs, _one_host(mod, xs)):
        np.testing.assert_allclose(got[0], w, rtol=1e-5, atol=1e-6)
    assert e.value.input_index == 3 and len(e.value.results) == 3
    assert "replica" in str(e.value) and e.value.host in ("alpha", "beta")
