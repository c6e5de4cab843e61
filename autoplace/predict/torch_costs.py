"""Costs of a torch device (:meth:`autoplace.Device.torch`), from its calls' timings.

A node a torch device runs costs what its PyTorch call took
(:class:`~autoplace.profile.torch_timings.TorchTimings`: its profile's figure, or timed here
on random inputs of its shapes), plus the hand-off of a call from the Relax VM into PyTorch,
plus what a call costs in the model's sequence beyond its time alone. TVM devices cannot run a
PyTorch call (``inf``), a torch device runs nothing it has no call for (``inf``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph
    from autoplace.profile.torch_timings import TorchTimings


class TorchCostModel:
    """Seconds per node on one torch device: each call's time
    (:func:`~autoplace.profile.torch_timings.time_torch_device` took them), the VM's hand-off
    and the call's excess in the model's sequence.

    >>> timings = time_torch_device(graph, Device.torch())          # doctest: +SKIP
    >>> TorchCostModel(timings).predict(graph, Device.torch())      # doctest: +SKIP
    """

    source = "torch-timed"
    #: Relative spread of a PyTorch call's cost in a build, for the guard against losing plans
    #: (a close call is then settled by running it). A call is timed alone on copies of its
    #: inputs; inside a mixed build the calls of models of many small ops ran up to 1.7x that,
    #: and others 1.05-1.2x (docs/results.md): their timing's own noise is far less.
    spread = 0.3

    def __init__(self, timings: TorchTimings):
        self.timings = timings

    def _per_call(self, node: int) -> float:
        return self.timings.handoff(node) + self.timings.in_sequence_s

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        out = np.full(len(graph.nodes), np.inf)
        if device.runtime != "torch":
            return out
        t = self.timings
        if device.torch_place != t.place:
            raise ValueError(f"these timings are of PyTorch on {t.place}, not {device.name!r} "
                             f"({device.torch_place}): one TorchCostModel per torch device")
        for key, idx in graph.workloads().items():
            if not device.can_run(graph.nodes[idx[0]].op_type):
                continue
            if key not in t.calls:
                raise ValueError(f"no timing of {graph.nodes[idx[0]].name!r} "
                                 f"({graph.nodes[idx[0]].op_type}): these timings are of "
                                 "another model; time_torch_device(graph, device) first")
            out[idx] = [t.calls[key] + self._per_call(i) for i in idx]
        return out

    def fused_cost(self, graph: OpGraph, device: Device, chain: Sequence[int]) -> float:
        """Seconds of ``chain`` (node indices of ``graph``: a conv or linear, its bias add and
        its activation, :func:`~autoplace.graph.chains.fused_chains`) run as one call on
        ``device``, plus one call's hand-off and its excess in the model's sequence; ``inf``
        where it was not timed as one."""
        return self.timings.chain_s(graph, chain) + self._per_call(chain[0])

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        """``"measured"`` where a profile timed the node's call, ``"torch-timed"`` where it was
        timed here, ``"unsupported"`` where the device runs no such op."""
        return [("measured" if n.workload_key in self.timings.stored else self.source)
                if device.runtime == "torch" and device.can_run(n.op_type)
                else "unsupported" for n in graph.nodes]

    def describe(self, graph: OpGraph) -> str:
        """Where ``graph``'s PyTorch costs came from, in words."""
        t = self.timings
        keys = set(graph.workloads()) & set(t.calls)
        stored, kept = len(keys & t.stored), len(keys & t.kept)
        here = len(keys) - stored - kept
        prof = t.profile
        return (f"{stored} PyTorch call(s) measured by profile {prof.name} ({prof.fingerprint}), "
                if prof is not None else "") + (
            f"{kept} timed on this host for an earlier model, " if kept else "") + (
            f"{here} timed here{_copies_words(t)}, each + {_handoff_words(t)} from the VM "
            f"({t.handoff_from}) + {t.in_sequence_s * 1e6:.1f} us in the model's sequence (its "
            "calls timed one after another, against alone)") + (
            f"; {t.unscreened} chain(s) not timed as one call: the anchor alone costs more than "
            "another device takes for the whole chain" if t.unscreened else "")


