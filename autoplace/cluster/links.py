"""Links between the hosts of a cluster: Ray's object transfer from a node to another, timed
over tensor sizes and fitted as ``alpha + bytes / beta`` like the links between devices
(:func:`autoplace.profile.links.fit_link`), stored in the profile store under each host's name.

A tensor goes between stages as a stage's pipeline sends it: returned by an actor on one node,
read by an actor on the other (Ray keeps a small one with its owner, the caller, and a large
one in the first node's object store). A host is stored by its name, so a cluster that restarts
with the same host names keeps its links.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from autoplace.cluster._ray import connected_ray
from autoplace.cluster.hosts import Host, named_hosts
from autoplace.devices import Device, Link
from autoplace.profile import LinkFit, ProfileStore, fit_link

log = logging.getLogger(__name__)

#: Tensor sizes a host link is timed at: 4 KiB .. 16 MiB.
HOST_SIZES = tuple(4096 * 4**k for k in range(7))


def host_fingerprint(name: str) -> str:
    """A host's key in the profile store (its devices table, and the links' ends)."""
    return hashlib.sha1(f"ray-host:{name}".encode()).hexdigest()[:16]


class _Endpoint:
    """An actor on one host: makes tensors there, or reads ones made elsewhere and times it."""

    def make(self, size: int) -> np.ndarray:
        return np.ones(size, dtype=np.uint8)

    def ready(self) -> bool:
        return True

    def echo(self, x):
        """``x`` as it came: a hop of a pipeline without its compute."""
        return x

    def cpu_s(self) -> float:
        """CPU seconds this actor's process has spent (every thread, Ray's own included)."""
        return time.process_time()

    def compute(self, seconds: float) -> float:
        """CPU seconds per step of single-threaded compute (a tanh and a multiply of 256 x 256
        floats, in cache), stepping for ``seconds``: what a step takes here alone and beside
        other work (CPU time, so not the time other processes hold the core)."""
        a = np.linspace(-1, 1, 256 * 256, dtype=np.float32).reshape(256, 256)
        b = np.empty_like(a)
        steps, t0, cpu0 = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - t0 < seconds:
            np.tanh(a, out=b)
            np.multiply(b, a, out=b)
            steps += 1
        return (time.thread_time() - cpu0) / steps

    def machine(self, exclude: Sequence[int] = ()) -> dict:
        """This machine's cores (those this process may run on) and the CPU seconds its
        cluster's daemons have spent so far (:func:`daemons_cpu_s`; ``exclude``: pids of
        actors whose CPU is counted apart)."""
        import os

        return {"cores": len(os.sched_getaffinity(0)), "daemons_cpu_s": daemons_cpu_s(exclude)}

    def pull(self, boxed: list) -> float:
        import ray

        t0 = time.perf_counter()
        ray.get(boxed[0])
        return time.perf_counter() - t0


def daemons_cpu_s(exclude: Sequence[int] = ()) -> float:
    """CPU seconds spent so far by the processes of this process's Ray cluster on this machine
    but this one and ``exclude`` (pids): its node's raylet (this actor's parent) and every
    process that names the raylet's session (GCS, other raylets, agents), with their workers;
    nan without psutil. The driver, which names no session, is not counted."""
    import re

    try:
        import psutil
    except ImportError:
        return float("nan")
    me = psutil.Process()
    raylet = me.parent()
    found = re.search(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+",
                      " ".join(raylet.cmdline()) if raylet is not None else "")
    if found is None:
        return float("nan")
    ours: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        try:
            if found.group() in " ".join(proc.cmdline()):
                ours[proc.pid] = proc
                for child in proc.children(recursive=True):
                    ours[child.pid] = child
        except psutil.Error:
            continue
    total = 0.0
    for pid, proc in ours.items():
        if pid == me.pid or pid in exclude:
            continue
        try:
            total += _process_cpu_s(proc)
        except (psutil.Error, OSError):
            continue
    return total


def _process_cpu_s(proc) -> float:
    """CPU seconds of a process: its live threads' run time in nanoseconds where Linux gives it
    (``/proc/PID/task/*/schedstat``), else its user and system time in clock ticks."""
    import glob

    threads = glob.glob(f"/proc/{proc.pid}/task/*/schedstat")
    if threads:
        total = 0
        for path in threads:
            try:
                with open(path) as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended
        return total * 1e-9
    t = proc.cpu_times()
    return t.user + t.system


def transfer_times(src: Host, dst: Host, sizes: Sequence[int] = HOST_SIZES, *,
                   repeats: int = 5, budget_s: float = 20.0) -> list[tuple[int, float]]:
    """Median seconds for an actor on ``dst`` to read a tensor an actor on ``src`` returned,
    per size (bytes); a new tensor each time (a read one is cached on ``dst``). Sizes beyond
    the time budget are skipped."""
    ray = connected_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(_Endpoint)
    a, b = (remote.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        h.node_id, soft=False)).remote() for h in (src, dst))
    try:
        ray.get([a.ready.remote(), b.ready.remote()])
        points, t_start = [], time.perf_counter()
        for size in sizes:
            if time.perf_counter() - t_start > budget_s:
                break
            times = []
            for _ in range(repeats + 1):  # the first warms up
                ref = a.make.remote(int(size))
                ray.wait([ref], fetch_local=False)
                times.append(ray.get(b.pull.remote([ref])))
                del ref
            points.append((int(size), float(np.median(times[1:]))))
        return points
    finally:
        for actor in (a, b):
            ray.kill(actor)


