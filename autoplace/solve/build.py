"""The solver's :class:`~autoplace.solve.Problem` from an op graph, its devices and their costs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from autoplace.devices import Device, Link
from autoplace.solve.problem import OBJECT_SIDES, Machines, Problem

if TYPE_CHECKING:
    from autoplace.graph import OpGraph


class SharedMachines(NamedTuple):
    """Devices whose hosts share a machine's cores, by name: :class:`Machines
    <autoplace.solve.problem.Machines>` before the devices are numbered.
    :func:`autoplace.cluster.host_overheads` makes it from a cluster's measured calls.

    ``machine``: device name -> its machine's name (a device it leaves out has a machine of its
    own); ``cores``: machine name -> cores; ``slowdown``: machine name -> how much longer ops
    take there with its cores all busy (1 where left out); ``threads``, ``call_cpu_s``,
    ``daemon_cpu_s``, ``driver_cpu_s``, ``actor_share``, ``daemon_share``, ``driver_share``:
    device name -> figure (0 where left out; ``threads`` 1); ``driver``: the machine the
    driving process runs on, if one of them; ``objects``: ``(from, to)`` device names (``""``:
    the driving process) -> the CPU seconds a tensor larger than ``inline_bytes`` costs there
    through the object store, an ``(alpha, beta)`` per :data:`OBJECT_SIDES
    <autoplace.solve.problem.OBJECT_SIDES>` side (``alpha + beta * bytes``; a pair left out
    costs nothing).
    """

    machine: Mapping[str, str]
    cores: Mapping[str, float]
    slowdown: Mapping[str, float]
    threads: Mapping[str, float]
    call_cpu_s: Mapping[str, float]
    daemon_cpu_s: Mapping[str, float]
    driver_cpu_s: Mapping[str, float]
    driver: str | None = None
    actor_share: Mapping[str, float] = {}
    daemon_share: Mapping[str, float] = {}
    driver_share: Mapping[str, float] = {}
    objects: Mapping[tuple[str, str], Sequence[tuple[float, float]]] = {}
    inline_bytes: float = float("inf")

    def arrays(self, device_names: Sequence[str], graph: OpGraph | None = None) -> Machines:
        """The arrays over ``device_names``, machines numbered by name; ``graph``'s inputs
        and outputs are the tensors from and to the driving process."""
        unknown = sorted(set(self.machine.values()) - set(self.cores))
        if unknown:
            raise ValueError(f"machine(s) {unknown} have no cores")
        names = sorted(self.cores)
        pos = {m: i for i, m in enumerate(names)}
        return Machines.build(
            [pos[self.machine[n]] if n in self.machine else -1 for n in device_names],
            [self.cores[m] for m in names],
            slowdown=[self.slowdown.get(m, 1.0) for m in names],
            threads=[self.threads.get(n, 1.0) for n in device_names],
            call_cpu_s=[self.call_cpu_s.get(n, 0.0) for n in device_names],
            daemon_cpu_s=[self.daemon_cpu_s.get(n, 0.0) for n in device_names],
            driver_cpu_s=[self.driver_cpu_s.get(n, 0.0) for n in device_names],
            actor_share=[self.actor_share.get(n, 0.0) for n in device_names],
            daemon_share=[self.daemon_share.get(n, 0.0) for n in device_names],
            driver_share=[self.driver_share.get(n, 0.0) for n in device_names],
            driver=pos.get(self.driver, -1) if self.driver is not None else -1,
            **self._objects(device_names, graph))

    def _objects(self, device_names: Sequence[str], graph: OpGraph | None) -> dict:
        """:meth:`Machines.build <autoplace.solve.problem.Machines.build>`'s object keywords."""
        if not self.objects:
            return {}
        ends = [*device_names, ""]
        fit = np.zeros((2, len(ends), len(ends), len(OBJECT_SIDES)))
        for i, a in enumerate(ends):
            for j, b in enumerate(ends):
                if (a, b) in self.objects:
                    fit[:, i, j] = np.asarray(self.objects[(a, b)], dtype=float).T
        inputs = () if graph is None else tuple(
            (float(x.tensor.nbytes), tuple(x.consumers)) for x in graph.inputs)
        outputs = () if graph is None else tuple(n.index for n in graph.nodes if n.is_output)
        return dict(object_alpha=fit[0], object_beta=fit[1], inline_bytes=self.inline_bytes,
                    inputs=inputs, outputs=outputs)


def build_problem(
    graph: OpGraph,
    devices: Sequence[Device],
    cost: np.ndarray,
    links: Mapping[tuple[str, str], Link] | None = None,
    pins: Mapping[int, str] | None = None,
    stage_overhead_s: float | Mapping[str, float] = 0.0,
    max_stages: int | None = None,
    segment_overhead_s: Mapping[str, float] | None = None,
    call_s: Mapping[str, float] | None = None,
    serial: bool = False,
    groups: Sequence[Sequence[int]] = (),
    machines: SharedMachines | None = None,
) -> Problem:
    """The array-only problem the solvers see: costs, tensors on edges, links, memory, pins, and
    the seconds a pipeline stage costs per input (one figure, or one per device name).

    ``call_s`` (throughput plans): seconds per input a call of a stage or replica costs its
    device, by device name (a device it leaves out: 0).

    ``serial`` (latency plans): one thread runs every device's ops and copies, one after
    another (:attr:`Problem.serial <autoplace.solve.Problem.serial>`).

    ``groups``: node indices that must share a device, one sequence per group.

    ``machines``: devices whose hosts share a machine's cores (:class:`SharedMachines`).

    ``segment_overhead_s`` (latency plans, which run as segments on one worker per device):
    every copy also costs the figures of both its devices: the result ends its segment on the
    device that computes it (its next node starts a new one), and the device that reads it starts
    a new segment.
    """
    d = len(devices)
    alpha, beta = np.zeros((d, d)), np.full((d, d), np.inf)
    links = links or {}
    for a, da in enumerate(devices):
        for b, db in enumerate(devices):
            if a != b:
                link = links.get((da.name, db.name)) or Link.default(da, db)
                alpha[a, b], beta[a, b] = link.alpha, link.beta
                over = segment_overhead_s or {}
                if da.runtime == db.runtime == "tvm":  # runtime calls run inside the one VM
                    alpha[a, b] += over.get(da.name, 0.0) + over.get(db.name, 0.0)
    pos = {dev.name: k for k, dev in enumerate(devices)}
    pin_arr = np.full(len(graph.nodes), -1, dtype=np.int64)
    for i, name in (pins or {}).items():
        pin_arr[i] = pos[name]
    if isinstance(stage_overhead_s, Mapping):
        unknown = sorted(set(stage_overhead_s) - set(pos))
        if unknown:
            raise ValueError(f"stage_overhead_s names unknown device(s) {unknown}; devices are "
                             f"{sorted(pos)}")
        stage_overhead_s = [stage_overhead_s.get(dev.name, 0.0) for dev in devices]
    return Problem.build(
        cost,
        [(e.src, e.dst) for e in graph.edges],
        [n.out_bytes for n in graph.nodes],
        alpha=alpha, beta=beta,
        node_mem=[n.mem_bytes for n in graph.nodes],
        mem_cap=[dev.memory_bytes for dev in devices],
        pins=pin_arr,
        stage_overhead_s=stage_overhead_s,
        call_s=[(call_s or {}).get(dev.name, 0.0) for dev in devices],
        max_stages=max_stages,
        serial=serial,
        groups=_group_ids(len(graph.nodes), groups),
        node_names=[n.name for n in graph.nodes],
        device_names=[dev.name for dev in devices],
        machines=None if machines is None else machines.arrays([d.name for d in devices], graph),
    )



def _group_ids(n: int, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(n,) colocation group id per node (-1: none) of ``groups``."""
    ids = np.full(n, -1, dtype=np.int64)
    for g, members in enumerate(groups):
        if (ids[list(members)] >= 0).any():
            raise ValueError(f"colocation groups overlap at node(s) {list(members)}")
        ids[list(members)] = g
    return ids

