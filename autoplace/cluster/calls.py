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
from autoplace.cluster.objects import object_costs
from autoplace.cluster.pipeline import INLINE_BYTES
from autoplace.devices import Device
from autoplace.profile import OverheadFit, ProfileStore
from autoplace.solve.build import SharedMachines

log = logging.getLogger(__name__)

#: Bytes of the array each timed call passes (what a host link's alpha is fitted from, too).
CALL_BYTES = 4096

#: How the stored figures were measured (their ``detail["how"]``).
HOW = "ray_stage_call"


def call_times(host: Host, *, calls: int = 200, in_flight: int = 8,
               gap_s: float = 0.01) -> dict[str, float]:
    """What a stage's call costs on ``host``, timed through a :class:`RayPipeline` of one stage
    there that computes next to nothing (a relu of :data:`CALL_BYTES`), driven from this
    process: CPU seconds per input in the stage's actor beyond its compute (``"actor"``), in
    this process (``"driver"``) and in the cluster's daemons on the host's machine
    (``"daemons"``: :func:`daemons_cpu_s <autoplace.cluster.links.daemons_cpu_s>`, nan without
    psutil there), and the wall seconds per input (``"wall"``), for three streams:

    - ``calls`` inputs ``in_flight`` at a time, after a warm-up of ``calls // 4`` (no prefix);
    - ``calls // 2`` inputs one at a time, submission to result (prefix ``"one_"``);
    - ``calls // 8`` inputs one every ``gap_s`` seconds (prefix ``"spaced_"``): Ray's processes
      spend more CPU per call when the calls come apart.

    And the cores of the host's machine (``"cores"``)."""
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
    out: dict[str, float] = {}

    def spaced(count: int):
        for _ in range(count):
            time.sleep(gap_s)
            yield [x]

    try:
        with RayPipeline.from_plan(mod, plan, max_in_flight=in_flight) as pipe:
            worker = pipe._actors[0]
            pid = ray.get(worker.pid.remote())

            def sides() -> tuple[float, ...]:
                """CPU seconds so far of the stage's actor, this process and the daemons, the
                seconds the actor computed since the last call, and the time."""
                actor, machine, busy = ray.get([worker.cpu_s.remote(),
                                                probe.machine.remote([pid]),
                                                worker.busy.remote()])
                return (actor, time.process_time(), machine["daemons_cpu_s"], busy,
                        time.perf_counter())

            def timed(prefix: str, inputs, count: int) -> None:
                before = sides()
                pipe.run(inputs)
                after = sides()
                out.update({f"{prefix}actor": max(0.0, after[0] - before[0] - after[3]) / count,
                            f"{prefix}driver": (after[1] - before[1]) / count,
                            f"{prefix}daemons": (after[2] - before[2]) / count,
                            f"{prefix}wall": (after[4] - before[4]) / count})

            pipe.run([x] for _ in range(max(1, calls // 4)))
            timed("", ([x] for _ in range(calls)), calls)
            pipe.max_in_flight = 1
            ones = max(1, calls // 2)
            timed("one_", ([x] for _ in range(ones)), ones)
            timed("spaced_", spaced(max(1, calls // 8)), max(1, calls // 8))
            out["cores"] = ray.get(probe.machine.remote())["cores"]
    finally:
        ray.kill(probe)
    out["one"] = out["one_wall"]
    return out


def background_shares(t: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Per side of a call (``"actor"``, ``"driver"``, ``"daemons"``), from :func:`call_times`:
    the share of a core its processes keep busy while a plan runs, and the CPU seconds of a
    call beyond it, from the inputs close together and those apart (a straight line through
    the two, CPU per input against seconds per input; neither below 0)."""
    out = {}
    span = t["spaced_wall"] - t["wall"]
    for side in ("actor", "driver", "daemons"):
        share = max(0.0, (t[f"spaced_{side}"] - t[side]) / span) if span > 0 else 0.0
        share = share if share == share else 0.0  # nan: no daemons read
        out[side] = (share, max(0.0, t[side] - share * t["wall"]))
    return out


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
        shares = background_shares(t)
        detail = {"how": HOW, "host": name, "bytes": CALL_BYTES, "calls": calls,
                  "in_flight": 8, "wall_s": t["wall"], "machine": live[name].address,
                  "machine_cores": t["cores"], "cpus": live[name].cpus, "driver_machine": here,
                  "machine_slowdown": slowdowns.get(address, 1.0),
                  "shares": {k: v[0] for k, v in shares.items()},
                  "spaced": {k: t[f"spaced_{k}"] for k in ("actor", "driver", "daemons", "wall")}}
        beyond = {k: v[1] for k, v in shares.items()}
        one = {f"{k}_cpu_s": max(0.0, t[f"one_{k}"] - shares[k][0] * t["one_wall"])
               for k in shares}
        fits = [OverheadFit(fp, "", "call", t["actor"],
                            {**detail, "side": "actor", "daemons_cpu_s": t["daemons"],
                             "beyond": beyond}),
                OverheadFit(fp, "", "stage", t["driver"], {**detail, "side": "driver"}),
                OverheadFit(fp, "", "segment", t["one"],
                            {**detail, "side": "round trip", "in_flight": 1, **one})]
        log.info("a stage's call on host %s: %.0f us of CPU in the actor, %.0f us in the driver, "
                 "%.0f us in the daemons on its machine (%s, %d cores), %.0f us wall; one at a "
                 "time %.0f us; while a plan runs they keep %.3f, %.3f, %.3f of a core busy",
                 name, t["actor"] * 1e6, t["driver"] * 1e6, t["daemons"] * 1e6,
                 live[name].address, t["cores"], t["wall"] * 1e6, t["one"] * 1e6,
                 shares["actor"][0], shares["driver"][0], shares["daemons"][0])
        if store is not None:
            h = live[name]
            store.add_device(fp, f"host:{name}", {"kind": "host", "host": name, "cpus": h.cpus})
            for f in fits:
                store.put_overhead(f)
        out += fits
    return out


def _stored(store: ProfileStore, fp: str) -> bool:
    fits = {f.kind: f for f in store.overheads(fp) if f.detail.get("how") == HOW}
    return {"call", "stage", "segment"} <= set(fits) and "shares" in fits["call"].detail


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
    fits = list(fits)
    kinds = {"throughput": {"call_overhead_s": "call", "stage_overhead_s": "stage"},
             "latency": {"segment_overhead_s": "segment"}}.get(objective)
    if kinds is None:
        raise ValueError(f"objective {objective!r} is not 'throughput' or 'latency'")
    by_host = {(f.device, f.kind): f.seconds for f in fits if f.detail.get("how") == HOW}
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
    here, as :class:`RayPipeline` runs its stages), and what a call of it costs its actor, the
    cluster's daemons on its machine and the driver (charged to the driver's machine where it
    is one of these): the share of a core each keeps busy while a plan runs, and the CPU seconds
    per call beyond it, for calls eight in flight (``"throughput"``) or one at a time
    (``"latency"``). With them, what a tensor larger than :data:`INLINE_BYTES
    <autoplace.cluster.pipeline.INLINE_BYTES>` costs each side where it goes through the object
    store, as :func:`measure_object_costs <autoplace.cluster.objects.measure_object_costs>`
    stored it (:func:`object_costs <autoplace.cluster.objects.object_costs>`; a pair of ends
    it did not measure: nothing). None where no two hosts share a machine, or a host's figures
    predate the machine's (measure them ``again``).
    """
    if isinstance(fits, ProfileStore):
        fits = fits.overheads()
    fits = list(fits)
    by_host = {(f.device, f.kind): f for f in fits if f.detail.get("how") == HOW}
    figures = {}  # host -> (its call's detail, CPU s per call of the actor, daemons, driver)
    for d in devices:
        if d.host is None or d.host in figures:
            continue
        fp = host_fingerprint(d.host)
        call, one = by_host.get((fp, "call")), by_host.get((fp, "segment"))
        if call is None or one is None or "shares" not in call.detail:
            return None
        per_call = one.detail if objective == "latency" else call.detail["beyond"]
        figures[d.host] = (call.detail, *(per_call[k] for k in (
            ("actor_cpu_s", "daemons_cpu_s", "driver_cpu_s") if objective == "latency"
            else ("actor", "daemons", "driver"))))
    hosts_on: dict[str, set[str]] = {}
    for host, (detail, *_) in figures.items():
        hosts_on.setdefault(detail["machine"], set()).add(host)
    shared = {m for m, hs in hosts_on.items() if len(hs) > 1}
    if not shared:
        return None
    per_host = {h: sum(d.host == h for d in devices) for h in figures}
    machine, threads = {}, {}
    cpu: dict[str, dict[str, float]] = {"actor": {}, "daemons": {}, "driver": {}}
    share: dict[str, dict[str, float]] = {"actor": {}, "daemons": {}, "driver": {}}
    for d in devices:
        if d.host is None:
            continue
        detail, *per_call = figures[d.host]
        if detail["machine"] in shared:
            machine[d.name] = detail["machine"]
        threads[d.name] = max(1, detail.get("cpus", 1) // per_host[d.host])
        for side, s in zip(cpu, per_call):
            cpu[side][d.name] = s
            share[side][d.name] = detail["shares"][side]
    details = [f[0] for f in figures.values()]
    cores = {m: float(min(x["machine_cores"] for x in details if x["machine"] == m))
             for m in shared}
    slowdown = {m: float(max(x.get("machine_slowdown", 1.0) for x in details
                             if x["machine"] == m)) for m in shared}
    drivers = {x.get("driver_machine") for x in details}
    here = next(iter(drivers)) if len(drivers) == 1 else None
    return SharedMachines(machine, cores, slowdown, threads, cpu["actor"], cpu["daemons"],
                          cpu["driver"], here if here in shared else None, share["actor"],
                          share["daemons"], share["driver"], object_costs(devices, fits),
                          float(INLINE_BYTES))
