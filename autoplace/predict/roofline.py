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

    Has the cost-model interface (``fit`` / ``predict`` / ``save`` / ``load``). Unfitted, it is
    ready and uses the peaks of the :class:`autoplace.Device` it is asked about (rough defaults).
    ``fit(rows)`` learns each profiled device's effective peak FLOP/s and bandwidth from
    measurements (rows of :func:`autoplace.predict.rows.profile_rows`); a device that matches a
    fitted one (:func:`~autoplace.predict.rows.match_device`) then uses those.

    >>> from autoplace import Device, zoo, OpGraph                 # doctest: +SKIP
    >>> RooflineCostModel().predict(OpGraph.from_relax(zoo.load("mlp").mod), Device.cpu())  # doctest: +SKIP
    """

    source = "roofline"
    #: Relative spread of an estimate, for the guard against losing plans. A roofline fitted to
    #: a profile missed held-out op shapes by a median 65-106 % (docs/results.md); one that
    #: uses a device's rough peaks misses by more.
    spread = 1.0

    def __init__(self, launch_s: float = 2e-6):
        self.launch_s = launch_s

    def fit(self, rows=None, **_kwargs) -> RooflineCostModel:
        """Learn per device the peaks that minimise the mean absolute log error on ``rows``
        (a grid over the FLOP/s and bytes/s the measured ops achieved); no rows: learn nothing."""
        if rows is None:
            return self
        devices = {}
        for fp in dict.fromkeys(r["device"] for r in rows):
            mine = [r for r in rows if r["device"] == fp]
            flops, moved, lat = (np.array(v, dtype=float) for v in zip(*[
                (r["flops"], r["bytes_read"] + r["bytes_written"], r["latency_s"]) for r in mine]))
            devices[fp] = {"name": mine[0].get("device_name"), "kind": mine[0].get("device_kind"),
                           "threads": mine[0].get("threads"), "target": mine[0].get("target"),
                           **_fit_peaks(flops, moved, lat, self.launch_s)}
        self.devices_ = devices
        return self

    def _peaks(self, device) -> tuple[float, float]:
        from autoplace.predict.rows import match_device

        fp = match_device(device, getattr(self, "devices_", {}))
        if fp is not None:
            return self.devices_[fp]["peak_flops"], self.devices_[fp]["mem_bandwidth"]
        if isinstance(device, str):
            raise KeyError(f"no fitted peaks for device {device!r}: fit the model on its "
                           "measurements or pass an autoplace.Device")
        get = device.get if isinstance(device, dict) else (lambda k: getattr(device, k))
        return get("peak_flops"), get("mem_bandwidth")

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        """Predicted seconds of every node of ``graph`` on ``device``, in node order."""
        flops = np.array([n.flops for n in graph.nodes], dtype=float)
        moved = np.array([n.bytes_read + n.bytes_written for n in graph.nodes], dtype=float)
        peak, bw = self._peaks(device)
        return np.maximum(flops / peak, moved / bw) + self.launch_s

    def predict_workloads(self, rows, device=None) -> np.ndarray:
        """Predicted seconds of store rows, on ``device`` or else each row's own ``device``."""
        out = np.empty(len(rows))
        for i, r in enumerate(rows):
            peak, bw = self._peaks(device if device is not None else r["device"])
            out[i] = max(r["flops"] / peak, (r["bytes_read"] + r["bytes_written"]) / bw)
        return out + self.launch_s

    def save(self, path: str | Path) -> None:
        d = {"model": "roofline", "launch_s": self.launch_s}
        if hasattr(self, "devices_"):
            d["devices"] = self.devices_
        Path(path).write_text(json.dumps(d))

    @classmethod
    def load(cls, path: str | Path) -> RooflineCostModel:
        d = json.loads(Path(path).read_text())
        if d.get("model") != "roofline":
            raise ValueError(f"{path} is not a roofline cost model (model={d.get('model')!r})")
        model = cls(launch_s=d["launch_s"])
        if "devices" in d:
            model.devices_ = d["devices"]
        return model


def _fit_peaks(flops, moved, lat, launch_s: float) -> dict:
    """Peak FLOP/s and bytes/s minimising mean |log(predicted / measured)| over a 64x64 grid."""
    work = np.maximum(lat - launch_s, lat * 0.05)
    rate = flops[flops > 0] / work[flops > 0]
    bw = moved / work
    peaks = np.geomspace(rate.min(), rate.max() * 4, 64) if rate.size else np.array([1e30])
    bws = np.geomspace(bw.min(), bw.max() * 4, 64)
    pred = np.maximum(flops[None, None] / peaks[:, None, None],
                      moved[None, None] / bws[None, :, None]) + launch_s
    loss = np.abs(np.log(pred / lat[None, None])).mean(axis=2)
    i, j = np.unravel_index(np.argmin(loss), loss.shape)
    return {"peak_flops": float(peaks[i]), "mem_bandwidth": float(bws[j])}