def measure_host_links(store: ProfileStore | None = None, names: Iterable[str] | None = None,
                       *, sizes: Sequence[int] = HOST_SIZES, repeats: int = 5,
                       budget_s: float = 20.0, again: bool = False) -> list[LinkFit]:
    """Time and fit the link of every ordered pair of the cluster's hosts (or of ``names``),
    and store each in ``store`` (with a record per host), unless ``store`` has it and not
    ``again``. Returns the fits made.

    Raises
    ------
    ClusterError
        A name the cluster lacks.
    """
    live = named_hosts(names)
    names = list(live)
    done = set() if store is None or again else {(f.src, f.dst) for f in store.links()}
    fits = []
    for s in names:
        for d in names:
            key = (host_fingerprint(s), host_fingerprint(d))
            if s == d or key in done:
                continue
            points = transfer_times(live[s], live[d], sizes, repeats=repeats, budget_s=budget_s)
            alpha, beta, r2 = fit_link(points)
            fit = LinkFit(*key, alpha, beta, r2, tuple(points))
            log.info("host link %s -> %s: alpha %.3g s, beta %.3g B/s (r2 %.3f)",
                     s, d, alpha, beta, r2)
            if store is not None:
                for h in (live[s], live[d]):
                    store.add_device(host_fingerprint(h.name), f"host:{h.name}",
                                     {"kind": "host", "host": h.name, "cpus": h.cpus})
                store.put_link(fit)
            fits.append(fit)
    return fits


def host_links(devices: Sequence[Device], fits: Iterable[LinkFit] | ProfileStore
               ) -> dict[tuple[str, str], Link]:
    """The links between ``devices`` of different hosts that ``fits`` (or a store's links)
    measured, by device names: what :func:`autoplace.optimize`'s ``links`` takes. A pair whose
    hosts have no fit is left out (it gets :meth:`Link.default`'s network guess). A device of
    no host (this process's) is matched by no host fit."""
    if isinstance(fits, ProfileStore):
        fits = fits.links()
    by_pair: Mapping[tuple[str, str], LinkFit] = {(f.src, f.dst): f for f in fits}
    out = {}
    for a in devices:
        for b in devices:
            if a.host == b.host or a.host is None or b.host is None:
                continue
            f = by_pair.get((host_fingerprint(a.host), host_fingerprint(b.host)))
            if f is not None:
                out[(a.name, b.name)] = Link(a.name, b.name, f.alpha_s, f.beta_bps)
    return out
