"""A learned cost model of one machine, adapted to another from a few measurements.

A model trained on a profile of one CPU predicts that CPU. Another machine (another CPU, another
thread count or build target, or a host of the same name that runs faster) differs by a factor,
and by more on some kinds of ops than on others. :func:`adapt` measures nothing itself: given a
few workloads timed on the new machine (rows of :func:`autoplace.predict.profile_rows`) it fits
how the base model's predictions map to those times, in log space,

    log t_new = log t_base + a + b (log t_base - m) + c[class],

a global factor ``a``, a slope ``b`` (large and small ops move apart: a second thread halves a
large conv, not a 10 µs add) and an offset per op class (:data:`~autoplace.predict.features.OP_CLASSES`)
shrunk towards zero where a class has few rows, and returns an :class:`AdaptedCostModel` that
predicts the new machine. :func:`choose_workloads` picks the workloads worth timing for a model:
the ones that take most of its predicted time, every op class it uses among them.

>>> base = load_cost_model(shipped_dir() / "amd-epyc-cpu-1thread.xgb.json")   # doctest: +SKIP
>>> keys = choose_workloads([graph], base, count=40)                            # doctest: +SKIP
>>> ... time those on the new device into a store ...                           # doctest: +SKIP
>>> model = adapt(base, profile_rows(store, "cpu:0"))                          # doctest: +SKIP
>>> model.predict(graph, Device.cpu(0))                                         # doctest: +SKIP

``autoplace profile --quick --model M --device DEV --db PATH`` does all of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autoplace.predict.features import workload_row
from autoplace.predict.rows import match_device

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph

__all__ = ["AdaptedCostModel", "QuickReport", "adapt", "choose_workloads", "op_class",
           "quick_profile", "shipped_base"]

# Rows a class needs for its own offset to count half: fewer pull it towards the global fit.
SHRINK_ROWS = 3.0
# Ridge weight on the slope, in rows: a few rows of one size say nothing about the slope.
SLOPE_RIDGE = 4.0
SLOPE_LIMIT = 0.5
_Z90 = 1.2816  # the standard normal's 90th percentile


def op_class(op_type: str) -> str:
    """The coarse class of an op type (``"conv"``, ``"matmul"``, ...; ``"elementwise"`` for the
    op types the feature table does not name)."""
    from autoplace.predict.features import _CLASS_OF

    return _CLASS_OF.get(op_type, "elementwise")


def _rows(what) -> list[dict]:
    return [workload_row(n) for n in what.nodes] if hasattr(what, "nodes") else list(what)


class AdaptedCostModel:
    """``base`` (a fitted learned model) predicting as on ``base_device``, corrected to the
    device the adaptation rows were measured on (:func:`adapt`).

    Attributes
    ----------
    devices_ : dict
        The device it predicts (fingerprint -> its record): :class:`MeasuredCostModel` picks it
        as the fallback of that device, and only of that device.
    calibration : dict
        ``a``, ``b``, ``m`` and ``classes`` (class -> offset) of the fit, ``rows`` it was fitted
        on, ``spread`` (std of the log error of a row left out of the fit) and ``before`` /
        ``after`` (median absolute relative error of the base model and of the adapted one on
        the rows, each row left out of the fit that predicts it).
    """

    source = "learned"
    model_name = "adapted"

    def __init__(self, base, base_device: str, device: dict, calibration: dict,
                 base_path: str | None = None):
        self.base = base
        self.base_device = base_device
        self.devices_ = {device["fingerprint"]: device}
        self.calibration = calibration
        self.base_path = base_path

    def _log_correction(self, rows, base_s: np.ndarray) -> np.ndarray:
        c = self.calibration
        x = np.log(base_s)
        classes = np.array([c["classes"].get(op_class(r["op_type"]), 0.0) for r in rows])
        return c["a"] + c["b"] * (x - c["m"]) + classes

    def _check_device(self, device) -> None:
        if device is not None and match_device(device, self.devices_) is None:
            name = next(iter(self.devices_.values())).get("name")
            raise ValueError(f"this model was adapted to {name!r}, not to "
                             f"{getattr(device, 'name', device)!r}: adapt it to that device "
                             "('autoplace profile --quick')")

    def predict_workloads(self, rows, device=None) -> np.ndarray:
        """Seconds of store rows (or graph-node rows) on the adapted device."""
        self._check_device(device)
        rows = list(rows)
        if not rows:
            return np.zeros(0)
        base = self.base.predict_workloads(rows, self.base_device)
        return base * np.exp(self._log_correction(rows, base))

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        """Predicted seconds of every node of ``graph`` on ``device``, in node order."""
        return self.predict_workloads(_rows(graph), device)

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        return [self.source] * len(graph.nodes)

    def quantiles(self, graph_or_rows, device=None) -> np.ndarray:
        """``(n, 3)`` seconds: the base model's band, corrected, widened by the adaptation's
        own spread."""
        self._check_device(device)
        rows = _rows(graph_or_rows)
        if not rows:
            return np.zeros((0, 3))
        q = self.base.quantiles(rows, self.base_device)
        mid = q[:, q.shape[1] // 2]
        corr = self._log_correction(rows, mid)
        widen = _Z90 * self.calibration["spread"]
        out = np.column_stack([q[:, 0] * np.exp(corr - widen), mid * np.exp(corr),
                               q[:, -1] * np.exp(corr + widen)])
        return np.sort(out, axis=1)

    def extrapolated(self, graph_or_rows, device=None) -> np.ndarray:
        """The base model's flag: where its prediction leaves its own training data."""
        self._check_device(device)
        return self.base.extrapolated(_rows(graph_or_rows), self.base_device)

    def describe(self) -> str:
        c = self.calibration
        return (f"adapted on {c['rows']} workloads: x{math.exp(c['a']):.2f} overall, slope "
                f"{c['b']:+.2f}; median error on them (each left out) "
                f"{c['before']:.1%} -> {c['after']:.1%}")

    def save(self, path: str | Path) -> None:
        """One JSON file: the calibration, the device, and where the base model is (a shipped
        model by its file name, else its path as given to :func:`adapt`)."""
        if self.base_path is None:
            raise ValueError("the base model has no file: save it first and pass base_path")
        d = {"model": self.model_name, "format_version": 1, "base": self.base_path,
             "base_device": self.base_device, "device": next(iter(self.devices_.values())),
             "calibration": self.calibration}
        Path(path).write_text(json.dumps(d, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> AdaptedCostModel:
        from autoplace.predict.learned import load_cost_model
        from autoplace.profile.store import shipped_dir

        d = json.loads(Path(path).read_text())
        if d.get("model") != cls.model_name or d.get("format_version") != 1:
            raise ValueError(f"{path} is not an adapted cost model of this autoplace "
                             f"(model={d.get('model')!r}, format {d.get('format_version')})")
        base = Path(d["base"])
        if not base.is_absolute():
            shipped = shipped_dir() / base
            base = shipped if shipped.exists() else Path(path).parent / base
        if not base.exists():
            raise ValueError(f"{path} adapts {d['base']}, which is not there: adapt again "
                             "('autoplace profile --quick')")
        return cls(load_cost_model(base), d["base_device"], d["device"], d["calibration"],
                   base_path=d["base"])


def _fit(x, r, classes) -> dict:
    """The calibration of log ratios ``r`` at log base seconds ``x`` (see the module doc)."""
    m = float(np.mean(x))
    dx = x - m
    a0 = float(np.median(r))
    # Ridge slope about the robust level, clipped: an adaptation of a few rows may not tilt far.
    b = float(np.clip(np.sum(dx * (r - a0)) / (np.sum(dx * dx) + SLOPE_RIDGE),
                      -SLOPE_LIMIT, SLOPE_LIMIT))
    a = float(np.median(r - b * dx))
    left = r - a - b * dx
    offsets = {}
    for c in sorted(set(classes)):
        sel = np.array([k == c for k in classes])
        offsets[c] = float(np.sum(left[sel]) / (sel.sum() + SHRINK_ROWS))
    return {"a": a, "b": b, "m": m, "classes": offsets}


def _apply(fit: dict, x, classes) -> np.ndarray:
    return fit["a"] + fit["b"] * (x - fit["m"]) + np.array([fit["classes"].get(c, 0.0)
                                                             for c in classes])


def adapt(base, rows: Sequence[dict], *, base_device: str | None = None,
          base_path: str | None = None) -> AdaptedCostModel:
    """Adapt ``base`` to the device ``rows`` were measured on.

    Parameters
    ----------
    base : XGBCostModel (or any fitted learned model with ``devices_``, ``predict_workloads``,
        ``quantiles`` and ``extrapolated``)
        The model to adapt, trained on another device.
    rows : sequence of dict
        :func:`~autoplace.predict.profile_rows` of one device (the new one), at least 3.
    base_device : str, optional
        Which of ``base``'s devices (fingerprint) to start from; default its only one of the
        rows' kind.
    base_path : str, optional
        Where ``base`` is saved, for :meth:`AdaptedCostModel.save`.
    """
    rows = [r for r in rows if r.get("latency_s")]
    devices = {r["device"] for r in rows}
    if len(devices) != 1:
        raise ValueError(f"adapt needs rows of one device, got {len(devices)} "
                         "(profile_rows(store, device))")
    if len(rows) < 3:
        raise ValueError(f"only {len(rows)} measured workloads to adapt on: time at least 3 "
                         "(autoplace profile --quick)")
    kind = rows[0].get("device_kind", "cpu")
    if base_device is None:
        same = [fp for fp, d in base.devices_.items() if d.get("kind", "cpu") == kind]
        if len(same) != 1:
            raise ValueError(f"the base model knows {len(same)} {kind} devices: pass base_device")
        base_device = same[0]
    elif base_device not in base.devices_:
        raise ValueError(f"the base model was not trained on {base_device!r}")
    pred = base.predict_workloads(rows, base_device)
    x = np.log(pred)
    r = np.log([row["latency_s"] for row in rows]) - x
    classes = [op_class(row["op_type"]) for row in rows]
    # Each row predicted by a fit it is left out of: what the adaptation does for unseen ops.
    held = np.empty(len(rows))
    for i in range(len(rows)):
        keep = np.arange(len(rows)) != i
        f = _fit(x[keep], r[keep], [c for j, c in enumerate(classes) if j != i])
        held[i] = r[i] - _apply(f, x[i:i + 1], classes[i:i + 1])[0]
    fit = _fit(x, r, classes)
    calibration = {**fit, "rows": len(rows), "spread": float(np.std(held)),
                   "before": float(np.median(np.abs(np.expm1(r)))),
                   "after": float(np.median(np.abs(np.expm1(held))))}
    first = rows[0]
    device = {"fingerprint": first["device"], "name": first.get("device_name"), "kind": kind,
              "threads": first.get("threads"), "target": first.get("target")}
    return AdaptedCostModel(base, base_device, device, calibration, base_path=base_path)


def choose_workloads(graphs: Sequence[OpGraph], base, *, count: int = 40,
                     base_device: str | None = None) -> list[str]:
    """The workload keys of ``graphs`` worth timing on a new device to adapt ``base``: in order
    of predicted time (per-op prediction times the nodes that use it), the heaviest of each op
    class first so that every class the models use gets a row; at most ``count``."""
    weight: dict[str, float] = {}
    cls: dict[str, str] = {}
    rows = {}
    for g in graphs:
        for n in g.nodes:
            rows.setdefault(n.workload_key, workload_row(n))
            cls[n.workload_key] = op_class(n.op_type)
    keys = list(rows)
    if not keys:
        return []
    if base_device is None:
        base_device = next(iter(base.devices_))
    pred = dict(zip(keys, base.predict_workloads([rows[k] for k in keys], base_device)))
    for g in graphs:
        for n in g.nodes:
            weight[n.workload_key] = weight.get(n.workload_key, 0.0) + float(pred[n.workload_key])
    ranked = sorted(keys, key=lambda k: -weight[k])
    # The heaviest workload of each class first (so every class gets a row), then by weight.
    first = list({cls[k]: k for k in reversed(ranked)}.values())
    first.sort(key=lambda k: -weight[k])
    chosen = list(dict.fromkeys([*first, *ranked]))[:count]
    return chosen


def shipped_base(kind: str = "cpu"):
    """``(model, file name)`` of the learned model shipped for a device of ``kind``, the base
    :func:`quick_profile` adapts; ValueError if none or several ship."""
    from autoplace.predict.learned import load_cost_model
    from autoplace.profile.store import shipped_dir

    found = []
    for path in sorted(shipped_dir().glob("*.xgb.json")):
        model = load_cost_model(path)
        if any(d.get("kind", "cpu") == kind for d in model.devices_.values()):
            found.append((model, path.name))
    if len(found) != 1:
        raise ValueError(f"{len(found)} learned models ship for {kind} devices; pass base")
    return found[0]


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
        The models whose workloads to choose from (:func:`choose_workloads`).
    count : int
        Workloads to time at most.
    base, base_path : optional
        The model to adapt and where it is saved; default the learned model shipped for the
        device's kind (:func:`shipped_base`).
    out : path, optional
        Save the adapted model there (:meth:`AdaptedCostModel.save`).
    campaign_kwargs
        For :func:`autoplace.profile.run_campaign` (``policy``, ``progress``, ...).
    """
    import time

    from autoplace.graph import OpGraph
    from autoplace.predict.rows import profile_rows
    from autoplace.profile.campaign import run_campaign
    from autoplace.profile.workload import single_op_modules

    if base is None:
        kind = "cuda" if device_spec.startswith("cuda") else "cpu"
        base, base_path = shipped_base(kind)
    graphs, modules = [], {}
    for name, mod in models:
        g = OpGraph.from_relax(mod)
        graphs.append(g)
        modules.update(single_op_modules(mod, g))
        store.add_workloads(g.nodes, model=name)
    keys = [k for k in choose_workloads(graphs, base, count=count) if k in modules]
    t = time.perf_counter()
    rep = run_campaign([("quick", modules[k]) for k in keys], [device_spec], store,
                       links=False, **campaign_kwargs)
    dev = rep.devices[0]
    if dev.error:
        raise ValueError(f"cannot time on {device_spec}: {dev.error}")
    rows = profile_rows(store, dev.fingerprint)
    model = adapt(base, rows, base_path=base_path)
    if out is not None:
        model.save(out)
    return QuickReport(device_spec, len(keys), dev.measured, time.perf_counter() - t, model,
                       None if out is None else str(out))
