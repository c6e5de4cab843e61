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


def outside_training(graph: OpGraph, devices: Sequence[Device], model,
                     cost) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """The nodes whose learned cost on each device leaves what the learned model was trained on
    (its ``extrapolated``: an op type it never saw, or a feature outside its training range), by
    device name, and a line per device that has any: how many, their share of the device's
    predicted time (``cost``, nodes x devices: the seconds charged; a node charged 0 there,
    whatever its model says, is not flagged), the op types, and what to do about it."""
    import numpy as np

    from autoplace.predict.features import workload_row

    nodes: dict[str, tuple[int, ...]] = {}
    lines = []
    for k, dev in enumerate(devices):
        learned = model.fallback_for(dev) if hasattr(model, "fallback_for") else model
        flag = getattr(learned, "extrapolated", None)
        if flag is None or getattr(learned, "source", None) != "learned":
            continue
        src = sources(model, graph, dev)
        picked = [i for i in range(len(graph.nodes)) if src[i] == "learned" and cost[i, k] > 0]
        if not picked:
            continue
        try:  # only the nodes it prices: its features are computed per row
            out = np.asarray(flag([workload_row(graph.nodes[i]) for i in picked], dev),
                             dtype=bool)
        except ValueError:  # a model that does not know this device predicts nothing for it
            continue
        idx = tuple(i for i, o in zip(picked, out) if o)
        if not idx:
            continue
        nodes[dev.name] = idx
        col = np.where(np.isfinite(cost[:, k]), cost[:, k], 0.0)
        share = col[list(idx)].sum() / max(col.sum(), 1e-30)
        # An adapted model knows the op types of the model it adapts.
        known = set(getattr(getattr(learned, "base", learned), "op_types_", ()) or ())
        ops: dict[str, int] = {}
        for i in idx:
            ops[graph.nodes[i].op_type] = ops.get(graph.nodes[i].op_type, 0) + 1
        never = sorted(op for op in ops if known and op not in known)
        what = ", ".join(f"{op} x{c}" for op, c in sorted(ops.items(), key=lambda t: -t[1]))
        lines.append(f"{dev.name}: {len(idx)} ops ({share:.0%} of its predicted time) learned "
                     f"outside the data the model was trained on ({what}"
                     + (f"; op types it never saw: {', '.join(never)}" if never else "")
                     + "): the least sure costs; autoplace profile --model ... measures them")
    return nodes, tuple(lines)
