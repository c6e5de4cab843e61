"""How uncertain each cost a model predicts is: the relative spread the guard and reports read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from autoplace.predict.protocol import ProfiledCostModel, QuantileCostModel, SourcedCostModel

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph


def cost_spread(graph: OpGraph, devices: Sequence[Device], cost_model) -> np.ndarray:
    """``(n, d)`` relative uncertainty of each node's cost on each device; ``nan`` if unknown.

    Measured costs: the spread of the profile's repeats (std / mean) or of its occasions,
    whichever is larger (:attr:`autoplace.profile.Measurement.spread`). Learned costs from a
    model with ``quantiles`` (:class:`~autoplace.predict.XGBCostModel`, also as a measured
    model's fallback): half the P10-P90 band over the P50. Roofline estimates:
    :attr:`RooflineCostModel.spread <autoplace.predict.RooflineCostModel.spread>`.
    """
    from autoplace.predict.roofline import RooflineCostModel

    out = np.full((len(graph.nodes), len(devices)), np.nan)
    if isinstance(cost_model, RooflineCostModel):
        out[:] = cost_model.spread
    if not isinstance(cost_model, SourcedCostModel):
        return out
    profiled = isinstance(cost_model, ProfiledCostModel)
    for k, dev in enumerate(devices):
        sources = cost_model.sources(graph, dev)
        prof = cost_model.profile_for(dev) if profiled else None
        # the model that gives this device what its profile lacks (a calibrated one, say)
        learned = (cost_model.fallback_for(dev) if hasattr(cost_model, "fallback_for")
                   else cost_model.fallback if profiled else cost_model)
        q = None
        for n in graph.nodes:
            if sources[n.index] == "measured" and prof is not None:
                out[n.index, k] = prof.spread.get(n.workload_key, np.nan)
            elif sources[n.index] == "learned" and isinstance(learned, QuantileCostModel):
                q = learned.quantiles(graph, dev) if q is None else q
                lo, mid, hi = q[n.index, 0], q[n.index, q.shape[1] // 2], q[n.index, -1]
                out[n.index, k] = (hi - lo) / (2 * mid)
            elif sources[n.index] == RooflineCostModel.source:
                out[n.index, k] = RooflineCostModel.spread
    return out

