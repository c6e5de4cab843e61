"""Costs of a whole model on one device given more TVM threads than it was planned with: what the
"all threads" baseline (one CPU device with the threads of all the plan's CPU devices) rests on.

Only a profile measured with that thread count predicts it; no scaling rule stands in for one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph
    from autoplace.profile import DeviceProfile


class ThreadedCosts(NamedTuple):
    """Seconds per node on ``device`` with ``threads`` threads (``inf`` where the profile failed
    to run the op), and the relative spread of each; ``cost`` is None when nothing predicts them,
    and ``note`` says why (else which profile they come from)."""

    cost: np.ndarray | None
    spread: np.ndarray | None
    note: str


def costs_at_threads(model, graph: OpGraph, device: Device, threads: int,
                     extra: Sequence[DeviceProfile] = ()) -> ThreadedCosts:
    """Every node of ``graph`` on ``device`` with ``threads`` TVM threads, from a profile measured
    with that many: the model's (:meth:`MeasuredCostModel.profile_at`), else the first of
    ``extra`` (profiles found elsewhere for this device at that thread count).

    The profile must cover every node: a learned or roofline fallback was fitted at another
    thread count, so a gap leaves the baseline unpredicted rather than guessed.
    """
    prof = model.profile_at(device, threads) if hasattr(model, "profile_at") else None
    prof = prof or next(iter(extra), None)
    if prof is None:
        return ThreadedCosts(None, None, f"not predicted: no profile of {device.name} measured "
                                         f"with {threads} TVM threads (autoplace profile with "
                                         f"TVM_NUM_THREADS={threads} makes one)")
    known = {**dict.fromkeys(prof.unsupported, np.inf), **prof.latency_s}
    missing = [n for n in graph.nodes if n.workload_key not in known]
    if missing:
        return ThreadedCosts(None, None, f"not predicted: the {threads}-thread profile "
                                         f"{prof.name} lacks {len(missing)} of the "
                                         f"{len(graph.nodes)} ops (first {missing[0].name})")
    keys = [n.workload_key for n in graph.nodes]
    return ThreadedCosts(np.array([known[k] for k in keys], dtype=float),
                         np.array([prof.spread.get(k, np.nan) for k in keys], dtype=float),
                         f"measured ({prof.name}, {threads} threads)")
