"""What a tensor handed between stages costs in CPU where it goes through Ray's object store.

A stage's call passes a tensor of up to :data:`~autoplace.cluster.pipeline.INLINE_BYTES` inside
the call (the call's own figures, :mod:`autoplace.cluster.calls`, are timed so); a larger one
goes through the object store: the process that makes it writes it into its node's store, the
node's raylet sends it to the reader's node, whose raylet writes it into that node's store, the
reader maps it, and the driving process, which submitted both calls and so owns the tensor,
tracks where it is. Each of them spends CPU, a good part of it per tensor whatever its size.

:func:`measure_object_costs` times it per ordered pair of ends, the driving process and the
hosts (a host to itself: two actors on one node): an actor on one end returns tensors that an
actor on the other reads (or the driving process passes them, or reads them), eight in flight,
at a 4 KiB size (inline) and two sizes above the limit, and reads the CPU seconds each side
spent per tensor: the two processes, each node's raylet (the rest of the cluster's daemons on a
machine with its first end) and the driving process. Beyond the inline tensor's figure, each
side is fitted ``alpha + beta * bytes`` and stored in the profile store under the two ends'
names; :func:`object_costs` reads them back by device names, as :func:`shared_machines
<autoplace.cluster.calls.shared_machines>` gives them to the solver.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from autoplace.cluster._ray import connected_ray
from autoplace.cluster.hosts import Host, named_hosts
from autoplace.cluster.links import _process_cpu_s, daemons_cpu_s, host_fingerprint
from autoplace.cluster.pipeline import INLINE_BYTES
from autoplace.devices import Device
from autoplace.profile import OverheadFit, ProfileStore
from autoplace.solve.problem import OBJECT_SIDES

log = logging.getLogger(__name__)

#: How the stored figures were measured (their ``detail["how"]``).
HOW = "ray_object_store"

#: The name of the driving process's end in the figures (a host's name is never empty).
DRIVER = ""

#: Tensor sizes the object store is timed at, both above :data:`INLINE_BYTES`; and the inline
#: size each is compared with.
SIZES = (256 * 1024, 2 * 1024 * 1024)
INLINE_SIZE = 4096


class _End:
    """An actor on a host: makes tensors, reads them, and reads the CPU spent on its machine."""

    def __init__(self):
        self._made: dict[int, np.ndarray] = {}

    def pid(self) -> int:
        return os.getpid()

    def make(self, size: int) -> np.ndarray:
        """A tensor of ``size`` bytes (made once: what is timed is Ray's handing it over)."""
        if size not in self._made:
            self._made[size] = np.ones(size, dtype=np.uint8)
        return self._made[size]

    def take(self, x) -> int:
        return 0

    def reading(self, pids: Sequence[int], exclude: Sequence[int]) -> dict:
        """CPU seconds so far of this node's raylet (this actor's parent), of each of ``pids``
        (processes of this node), and of the cluster's daemons on this machine but this
        process and ``exclude`` (:func:`daemons_cpu_s <autoplace.cluster.links.daemons_cpu_s>`;
        nan without psutil)."""
        import psutil

        here = {}
        for pid in pids:
            try:
                here[pid] = _process_cpu_s(psutil.Process(pid))
            except (psutil.Error, OSError):
                continue
        return {"raylet": _process_cpu_s(psutil.Process(os.getppid())), "pids": here,
                "daemons": daemons_cpu_s(exclude)}


def object_times(hosts: Sequence[Host], sizes: Sequence[int] = SIZES, *, count: int = 60,
                 in_flight: int = 8, rounds: int = 3) -> dict[tuple[str, str], dict]:
    """CPU seconds per tensor on each side (:data:`OBJECT_SIDES
    <autoplace.solve.problem.OBJECT_SIDES>`) of every ordered pair of ends, the driving process
    (:data:`DRIVER`) and ``hosts``, at :data:`INLINE_SIZE` and at each of ``sizes``: ``count``
    tensors ``in_flight`` at a time, the least of ``rounds`` streams per side (other processes'
    load only adds to it: Ray's threads poll while they wait). Returns ``{(from, to):
    {size: {side: seconds}}}``."""
    ray = connected_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(_End)

    def on(host):
        return remote.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            host.node_id, soft=False)).remote()

    by_name = {h.name: h for h in hosts}
    driver_node = ray.get_runtime_context().get_node_id()
    nodes = {h.node_id: h for h in hosts}
    if driver_node not in nodes:  # the driver's node is not one of ``hosts``: probe it too
        nodes[driver_node] = next(h for h in named_hosts().values() if h.node_id == driver_node)
    makers = {h.name: on(h) for h in hosts}
    takers = {h.name: on(h) for h in hosts}
    probes = {node: on(h) for node, h in nodes.items()}
    actors = [*makers.values(), *takers.values(), *probes.values()]
    try:
        # The pid of each maker ("m:HOST") and taker ("t:HOST"), and what runs on each node.
        pid = dict(zip([f"{k}:{n}" for k in "mt" for n in by_name],
                       ray.get([a.pid.remote() for a in [*makers.values(),
                                                          *takers.values()]])))
        probe_pid = dict(zip(probes, ray.get([p.pid.remote() for p in probes.values()])))
        machine_of = {node: h.address for node, h in nodes.items()}
        on_node = {node: [probe_pid[node]] for node in nodes}
        for key, p in pid.items():
            on_node[by_name[key[2:]].node_id].append(p)
        on_machine: dict[str, list[int]] = {}
        for node, address in machine_of.items():
            on_machine.setdefault(address, []).extend(on_node[node])
        first = {}  # one probe per machine reads the daemons there (nodes may share one)
        for node, address in machine_of.items():
            first.setdefault(address, node)

        def reading() -> dict:
            got = dict(zip(probes, ray.get([p.reading.remote(on_node[node],
                                                             on_machine[machine_of[node]])
                                            for node, p in probes.items()])))
            cpu = {k: got[by_name[k[2:]].node_id]["pids"][p] for k, p in pid.items()}
            cpu["driver"] = time.process_time()
            for node, g in got.items():
                cpu[f"raylet:{node}"] = g["raylet"]
            for address, node in first.items():
                raylets = sum(got[n]["raylet"] for n, a in machine_of.items() if a == address)
                cpu[f"rest:{address}"] = got[node]["daemons"] - raylets
            return cpu

        def node_of(end: str) -> str:
            return driver_node if end == DRIVER else by_name[end].node_id

        def stream(src: str, dst: str, size: int) -> dict[str, float]:
            x = np.ones(size, dtype=np.uint8)

            def submit():
                if src == DRIVER:
                    return takers[dst].take.remote(x)
                ref = makers[src].make.remote(size)
                return ref if dst == DRIVER else takers[dst].take.remote(ref)

            ray.get([submit() for _ in range(in_flight)])  # warm
            before, pending = reading(), []
            for _ in range(count):
                pending.append(submit())
                if len(pending) >= in_flight:
                    np.array(ray.get(pending.pop(0)))  # copied, as a pipeline's output is
            [np.array(x) for x in ray.get(pending)]
            after = reading()
            spent = {k: (after[k] - before[k]) / count for k in after}
            a, b = node_of(src), node_of(dst)
            rest = {address: spent[f"rest:{address}"] for address in first}
            return {"src": spent["driver" if src == DRIVER else "m:" + src],
                    "dst": spent["driver" if dst == DRIVER else "t:" + dst],
                    "src_daemons": spent[f"raylet:{a}"] + rest[machine_of[a]],
                    "dst_daemons": (spent[f"raylet:{b}"] if b != a else 0.0)
                    + (rest[machine_of[b]] if machine_of[b] != machine_of[a] else 0.0),
                    "driver": 0.0 if DRIVER in (src, dst) else spent["driver"]}

        ends = [DRIVER, *by_name]
        out = {}
        for src in ends:
            for dst in ends:
                if src == dst == DRIVER:
                    continue
                out[(src, dst)] = {}
                for size in (INLINE_SIZE, *sizes):
                    runs = [stream(src, dst, size) for _ in range(rounds)]
                    out[(src, dst)][size] = {side: float(min(r[side] for r in runs))
                                             for side in OBJECT_SIDES}
        return out
    finally:
        for a in actors:
            ray.kill(a)


