"""Each host's devices profiled on that host: the per-op campaign ``autoplace profile`` runs
here (:func:`autoplace.profile.run_campaign`), its timings taken by a Ray actor on the host's
node, written into this process's profile store.

A host's device is timed as a stage of a plan runs on it: built in the actor for that host's
CPU, its TVM pool given the host's CPUs (a stage alone on its host has them all) and told not
to spin between kernels. Its fingerprint names the host (``remote`` is ``ray:NAME``, beside the
host's CPU, target, threads and TVM), so two hosts of one CPU model keep two profiles, and this
machine's profile is never taken for a host's. The device is recorded by its spec
(``node2/cpu:0``): :func:`host_cost_model` finds a host's profile by it, so a cluster restarted
with the same host names needs no new profile.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.cluster._ray import ClusterError, connected_ray
from autoplace.cluster.hosts import Host, cluster_devices, named_hosts
from autoplace.devices import Device
from autoplace.profile import (CampaignReport, DeviceProfile, DeviceUnavailable, OpFailed,
                               ProfileStore, TimingPolicy, run_campaign)

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)


class _HostTimer:
    """An actor on one host: times one-op modules there, as a :class:`LocalRunner` of the
    host's device does, on a TVM pool of ``threads`` threads."""

    def __init__(self, device: Device, spec: str, threads: int):
        # As a stage's actor (pipeline._StageWorker): TVM's idle pool workers do not spin.
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
        from autoplace.profile import LocalRunner

        self._runner = LocalRunner(device, spec)
        self._threads = threads
        self._pooled: set[int] = set()

    def _pool(self) -> None:
        """The calling thread's TVM pool: ``threads`` threads over the process's cores (once per
        thread; the runner's own set-up then keeps it)."""
        import threading

        from autoplace.backend import limit_tvm_threads, process_cpus

        if self._runner.device.is_gpu or threading.get_ident() in self._pooled:
            return
        limit_tvm_threads(self._threads, sorted(process_cpus()))
        self._pooled.add(threading.get_ident())

    def info(self, host: str) -> dict[str, Any]:
        import ray

        return {**self._runner.info(), "threads": self._threads, "remote": f"ray:{host}",
                "ray_node": ray.get_runtime_context().get_node_id()}

    def check(self) -> str | None:
        """None, or why the device cannot be used."""
        self._pool()
        try:
            self._runner.check()
        except DeviceUnavailable as e:
            return str(e)
        return None

    def measure(self, mod_json: str, policy: TimingPolicy, rng: np.random.Generator):
        """``("ok", Timing)``, or ``("failed", why)`` where the op does not build or run."""
        import tvm

        self._pool()
        try:
            return "ok", self._runner.measure(tvm.ir.load_json(mod_json), policy, rng)
        except OpFailed as e:
            return "failed", str(e)


class RayRunner:
    """A device of a cluster's host, as the profiler reaches it: an actor on the host's node
    (started on the first :meth:`info`, :meth:`check` or :meth:`measure`) times each workload
    there. The runner :func:`autoplace.profile.run_campaign` takes, like ``LocalRunner``.

    Parameters
    ----------
    device : Device
        A device of ``host`` (``Device.cpu(0, host=host.name)``).
    host : Host
        The live host (:func:`autoplace.cluster.hosts`).
    threads : int, optional
        TVM threads to time with (default: the host's CPUs, as a stage alone there runs).
    """

    def __init__(self, device: Device, host: Host, *, threads: int | None = None):
        if device.host != host.name:
            raise ValueError(f"device {device.name!r} is on host {device.host!r}, not "
                             f"{host.name!r}")
        self.device, self.host = device, host
        self.spec = device.spec or device.name
        self.threads = max(1, threads if threads is not None else host.cpus)
        self._actor = self._info = None

    @property
    def name(self) -> str:
        return self.device.name

    def _remote(self):
        if self._actor is None:
            ray = connected_ray()
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            self._actor = ray.remote(_HostTimer).options(
                num_cpus=0, max_restarts=0, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(self.host.node_id, soft=False),
            ).remote(self.device, self.spec, self.threads)
        return self._actor

    def _get(self, ref):
        import ray

        try:
            return ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError) as e:
            self.close()
            raise DeviceUnavailable(f"{self.spec}: the profiling actor on host {self.host.name!r} "
                                    f"died ({type(e).__name__}): is the node alive?") from None

    def start(self) -> RayRunner:
        """Start the actor and ask what the device is, without waiting: runners started one
        after another start side by side. Returns self."""
        if self._info is None:
            self._info = self._remote().info.remote(self.host.name)
        return self

    def info(self) -> dict[str, Any]:
        """What makes this device's numbers comparable (:func:`autoplace.profile.fingerprint`),
        as the host says: its CPU, target, TVM; the threads timed with; ``remote`` naming the
        host."""
        return self._get(self.start()._info)

    def check(self) -> None:
        """Raise :class:`DeviceUnavailable` unless the host has the device and runs a trivial
        op on it."""
        why = self._get(self._remote().check.remote())
        if why is not None:
            raise DeviceUnavailable(f"{why} (on host {self.host.name!r})")

    def measure(self, mod: tvm.IRModule, policy: TimingPolicy = TimingPolicy(),
                rng: np.random.Generator | None = None):
        """Median time of ``mod["main"]`` on the host's device (built there).

        Raises
        ------
        OpFailed
            The op does not build or run there.
        DeviceUnavailable
            The actor (or its node) died.
        """
        import tvm

        status, got = self._get(self._remote().measure.remote(
            tvm.ir.save_json(mod), policy, rng or np.random.default_rng(0)))
        if status != "ok":
            raise OpFailed(got)
        return got

    def close(self) -> None:
        """End the actor (a later call starts another)."""
        if self._actor is not None:
            import ray

            ray.kill(self._actor)
            self._actor = self._info = None


