"""Active refinement: measure next the workloads the learned model is least sure about.

Each round fits :class:`XGBCostModel` on what the store holds for a device, draws candidate
shape-sweep workloads of the op types it knows, predicts them, measures the ``size`` with the
widest P10–P90 band, and scores the model on them *before* it learns them: that error, round
after round, is how the model improves where it was weakest.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np

from autoplace.graph import OpGraph
from autoplace.predict.features import workload_row
from autoplace.predict.rows import profile_rows
from autoplace.predict.learned import XGBCostModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefineRound:
    """One round: how many were measured, their band width, and the model's error on them."""

    round: int
    trained_on: int
    measured: int
    mean_band: float   # mean P90 / P10 of the picked workloads, before measuring them
    mape: float        # mean |predicted - measured| / measured on them, before training on them
    within_25: float

    def to_dict(self) -> dict:
        return asdict(self)


def refine(store, device_spec: str, *, rounds: int = 2, size: int = 16, candidates: int = 8,
           rng: np.random.Generator | None = None, drift_tolerance: float | None = None,
           **campaign_kwargs) -> list[RefineRound]:
    """Run ``rounds`` rounds of picking and measuring ``size`` workloads on ``device_spec``.

    ``candidates`` is how many sweep workloads are drawn per op type, sweep family with layers
    of it (:func:`~autoplace.profile.sweeps.sweep_families`) and round; ``drift_tolerance``
    (checked before the first round measures) and ``campaign_kwargs`` go to
    :func:`autoplace.profile.run_campaign` (policy, progress...).
    """
    from autoplace.profile.campaign import run_campaign
    from autoplace.profile.sweeps import sweep, sweep_families, sweep_names

    rng = rng or np.random.default_rng(0)
    device = store.device(device_spec).fingerprint
    out = []
    for r in range(rounds):
        rows = profile_rows(store, device)
        if not rows:
            raise ValueError(f"nothing measured on {device_spec} yet: profile some models first")
        model = XGBCostModel().fit(rows)
        done = {m.workload for m in store.measurements(device)}
        pool = []
        for op in sorted(set(sweep_names()) & set(model.op_types_)):
            for family in sweep_families(op):
                try:
                    drawn = sweep(op, candidates, family=family,
                                  rng=np.random.default_rng(rng.integers(2**31)))
                except RuntimeError:  # fewer distinct shapes exist than asked for
                    continue
                for name, mod in drawn:
                    node = OpGraph.from_relax(mod).nodes[0]
                    if node.workload_key not in done:  # measured, or drawn from another family
                        done.add(node.workload_key)
                        pool.append((name, mod, workload_row(node)))
        if not pool:
            break
        q = model.quantiles([row for _, _, row in pool], device)
        band = q[:, -1] / q[:, 0]
        pick = np.argsort(-band)[:size]
        chosen = [pool[i] for i in pick]
        run_campaign([(f"refine:{name}", mod) for name, mod, _ in chosen], [device_spec], store,
                     links=False, drift_tolerance=drift_tolerance if r == 0 else None,
                     **campaign_kwargs)
        measured = {m.workload: m.latency_s for m in store.measurements(device) if m.ok}
        point = model.predict_workloads([pool[i][2] for i in pick], device)
        pairs = [(p, measured[pool[i][2]["key"]]) for p, i in zip(point, pick)
                 if pool[i][2]["key"] in measured]
        ape = np.array([abs(p - t) / t for p, t in pairs]) if pairs else np.array([np.nan])
        out.append(RefineRound(r + 1, len(rows), len(pairs), float(band[pick].mean()),
                               float(ape.mean()), float(np.mean(ape <= 0.25))))
        log.info("refine round %d: %s", r + 1, out[-1])
    return out
