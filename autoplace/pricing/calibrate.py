"""Costs for a CPU as it runs today: calibrated on first use, cached per host; and the
quick profile of a device no profile describes (``autoplace profile --quick``).

A shipped profile describes the host it was measured on. Any other CPU (another vendor, another
build target, or a host of the same name that runs at another speed) gets costs from the shipped
learned model adapted to a few of the model's own workloads timed here
(:func:`autoplace.predict.adapt.adapt`, as ``autoplace profile --quick`` does), and a profile
whose host is this one is first checked against it (:func:`check_profile`). Both results are
cached under :func:`~autoplace.profile.calibration_cache.cache_dir`, keyed by the device's
fingerprint and by how fast a fixed probe kernel runs
(:func:`~autoplace.profile.calibration_cache.speed_probe`): a host of the same name that runs
at another speed gets its own entry, and the next call on this host times nothing but the
probe.

>>> cal = calibrated(Device.cpu(0), [("mine", mod)])                           # doctest: +SKIP
>>> cal.note
'calibrated on this machine from 12 workloads (6.1 s)'
>>> cal.model.predict(graph, Device.cpu(0))                                    # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autoplace.predict.adapt import (MIN_ROWS, AdaptedCostModel, adapt, choose_workloads,
                                     shipped_base)
from autoplace.profile.calibration_cache import cache_entry
from autoplace.profile.measure import TimingPolicy

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.profile.profiles import DeviceProfile

log = logging.getLogger(__name__)

#: Workloads timed at most for one model on first use (fewer where the model has fewer kernels).
CALIBRATION_WORKLOADS = 12
#: ... where a torch device competes for the model's ops: each op's TVM cost then decides
#: where it goes, and an op type the adapted model mispredicts is charged as timed.
MIXED_CALIBRATION_WORKLOADS = 48
#: How each calibration workload is timed: a few short repeats (its build costs more).
CALIBRATION_POLICY = TimingPolicy(min_repeat_ms=2.0, min_repeats=3, max_repeats=9, round_size=3,
                                  cv_target=0.05, budget_s=0.5)
#: Workloads of a profile timed again to see whether this host still runs as it measured.
CHECK_WORKLOADS = 5
#: Below this, a profile's re-timed workloads agree with it (its own noise can raise it).
PROFILE_TOLERANCE = 0.25


@dataclass(frozen=True)
class Calibration:
    """A device's calibrated costs and how they were made.

    ``profile``: what was timed here (a :class:`~autoplace.profile.DeviceProfile` of the
    workloads, and of the overheads of running a plan where they were measured); ``model``: an
    :class:`~autoplace.predict.AdaptedCostModel` of the device, for every other op; ``rows``:
    the workloads it was fitted on; ``timed``: those timed by this call (0: all from the
    cache); ``seconds``: this call's timing and fitting; ``path``: the cache entry, None where
    the cache could not be written.
    """

    profile: DeviceProfile
    model: object
    rows: int
    timed: int
    seconds: float
    path: Path | None

    @property
    def note(self) -> str:
        if self.timed == 0:
            return (f"calibrated on this machine from {self.rows} workloads (cached in "
                    f"{self.path})")
        return (f"calibrated on this machine from {self.rows} workloads ({self.seconds:.1f} s; "
                f"{self.timed} timed now)")


@dataclass(frozen=True)
class ProfileCheck:
    """A profile's workloads timed again here: ``ratio`` is the median of now / profile (above
    1: this host is slower), ``tolerance`` the relative difference it may show and still agree
    (:data:`PROFILE_TOLERANCE`, or twice the profile's own spread on them, whichever is more)."""

    profile: str
    ratio: float
    workloads: int
    tolerance: float
    seconds: float = 0.0
    cached: bool = False

    @property
    def agrees(self) -> bool:
        return abs(math.log(self.ratio)) <= math.log1p(self.tolerance)

    def describe(self) -> str:
        how = "as the profile says" if self.agrees else "not as the profile says"
        return (f"this host runs {self.workloads} of profile {self.profile}'s workloads "
                f"{self.ratio:.2f}x as long as it measured ({how}: within "
                f"{self.tolerance:.0%})" + (" [cached]" if self.cached else ""))


def calibrated(device: Device, models, *, count: int = CALIBRATION_WORKLOADS,
               policy: TimingPolicy = CALIBRATION_POLICY, progress: bool = True,
               overheads=None, skip: frozenset[str] = frozenset()) -> Calibration:
    """The shipped learned model adapted to ``device`` on up to ``count`` workloads of
    ``models`` (``(name, tvm.IRModule)`` pairs) timed here, none of ``skip`` (workload keys),
    and on every workload the cache entry of this host already holds; workloads the entry holds
    are not timed again, and where it holds them all, its model is reused and nothing is timed.
    ``overheads(store, spec)``,
    if given, measures into the entry's store the overheads of running a plan on the device
    that it lacks (the run layer's work: :func:`autoplace.pricing.auto_cost_model` passes it).

    Raises ValueError where the device has no CLI spec (:attr:`Device.spec`) or cannot be
    timed.
    """
    from autoplace.predict.rows import profile_rows
    from autoplace.profile.profiles import DeviceProfile
    from autoplace.profile.store import ProfileStore
    from autoplace.profile.measurements import ProfileStoreError

    if device.spec is None:
        raise ValueError(f"{device.name}: target {device.target!r} has no device spec to time "
                         "it with; calibrate a 'native' or 'llvm' CPU device")
    t = time.perf_counter()
    cache, entry = cache_entry(device)
    base, base_path = shipped_base(device.kind)
    digest = f"{_models_digest(models)}:{count}" + (
        f":{hashlib.sha1(chr(10).join(sorted(skip)).encode()).hexdigest()[:16]}" if skip else "")
    done = (cache.read(entry, "models.json") or {}).get("models", [])
    if digest in done:  # calibrated on these very models: read, time nothing
        try:
            with ProfileStore(entry / "profile.db", readonly=True) as store:
                profile = DeviceProfile.from_store(store, cache.fingerprint)
            model = AdaptedCostModel.load(entry / "model.json", base=base)
            return Calibration(profile, model, model.calibration["rows"], 0,
                               time.perf_counter() - t, entry if cache.kept else None)
        except (OSError, ValueError, KeyError, TypeError, ProfileStoreError) as e:
            log.warning("calibration cache entry %s is incomplete (%s): timed again", entry, e)
            done = []
    for attempt in range(2):
        try:
            with ProfileStore(entry / "profile.db") as store:
                chosen, dev = time_chosen(store, device.spec, models, base, count=count,
                                          skip=skip, policy=policy, progress=progress)
                if overheads is not None:
                    overheads(store, device.spec)
                rows = profile_rows(store, dev.fingerprint)
                profile = DeviceProfile.from_store(store, dev.fingerprint)
            break
        except ProfileStoreError as e:
            if attempt:
                raise
            log.warning("calibration cache store %s is damaged (%s): rebuilt",
                        entry / "profile.db", e)
            (entry / "profile.db").unlink(missing_ok=True)
            (entry / "model.json").unlink(missing_ok=True)
    model = None
    if dev.measured == 0 and (entry / "model.json").exists():
        try:
            model = AdaptedCostModel.load(entry / "model.json")
        except (OSError, ValueError, KeyError) as e:
            log.warning("calibration cache model %s is unreadable (%s): fitted again",
                        entry / "model.json", e)
    if model is None or model.calibration.get("rows") != len(rows):
        model = adapt(base, rows, base_path=base_path)
        model.save(entry / "model.json")
    try:
        (entry / "models.json").write_text(json.dumps({"models": [*done, digest]}))
    except OSError as e:
        log.warning("cannot note the calibration in %s: %s", entry, e)
    return Calibration(profile, model, len(rows), dev.measured, time.perf_counter() - t,
                       entry if cache.kept else None)


def _models_digest(models) -> str:
    """A digest of the workloads of ``models`` (``(name, tvm.IRModule)`` pairs): a calibration
    on the same workloads is the same calibration."""
    from autoplace.graph import OpGraph

    keys = sorted({n.workload_key for _, mod in models for n in OpGraph.from_relax(mod).nodes})
    return hashlib.sha1("\n".join(keys).encode()).hexdigest()[:16]


def check_profile(profile: DeviceProfile, device: Device, keys=(), *,
                  count: int = CHECK_WORKLOADS) -> ProfileCheck | None:
    """Time ``count`` of ``profile``'s workloads again on ``device`` (those of ``keys`` first,
    the model's own, spread over their latencies) and compare with what it measured; cached
    per host like :func:`calibrated`. None where none of its workloads can be rebuilt."""
    from autoplace.profile import LocalRunner
    from autoplace.profile.measure import OpFailed
    from autoplace.profile.workload import module_from_key

    cache, entry = cache_entry(device)
    found = cache.read(entry, "profile-check.json")
    if found is not None and found.get("profile") == profile.fingerprint:
        return ProfileCheck(found["profile"], found["ratio"], found["workloads"],
                            found["tolerance"], cached=True)
    t = time.perf_counter()
    mine = [k for k in dict.fromkeys(keys) if k in profile.latency_s]
    pool = sorted(mine or profile.latency_s, key=profile.latency_s.get)
    runner = LocalRunner(device)
    policy = TimingPolicy(min_repeat_ms=2.0, min_repeats=3, max_repeats=6, round_size=3,
                          cv_target=0.05, budget_s=0.3)
    ratios, spreads = [], []
    for i in np.linspace(0, len(pool) - 1, num=min(count, len(pool))).round().astype(int):
        key = pool[i]
        try:
            timing = runner.measure(module_from_key(key), policy)
        except (OpFailed, ValueError, RuntimeError) as e:
            log.info("cannot time %s again to check the profile: %s", key, e)
            continue
        ratios.append(timing.min_s / profile.latency_s[key])
        spreads.append(profile.spread.get(key, float("nan")))
    if not ratios:
        return None
    noise = np.nanmedian(spreads) if not np.isnan(spreads).all() else 0.0
    check = ProfileCheck(profile.fingerprint, float(np.median(ratios)), len(ratios),
                         float(max(PROFILE_TOLERANCE, 2 * noise)), time.perf_counter() - t)
    try:
        (entry / "profile-check.json").write_text(json.dumps(
            {"profile": check.profile, "ratio": check.ratio, "workloads": check.workloads,
             "tolerance": check.tolerance}))
    except OSError as e:
        log.warning("cannot cache the profile check in %s: %s", entry, e)
    return check


@dataclass(frozen=True)
class QuickReport:
    """What :func:`quick_profile` did: the workloads it chose and timed, and the model."""

    device: str
    chosen: int
    measured: int
    seconds: float
    model: AdaptedCostModel
    path: str | None

    def lines(self) -> list[str]:
        return [f"{self.device}: timed {self.measured} of the {self.chosen} workloads chosen in "
                f"{self.seconds:.0f} s; {self.model.describe()}",
                *([f"wrote {self.path}"] if self.path else [])]


def quick_profile(store, device_spec: str, models, *, count: int = 40, base=None,
                  base_path: str | None = None, out: str | Path | None = None,
                  **campaign_kwargs) -> QuickReport:
    """Time a few workloads of ``models`` on a device that has no profile, and adapt a learned
    model to it from them.

    Parameters
    ----------
    store : ProfileStore
        Where the timings go (with the models' workloads); a store holding earlier timings of
        the device adapts on those too.
    device_spec : str
        The device (``cpu:0``, ``cpu:0:native``, ``rpc:...``).
    models : sequence of (name, tvm.IRModule)
        The models whose workloads to choose from
        (:func:`~autoplace.predict.adapt.choose_workloads`).
    count : int
        Workloads to time at most.
    base, base_path : optional
        The model to adapt and where it is saved; default the learned model shipped for the
        device's kind (:func:`~autoplace.predict.adapt.shipped_base`).
    out : path, optional
        Save the adapted model there (:meth:`AdaptedCostModel.save`).
    campaign_kwargs
        For :func:`autoplace.profile.run_campaign` (``policy``, ``progress``, ...).
    """
    from autoplace.predict.rows import profile_rows

    if base is None:
        kind = "cuda" if device_spec.startswith("cuda") else "cpu"
        base, base_path = shipped_base(kind)
    t = time.perf_counter()
    chosen, dev = time_chosen(store, device_spec, models, base, count=count, **campaign_kwargs)
    rows = profile_rows(store, dev.fingerprint)
    model = adapt(base, rows, base_path=base_path)
    if out is not None:
        model.save(out)
    return QuickReport(device_spec, chosen, dev.measured, time.perf_counter() - t, model,
                       None if out is None else str(out))


def time_chosen(store, device_spec: str, models, base, *, count: int = 40,
                skip: frozenset[str] = frozenset(), **campaign_kwargs):
    """Time on ``device_spec`` the workloads :func:`~autoplace.predict.adapt.choose_workloads`
    picks from ``models``
    (``(name, tvm.IRModule)`` pairs; only ops that become kernels of their own, none of
    ``skip`` unless fewer than :data:`~autoplace.predict.adapt.MIN_ROWS` are left) into
    ``store``,
    skipping those it already holds. Returns ``(how many were chosen, the campaign's
    DeviceReport)``; ValueError where the device cannot be reached."""
    from autoplace.graph import OpGraph
    from autoplace.graph.fusion import fused_groups
    from autoplace.profile.campaign import run_campaign
    from autoplace.profile.workload import single_op_modules

    graphs, modules, in_kernel, every = [], {}, set(), set()
    for name, mod in models:
        g = OpGraph.from_relax(mod)
        graphs.append(g)
        modules.update(single_op_modules(mod, g))
        store.add_workloads(g.nodes, model=name)
        every.update(n.workload_key for n in g.nodes)
        for _, nodes in fused_groups(mod, gpu=device_spec.startswith("cuda")):
            in_kernel.update(g.nodes[i].workload_key for i in nodes)
    no_kernel = frozenset(every - in_kernel)
    chosen = choose_workloads(graphs, base, count=count, skip=no_kernel | skip)
    if len(chosen) < MIN_ROWS and skip:  # too few left to adapt on: the heaviest skipped too
        more = choose_workloads(graphs, base, count=count, skip=no_kernel)
        chosen += [k for k in more if k not in chosen][:MIN_ROWS - len(chosen)]
    keys = [k for k in chosen if k in modules]
    rep = run_campaign([("quick", modules[k]) for k in keys], [device_spec], store,
                       links=False, **campaign_kwargs)
    dev = rep.devices[0]
    if dev.error:
        raise ValueError(f"cannot time on {device_spec}: {dev.error}")
    return len(keys), dev
