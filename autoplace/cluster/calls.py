"""What a stage on a host costs beyond its ops: the Ray actor call it takes per input.

A :class:`~autoplace.cluster.RayPipeline` calls every stage's actor once per input, a plan of one
stage too. Each call costs CPU time twice: in the actor on the stage's host (receiving the call,
reading its arguments, returning its results) and in the process that drives the pipeline
(submitting the call, holding its small results). Both are timed per host, once, by streaming
calls of a small array from this process to a pass-through actor on the host and reading the
CPU time each process spent (``time.process_time``: every thread of the process, Ray's own
included). They are stored in the profile store under the host's name, beside its links, as the
host's ``call`` (the actor's) and ``stage`` (the driver's) overheads. A call made one at a time
is timed too, from its submission to its result: the host's ``segment`` overhead, what each
stage of a latency plan waits for.

:func:`host_overheads` gives them as :func:`autoplace.optimize`'s ``call_overhead_s`` (each stage
and each replica pays its device's call per input, a plan of one stage too) and
``stage_overhead_s`` (each stage of a pipeline pays the hand-off, and the driver's load is their
sum), so a plan that cuts a model into small stages over hosts is priced with the calls it makes;
for a latency plan, as ``segment_overhead_s`` (each stage waits for its call).
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

log = logging.getLogger(__name__)

#: Bytes of the array each timed call passes (what a host link's alpha is fitted from, too).
CALL_BYTES = 4096

#: How the stored figures were measured (their ``detail["how"]``).
HOW = "ray_actor_call"


def call_times(host: Host, *, calls: int = 200, in_flight: int = 8,
               size: int = CALL_BYTES) -> dict[str, float]:
    """CPU seconds per call of a pass-through actor on ``host`` called from this process,
    ``in_flight`` calls at a time: the actor's (``"actor"``) and this process's (``"driver"``);
    the wall seconds per call (``"wall"``), after a warm-up of ``calls // 4``; and the wall
    seconds of a call made one at a time, submission to result (``"one"``, over ``calls // 2``
    calls)."""
    ray = connected_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(_Endpoint).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(host.node_id, soft=False)
    ).remote()
    x = np.zeros(size, dtype=np.uint8)

    def stream(n: int, in_flight: int = in_flight) -> None:
        pending = []
        for _ in range(n):
            pending.append(actor.echo.remote(x))
            if len(pending) >= in_flight:
                ray.get(pending.pop(0))
        ray.get(pending)

    try:
        stream(max(1, calls // 4))
        actor_0 = ray.get(actor.cpu_s.remote())
        driver_0, wall_0 = time.process_time(), time.perf_counter()
        stream(calls)
        wall, driver = time.perf_counter() - wall_0, time.process_time() - driver_0
        actor_s = ray.get(actor.cpu_s.remote()) - actor_0
        ones = max(1, calls // 2)
        one_0 = time.perf_counter()
        stream(ones, in_flight=1)
        one = (time.perf_counter() - one_0) / ones
    finally:
        ray.kill(actor)
    return {"actor": actor_s / calls, "driver": driver / calls, "wall": wall / calls, "one": one}


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
    out = []
    for name in names:
        fp = host_fingerprint(name)
        if store is not None and not again and _stored(store, fp):
            continue
        t = call_times(live[name], calls=calls)
        detail = {"how": HOW, "host": name, "bytes": CALL_BYTES, "calls": calls,
                  "in_flight": 8, "wall_s": t["wall"]}
        fits = [OverheadFit(fp, "", "call", t["actor"], {**detail, "side": "actor"}),
                OverheadFit(fp, "", "stage", t["driver"], {**detail, "side": "driver"}),
                OverheadFit(fp, "", "segment", t["one"],
                            {**detail, "side": "round trip", "in_flight": 1})]
        log.info("actor call on host %s: %.0f us in the actor, %.0f us in the driver, "
                 "%.0f us wall; one at a time %.0f us", name, t["actor"] * 1e6,
                 t["driver"] * 1e6, t["wall"] * 1e6, t["one"] * 1e6)
        if store is not None:
            h = live[name]
            store.add_device(fp, f"host:{name}", {"kind": "host", "host": name, "cpus": h.cpus})
            for f in fits:
                store.put_overhead(f)
        out += fits
    return out


def _stored(store: ProfileStore, fp: str) -> bool:
    kinds = {f.kind for f in store.overheads(fp) if f.detail.get("how") == HOW}
    return {"call", "stage", "segment"} <= kinds


def host_overheads(devices: Sequence[Device], fits: Iterable[OverheadFit] | ProfileStore,
                   objective: str = "throughput") -> dict[str, dict[str, float]]:
    """The actor call of each of ``devices``' hosts, from ``fits`` (or a store's), as the
    keywords :func:`autoplace.optimize` takes for ``objective``: ``{"call_overhead_s": {device
    name: s}, "stage_overhead_s": {...}}`` for throughput, ``{"segment_overhead_s": {...}}``
    (a call one at a time) for latency. A device of no host (this process's) gets none.

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
    kinds = {"throughput": {"call_overhead_s": "call", "stage_overhead_s": "stage"},
             "latency": {"segment_overhead_s": "segment"}}.get(objective)
    if kinds is None:
        raise ValueError(f"objective {objective!r} is not 'throughput' or 'latency'")
    by_host = {(f.device, f.kind): f.seconds for f in fits if f.detail.get("how") == HOW}
    out: dict[str, dict[str, float]] = {key: {} for key in kinds}
    for d in devices:
        if d.host is None:
            continue
        fp = host_fingerprint(d.host)
        if any((fp, kind) not in by_host for kind in kinds.values()):
            raise ClusterError(f"no actor call measured for host {d.host!r}: "
                               "'autoplace cluster --measure-links --db PATH' times it")
        for key, kind in kinds.items():
            out[key][d.name] = by_host[(fp, kind)]
    return out
