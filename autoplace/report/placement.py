"""What a report reads of an optimization result (:class:`autoplace.OptimizeResult` has it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph
    from autoplace.plan import Plan
    from autoplace.solve import Problem, Solution
    from autoplace.solve.simulate import Schedule


class PlacementResult(Protocol):
    """A plan with the problem it solves: the reports take any object with these attributes."""

    plan: Plan
    graph: OpGraph
    problem: Problem
    solution: Solution
    baselines: Mapping[str, float]
    cost_model: str  # which costs the solver saw, in words
    predictor: Any  # the cost model object (its uncertainty, where it has one)
    predicted_latency_s: float  # what the build is predicted to take (per input)
    delivery: Any  # latency plans: how the build runs it (str() says), or None

    def schedule(self) -> Schedule:
        """The simulator's one-input schedule of the plan."""
        ...


def device_label(device: Device) -> str:
    """A device's name, and its host where the name does not begin with it (``"gpu@node2"``),
    as ``str(plan)`` shows it."""
    host = device.host
    if host is None or device.name.startswith(f"{host}-"):
        return device.name
    return f"{device.name}@{host}"


def device_labels(result: PlacementResult) -> list[str]:
    """:func:`device_label` of each of ``result.problem``'s devices, by index."""
    by_name = {d.name: d for d in result.plan.devices}
    return [device_label(by_name[n]) if n in by_name else n for n in result.problem.device_names]


def hosts_line(devices) -> str:
    """``"hosts: alpha (alpha-cpu0, alpha-cpu1), beta (beta-cpu0)"``: the devices of each host,
    or ``""`` when no device names one."""
    by_host: dict[str, list[str]] = {}
    for d in devices:
        if d.host is not None:
            by_host.setdefault(d.host, []).append(d.name)
    if not by_host:
        return ""
    return "hosts: " + ", ".join(f"{h} ({', '.join(names)})" for h, names in by_host.items())