def fit_sides(points: Mapping[int, Mapping[str, float]]) -> dict[str, tuple[float, float]]:
    """Per side, ``(alpha, beta)`` of ``alpha + beta * bytes`` through the CPU seconds of the
    sizes above :data:`INLINE_BYTES` beyond those of the inline size (the smallest of
    ``points``): least squares, neither below 0.

    0.5 s inline, 1.7 s at 200 kB and 1.9 s at 400 kB: 1 s a tensor and 1 µs a byte beyond it.

    >>> a, b = fit_sides({4096: {"src": 0.5}, 200_000: {"src": 1.7}, 400_000: {"src": 1.9}})["src"]
    >>> round(a, 9), round(b, 12)
    (1.0, 1e-06)
    """
    inline = min(points)
    sizes = np.array([s for s in points if s > INLINE_BYTES], dtype=float)
    out = {}
    for side in points[inline]:
        y = np.array([points[int(s)][side] - points[inline][side] for s in sizes])
        beta, alpha = np.polyfit(sizes, y, 1) if sizes.size > 1 else (0.0, float(y.mean()))
        if beta < 0:
            beta, alpha = 0.0, float(y.mean())
        if alpha < 0:
            alpha, beta = 0.0, float((y * sizes).sum() / (sizes * sizes).sum())
        out[side] = (max(0.0, float(alpha)), max(0.0, float(beta)))
    return out