def profile_on_hosts(models, store: ProfileStore, devices: Iterable[Device | str] | None = None,
                     *, policy: TimingPolicy = TimingPolicy(), passes: int = 1,
                     threads: int | None = None, progress: bool = True) -> CampaignReport:
    """Profile every distinct workload of ``models`` on each host device of ``devices``
    (default: every device of every host of the cluster) on its host, into ``store``: the
    campaign :func:`autoplace.profile.run_campaign` runs, each device timed by a
    :class:`RayRunner`. Resumable like it: a workload ``store`` holds for a device is not
    timed again. Returns the campaign's report (a device that failed has its ``error``).

    ``models``: an IRModule, or ``(name, IRModule)`` pairs; ``devices``: :class:`Device` s of
    hosts or their specs (``"node2/cpu:0"``); ``threads``: TVM threads to time with (default,
    each host's CPUs).

    >>> ray.init(address="auto")                                            # doctest: +SKIP
    >>> with ProfileStore("prof.db") as store:                              # doctest: +SKIP
    ...     profile_on_hosts(zoo.from_spec("zoo:mlp").mod, store, ["node2/cpu:0"])

    Raises
    ------
    ClusterError
        Not connected, or a host the cluster lacks (named, before anything is timed).
    ValueError
        A device of no host (this process's: ``autoplace profile`` times it).
    """
    if hasattr(models, "functions"):  # one IRModule
        models = [("model", models)]
    devices = [Device.from_spec(d) if isinstance(d, str) else d
               for d in (cluster_devices() if devices is None else devices)]
    local = [d.name for d in devices if d.host is None]
    if local:
        raise ValueError(f"device {local[0]!r} is of no host: it is this process's, which "
                         "'autoplace profile' (autoplace.profile.run_campaign) times here")
    live = named_hosts(dict.fromkeys(d.host for d in devices))
    runners = [RayRunner(d, live[d.host], threads=threads).start() for d in devices]
    try:
        return run_campaign(models, runners, store, policy=policy, links=False,
                            progress=progress, passes=passes)
    finally:
        for r in runners:
            r.close()


def host_profiles(devices: Sequence[Device], store: ProfileStore) -> dict[str, DeviceProfile]:
    """The profile ``store`` holds of each host device of ``devices`` (by device name; a device
    of no host is left out): the latest timed on its host under its spec
    (:func:`profile_on_hosts`), else the latest of a device of its kind on its host
    (``node2/cpu:1`` takes ``node2/cpu:0``'s: one CPU, as this machine's CPU devices share one
    profile). A device recorded under a host's spec but timed on this machine is not taken.

    Raises
    ------
    ClusterError
        A host device with no profile: the message says how to make one.
    """
    records = store.devices()
    out = {}
    for d in devices:
        if d.host is None:
            continue
        theirs = [r for r in records if r.info.get("remote") == f"ray:{d.host}"]
        found = ([r for r in theirs if r.name == d.spec] or
                 [r for r in theirs if r.info.get("kind") == d.kind])
        if not found:
            raise ClusterError(f"no profile of {d.spec} in {store.path}: 'autoplace cluster "
                               f"--profile --model MODEL --device {d.spec} --db {store.path}' "
                               "times it on its host")
        out[d.name] = DeviceProfile.from_store(store, found[-1].fingerprint)
    return out


def host_cost_model(devices: Sequence[Device], store: ProfileStore, *, fallback=None):
    """A cost model that charges each host device of ``devices`` its host's measured costs
    (:func:`host_profiles`), and ops they lack by ``fallback`` (default
    :class:`~autoplace.predict.RooflineCostModel`): :func:`autoplace.optimize`'s
    ``cost_model``. A device of no host gets the profile of this machine ``store`` holds, if
    any.

    >>> res = autoplace.optimize(mod, devices, objective="throughput",       # doctest: +SKIP
    ...                          cost_model=host_cost_model(devices, store),
    ...                          links=host_links(devices, store), **host_overheads(devices, store))
    """
    from autoplace.predict import MeasuredCostModel
    from autoplace.profile import LocalRunner, fingerprint

    profiles = host_profiles(devices, store)
    known = {r.fingerprint for r in store.devices()}
    for d in devices:
        fp = None if d.host is not None else fingerprint(LocalRunner(d).info())
        if fp in known:
            profiles[d.name] = DeviceProfile.from_store(store, fp)
    return MeasuredCostModel(profiles, fallback=fallback)
