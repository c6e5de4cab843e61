"""Cost models learned from a profile: gradient-boosted quantiles, and a nearest-neighbour baseline.

Both are fitted on rows of :func:`autoplace.predict.rows.profile_rows` (one successful
measurement each) and predict the seconds of ops never measured. They share the interface of
:class:`autoplace.predict.RooflineCostModel` (``fit`` / ``predict`` / ``save`` / ``load``), so
either can be the ``fallback`` of :class:`autoplace.predict.MeasuredCostModel`: measured where a
profile has the workload, learned elsewhere.

>>> from autoplace.profile import ProfileStore                          # doctest: +SKIP
>>> rows = profile_rows(ProfileStore("prof.db"))                        # doctest: +SKIP
>>> model = XGBCostModel().fit(rows)                                    # doctest: +SKIP
>>> model.quantiles(graph, Device.cpu(0))[:, 0] <= model.predict(graph, Device.cpu(0))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autoplace.predict.features import (FEATURE_NAMES, cache_features, code_features,
                                        feature_matrix, tir_features, workload_rows)
from autoplace.predict.instructions import InstructionModel
from autoplace.predict.kernels import (CACHE_FEATURE_NAMES, CODE_FEATURE_NAMES, TIR_FEATURE_NAMES,
                                       KernelAnalysis)
from autoplace.predict.rows import match_device, profile_rows
from autoplace.predict.roofline import RooflineCostModel

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph

__all__ = ["NearestNeighborCostModel", "NotFittedError", "XGBCostModel", "booster_from_json",
           "booster_to_json", "profile_rows"]

_DEVICE_COLUMNS = ("threads", "log10_peak_flops", "log10_mem_bandwidth", "log10_t_compute",
                   "log10_t_memory")


class NotFittedError(ValueError):
    """A learned cost model was asked to predict before ``fit`` or ``load``."""


class _Learned:
    """What the learned models share: checks, device resolution, graph -> rows."""

    source = "learned"

    def _check_fitted(self) -> None:
        if not hasattr(self, "devices_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted: call fit(rows) "
                                 "(rows from autoplace.predict.profile_rows) or load(path) first")

    def _device_per_row(self, rows, device) -> list[str | None]:
        """Fingerprint of the fitted device each row is predicted on (None: not a fitted one)."""
        if device is not None:
            return [match_device(device, self.devices_)] * len(rows)
        return [match_device(r.get("device"), self.devices_) for r in rows]

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        """Predicted seconds of every node of ``graph`` on ``device``, in node order."""
        return self.predict_workloads(workload_rows(graph), device)

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        """``"learned"`` for every node."""
        self._check_fitted()
        return [self.source] * len(graph.nodes)


class XGBCostModel(_Learned):
    """Gradient-boosted trees predicting the log latency of a workload, and its P10 / P50 / P90.

    The trees learn the log ratio of the measured latency to a baseline fitted on the same rows:
    with ``tir=True``, where the device compiles with LLVM, an
    :class:`~autoplace.predict.instructions.InstructionModel` of the op's executed instructions,
    else a :class:`RooflineCostModel`. Their features are
    :func:`~autoplace.predict.features.features` and (``tir=True``)
    :func:`~autoplace.predict.features.tir_features`,
    :func:`~autoplace.predict.features.code_features` and
    :func:`~autoplace.predict.features.cache_features`. Two boosters: one of squared error gives
    :meth:`predict` (the mean log ratio), one of XGBoost's ``reg:quantileerror`` gives
    :meth:`quantiles` (three in one model); the squared-error one is the more accurate point on
    held-out shapes (``autoplace/profile/shipped/README.md``). The model records what it was
    trained on (devices, op types, the range of every feature) and :meth:`extrapolated` flags
    predictions outside it.

    Parameters
    ----------
    rounds, max_depth, learning_rate, min_child_weight, subsample : XGBoost settings.
    quantiles : the quantiles to learn; the middle one is the point prediction.
    seed : int
    threads : int, XGBoost threads.
    tir : bool
        Also learn from TVM's per-store features of the op's lowered TIR, from what LLVM
        compiled it to on CPU targets and from its loop nest's cache misses (about 150 ms per
        distinct workload, TVM needed).
    analysis : KernelAnalysis, optional
        Where those are remembered per workload; pass one to models that see the same
        workloads (as :func:`~autoplace.predict.evaluate.evaluate` does). Default: the model's own.
    """

    model_name = "xgboost"

    def __init__(self, rounds: int = 400, max_depth: int = 8, learning_rate: float = 0.05,
                 min_child_weight: float = 2.0, subsample: float = 0.8,
                 quantiles: tuple[float, ...] = (0.1, 0.5, 0.9), seed: int = 0, threads: int = 1,
                 tir: bool = True, analysis: KernelAnalysis | None = None):
        self.rounds = rounds
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.min_child_weight = min_child_weight
        self.subsample = subsample
        self.quantiles_at = tuple(quantiles)
        self.seed = seed
        self.threads = threads
        self.tir = tir
        self.analysis = analysis

    @property
    def _kernels(self) -> KernelAnalysis:
        if self.analysis is None:
            self.analysis = KernelAnalysis()
        return self.analysis

    def _settings(self) -> dict:
        return {"rounds": self.rounds, "max_depth": self.max_depth,
                "learning_rate": self.learning_rate, "min_child_weight": self.min_child_weight,
                "subsample": self.subsample, "quantiles": list(self.quantiles_at),
                "seed": self.seed, "threads": self.threads, "tir": self.tir}

    def _feature_names(self) -> list[str]:
        return [*FEATURE_NAMES, *((*TIR_FEATURE_NAMES, *CODE_FEATURE_NAMES, *CACHE_FEATURE_NAMES)
                                  if self.tir else ())]

    def fit(self, rows) -> XGBCostModel:
        """Fit on measured rows (dicts of :func:`profile_rows`); returns ``self``."""
        import xgboost as xgb

        rows = list(rows)
        if not rows:
            raise ValueError("no measurements to fit on: profile some workloads first")
        self.roofline_ = RooflineCostModel().fit(rows)
        self.devices_ = self.roofline_.devices_
        self.instructions_ = InstructionModel().fit(rows, self._kernels) if self.tir else None
        x, base = self._inputs(rows, None)
        y = np.log([r["latency_s"] for r in rows]) - base
        data = xgb.DMatrix(x, y, feature_names=self._feature_names())
        params = {"tree_method": "hist", "max_depth": self.max_depth, "eta": self.learning_rate,
                  "min_child_weight": self.min_child_weight, "subsample": self.subsample,
                  "seed": self.seed, "nthread": self.threads}
        self.booster_ = xgb.train({**params, "objective": "reg:quantileerror",
                                   "quantile_alpha": np.array(self.quantiles_at)},
                                  data, num_boost_round=self.rounds)
        self.point_booster_ = xgb.train({**params, "objective": "reg:squarederror"}, data,
                                        num_boost_round=self.rounds)
        self.op_types_ = sorted({r["op_type"] for r in rows})
        with np.errstate(all="ignore"):
            self.feature_min_ = np.nanmin(np.where(np.isnan(x), np.inf, x), axis=0)
            self.feature_max_ = np.nanmax(np.where(np.isnan(x), -np.inf, x), axis=0)
        self.n_train_ = len(rows)
        return self

    def _inputs(self, rows, device) -> tuple[np.ndarray, np.ndarray]:
        """Feature matrix and log roofline seconds of ``rows`` on ``device`` (or their own)."""
        fps = self._device_per_row(rows, device)
        targets = [fp if fp is not None else device for fp in fps]
        base = np.log([self.roofline_.predict_workloads([r], t)[0] for r, t in zip(rows, targets)])
        descs = [self.devices_[fp] if fp is not None else device for fp in fps]
        x = feature_matrix(rows, descs)
        if not self.tir:
            return x, base
        targets = [_target(d) for d in descs]
        counted = self.instructions_.predict(rows, fps, targets, self._kernels)
        base = np.log(counted, out=base.copy(), where=counted > 0)  # nan: no counts, keep roofline
        kernels = self._kernels
        return (np.hstack([x, tir_features(rows, kernels, targets),
                           code_features(rows, targets, kernels),
                           cache_features(rows, targets, kernels)]), base)

    def _log_seconds(self, booster, graph_or_rows, device, outputs: int) -> np.ndarray:
        """``(n, outputs)`` log seconds of each node or row: ``booster``'s log ratio plus the
        log roofline seconds."""
        rows = workload_rows(graph_or_rows)
        if not rows:
            return np.zeros((0, outputs))
        return self._applied(booster, *self._inputs(rows, device), outputs)

    def _applied(self, booster, x: np.ndarray, base: np.ndarray, outputs: int) -> np.ndarray:
        import xgboost as xgb

        out = booster.predict(xgb.DMatrix(x, feature_names=self._feature_names()))
        return out.reshape(len(x), outputs) + base[:, None]

    def features_and_seconds(self, rows, device=None) -> tuple[np.ndarray, np.ndarray]:
        """The feature matrix of ``rows`` (store rows or an op graph's) on ``device`` (or each
        row's own) and their predicted seconds, from one pass over their features (what a model
        built on this one's, :func:`autoplace.predict.adapt.adapt`, reads)."""
        self._check_fitted()
        x, base = self._inputs(workload_rows(rows), device)
        return x, np.exp(self._applied(self.point_booster_, x, base, 1)[:, 0])

    def quantiles(self, graph_or_rows, device=None) -> np.ndarray:
        """``(n, len(quantiles))`` seconds: P10 / P50 / P90 of each node or row, sorted per row."""
        self._check_fitted()
        q = self._log_seconds(self.booster_, graph_or_rows, device, len(self.quantiles_at))
        return np.exp(np.sort(q, axis=1))

    def predict_workloads(self, rows, device=None) -> np.ndarray:
        """Seconds of store rows on ``device``, or else on each row's own ``device``."""
        self._check_fitted()
        return np.exp(self._log_seconds(self.point_booster_, rows, device, 1)[:, 0])

    def extrapolated(self, graph_or_rows, device=None) -> np.ndarray:
        """True where a prediction leaves the training data: an op type or device it never saw,
        or a feature outside the range it was trained on."""
        self._check_fitted()
        rows = workload_rows(graph_or_rows)
        fps = self._device_per_row(rows, device)
        x, _ = self._inputs(rows, device)
        with np.errstate(invalid="ignore"):
            out = ((x < self.feature_min_ - 1e-9) | (x > self.feature_max_ + 1e-9)).any(axis=1)
        ops = np.array([_op_type(r) not in self.op_types_ for r in rows], dtype=bool)
        return out | ops | np.array([fp is None for fp in fps], dtype=bool)

    def save(self, path: str | Path) -> None:
        """One JSON file; the trees are XGBoost's own JSON models under ``"booster"`` (the
        quantiles) and ``"point_booster"``."""
        self._check_fitted()
        d = {"model": self.model_name, "format_version": 3, "settings": self._settings(),
             "devices": self.devices_, "launch_s": self.roofline_.launch_s,
             "op_types": self.op_types_, "n_train": self.n_train_,
             "feature_names": self._feature_names(),
             "feature_min": [_num(v) for v in self.feature_min_],
             "feature_max": [_num(v) for v in self.feature_max_],
             "instructions": self.instructions_ and self.instructions_.to_dict(),
             "booster": booster_to_json(self.booster_),
             "point_booster": booster_to_json(self.point_booster_)}
        Path(path).write_text(json.dumps(d))

    @classmethod
    def load(cls, path: str | Path) -> XGBCostModel:
        return cls.from_saved(json.loads(Path(path).read_text()), path)

    @classmethod
    def from_saved(cls, d: dict, path: str | Path) -> XGBCostModel:
        """The model of ``d``, what :meth:`save` wrote to ``path`` (named in errors)."""
        _check_name(d, path, cls.model_name)
        if d.get("format_version") != 3:
            raise ValueError(f"{path} was saved by an older autoplace (format "
                             f"{d.get('format_version')}, this one reads 3); train it again "
                             "('autoplace train')")
        s = d["settings"]
        model = cls(**{**s, "quantiles": tuple(s["quantiles"])})
        if d["feature_names"] != model._feature_names():
            raise ValueError(f"{path} was trained on other features than this autoplace computes; "
                             "train it again ('autoplace train')")
        model.devices_ = d["devices"]
        model.roofline_ = RooflineCostModel(launch_s=d["launch_s"])
        model.roofline_.devices_ = d["devices"]
        model.instructions_ = d["instructions"] and InstructionModel.from_dict(d["instructions"])
        model.op_types_, model.n_train_ = d["op_types"], d["n_train"]
        model.feature_min_ = np.array([_inf(v, -1) for v in d["feature_min"]], dtype=float)
        model.feature_max_ = np.array([_inf(v, +1) for v in d["feature_max"]], dtype=float)
        model.booster_ = booster_from_json(d["booster"], model.threads)
        model.point_booster_ = booster_from_json(d["point_booster"], model.threads)
        return model


class NearestNeighborCostModel(_Learned):
    """The mean measured latency of the ``k`` nearest measured workloads of the same op type (and
    device), in standardised log-feature space; an unseen op type uses all workloads.

    Parameters
    ----------
    k : int
        Neighbours averaged (geometric mean of their latencies).
    """

    model_name = "nearest"

    def __init__(self, k: int = 1):
        self.k = k

    def fit(self, rows) -> NearestNeighborCostModel:
        """Remember measured rows (dicts of :func:`profile_rows`); returns ``self``."""
        rows = list(rows)
        if not rows:
            raise ValueError("no measurements to fit on: profile some workloads first")
        keep = [i for i, n in enumerate(FEATURE_NAMES) if n not in _DEVICE_COLUMNS]
        x = feature_matrix(rows, None)[:, keep]
        self.columns_ = keep
        self.mean_, self.scale_ = x.mean(axis=0), x.std(axis=0) + 1e-9
        self.x_ = (x - self.mean_) / self.scale_
        self.y_ = np.log([r["latency_s"] for r in rows])
        self.op_types_ = np.array([r["op_type"] for r in rows])
        self.row_devices_ = np.array([r["device"] for r in rows])
        self.train_ = [{k: r.get(k) for k in ("key", "op_type", "flops", "bytes_read",
                                              "bytes_written", "device", "latency_s")}
                       for r in rows]
        self.devices_ = {fp: {"name": r.get("device_name"), "kind": r.get("device_kind")}
                         for fp, r in {r["device"]: r for r in rows}.items()}
        return self

    def predict_workloads(self, rows, device=None) -> np.ndarray:
        """Seconds of store rows on ``device``, or else on each row's own ``device``."""
        self._check_fitted()
        rows = list(rows)
        if not rows:
            return np.zeros(0)
        x = (feature_matrix(rows, None)[:, self.columns_] - self.mean_) / self.scale_
        fps = self._device_per_row(rows, device)
        out = np.empty(len(rows))
        for i, (r, fp) in enumerate(zip(rows, fps)):
            pool = self.op_types_ == _op_type(r)
            if fp is not None and (pool & (self.row_devices_ == fp)).any():
                pool &= self.row_devices_ == fp
            if not pool.any():
                pool = np.ones(len(self.y_), dtype=bool)
            idx = np.flatnonzero(pool)
            d = np.linalg.norm(self.x_[idx] - x[i], axis=1)
            out[i] = math.exp(self.y_[idx[np.argsort(d, kind="stable")[:self.k]]].mean())
        return out

    def save(self, path: str | Path) -> None:
        """One JSON file holding the remembered rows."""
        self._check_fitted()
        Path(path).write_text(json.dumps({"model": self.model_name, "format_version": 1,
                                          "k": self.k, "devices": self.devices_,
                                          "rows": self.train_}))

    @classmethod
    def load(cls, path: str | Path) -> NearestNeighborCostModel:
        d = _read(path, cls.model_name)
        meta = d["devices"]
        rows = [{**r, "device_name": meta[r["device"]]["name"],
                 "device_kind": meta[r["device"]]["kind"]} for r in d["rows"]]
        return cls(k=d["k"]).fit(rows)


def _target(device) -> str | None:
    """The TVM target of a fitted device's record (``"target"``) or of a :class:`Device`."""
    if isinstance(device, dict):
        return device.get("target")
    return str(device.tvm_target()) if hasattr(device, "tvm_target") else None


def _op_type(row) -> str:
    return row.get("op_type") or json.loads(row["key"])[0].removeprefix("relax.")


def _read(path, name: str) -> dict:
    d = json.loads(Path(path).read_text())
    _check_name(d, path, name)
    return d


def _check_name(d: dict, path, name: str) -> None:
    if d.get("model") != name:
        raise ValueError(f"{path} is not a {name} cost model (model={d.get('model')!r})")


def booster_to_json(booster) -> dict:
    """An XGBoost booster's trees as XGBoost's own JSON model, to save in a cost model's file."""
    return json.loads(bytes(booster.save_raw(raw_format="json")))


def booster_from_json(trees: dict, threads: int):
    """The XGBoost booster of ``trees`` (:func:`booster_to_json`), predicting on ``threads``
    threads."""
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(json.dumps(trees).encode()))
    booster.set_param({"nthread": threads})
    return booster


def _num(v: float):
    return None if not np.isfinite(v) else float(v)


def _inf(v, sign: int) -> float:
    return -sign * math.inf if v is None else v  # missing min -> +inf, missing max -> -inf
