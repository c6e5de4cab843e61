"""A tensor larger than Ray's inline limit goes between stages through the object store, whose
CPU (the two processes, the raylets, the driver that owns it) is charged to the machines the
hosts share; an inline tensor is priced as before. The figures are measured on the cluster and
kept in the profile store."""

import numpy as np
import pytest

import autoplace
from autoplace.cluster.calls import host_overheads
from autoplace.cluster.links import host_fingerprint
from autoplace.cluster.objects import DRIVER, HOW, measure_object_costs, object_costs
from autoplace.cluster.pipeline import INLINE_BYTES
from autoplace.graph import OpGraph
from autoplace.profile import OverheadFit, ProfileStore
from autoplace.solve import Problem, simulate_replicas, simulate_throughput
from autoplace.solve.build import SharedMachines, build_problem
from autoplace.solve.problem import OBJECT_SIDES, Machines
from autoplace.solve.simulate import machine_cpu, object_flows
from cluster_models import chain  # noqa: E402
from test_cluster_machines import HOSTS, _fits, _Ops  # noqa: E402

# A tensor from device 0 to device 1 costs, beyond one passed inline: the maker 0.1 s + 1 us a
# byte, the reader 0.2 s, the maker's raylet 0.3 s + 1 us a byte, the reader's 0.4 s, the
# driver 0.25 s. At 200 kB: 0.3 + 0.2 + 0.5 + 0.4 + 0.25 = 1.65 s.
ALPHA = [0.1, 0.2, 0.3, 0.4, 0.25]
BETA = [1e-6, 0.0, 1e-6, 0.0, 0.0]


def _objects(d=2, pairs=((0, 1),)):
    """Object arrays over ``d`` devices and the driver, ALPHA and BETA on ``pairs``."""
    alpha, beta = np.zeros((2, d + 1, d + 1, len(OBJECT_SIDES)))
    for i, j in pairs:
        alpha[i, j], beta[i, j] = ALPHA, BETA
    return dict(object_alpha=alpha, object_beta=beta, inline_bytes=INLINE_BYTES)


def _chain(edge_bytes, of=(0, 0), cores=2.0):
    """Two ops of 4 s in a chain, the first's output ``edge_bytes``; a call per stage 0.5 s in
    its actor, 0.25 s in the daemons, 0.5 s in the driver (on machine 0)."""
    return Problem.build(np.full((2, 2), 4.0), [(0, 1)], [edge_bytes, 4.0],
                         machines=Machines.build(of, [cores], call_cpu_s=0.5, daemon_cpu_s=0.25,
                                                 driver_cpu_s=0.5, driver=0, **_objects()))


def test_a_big_edge_between_stages_is_charged_its_object_store_cpu():
    # A stage a device: 8 s of ops, 2 x 0.75 s of calls, 2 x 0.5 s in the driver: 10.5 s of
    # CPU per input, and the 200 kB tensor 1.65 s: 12.15 s on two cores, 6.075 s per input.
    big = _chain(200e3)
    assert object_flows(big, [0, 1]) == [(0, 1, 200e3)]
    assert simulate_throughput(big, [0, 1]) == pytest.approx(12.15 / 2)
    # By process: in the actors 2 x 0.5 + 0.3 + 0.2 s, the daemons 2 x 0.25 + 0.5 + 0.4 s, the
    # driver 2 x 0.5 + 0.25 s.
    assert machine_cpu(big, [0, 1]).tolist()[0] == pytest.approx([8.0, 1.5, 1.4, 1.25])
    # Inline (100 KiB at most): 10.5 s on two cores, as without the figures.
    small = _chain(float(INLINE_BYTES))
    plain = Problem.build(np.full((2, 2), 4.0), [(0, 1)], [float(INLINE_BYTES), 4.0],
                          machines=small.machines._replace(object_alpha=None, object_beta=None))
    assert object_flows(small, [0, 1]) == []
    assert simulate_throughput(small, [0, 1]) == pytest.approx(10.5 / 2)
    assert simulate_throughput(small, [0, 1]) == simulate_throughput(plain, [0, 1])
    # One stage: nothing crosses; 8 s of ops stand (9.25 s of CPU on two cores).
    assert simulate_throughput(big, [0, 0]) == pytest.approx(8.0)
    # The reader on a machine of its own: machine 0 (one core) keeps its stage (4 + 0.75 s),
    # the driver's 1 s, the maker's side (0.3 + 0.5 s) and the driver's 0.25 s: 6.8 s.
    part = _chain(200e3, of=(0, -1), cores=1.0)
    assert simulate_throughput(part, [0, 1]) == pytest.approx(6.8)


def test_devices_on_machines_of_their_own_are_charged_no_tensor():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n, d = int(rng.integers(2, 7)), 3
        edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
        kw = dict(out_bytes=rng.uniform(0, 1e6, n), alpha=1e-3, beta=1e9, call_s=1e-4)
        cost = rng.uniform(1e-3, 1e-2, (n, d))
        plain = Problem.build(cost, edges, **kw)
        alone = Problem.build(cost, edges, **kw, machines=Machines.build(
            [-1] * d, [1.0], object_alpha=1.0, object_beta=1e-6, inline_bytes=0,
            inputs=[(1e6, (0,))], outputs=(n - 1,)))
        a = rng.integers(0, d, n)
        assert object_flows(alone, a)  # tensors cross, but no machine is shared
        assert simulate_throughput(alone, a) == simulate_throughput(plain, a)
        assert simulate_replicas(alone, [0, 1, 2]) == simulate_replicas(plain, [0, 1, 2])


