"""The solver's :class:`~autoplace.solve.Problem` from an op graph, its devices and their costs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from autoplace.devices import Device, Link
from autoplace.solve.problem import Problem

if TYPE_CHECKING:
    from autoplace.graph import OpGraph


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
) -> Problem:
    """The array-only problem the solvers see: costs, tensors on edges, links, memory, pins, and
    the seconds a pipeline stage costs per input (one figure, or one per device name).

    ``call_s`` (throughput plans): seconds per input a call of a stage or replica costs its
    device, by device name (a device it leaves out: 0).

    ``serial`` (latency plans): one thread runs every device's ops and copies, one after
    another (:attr:`Problem.serial <autoplace.solve.Problem.serial>`).

    ``groups``: node indices that must share a device, one sequence per group.

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
    )



def _group_ids(n: int, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(n,) colocation group id per node (-1: none) of ``groups``."""
    ids = np.full(n, -1, dtype=np.int64)
    for g, members in enumerate(groups):
        if (ids[list(members)] >= 0).any():
            raise ValueError(f"colocation groups overlap at node(s) {list(members)}")
        ids[list(members)] = g
    return ids

