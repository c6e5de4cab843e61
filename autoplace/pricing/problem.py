"""The solver's problems from the prices: the one it solves and, for a latency plan, the one
its delivery is judged on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.manual import rule_assignment
from autoplace.predict.protocol import ProfiledCostModel
from autoplace.pricing.prices import Prices
from autoplace.solve import Problem
from autoplace.solve.build import SharedMachines, build_problem


class Problems(NamedTuple):
    """``solved``: what the solver sees; ``plain`` (latency plans): the same without the
    segment overhead on its copies (:class:`~autoplace.report.result.Delivery` charges it per
    segment instead), else None."""

    solved: Problem
    plain: Problem | None


def resolve_pins(graph: OpGraph, devices: Sequence[Device], pins) -> dict[int, str]:
    """Node index -> device name: the placement rules ``pins``
    (:func:`autoplace.manual.rule_assignment`), and every PyTorch call on the torch device,
    whatever the rules say."""
    pinned = rule_assignment(graph, devices, pins)
    runtime = next((d.name for d in devices if d.runtime == "torch"), None)
    if runtime is not None:
        for n in graph.nodes:
            if n.is_torch:
                pinned[n.index] = runtime
    return pinned


def problems(graph: OpGraph, devices: Sequence[Device], prices: Prices, objective: str, links,
             pinned: Mapping[int, str], max_stages: int | None,
             machines: SharedMachines | None = None) -> Problems:
    """The solver's problem (links: the given ones, else the profiles' measured ones;
    ``serial`` where a torch device runs its PyTorch calls inside the one VM; ``machines``:
    devices whose hosts share a machine's cores) and, for a latency plan, the plain one
    (:class:`Problems`)."""
    if links is None and (isinstance(prices.model, ProfiledCostModel)
                          or any(d.runtime == "ort" for d in devices)):
        links = prices.model.links(devices)  # (a runtime device's model knows its links)
    rate = objective == "throughput"
    # A latency plan with runtime calls runs on one VM, one op after another: no segments.
    serial = not rate and any(d.runtime != "tvm" for d in devices)
    overhead = prices.overheads.charged
    problem = build_problem(graph, devices, prices.cost, links, pinned,
                            stage_overhead_s=(overhead or 0.0) if rate else 0.0,
                            max_stages=max_stages,
                            segment_overhead_s=None if rate or serial else overhead,
                            call_s=prices.overheads.calls if rate else None, serial=serial,
                            groups=prices.groups, machines=machines)
    plain = None if rate else build_problem(graph, devices, prices.cost, links, pinned,
                                            serial=serial, groups=prices.groups,
                                            machines=machines)
    return Problems(problem, plain)