def _copies_words(t: TorchTimings) -> str:
    """``' on copies filling twice the 32 MB last-level cache'`` for calls timed on the CPU."""
    if t.place != "cpu":
        return ""
    from autoplace.profile.host_cache import describe_cpu_cache

    return f" on copies filling twice {describe_cpu_cache()}"


def _handoff_words(t: TorchTimings) -> str:
    """``'5.6 us hand-off'``, or with the range the ops before the calls make of it."""
    low, high = (min(t.handoffs), max(t.handoffs)) if t.handoffs else (t.handoff_s, t.handoff_s)
    if high <= low * 1.05:
        return f"{t.handoff_s * 1e6:.1f} us hand-off"
    return (f"{low * 1e6:.1f}-{high * 1e6:.1f} us hand-off (more where the op before the call "
            "touched more bytes, measured on this host)")


class WithTorch:
    """A TVM cost model (``base``) with runtime devices beside it (torch, ORT): TVM devices get
    ``base``'s costs, ``inf`` for PyTorch calls; each runtime device gets its own model's
    (``models``, by device name: a :class:`TorchCostModel`, an
    :class:`~autoplace.predict.ort_costs.OrtCostModel`). Everything else (profiles,
    overheads) is ``base``'s, for the TVM devices; links too, a torch device's being those of
    the TVM device whose memory it shares (:meth:`links`)."""

    def __init__(self, base, models: Mapping[str, TorchCostModel]):
        self.base = base
        self.models = dict(models)

    @property
    def torch(self) -> TorchCostModel:
        """The first torch device's model."""
        return next(m for m in self.models.values() if isinstance(m, TorchCostModel))

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        if device.runtime != "tvm":
            return self.models[device.name].predict(graph, device)
        cost = np.asarray(self.base.predict(graph, device), dtype=float).copy()
        cost[[n.index for n in graph.nodes if n.is_torch]] = np.inf
        return cost

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        if device.runtime != "tvm":
            return self.models[device.name].sources(graph, device)
        from autoplace.predict.protocol import sources

        return sources(self.base, graph, device)

    def links(self, devices: Sequence[Device]) -> dict:
        """``base``'s links between the TVM devices, and a torch device's: the copies the VM
        makes from and to the TVM device that holds its tensors (the first of ``devices`` of
        its memory, :attr:`~autoplace.devices.Device.memory`), under the torch device's name.
        Between a torch device and that device there is none (a hand-off, charged in each call's
        cost); an ORT device's, to and from every device of its memory, cost what entering or
        leaving a segment costs (its model's ``edge_s`` a tensor and ``edge_byte_s`` a byte)."""
        links = getattr(self.base, "links", None)
        tvm = [d for d in devices if d.runtime == "tvm"]
        found = dict(links(tvm)) if callable(links) else {}
        for t in devices:
            mate = next((d for d in tvm if d.memory == t.memory), None)
            if t.runtime == "tvm" or mate is None:
                continue
            for (a, b), link in list(found.items()):
                if mate.name in (a, b) and t.name not in (a, b):
                    src, dst = (t.name, b) if a == mate.name else (a, t.name)
                    found[(src, dst)] = replace(link, src=src, dst=dst)
        from autoplace.devices import Link

        for t in devices:
            model = self.models.get(t.name)
            if t.runtime != "ort" or model is None:
                continue
            beta = 1 / model.edge_byte_s if model.edge_byte_s > 0 else np.inf
            for d in devices:
                if d.name != t.name and d.memory == t.memory:
                    found[(t.name, d.name)] = Link(t.name, d.name, alpha=model.edge_s, beta=beta)
                    found[(d.name, t.name)] = Link(d.name, t.name, alpha=model.edge_s, beta=beta)
        return found

    def overheads(self, devices: Sequence[Device]) -> dict:
        over = getattr(self.base, "overheads", None)
        return over([d for d in devices if d.runtime == "tvm"]) if callable(over) else {}

    def __getattr__(self, name: str) -> Any:
        if name in ("base", "models"):
            raise AttributeError(name)
        return getattr(self.base, name)

