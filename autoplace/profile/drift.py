"""Whether a device still runs as fast as when a store measured it: a few stored workloads again.

A store grows over days (more sweeps, refinement rounds) and each new row has to be on the scale
of the old ones, or a cost model trained on them learns the difference between two occasions: a
machine can run a profile's workloads a third slower on another day, and rows measured then make
the learned model worse (docs/results.md).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np

from autoplace.profile.measure import OpFailed, TimingPolicy
from autoplace.profile.measurements import Measurement
from autoplace.profile.workload import module_from_key

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

#: A device whose re-timed workloads take a median this much longer or shorter (as a fraction)
#: than the store says has drifted (``autoplace profile`` refuses to mix its rows in).
DRIFT_TOLERANCE = 0.15
#: Rows measured less than this many seconds ago are this occasion's: no drift to check.
SAME_OCCASION_S = 3600.0


class DriftError(ValueError):
    """A device does not run a store's workloads as fast as when the store measured them."""


@dataclass(frozen=True)
class Drift:
    """Stored workloads timed again on a device: ``ratios`` are now / stored, per workload."""

    spec: str
    keys: tuple[str, ...]
    ratios: tuple[float, ...]

    @property
    def ratio(self) -> float:
        """The median ratio: above 1, the device is slower now."""
        return float(np.median(self.ratios))

    def exceeds(self, tolerance: float) -> bool:
        return abs(math.log(self.ratio)) > math.log1p(tolerance)

    def describe(self) -> str:
        return (f"{self.spec} now takes a median {self.ratio:.2f}x as long on {len(self.ratios)} "
                f"workloads of the store as when it measured them ({min(self.ratios):.2f}x to "
                f"{max(self.ratios):.2f}x)")


def anchors(measurements: list[Measurement], n: int = 12, *,
            older_than_s: float = SAME_OCCASION_S, now: float | None = None
            ) -> list[tuple[Measurement, tvm.IRModule]]:
    """Up to ``n`` successful ``measurements`` taken more than ``older_than_s`` ago whose op can
    be rebuilt from its key, with that op's module, spread evenly over their latencies: short ops
    drift as much as long ones (call overhead), and a cost model predicts both."""
    now = time.time() if now is None else now
    old = [m for m in measurements if m.ok and m.latency_s and m.measured_at
           and now - datetime.fromisoformat(m.measured_at).timestamp() > older_than_s]
    pool = sorted(old, key=lambda m: m.latency_s)
    out, taken = [], set()
    for start in np.linspace(0, len(pool), num=n, endpoint=False).astype(int):
        for i in range(start, len(pool)):  # the next one up where a key cannot rebuild its op
            if i not in taken and (mod := _rebuilt(pool[i].workload)) is not None:
                taken.add(i)
                out.append((pool[i], mod))
                break
    return out


def measure_drift(runner, spec: str, measurements: list[Measurement], n: int = 12, *,
                  policy: TimingPolicy = TimingPolicy(), **anchor_kwargs) -> Drift | None:
    """Time ``n`` :func:`anchors` of a device's stored ``measurements`` again on ``runner``;
    ``None`` if the store has none to time (nothing from an earlier occasion)."""
    keys, ratios = [], []
    for m, mod in anchors(measurements, n, **anchor_kwargs):
        try:
            t = runner.measure(mod, policy)
        except OpFailed as e:
            log.info("%s cannot time the anchor %s again: %s", spec, m.workload, e)
            continue
        keys.append(m.workload)
        ratios.append(t.min_s / m.latency_s)
    return Drift(spec, tuple(keys), tuple(ratios)) if ratios else None


def _rebuilt(key: str) -> tvm.IRModule | None:
    try:
        return module_from_key(key)
    except Exception:  # noqa: BLE001 - whatever stops the rebuild, it is no anchor
        return None
