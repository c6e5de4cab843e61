"""Seconds as a weighted sum of the instructions a kernel executes, fitted per device and op type.

The baseline :class:`~autoplace.predict.learned.XGBCostModel` corrects on CPUs, in place of the
roofline: an untuned kernel's time follows what LLVM made of it (vector or scalar arithmetic,
loads, copies) more closely than its FLOPs and bytes (docs/results.md).
"""

from __future__ import annotations

import numpy as np

from autoplace.predict.features import executed_counts
from autoplace.predict.kernels import KernelAnalysis


class InstructionModel:
    """``seconds = w . [executed counts, 1]`` with ``w >= 0`` per (device, op type); the counts
    are :data:`~autoplace.predict.llvm_ir.EXECUTED_COUNT_NAMES`.

    Weights are fitted by non-negative least squares on relative error; an op type with fewer
    than ``min_rows`` measurements on a device uses that device's weights over all its rows.
    Devices without counts (GPUs) or unknown to the fit predict ``nan``.
    """

    def __init__(self, min_rows: int = 8):
        self.min_rows = min_rows

    def fit(self, rows, analysis: KernelAnalysis | None = None) -> InstructionModel:
        """Fit on :func:`~autoplace.predict.rows.profile_rows` rows; returns ``self``. The
        executed counts are remembered by ``analysis`` (default: a new one)."""
        from scipy.optimize import nnls

        rows = list(rows)
        x = self._design(rows, [r.get("target") for r in rows], analysis)
        y = np.array([r["latency_s"] for r in rows])
        self.weights_: dict[str, dict[str, list[float]]] = {}
        for fp in sorted({r["device"] for r in rows}):
            mine = [i for i, r in enumerate(rows) if r["device"] == fp and np.isfinite(x[i]).all()]
            groups = {"*": mine}
            for i in mine:
                groups.setdefault(rows[i]["op_type"], []).append(i)
            for op, idx in groups.items():
                if len(idx) >= (self.min_rows if op != "*" else 1):
                    a = x[idx] / y[idx, None]
                    scale = np.abs(a).max(axis=0) + 1e-30
                    w = nnls(a / scale, np.ones(len(idx)))[0] / scale
                    self.weights_.setdefault(fp, {})[op] = w.tolist()
        return self

    def predict(self, rows, devices: list[str | None], targets: list[str | None],
                analysis: KernelAnalysis | None = None) -> np.ndarray:
        """Seconds of ``rows`` on fitted device fingerprints ``devices`` compiled for
        ``targets`` (one each); ``nan`` where there is no fit or no counts."""
        x = self._design(rows, targets, analysis)
        out = np.full(len(rows), np.nan)
        for i, (r, fp) in enumerate(zip(rows, devices)):
            per_op = self.weights_.get(fp, {})
            w = per_op.get(r.get("op_type"), per_op.get("*"))
            if w is not None:
                out[i] = x[i] @ w
        return out

    def to_dict(self) -> dict:
        return {"min_rows": self.min_rows, "weights": self.weights_}

    @classmethod
    def from_dict(cls, d: dict) -> InstructionModel:
        model = cls(d["min_rows"])
        model.weights_ = d["weights"]
        return model

    @staticmethod
    def _design(rows, targets, analysis: KernelAnalysis | None = None) -> np.ndarray:
        counts = executed_counts(rows, list(targets), analysis)
        return np.hstack([counts, np.ones((len(counts), 1))])
