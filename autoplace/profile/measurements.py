"""The rows of a profile: a workload's measurement, a link's fit, an overhead, and their format.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

SCHEMA_VERSION = 3
# Version 1 had no passes or slowest_s column (one pass each); versions 1 and 2 had no overheads.
READABLE_VERSIONS = (1, 2, 3)
PROFILE_FORMAT = "autoplace-profile"

#: What an overhead row measures (:func:`autoplace.run.overhead.measure_overheads`): a
#: pipeline stage's hand-off, a concurrent latency run's segment, a direct call, the least a
#: kernel costs, a call into PyTorch from the VM (a torch device's, with the TVM device as peer),
#: a tensor entering or leaving an ONNX Runtime segment (an ORT device's, ``"ort_edge"``).
OVERHEAD_KINDS = ("stage", "segment", "call", "kernel", "handoff", "ort_edge")


class ProfileStoreError(RuntimeError):
    """The store cannot be used as asked; the message says what was wrong and how to fix it."""


@dataclass(frozen=True)
class Measurement:
    """One workload's latency on one device (``status == "unsupported"``: it failed there).

    Each repeat is the mean of ``number`` back-to-back calls; ``passes`` counts the occasions
    (campaign passes) it was timed on, and the row keeps the fastest occasion (:func:`fastest`)
    and the slowest occasion's latency (``slowest_s``).
    """

    workload: str
    device: str  # fingerprint
    status: str
    median_s: float | None = None
    min_s: float | None = None
    mean_s: float | None = None
    cv: float | None = None
    repeats: int | None = None
    number: int | None = None
    schedule: str = "default"
    error: str | None = None
    measured_at: str = ""
    passes: int = 1
    slowest_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def latency_s(self) -> float | None:
        """The latency profiles report: the fastest repeat. Other load on the machine only ever
        slows a repeat down, so the fastest one is the most repeatable statistic: two campaigns
        back to back on a quiet 2-core machine agreed within +-10 % on 93 % of 104 workloads by
        it, on 83 % by the median (``benchmarks/retest_noise.py``, ``shipped/README.md``)."""
        return self.min_s

    @property
    def occasion_spread(self) -> float | None:
        """How much slower the slowest occasion was than the fastest (``None`` after one pass):
        the test-retest noise of this workload's label."""
        if not self.ok or self.slowest_s is None or not self.latency_s:
            return None
        return self.slowest_s / self.latency_s - 1

    @property
    def spread(self) -> float | None:
        """How sure the label is, relative to it: the larger of its repeats' spread (``cv``) and
        its occasions' (:attr:`occasion_spread`); None when neither is known."""
        known = [s for s in (self.cv, self.occasion_spread) if s is not None]
        return max(known) if known else None


def fastest(old: Measurement | None, new: Measurement) -> Measurement:
    """One more pass over a workload: keep the faster occasion, count both. A failure does not
    replace a success."""
    if old is None or not old.ok:
        return new
    if not new.ok:
        return old
    keep = new if new.latency_s < old.latency_s else old
    slowest = max(m.slowest_s if m.slowest_s is not None else m.latency_s for m in (old, new))
    return replace(keep, passes=old.passes + new.passes, slowest_s=slowest)


@dataclass(frozen=True)
class LinkFit:
    """Copy time ``alpha_s + bytes / beta_bps`` from device ``src`` to ``dst`` (fingerprints)."""

    src: str
    dst: str
    alpha_s: float
    beta_bps: float
    r2: float
    points: tuple[tuple[int, float], ...]
    measured_at: str = ""


@dataclass(frozen=True)
class OverheadFit:
    """Seconds of one overhead ``kind`` (:data:`OVERHEAD_KINDS`) measured on device ``device``
    (a fingerprint): its own figure (``peer == ""``), or with stages or segments alternating
    between it and ``peer``. ``detail`` says how it was measured."""

    device: str
    peer: str
    kind: str
    seconds: float
    detail: dict = field(default_factory=dict)
    measured_at: str = ""


def overhead_row(f: OverheadFit) -> tuple:
    """The row of a well-formed overhead; ValueError or TypeError says what is wrong."""
    if not all(isinstance(v, str) for v in (f.device, f.peer, f.kind, f.measured_at)):
        raise TypeError(f"overhead {f.kind!r} of {f.device!r}: device, peer, kind and "
                        "measured_at must be strings")
    if f.kind not in OVERHEAD_KINDS:
        raise ValueError(f"overhead kind {f.kind!r} is not one of {OVERHEAD_KINDS}")
    seconds = f.seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not 0 <= seconds < float("inf"):
        raise ValueError(f"overhead {f.kind!r} of {f.device}: seconds must be a finite number "
                         f">= 0, got {seconds!r}")
    if not isinstance(f.detail, dict):
        raise TypeError(f"overhead {f.kind!r} of {f.device}: detail must be a JSON object")
    return (f.device, f.peer, f.kind, float(seconds), json.dumps(f.detail, sort_keys=True),
            f.measured_at or timestamp())


def checked(f: OverheadFit) -> OverheadFit:
    """``f``, where it is well-formed (:func:`overhead_row` says what is wrong otherwise)."""
    overhead_row(f)
    return f


@dataclass(frozen=True)
class DeviceRecord:
    fingerprint: str
    name: str
    info: dict


def timestamp() -> str:
    """Now, as the store writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
