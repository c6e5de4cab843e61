"""What a stage on a host costs beyond its ops: the Ray actor call it takes per input.

A :class:`~autoplace.cluster.RayPipeline` calls every stage's actor once per input, a plan of one
stage too. Each call costs CPU time twice: in the actor on the stage's host (receiving the call,
reading its arguments, returning its results) and in the process that drives the pipeline
(submitting the call, collecting its results). Both are timed per host, once, by running a
``RayPipeline`` of one stage that computes next to nothing (a relu of 4 KiB) on the host from
this process and reading the CPU time each process spent (``time.process_time``: every thread
of the process, Ray's own included; the actor's compute left out). They are stored in the
profile store under the host's name, beside its links, as the host's ``call`` (the actor's) and
``stage`` (the driver's) overheads. Inputs run one at a time are timed too, from submission to
result: the host's ``segment`` overhead, what each stage of a latency plan waits for.

:func:`host_overheads` gives them as :func:`autoplace.optimize`'s ``call_overhead_s`` (each stage
and each replica pays its device's call per input, a plan of one stage too) and
``stage_overhead_s`` (each stage of a pipeline pays the hand-off, and the driver's load is their
sum), so a plan that cuts a model into small stages over hosts is priced with the calls it makes;
for a latency plan, as ``segment_overhead_s`` (each stage waits for its call).

Where hosts share one machine (Ray's nodes at one address), their stages, the driver and the
cluster's daemons compete for its cores. So each call's CPU seconds in the daemons on the host's
machine (raylets, GCS, agents: the processes of the cluster's session there) are read too, with
the machine's cores, its address, the driver's, and how much more CPU time compute takes there
with every core busy (:func:`machine_slowdown`): :func:`shared_machines` gives them as
``optimize``'s ``machines``, which bounds a plan's rate by the machine's cores over the CPU
seconds per input spent there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

import numpy as np

from autoplace.cluster._ray import ClusterError, connected_ray
from autoplace.cluster.hosts import Host, named_hosts
from autoplace.cluster.links import _Endpoint, host_fingerprint
from autoplace.devices import Device
from autoplace.profile import OverheadFit, ProfileStore
from autoplace.solve.build import SharedMachines

log = logging.getLogger(__name__)

#: Bytes of the array each timed call passes (what a host link's alpha is fitted from, too).
CALL_BYTES = 4096

#: How the stored figures were measured (their ``detail["how"]``).
HOW = "ray_stage_call"


def call_times(host: Host, *, calls: int = 200, in_flight: int = 8) -> dict[str, float]:
    """What a stage's call costs on ``host``, timed through a :class:`RayPipeline` of one stage
    there that computes next to nothing (a relu of :data:`CALL_BYTES`), driven from this
    process ``in_flight`` inputs at a time: CPU seconds per input in the stage's actor beyond
    its compute (``"actor"``), in this process (``"driver"``) and in the cluster's daemons on
    the host's machine (``"daemons"``: :func:`daemons_cpu_s
    <autoplace.cluster.links.daemons_cpu_s>`, nan without psutil there); the wall seconds per
    input (``"wall"``), after a warm-up of ``calls // 4``; the wall seconds of an input run one
    at a time, submission to result (``"one"``, over ``calls // 2`` inputs), with each side's
    CPU seconds then (``"one_actor"``, ``"one_driver"``, ``"one_daemons"``); and the cores of
    the host's machine (``"cores"``)."""
    ray = connected_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from autoplace.cluster.pipeline import RayPipeline
    from autoplace.graph import OpGraph
    from autoplace.plan import Plan

    mod = _relu_module((CALL_BYTES // 256, 64))
    device = Device.cpu(0, host=host.name)
    graph = OpGraph.from_relax(mod)
    n = len(graph.nodes)
    plan = Plan.from_assignment(graph, [device], [device.name] * n, stages=(0,) * n,
                                objective="throughput")
    probe = ray.remote(_Endpoint).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(host.node_id, soft=False)
    ).remote()
    x = np.ones((CALL_BYTES // 256, 64), dtype=np.float32)

    def sides(pipe) -> tuple[float, float, float, float]:
        """CPU seconds so far of the stage's actor, this process and the daemons; the seconds
        the actor computed since the last call."""
        worker = pipe._actors[0]
        actor, machine, busy = ray.get([worker.cpu_s.remote(), probe.machine.remote(),
                                        worker.busy.remote()])
        return actor, time.process_time(), machine["daemons_cpu_s"], busy

    def per_input(before, after, count) -> tuple[float, float, float]:
        return ((after[0] - before[0] - after[3]) / count, (after[1] - before[1]) / count,
                (after[2] - before[2]) / count)

    try:
        with RayPipeline.from_plan(mod, plan, max_in_flight=in_flight) as pipe:
            pipe.run([x] for _ in range(max(1, calls // 4)))
            before, wall_0 = sides(pipe), time.perf_counter()
            pipe.run([x] for _ in range(calls))
            wall = (time.perf_counter() - wall_0) / calls
            after = sides(pipe)
            actor, driver, daemons = per_input(before, after, calls)
            pipe.max_in_flight = 1
            ones = max(1, calls // 2)
            before, one_0 = sides(pipe), time.perf_counter()
            pipe.run([x] for _ in range(ones))
            one = (time.perf_counter() - one_0) / ones
            one_actor, one_driver, one_daemons = per_input(before, sides(pipe), ones)
            cores = ray.get(probe.machine.remote())["cores"]
    finally:
        ray.kill(probe)
    return {"actor": max(0.0, actor), "driver": driver, "wall": wall, "daemons": daemons,
            "cores": cores, "one": one, "one_actor": max(0.0, one_actor),
            "one_driver": one_driver, "one_daemons": one_daemons}


def _relu_module(shape):
    """A Relax module of one relu of a float32 input of ``shape``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    return bb.get()


def machine_slowdown(hosts: Sequence[Host], cores: int, *, seconds: float = 0.2,
                     rounds: int = 3) -> float:
    """How much more CPU time single-threaded compute takes on a machine whose cores are all
    busy than alone (cores that share a physical core or a cache; not the time other processes
    hold them): ``min(cores, 8)`` pass-through actors spread over ``hosts`` (all on the
    machine) step :meth:`_Endpoint.compute` for ``seconds``, one at a time, then all at once,
    ``rounds`` times; the median CPU seconds per step at once over the median alone (1 at
    least)."""
    ray = connected_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(_Endpoint)
    actors = [remote.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        hosts[i % len(hosts)].node_id, soft=False)).remote() for i in range(min(cores, 8))]
    try:
        ray.get([a.compute.remote(seconds / 4) for a in actors])  # started, warm
        alone, together = [], []
        for _ in range(rounds):
            alone += [ray.get(a.compute.remote(seconds)) for a in actors]
            together += ray.get([a.compute.remote(seconds) for a in actors])
    finally:
        for a in actors:
            ray.kill(a)
    return max(1.0, float(np.median(together) / np.median(alone)))


def measure_call_overheads(store: ProfileStore | None = None, names: Iterable[str] | None = None,
                           *, calls: int = 200, again: bool = False) -> list[OverheadFit]:
    """Time the actor call of every host of the cluster (or of ``names``) from this process
    (:func:`call_times`) and store each host's ``call``, ``stage`` and ``segment`` overheads in
    ``store`` (with a record of the host), unless ``store`` has them and not ``again``. Returns
    the figures made.

    Run it from where the pipelines will be driven: the ``stage`` figure is this process's.

    Raises
    ------
    ClusterError
        A name the cluster lacks.
    """
    live = named_hosts(names)
    names = list(live)
    here = connected_ray().util.get_node_ip_address()
    slowdowns: dict[str, float] = {}  # machine address -> slowdown, once per machine
    out = []
    for name in names:
        fp = host_fingerprint(name)
        if store is not None and not again and _stored(store, fp):
            continue
        t = call_times(live[name], calls=calls)
        address = live[name].address
        sharing = [h for h in live.values() if h.address == address]
        if len(sharing) > 1 and address not in slowdowns:
            slowdowns[address] = machine_slowdown(sharing, t["cores"])
        detail = {"how": HOW, "host": name, "bytes": CALL_BYTES, "calls": calls,
                  "in_flight": 8, "wall_s": t["wall"], "machine": live[name].address,
                  "machine_cores": t["cores"], "cpus": live[name].cpus, "driver_machine": here,
                  "machine_slowdown": slowdowns.get(address, 1.0)}
        daemons = {} if t["daemons"] != t["daemons"] else {"daemons_cpu_s": t["daemons"]}
        fits = [OverheadFit(fp, "", "call", t["actor"], {**detail, "side": "actor", **daemons}),
                OverheadFit(fp, "", "stage", t["driver"], {**detail, "side": "driver"}),
                OverheadFit(fp, "", "segment", t["one"],
                            {**detail, "side": "round trip", "in_flight": 1,
                             "actor_cpu_s": t["one_actor"], "driver_cpu_s": t["one_driver"],
                             **({} if t["one_daemons"] != t["one_daemons"]
                                else {"daemons_cpu_s": t["one_daemons"]})})]
        log.info("actor call on host %s: %.0f us in the actor, %.0f us in the driver, "
                 "%.0f us in the daemons on its machine (%s, %d cores), %.0f us wall; one at a "
                 "time %.0f us", name, t["actor"] * 1e6, t["driver"] * 1e6, t["daemons"] * 1e6,
                 live[name].address, t["cores"], t["wall"] * 1e6, t["one"] * 1e6)
        if store is not None:
            h = live[name]
            store.add_device(fp, f"host:{name}", {"kind": "host", "host": name, "cpus": h.cpus})
            for f in fits:
                store.put_overhead(f)
        out += fits
    return out


def _stored(store: ProfileStore, fp: str) -> bool:
    fits = {f.kind: f for f in store.overheads(fp) if f.detail.get("how") == HOW}
    return {"call", "stage", "segment"} <= set(fits) and "machine" in fits["call"].detail


def host_overheads(devices: Sequence[Device], fits: Iterable[OverheadFit] | ProfileStore,
                   objective: str = "throughput") -> dict:
    """The actor call of each of ``devices``' hosts, from ``fits`` (or a store's), as the
    keywords :func:`autoplace.optimize` takes for ``objective``: ``{"call_overhead_s": {device
    name: s}, "stage_overhead_s": {...}}`` for throughput, ``{"segment_overhead_s": {...}}``
    (a call one at a time) for latency; and ``"machines"``: the hosts that share a machine
    (:func:`shared_machines`), or None. A device of no host (this process's) gets none.

    >>> res = autoplace.optimize(mod, devices, objective="throughput",      # doctest: +SKIP
    ...                          links=host_links(devices, store),
    ...                          **host_overheads(devices, store))

    Raises
    ------
    ClusterError
        A host with no figure: the message says how to measure it.
    """
    if isinstance(fits, ProfileStore):
        fits = fits.overheads()
    fits = [f for f in fits if f.detail.get("how") == HOW]
    kinds = {"throughput": {"call_overhead_s": "call", "stage_overhead_s": "stage"},
             "latency": {"segment_overhead_s": "segment"}}.get(objective)
    if kinds is None:
        raise ValueError(f"objective {objective!r} is not 'throughput' or 'latency'")
    by_host = {(f.device, f.kind): f.seconds for f in fits}
    out: dict = {key: {} for key in kinds}
    for d in devices:
        if d.host is None:
            continue
        fp = host_fingerprint(d.host)
        if any((fp, kind) not in by_host for kind in kinds.values()):
            raise ClusterError(f"no actor call measured for host {d.host!r}: "
                               "'autoplace cluster --measure-links --db PATH' times it")
        for key, kind in kinds.items():
            out[key][d.name] = by_host[(fp, kind)]
    out["machines"] = shared_machines(devices, fits, objective)
    return out


def shared_machines(devices: Sequence[Device], fits: Iterable[OverheadFit] | ProfileStore,
                    objective: str = "throughput") -> SharedMachines | None:
    """The machines two or more of ``devices``' hosts share, by the address each host's
    measured call (``fits``, or a store's) recorded: each one's cores and slowdown
    (:func:`machine_slowdown`), each device's threads (its host's CPUs over the host's devices
    here, as :class:`RayPipeline` runs its stages), and the CPU seconds a call of it costs its
    actor, the cluster's daemons on its machine and the driver (charged to the driver's machine
    where it is one of these): calls eight in flight for ``"throughput"``, one at a time for
    ``"latency"``. None where no two hosts share a machine, or a host's figures predate the
    machine's (measure them ``again``).
    """
    if isinstance(fits, ProfileStore):
        fits = fits.overheads()
    by_host = {(f.device, f.kind): f for f in fits if f.detail.get("how") == HOW}
    figures = {}  # host -> (call fit, its machine's record, actor, daemons, driver CPU s)
    for d in devices:
        if d.host is None or d.host in figures:
            continue
        fp = host_fingerprint(d.host)
        call, stage, one = (by_host.get((fp, k)) for k in ("call", "stage", "segment"))
        if call is None or "machine" not in call.detail or stage is None:
            return None
        if objective == "latency":
            if one is None or "actor_cpu_s" not in one.detail:
                return None
            cpu = (one.detail["actor_cpu_s"], one.detail.get("daemons_cpu_s", 0.0),
                   one.detail["driver_cpu_s"])
        else:
            cpu = (call.seconds, call.detail.get("daemons_cpu_s", 0.0), stage.seconds)
        figures[d.host] = (call.detail, *cpu)
    hosts_on: dict[str, set[str]] = {}
    for host, (detail, *_) in figures.items():
        hosts_on.setdefault(detail["machine"], set()).add(host)
    shared = {m for m, hs in hosts_on.items() if len(hs) > 1}
    if not shared:
        return None
    per_host = {h: sum(d.host == h for d in devices) for h in figures}
    machine, threads, actor, daemons, driver = {}, {}, {}, {}, {}
    for d in devices:
        if d.host is None:
            continue
        detail, actor[d.name], daemons[d.name], driver[d.name] = figures[d.host]
        if detail["machine"] in shared:
            machine[d.name] = detail["machine"]
        threads[d.name] = max(1, detail.get("cpus", 1) // per_host[d.host])
    details = [f[0] for f in figures.values()]
    cores = {m: float(min(x["machine_cores"] for x in details if x["machine"] == m))
             for m in shared}
    slowdown = {m: float(max(x.get("machine_slowdown", 1.0) for x in details
                             if x["machine"] == m)) for m in shared}
    drivers = {x.get("driver_machine") for x in details}
    here = next(iter(drivers)) if len(drivers) == 1 else None
    return SharedMachines(machine, cores, slowdown, threads, actor, daemons, driver,
                          here if here in shared else None)
