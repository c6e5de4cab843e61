"""The cost model a machine has for its devices when the caller names none."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.predict import RooflineCostModel

log = logging.getLogger(__name__)


#: What ``OptimizeResult.cost_model`` calls roofline costs, whether asked for or fallen back on.
ROOFLINE = "roofline estimates"



def auto_cost_model(devices: Sequence[Device], mod=None, *, calibrate: bool = True,
                    func_name: str = "main", progress: bool = True,
                    graph: OpGraph | None = None, workloads: int | None = None,
                    skip: frozenset[str] = frozenset()) -> tuple[Any, str]:
    """The best cost model this machine has for ``devices``, and a line saying which.

    Per device: the profile shipped in the package (:func:`autoplace.profile.shipped_dir`)
    whose fingerprint is this device's, with the learned model shipped beside it for ops it
    lacks. With ``calibrate`` and the model ``mod`` given, a local CPU device is then checked
    against that profile (:func:`autoplace.pricing.calibrate.check_profile`: a few of its
    workloads timed again, cached per host) and one that does not run as the profile says, or
    that no profile describes, gets the shipped learned model calibrated on a few of ``mod``'s
    own workloads timed here (:func:`autoplace.pricing.calibrate.calibrated`, cached per host:
    the next call times nothing). Otherwise, where no profile applies,
    :class:`RooflineCostModel`. ``graph``: ``mod``'s op graph, where the caller has it;
    ``workloads``: how many a calibration times at most
    (:data:`~autoplace.pricing.calibrate.CALIBRATION_WORKLOADS` by default), none of ``skip``
    (workload keys).
    The files are read on every call: keep the model to reuse it (``optimize(cost_model=...)``).
    """
    from autoplace.predict import MeasuredCostModel, load_cost_model
    from autoplace.profile.profiles import shipped_profile

    profiles, adapted, first, notes = {}, {}, {}, []
    for d, fp in zip(devices, fingerprints(devices)):
        found = shipped_profile(fp)
        local_cpu = calibrate and mod is not None and d.kind == "cpu" and d.spec is not None
        if found is not None and local_cpu:
            graph = graph or OpGraph.from_relax(mod, func_name)
            found, note = _checked_profile(found, d, [n.workload_key for n in graph.nodes])
            notes.append(note)
        if found is not None:
            profiles[d.name] = found
        elif local_cpu:
            if fp not in adapted:
                from autoplace.pricing.calibrate import CALIBRATION_WORKLOADS, calibrated

                cal = calibrated(d, [("model", mod)], progress=progress,
                                 count=workloads or CALIBRATION_WORKLOADS,
                                 overheads=_calibration_overheads, skip=skip)
                adapted[fp], first[fp] = cal, d.name
                notes.append(f"{d.name}: {cal.note}")
            else:
                notes.append(f"{d.name}: calibrated as {first[fp]} (the same CPU and target)")
            profiles[d.name] = (adapted[fp].profile, None)
    if not profiles and not adapted:
        return RooflineCostModel(), f"{ROOFLINE} (no profile of this machine)"
    paths = list(dict.fromkeys(path for _, path in profiles.values() if path is not None))
    learned = [p.with_name(p.stem + ".xgb.json") for p in paths]
    learned = [p for p in learned if p.exists()]
    model = MeasuredCostModel({name: prof for name, (prof, _) in profiles.items()},
                              fallback=[*(c.model for c in adapted.values()),
                                        *map(load_cost_model, learned)])
    parts = []
    if paths:
        names = ", ".join(p.name for p in paths)
        parts.append(f"measured ({names}), " + (
            f"learned ({', '.join(p.name for p in learned)}) for ops they lack" if learned
            else "roofline for ops they lack"))
    return model, "; ".join(parts + notes)



def _calibration_overheads(store, spec: str) -> None:
    """Measure into ``store`` the overheads of running a plan on device ``spec`` (a stage, a
    segment, a call, a kernel's least) that it lacks, in fewer rounds and over shorter chains
    (up to 4 stages or segments: three points of each fit) than ``autoplace profile`` takes: a
    calibration's share of a few seconds."""
    from autoplace.profile.overheads import record_overheads
    from autoplace.run.overhead import measure_overheads

    report = record_overheads([spec], store, functools.partial(
        measure_overheads, rounds=5, max_stages=4, max_segments=4))
    if report.error:
        log.warning("calibration: overheads of %s not measured: %s", spec, report.error)


def _checked_profile(found, device: Device, keys: Sequence[str]):
    """``found`` (a shipped profile and its path) if ``device`` runs a few of its workloads as
    it measured them (:func:`~autoplace.pricing.calibrate.check_profile`; the model's own,
    ``keys``, first), else None; and a line saying which."""
    from autoplace.pricing.calibrate import check_profile

    prof, path = found
    check = check_profile(prof, device, keys)
    if check is None:
        return found, f"{device.name}: profile {path.name} not checked (no workload rebuilds)"
    if check.agrees:
        return found, f"{device.name}: {check.describe()}"
    log.warning("%s: %s: calibrating on this machine instead", device.name, check.describe())
    return None, f"{device.name}: {check.describe()}; calibrated instead"



def fingerprints(devices: Sequence[Device]) -> list[str]:
    """Each device's profile fingerprint (this process's view of it)."""
    from autoplace.profile import LocalRunner, fingerprint

    return [fingerprint(LocalRunner(d).info()) for d in devices]