def measure_object_costs(store: ProfileStore | None = None, names: Iterable[str] | None = None,
                         *, sizes: Sequence[int] = SIZES, count: int = 60,
                         again: bool = False) -> list[OverheadFit]:
    """Time a tensor through the object store between every ordered pair of ends, this process
    and the cluster's hosts (or ``names``) (:func:`object_times`), fit each side beyond the
    inline tensor (:func:`fit_sides`) and store each pair's fits in ``store`` under the two
    ends' names (this process's end under its machine's address), unless ``store`` has them
    all and not ``again``. Returns the figures made.

    Run it from where the pipelines will be driven: the driving process is one end.

    Raises
    ------
    ClusterError
        A name the cluster lacks.
    """
    live = named_hosts(names)
    ray = connected_ray()
    here = ray.util.get_node_ip_address()
    ends = [DRIVER, *live]
    keys = {(s, t): (_fingerprint(s, here), _fingerprint(t, here)) for s in ends for t in ends
            if not s == t == DRIVER}
    if store is not None and not again:
        have = {(f.device, f.peer) for f in store.overheads() if f.detail.get("how") == HOW}
        if set(keys.values()) <= have:
            return []
    times = object_times(list(live.values()), sizes, count=count)
    fits = []
    for (s, t), points in times.items():
        sides = fit_sides(points)
        total = sum(a + b * sizes[0] for a, b in sides.values())
        fits.append(OverheadFit(*keys[(s, t)], "call", total, {
            "how": HOW, "from": s, "to": t, "driver_machine": here, "count": count,
            "inline_bytes": INLINE_BYTES, "fit": {k: list(v) for k, v in sides.items()},
            "points": {str(size): v for size, v in points.items()},
            "machines": {n: live[n].address for n in (s, t) if n != DRIVER}}))
        log.info("a tensor %s -> %s through the object store: %s", s or "driver",
                 t or "driver", ", ".join(f"{k} {a * 1e6:.0f} us + {b * 1e9:.3g} ns/B"
                                          for k, (a, b) in sides.items()))
    if store is not None:
        for name in live:
            store.add_device(host_fingerprint(name), f"host:{name}",
                             {"kind": "host", "host": name, "cpus": live[name].cpus})
        store.add_device(_fingerprint(DRIVER, here), f"driver:{here}",
                         {"kind": "ray driver", "machine": here})
        for f in fits:
            store.put_overhead(f)
    return fits


def _fingerprint(end: str, driver_machine: str) -> str:
    """An end's key in the profile store: a host's, or the driving process's on its machine."""
    return host_fingerprint(end if end != DRIVER else f"driver@{driver_machine}")


def object_costs(devices: Sequence[Device], fits: Iterable[OverheadFit] | ProfileStore
                 ) -> dict[tuple[str, str], tuple[tuple[float, float], ...]]:
    """The measured object-store costs between ``devices`` (by their hosts; two stages on one
    host are a host to itself) and the driving process (``""``), from ``fits`` (or a store's):
    ``{(from device, to device): ((alpha, beta) per side of OBJECT_SIDES)}``, what
    :class:`~autoplace.solve.build.SharedMachines` takes as ``objects``. A pair not measured is
    left out (it is charged nothing); so is a device of no host."""
    if isinstance(fits, ProfileStore):
        fits = fits.overheads()
    by_ends = {(f.detail["from"], f.detail["to"]): f.detail["fit"] for f in fits
               if f.detail.get("how") == HOW}
    ends = [(d.name, d.host) for d in devices if d.host is not None] + [(DRIVER, DRIVER)]
    out = {}
    for a, ha in ends:
        for b, hb in ends:
            fit = by_ends.get((ha, hb))
            if fit is not None and not a == b == DRIVER:
                out[(a, b)] = tuple(tuple(fit[side]) for side in OBJECT_SIDES)
    return out