def test_the_model_inputs_and_outputs_come_from_and_go_to_the_driver():
    # relu then exp of 256 x 256 floats: every tensor 256 KiB, over the inline limit.
    graph = OpGraph.from_relax(chain((256, 256)))
    nbytes = 256 * 256 * 4.0
    names = [d.name for d in HOSTS]
    fit = tuple(zip(ALPHA, BETA))
    shared = SharedMachines(dict.fromkeys(names, "m"), {"m": 2.0}, {}, {}, {}, {}, {}, "m",
                            objects={(a, b): fit for a in [*names, DRIVER]
                                     for b in [*names, DRIVER] if not a == b == DRIVER},
                            inline_bytes=float(INLINE_BYTES))
    p = build_problem(graph, HOSTS, np.ones((2, 2)), machines=shared)
    assert p.machines.inputs == ((nbytes, (0,)),) and p.machines.outputs == (1,)
    # Split: the edge, the input to alpha's stage, the output from beta's; one stage: no edge.
    assert object_flows(p, [0, 1]) == [(0, 1, nbytes), (2, 0, nbytes), (1, 2, nbytes)]
    assert object_flows(p, [1, 1]) == [(2, 1, nbytes), (1, 2, nbytes)]
    # Replicas: each takes its share of the inputs and outputs. Two replicas of one speed (2 s
    # of ops each, half the inputs each); the input and the output 1.25 s + 2 x 1 us x 262144 B
    # = 1.774 s each; all on the machine of two cores.
    each = sum(ALPHA) + 2 * 1e-6 * nbytes
    assert simulate_replicas(p, [0, 1]) == pytest.approx((2.0 + 2 * each) / 2)


def _object_fits(sides_s=1e-4, per_byte=1e-9):
    """Stored object-store figures between alpha, beta and the driver: each side ``sides_s`` +
    ``per_byte`` a byte (the driver's own side 0 where it is an end, as measured)."""
    ends = [DRIVER, "alpha", "beta"]
    out = []
    for s in ends:
        for t in ends:
            if s == t == DRIVER:
                continue
            fit = {k: [0.0, 0.0] if k == "driver" and DRIVER in (s, t) else [sides_s, per_byte]
                   for k in OBJECT_SIDES}
            out.append(OverheadFit(host_fingerprint(s or "driver@10.0.0.1"),
                                   host_fingerprint(t or "driver@10.0.0.1"), "call", 0.0,
                                   {"how": HOW, "from": s, "to": t, "fit": fit}))
    return out


def test_optimize_charges_the_tensors_through_the_object_store():
    # test_optimize_prices_the_shared_machine's plan over both hosts (24.0 ms of CPU per
    # input on 1.92 free cores), on 256 KiB tensors: each side of a tensor 0.1 ms + 1 ns a byte
    # = 0.362 ms. The edge alpha -> beta: five sides, 1.811 ms; the input from the driver to
    # alpha and the output from beta to it: four each (the driver is an end), 1.449 ms:
    # 28.71 ms of CPU, 14.95 ms per input, still under one host's 20.5 ms of ops and a call.
    fits = (_fits("alpha", "10.0.0.1") + _fits("beta", "10.0.0.1") + _object_fits())
    over = host_overheads(HOSTS, fits)
    assert set(over["machines"].objects) == {(a, b) for a in ["", "alpha-cpu0", "beta-cpu0"]
                                             for b in ["", "alpha-cpu0", "beta-cpu0"]
                                             if not a == b == ""}
    res = autoplace.optimize(chain((256, 256)), HOSTS, objective="throughput",
                             cost_model=_Ops(10e-3), check_devices=False, calibrate=False,
                             db=None, replicate=False, **over)
    side = 1e-4 + 1e-9 * 256 * 256 * 4
    assert len(set(res.plan.assignment)) == 2
    assert res.plan.predicted_s == pytest.approx((24.0e-3 + 5 * side + 8 * side) / 1.92)
    # Without the object-store figures: as before, 24.0 / 1.92 ms.
    calls = host_overheads(HOSTS, _fits("alpha", "10.0.0.1") + _fits("beta", "10.0.0.1"))
    before = autoplace.optimize(chain((256, 256)), HOSTS, objective="throughput",
                                cost_model=_Ops(10e-3), check_devices=False, calibrate=False,
                                db=None, replicate=False, **calls)
    assert before.plan.predicted_s == pytest.approx(24.0e-3 / 1.92)


@pytest.mark.slow
def test_object_store_costs_are_measured_and_stored(ray_cluster, tmp_path):
    path = tmp_path / "profile.db"
    with ProfileStore(path) as store:
        fits = measure_object_costs(store, count=20)
        ends = ["", "alpha", "beta"]
        assert {(f.detail["from"], f.detail["to"]) for f in fits} == {
            (s, t) for s in ends for t in ends if not s == t == ""}
        for f in fits:
            assert set(f.detail["fit"]) == set(OBJECT_SIDES)
            assert all(a >= 0 and b >= 0 for a, b in f.detail["fit"].values())
        # A tensor from one node to the other costs CPU beyond an inline one: both raylets.
        cross = next(f for f in fits if (f.detail["from"], f.detail["to"]) == ("alpha", "beta"))
        assert cross.seconds > 0 and cross.detail["fit"]["dst_daemons"][0] > 0
        # Stored: measured again only when asked (a restarted cluster keeps its host names).
        assert measure_object_costs(store, count=20) == []
    with ProfileStore(path) as store:
        got = object_costs(HOSTS, store)
        assert set(got) == {(a, b) for a in ["", "alpha-cpu0", "beta-cpu0"]
                            for b in ["", "alpha-cpu0", "beta-cpu0"] if not a == b == ""}
        assert got[("alpha-cpu0", "beta-cpu0")] == tuple(
            tuple(cross.detail["fit"][k]) for k in OBJECT_SIDES)
