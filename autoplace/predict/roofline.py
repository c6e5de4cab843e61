"""Roofline latency estimate: the slower of compute and memory traffic, plus a launch overhead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph


class RooflineCostModel:
    """``max(flops / peak_flops, bytes / mem_bandwidth) + launch_s`` per node, from the device's peaks.

    Has the cost-model interface (``fit`` / ``predict`` / ``save`` / ``load``); ``fit`` learns
    nothing, so the model is always ready. Its numbers are only as good as the peaks: the
    defaults of :class:`autoplace.Device` are rough; a profiled device replaces them.

    >>> from autoplace import Device, zoo, OpGraph                 # doctest: +SKIP
    >>> RooflineCostModel().predict(OpGraph.from_relax(zoo.load("mlp").mod), Device.cpu())  # doctest: +SKIP
    """

    source = "roofline"

    def __init__(self, launch_s: float = 2e-6):
        self.launch_s = launch_s

    def fit(self, *_args, **_kwargs) -> RooflineCostModel:
        return self

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        """Predicted seconds of every node of ``graph`` on ``device``, in node order."""
        flops = np.array([n.flops for n in graph.nodes], dtype=float)
        moved = np.array([n.bytes_read + n.bytes_written for n in graph.nodes], dtype=float)
        return np.maximum(flops / device.peak_flops, moved / device.mem_bandwidth) + self.launch_s

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"model": "roofline", "launch_s": self.launch_s}))

    @classmethod
    def load(cls, path: str | Path) -> RooflineCostModel:
        d = json.loads(Path(path).read_text())
        if d.get("model") != "roofline":
            raise ValueError(f"{path} is not a roofline cost model (model={d.get('model')!r})")
        return cls(launch_s=d["launch_s"])
