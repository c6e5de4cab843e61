"""What a cost model is to the rest of autoplace, as protocols any object can satisfy.

Every cost model predicts seconds per node of an op graph on a device (:class:`CostModel`). Some
also say where each number came from (:class:`SourcedCostModel`), give an uncertainty band
(:class:`QuantileCostModel`), or carry measured device profiles and links
(:class:`ProfiledCostModel`, as :class:`~autoplace.predict.MeasuredCostModel` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from autoplace.devices import Device, Link
    from autoplace.graph import OpGraph
    from autoplace.profile import DeviceProfile


@runtime_checkable
class CostModel(Protocol):
    """Seconds of every node of ``graph`` on ``device``, in node order (``inf``: cannot run)."""

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray: ...


@runtime_checkable
class SourcedCostModel(CostModel, Protocol):
    """A cost model that says, per node, where its number comes from (one of
    :data:`autoplace.plan.COST_SOURCES`)."""

    def sources(self, graph: OpGraph, device: Device) -> list[str]: ...


@runtime_checkable
class QuantileCostModel(Protocol):
    """A model with an uncertainty band: ``(n, q)`` seconds per node, sorted per node."""

    def quantiles(self, graph_or_rows: Any, device: Device | None = None) -> np.ndarray: ...


@runtime_checkable
class ProfiledCostModel(SourcedCostModel, Protocol):
    """A cost model backed by measured device profiles: each device's profile, measured links,
    and the model it falls back on for ops the profiles lack."""

    fallback: Any

    def profile_for(self, device: Device) -> DeviceProfile | None: ...

    def links(self, devices: Sequence[Device]) -> dict[tuple[str, str], Link]: ...


def sources(model: CostModel, graph: OpGraph, device: Device) -> list[str]:
    """Where each node's cost comes from under ``model``: its own ``sources``, else its
    ``source`` attribute for every node (``"learned"`` when it has none)."""
    if isinstance(model, SourcedCostModel):
        return list(model.sources(graph, device))
    return [getattr(model, "source", "learned")] * len(graph.nodes)
