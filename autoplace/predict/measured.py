"""Measured latencies from device profiles, with a fallback model for what was not measured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from autoplace.predict.roofline import RooflineCostModel

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph
    from autoplace.profile.profiles import DeviceProfile


class MeasuredCostModel:
    """The profile's latency where a node's workload was measured on the device, ``inf`` where it
    failed there (the solver then avoids the device), else the ``fallback`` model's prediction.

    Parameters
    ----------
    profiles : DeviceProfile, sequence of them, or mapping device name -> DeviceProfile
        A mapping gives each device (by name) its profile; otherwise a device uses the only
        profile of its kind (``"cpu"``, ``"cuda"``). A device with no profile gets the
        fallback for every node.
    fallback : cost model or sequence of them, optional
        For ops a profile lacks: the first that was fitted on the device (or fitted on none),
        else :class:`RooflineCostModel`. A learned model does not guess for a device it has
        never seen (a CPU-trained model for a GPU).

    >>> model = MeasuredCostModel(DeviceProfile.load("mycpu.json"))         # doctest: +SKIP
    >>> model.sources(graph, Device.cpu(0))[:2]                            # doctest: +SKIP
    ['measured', 'measured']
    """

    source = "measured"

    def __init__(self, profiles, fallback=None):
        self.profiles = profiles
        self.fallback = fallback

    def fit(self, *_args, **_kwargs) -> MeasuredCostModel:
        return self

    def given(self) -> list[DeviceProfile]:
        """Every profile the model holds, whether or not it applies to a device."""
        p = self.profiles
        if isinstance(p, Mapping):
            return list(p.values())
        return list(p) if isinstance(p, Sequence) else [p]

    def profile_for(self, device: Device) -> DeviceProfile | None:
        if isinstance(self.profiles, Mapping):
            return self.profiles.get(device.name)
        same_kind = [x for x in self.given() if x.kind == device.kind]
        return same_kind[0] if len(same_kind) == 1 else None

    def profile_at(self, device: Device, threads: int) -> DeviceProfile | None:
        """A profile of ``device`` measured with ``threads`` TVM threads, or None: its own
        profile if that one was, else the only one given (also under a key that names no
        device) of its kind, hardware, target and TVM version measured with ``threads``."""
        own = self.profile_for(device)
        if own is not None and own.info.get("threads") == threads:
            return own
        same = ("kind", "hardware", "target", "tvm", "remote")
        found = [p for p in self.given() if p.kind == device.kind
                 and p.info.get("threads") == threads
                 and (own is None or all(p.info.get(k) == own.info.get(k) for k in same))]
        found = list({id(p): p for p in found}.values())
        return found[0] if len(found) == 1 else None

    def fallback_for(self, device: Device):
        """The model that predicts what ``device``'s profile lacks: the first ``fallback`` fitted
        on the device (or fitted on none), else :class:`RooflineCostModel`."""
        return self._fallback(device)

    def _fallback(self, device: Device):
        from autoplace.predict.rows import match_device

        f = self.fallback
        for model in f if isinstance(f, Sequence) else [] if f is None else [f]:
            known = getattr(model, "devices_", None)
            if known is None or match_device(device, known) is not None:
                return model
        return RooflineCostModel()

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        """Seconds of every node of ``graph`` on ``device``, in node order; the fallback is
        asked only when the profile lacks some node."""
        prof = self.profile_for(device)
        known = {} if prof is None else {**dict.fromkeys(prof.unsupported, np.inf),
                                         **prof.latency_s}
        keys = [n.workload_key for n in graph.nodes]
        if all(k in known for k in keys):
            return np.array([known[k] for k in keys], dtype=float)
        out = np.array(self._fallback(device).predict(graph, device), dtype=float)
        for i, k in enumerate(keys):
            out[i] = known.get(k, out[i])
        return out

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        """Where each node's number comes from: ``measured``, ``unsupported`` or the fallback's."""
        prof = self.profile_for(device)
        other = getattr(self._fallback(device), "source", "fallback")
        if prof is None:
            return [other] * len(graph.nodes)
        return ["measured" if n.workload_key in prof.latency_s else
                "unsupported" if n.workload_key in prof.unsupported else other
                for n in graph.nodes]

    def overheads(self, devices: Sequence[Device]) -> dict[str, dict[str, float]]:
        """Seconds of each overhead kind (``"stage"``, ``"segment"``, ``"call"``; see
        :data:`autoplace.profile.measurements.OVERHEAD_KINDS`) that each device's profile measured on
        that device alone, by device name; a device whose profile measured none is left out."""
        out = {}
        for d in devices:
            prof = self.profile_for(d)
            found = {f.kind: f.seconds for f in (prof.overheads if prof else ()) if not f.peer}
            if found:
                out[d.name] = found
        return out

    def links(self, devices: Sequence[Device]):
        """Measured :class:`autoplace.Link` for each ordered pair of ``devices`` the profiles
        cover (a copy between two devices of one profile uses that profile's own link)."""
        from autoplace.devices import Link

        out = {}
        for a in devices:
            for b in devices:
                pa, pb = self.profile_for(a), self.profile_for(b)
                if a is b or pa is None or pb is None:
                    continue
                fit = pa.link(pb.fingerprint)
                if fit is not None:
                    out[(a.name, b.name)] = Link(a.name, b.name, fit.alpha_s, fit.beta_bps)
        return out
