"""A learned cost model of one machine, adapted to another from a few measurements.

A model trained on a profile of one CPU predicts that CPU. Another machine (another CPU, another
thread count or build target, or a host of the same name that runs faster) differs by a factor,
and by more on some ops than on others: a wider vector unit speeds up the convs whose channels
it divides, not the rest. :func:`adapt` measures nothing itself: given a few workloads timed on
the new machine (rows of :func:`autoplace.predict.profile_rows`) it fits a small booster of
shallow trees on the base model's own features that learns the log ratio of the new machine's
time to the base model's prediction (the base prediction is its starting margin), and returns an
:class:`AdaptedCostModel` that predicts the new machine. With a handful of rows the trees cannot
split and it learns one factor; with tens, how the ratio moves with op class and shape.
:func:`choose_workloads` picks the workloads worth timing for a model: the one that takes most of
the predicted time in each op type it uses, then the heaviest.

>>> base, name = shipped_base("cpu")                                            # doctest: +SKIP
>>> keys = choose_workloads([graph], base, count=40)                            # doctest: +SKIP
>>> ... time those on the new device into a store ...                           # doctest: +SKIP
>>> model = adapt(base, profile_rows(store, "cpu:0"))                          # doctest: +SKIP
>>> model.predict(graph, Device.cpu(0))                                         # doctest: +SKIP

``autoplace profile --quick --model M --device DEV --db PATH`` does all of it
(:func:`autoplace.pricing.calibrate.quick_profile`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autoplace.predict.features import workload_row, workload_rows
from autoplace.predict.learned import XGBCostModel, booster_from_json, booster_to_json
from autoplace.predict.rows import match_device

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph

__all__ = ["AdaptedCostModel", "adapt", "choose_workloads", "op_class", "shipped_base"]

# The residual booster: few shallow, strongly regularised trees, as a few tens of rows allow.
BOOSTER = {"max_depth": 3, "eta": 0.1, "min_child_weight": 3, "lambda": 5.0, "seed": 0,
           "nthread": 1, "objective": "reg:squarederror"}
TREES = 60
FOLDS = 10  # the error of rows left out is estimated over this many folds (each row once)
_Z90 = 1.2816  # the standard normal's 90th percentile


def op_class(op_type: str) -> str:
    """The coarse class of an op type (``"conv"``, ``"matmul"``, ...; ``"elementwise"`` for the
    op types the feature table does not name)."""
    from autoplace.predict.features import _CLASS_OF

    return _CLASS_OF.get(op_type, "elementwise")


class AdaptedCostModel:
    """``base`` (a fitted :class:`~autoplace.predict.XGBCostModel`) predicting as on
    ``base_device``, corrected to the device the adaptation rows were measured on by ``booster``
    (:func:`adapt`).

    Attributes
    ----------
    devices_ : dict
        The device it predicts (fingerprint -> its record): :class:`MeasuredCostModel` picks it
        as the fallback of that device, and only of that device.
    calibration : dict
        ``rows`` it was fitted on, ``factor`` (the median ratio of its predictions to the base
        model's on them), ``spread`` (std of the log error of rows left out of the fit) and
        ``before`` / ``after`` (median absolute relative error on the rows of the base model,
        and of the adapted one fitted without them: :data:`FOLDS` folds).
    """

    source = "learned"
    model_name = "adapted"

    def __init__(self, base, base_device: str, device: dict, booster, calibration: dict,
                 base_path: str | None = None):
        self.base = base
        self.base_device = base_device
        self.devices_ = {device["fingerprint"]: device}
        self.booster = booster
        self.calibration = calibration
        self.base_path = base_path

    def _log_correction(self, rows) -> np.ndarray:
        """log(adapted / base point prediction) of each row."""
        x, base_s = self.base.features_and_seconds(rows, self.base_device)
        return _booster_log(self.booster, x, base_s) - np.log(base_s)

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
        x, base_s = self.base.features_and_seconds(rows, self.base_device)
        return np.exp(_booster_log(self.booster, x, base_s))

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        """Predicted seconds of every node of ``graph`` on ``device``, in node order."""
        return self.predict_workloads(workload_rows(graph), device)

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        return [self.source] * len(graph.nodes)

    def quantiles(self, graph_or_rows, device=None) -> np.ndarray:
        """``(n, 3)`` seconds: the base model's band, moved as the point moved, widened by the
        adaptation's own spread."""
        self._check_device(device)
        rows = workload_rows(graph_or_rows)
        if not rows:
            return np.zeros((0, 3))
        q = self.base.quantiles(rows, self.base_device)
        corr = self._log_correction(rows)
        widen = _Z90 * self.calibration["spread"]
        out = np.column_stack([q[:, 0] * np.exp(corr - widen), q[:, q.shape[1] // 2]
                               * np.exp(corr), q[:, -1] * np.exp(corr + widen)])
        return np.sort(out, axis=1)

    def extrapolated(self, graph_or_rows, device=None) -> np.ndarray:
        """The base model's flag: where its prediction leaves its own training data."""
        self._check_device(device)
        return self.base.extrapolated(workload_rows(graph_or_rows), self.base_device)

    def describe(self) -> str:
        c = self.calibration
        return (f"adapted on {c['rows']} workloads (x{c['factor']:.2f} the base model's "
                f"prediction, median); median error on them, each left out of the fit: "
                f"{c['before']:.1%} -> {c['after']:.1%}")

    def save(self, path: str | Path) -> None:
        """One JSON file: the booster's trees, the device, and where the base model is (a
        shipped model by its file name, else its path as given to :func:`adapt`)."""
        if self.base_path is None:
            raise ValueError("the base model has no file: save it first and pass base_path")
        d = {"model": self.model_name, "format_version": 2, "base": self.base_path,
             "base_device": self.base_device, "device": next(iter(self.devices_.values())),
             "calibration": self.calibration,
             "booster": booster_to_json(self.booster)}
        Path(path).write_text(json.dumps(d))

    @classmethod
    def load(cls, path: str | Path, base=None) -> AdaptedCostModel:
        """The model :meth:`save` wrote; ``base``: its base model, loaded already (else it is
        loaded from where the file says)."""
        from autoplace.profile.profiles import shipped_dir

        base_model = base
        d = json.loads(Path(path).read_text())
        if not isinstance(d, dict):
            raise ValueError(f"{path} is not an adapted cost model (a JSON "
                             f"{type(d).__name__}): adapt again ('autoplace profile --quick')")
        if d.get("model") != cls.model_name or d.get("format_version") != 2:
            raise ValueError(f"{path} is not an adapted cost model of this autoplace "
                             f"(model={d.get('model')!r}, format {d.get('format_version')}): "
                             "adapt again ('autoplace profile --quick')")
        base = Path(d["base"])
        if not base.is_absolute():
            shipped = shipped_dir() / base
            base = shipped if shipped.exists() else Path(path).parent / base
        if not base.exists():
            raise ValueError(f"{path} adapts {d['base']}, which is not there: adapt again "
                             "('autoplace profile --quick')")
        return cls(XGBCostModel.load(base) if base_model is None else base_model,
                   d["base_device"], d["device"],
                   booster_from_json(d["booster"], BOOSTER["nthread"]), d["calibration"],
                   base_path=d["base"])


def _booster_log(booster, x: np.ndarray, base_s: np.ndarray) -> np.ndarray:
    import xgboost as xgb

    return booster.predict(xgb.DMatrix(x, base_margin=np.log(base_s)))


def _fit_booster(x: np.ndarray, base_s: np.ndarray, seconds: np.ndarray):
    import xgboost as xgb

    data = xgb.DMatrix(x, np.log(seconds), base_margin=np.log(base_s))
    return xgb.train(BOOSTER, data, num_boost_round=TREES)


def adapt(base, rows: Sequence[dict], *, base_device: str | None = None,
          base_path: str | None = None) -> AdaptedCostModel:
    """Adapt ``base`` to the device ``rows`` were measured on.

    Parameters
    ----------
    base : XGBCostModel
        The model to adapt, trained on another device.
    rows : sequence of dict
        :func:`~autoplace.predict.profile_rows` of one device (the new one), at least
        :data:`MIN_ROWS`.
    base_device : str, optional
        Which of ``base``'s devices (fingerprint) to start from; default its only one of the
        rows' kind.
    base_path : str, optional
        Where ``base`` is saved, for :meth:`AdaptedCostModel.save`.
    """
    if not hasattr(base, "features_and_seconds"):
        raise TypeError(f"adapt needs a learned model with features (XGBCostModel), got "
                        f"{type(base).__name__}")
    rows = [r for r in rows if r.get("latency_s")]
    devices = {r["device"] for r in rows}
    if len(devices) != 1:
        raise ValueError(f"adapt needs rows of one device, got {len(devices)} "
                         "(profile_rows(store, device))")
    if len(rows) < MIN_ROWS:
        raise ValueError(f"only {len(rows)} measured workloads to adapt on: time at least "
                         f"{MIN_ROWS} (autoplace profile --quick)")
    kind = rows[0].get("device_kind", "cpu")
    if base_device is None:
        same = [fp for fp, d in base.devices_.items() if d.get("kind", "cpu") == kind]
        if len(same) != 1:
            raise ValueError(f"the base model knows {len(same)} {kind} devices: pass base_device")
        base_device = same[0]
    elif base_device not in base.devices_:
        raise ValueError(f"the base model was not trained on {base_device!r}")
    x, base_s = base.features_and_seconds(rows, base_device)
    t = np.array([r["latency_s"] for r in rows], dtype=float)
    # Each row predicted by a booster fitted without it (FOLDS folds): the error on unseen ops.
    fold = np.arange(len(rows)) % min(FOLDS, len(rows))
    held = np.empty(len(rows))
    for k in np.unique(fold):
        out = fold == k
        b = _fit_booster(x[~out], base_s[~out], t[~out])
        held[out] = _booster_log(b, x[out], base_s[out]) - np.log(t[out])
    booster = _fit_booster(x, base_s, t)
    adapted = np.exp(_booster_log(booster, x, base_s))
    calibration = {"rows": len(rows), "factor": float(np.median(adapted / base_s)),
                   "spread": float(np.std(held)),
                   "before": float(np.median(np.abs(base_s / t - 1))),
                   "after": float(np.median(np.abs(np.expm1(held))))}
    first = rows[0]
    device = {"fingerprint": first["device"], "name": first.get("device_name"), "kind": kind,
              "threads": first.get("threads"), "target": first.get("target")}
    return AdaptedCostModel(base, base_device, device, booster, calibration, base_path=base_path)


#: The fewest measured workloads :func:`adapt` adapts a model on.
MIN_ROWS = 3


def choose_workloads(graphs: Sequence[OpGraph], base, *, count: int = 40,
                     base_device: str | None = None,
                     skip: frozenset[str] = frozenset()) -> list[str]:
    """The workload keys of ``graphs`` worth timing on a new device to adapt ``base``: in order
    of predicted time (per-op prediction times the nodes that use it), the heaviest of each op
    type first so that every op the models use gets a row (and so every class; a type the
    adapted model mispredicts is then charged as timed where it matters most); at most
    ``count``, none of ``skip`` (the workloads whose nodes all run no kernel in the build: they
    cost nothing)."""
    weight: dict[str, float] = {}
    cls: dict[str, str] = {}
    rows = {}
    for g in graphs:
        for n in g.nodes:
            if n.workload_key in skip:
                continue
            rows.setdefault(n.workload_key, workload_row(n))
            cls[n.workload_key] = n.op_type
    keys = list(rows)
    if not keys:
        return []
    if base_device is None:
        base_device = next(iter(base.devices_))
    pred = dict(zip(keys, base.predict_workloads([rows[k] for k in keys], base_device)))
    for g in graphs:
        for n in g.nodes:
            if n.workload_key in pred:
                weight[n.workload_key] = (weight.get(n.workload_key, 0.0)
                                          + float(pred[n.workload_key]))
    ranked = sorted(keys, key=lambda k: -weight[k])
    # The heaviest workload of each op type first (so every type gets a row), then by weight.
    first = list({cls[k]: k for k in reversed(ranked)}.values())
    first.sort(key=lambda k: -weight[k])
    chosen = list(dict.fromkeys([*first, *ranked]))[:count]
    return chosen


def shipped_base(kind: str = "cpu"):
    """``(model, file name)`` of the learned model shipped for a device of ``kind``, the base
    a calibration adapts (:mod:`autoplace.pricing.calibrate`; read from the package on every
    call: keep it to reuse it); ValueError if none or several ship."""
    from autoplace.profile.profiles import shipped_dir

    found = []
    for path in sorted(shipped_dir().glob("*.xgb.json")):
        saved = json.loads(path.read_text())  # the trees are read into XGBoost for one only
        if any(d.get("kind", "cpu") == kind for d in saved.get("devices", {}).values()):
            found.append((saved, path))
    if len(found) != 1:
        raise ValueError(f"{len(found)} learned models ship for {kind} devices; pass base")
    saved, path = found[0]
    return XGBCostModel.from_saved(saved, path), path.name
