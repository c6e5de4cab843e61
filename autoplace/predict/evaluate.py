"""How well the learned cost model predicts latencies it was not trained on, against baselines."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import numpy as np

from autoplace.predict.features import parse_key
from autoplace.predict.kernels import KernelAnalysis
from autoplace.predict.rows import check_enough_rows, profile_rows
from autoplace.predict.learned import NearestNeighborCostModel, XGBCostModel
from autoplace.predict.roofline import RooflineCostModel

SPLITS = ("random", "heldout_shapes", "heldout_op_type", "heldout_model")
METRICS = ("mape", "median_ape", "within_10", "within_25", "roofline_mape", "nn_mape",
           "spearman", "kendall")


def evaluate(store, device: str | None = None, *, seed: int = 0,
             learned: Callable[[], object] | None = None, min_op_rows: int = 3,
             shape_draws: int = 5, compiled: Mapping[str, float] | None = None) -> dict:
    """Train on part of a profile and score predictions of the rest, in four splits.

    Splits (every fold fits the learned model, a :class:`RooflineCostModel` fitted to the training
    part's measured peaks, and a :class:`NearestNeighborCostModel` on the same rows):

    - ``random``: 80 / 20 over measured workloads.
    - ``heldout_shapes``: within each op type, 20 % of its distinct shape configurations (input
      shapes) are held out (op types with a single configuration stay in training); metrics
      averaged over ``shape_draws`` independent draws, as one draw's figure moves by several
      points with the seed.
    - ``heldout_op_type``: leave one op type out (those with at least ``min_op_rows``
      measurements), metrics averaged over op types.
    - ``heldout_model``: leave one ``zoo:`` model out: train on every workload that model does not
      use (other models and sweeps), test on its workloads; metrics averaged over models. Also,
      per model, the predicted model ``sum(count * predicted)`` over its ops against two
      references: the **whole-model error** against the model compiled and run whole
      (``compiled``: what a user means by it; fused kernels, the VM's own work), and the
      **sum-of-ops error** against ``sum(count * measured)`` (the cost model's error alone).

    Parameters
    ----------
    store : ProfileStore
    device : str, optional
        Profiled spec or fingerprint; default every device's measurements together.
    seed : int
        Seed of the random and held-out-shape splits.
    learned : callable, optional
        Returns an unfitted learned model; default an :class:`XGBCostModel`, every fold's
        sharing one :class:`~autoplace.predict.kernels.KernelAnalysis`.
    min_op_rows : int
        Op types with fewer measurements are not held out alone.
    shape_draws : int
        Draws of held-out shapes averaged.
    compiled : mapping of str to float, optional
        Measured seconds of each model compiled whole on the device, by the store's model name
        (``zoo:resnet``; :func:`autoplace.profile.whole_model.time_models` times them, with the
        default kernels the profile measured). Without it, or for a model it lacks, the
        whole-model error is ``None``.

    Returns
    -------
    dict
        ``device`` (spec or ``None``), ``n_workloads``, ``noise_cv`` (median spread std/mean of
        the repeats of the measurements), ``retest_within_10`` (the share of the
        ``retest_workloads`` timed in two or more passes whose slowest pass came within 10 % of
        their fastest; ``None`` if none was), and per split a dict of :data:`METRICS` plus
        ``n_test`` and ``folds``: ``mape`` / ``median_ape`` mean / median of
        ``|predicted - measured| / measured``, ``within_10`` / ``within_25`` the fraction within
        10 / 25 %,
        ``roofline_mape`` / ``nn_mape`` the baselines' MAPE, ``spearman`` / ``kendall`` rank
        correlation within each op type of the test part (op types with 3+ rows), averaged
        (``None`` if there is none). ``heldout_model`` adds ``whole_model_error``,
        ``whole_model_roofline_error``, ``sum_of_ops_error`` and ``sum_of_ops_roofline_error``
        (means over models; the whole-model ones over the models with a ``compiled`` time, else
        ``None``) and ``models`` (per model: ``ops``, ``compiled_s``, ``ops_measured_s``,
        ``predicted_s`` (the sum of its predicted ops), ``charged_s`` (the same, the ops its
        CPU build runs no kernel for at 0, as ``optimize`` charges them: what the whole-model
        error compares), ``roofline_s`` and the four errors).
    """
    rows = profile_rows(store, device)
    check_enough_rows(rows, store.path, "evaluating a cost model")
    if learned is None:
        shared = KernelAnalysis()

        def learned():
            return XGBCostModel(analysis=shared)
    rng = np.random.default_rng(seed)
    cvs = [r["cv"] for r in rows if r["cv"] is not None]
    spread = np.array([r["occasion_spread"] for r in rows if r["occasion_spread"] is not None])
    out = {"device": device, "n_workloads": len(rows),
           "noise_cv": float(np.median(cvs)) if cvs else None,
           "retest_workloads": int(spread.size),
           "retest_within_10": float(np.mean(spread <= 0.10)) if spread.size else None}

    n = len(rows)
    test = set(rng.permutation(n)[: max(1, round(0.2 * n))].tolist())
    out["random"] = _folds(rows, [test], learned)

    configs: dict[str, dict[tuple, list[int]]] = {}
    for i, r in enumerate(rows):
        shapes = tuple(s for s, _ in parse_key(r["key"])[1])
        configs.setdefault(r["op_type"], {}).setdefault((r["device"], shapes), []).append(i)
    draws = []
    for _ in range(shape_draws):
        test = set()
        for groups in configs.values():
            keys = list(groups)
            if len(keys) > 1:
                for k in rng.permutation(len(keys))[: max(1, round(0.2 * len(keys)))]:
                    test.update(groups[keys[k]])
        draws.append(test)
    out["heldout_shapes"] = _folds(rows, draws, learned)

    ops = sorted(op for op, g in configs.items() if sum(map(len, g.values())) >= min_op_rows)
    out["heldout_op_type"] = _folds(
        rows, [{i for i, r in enumerate(rows) if r["op_type"] == op} for op in ops], learned)

    models = sorted({m for r in rows for m in r["models"] if m.startswith("zoo:")})
    folds = [{i for i, r in enumerate(rows) if m in r["models"]} for m in models]
    out["heldout_model"] = _folds(rows, folds, learned, whole=models, compiled=compiled)
    return out


def compiled_times(store, device: str | None = None) -> tuple[dict[str, float] | None, str]:
    """The ``compiled`` argument of :func:`evaluate`: the store's ``zoo:`` models compiled whole
    and timed on this machine's device that the store measured (same fingerprint), and a line
    saying what was timed, or why nothing was (several devices, or none of them here).
    About a second per model plus its build."""
    from autoplace.devices import Device
    from autoplace.profile.measure import LocalRunner, fingerprint
    from autoplace.profile.whole_model import time_models

    rows = profile_rows(store, device)
    devices = {(r["device"], r["device_name"]) for r in rows}
    if len(devices) != 1:
        return None, (f"whole models not timed: the store holds {len(devices)} devices "
                      "(pass --device)")
    [(fp, name)] = devices
    for spec in dict.fromkeys([name, "cpu:0", "cpu:0:native", "cuda:0"]):
        try:
            local = Device.from_spec(spec)
            if fingerprint(LocalRunner(local).info()) == fp:
                break
        except Exception:  # noqa: BLE001 - not a spec, or a device this machine lacks
            continue
    else:
        return None, (f"whole models not timed: {name} (fingerprint {fp}) is not a device of "
                      "this machine")
    models = sorted({m for r in rows for m in r["models"] if m.startswith("zoo:")})
    times = time_models(models, local)
    return times, f"{len(times)} models compiled whole and timed on {local.name}"


def _folds(rows, tests: list[set[int]], learned, whole: list[str] | None = None,
           compiled: Mapping[str, float] | None = None) -> dict:
    """Metrics of each fold (train on the rest), averaged over folds."""
    per_fold, per_model = [], {}
    multi = len({r["device"] for r in rows}) > 1
    for k, test in enumerate(tests):
        train = [r for i, r in enumerate(rows) if i not in test]
        held = [r for i, r in enumerate(rows) if i in test]
        if not train or not held:
            continue
        pred = learned().fit(train).predict_workloads(held)
        roof = RooflineCostModel().fit(train).predict_workloads(held)
        near = NearestNeighborCostModel().fit(train).predict_workloads(held)
        per_fold.append(_metrics(held, pred, roof, near))
        if whole is not None:
            for fp in sorted({r["device"] for r in held}):
                mine = [j for j, r in enumerate(held) if r["device"] == fp]
                c = np.array([held[j]["models"][whole[k]] for j in mine], dtype=float)
                meas = float(c @ [held[j]["latency_s"] for j in mine])
                name = f"{whole[k]}@{held[mine[0]]['device_name']}" if multi else whole[k]
                whole_s = (compiled or {}).get(name)
                predicted, roofline = float(c @ pred[mine]), float(c @ roof[mine])
                # The build as optimize charges it: ops that run no kernel cost nothing.
                kc = (np.array([_kernel_counts(whole[k]).get(held[j]["key"], 0) for j in mine],
                               dtype=float) if whole_s is not None else c)
                charged, charged_roof = float(kc @ pred[mine]), float(kc @ roof[mine])
                per_model[name] = {
                    "ops": int(c.sum()), "compiled_s": whole_s, "ops_measured_s": meas,
                    "predicted_s": predicted, "roofline_s": roofline,
                    "charged_s": charged,
                    "whole_model_error": _rel_error(charged, whole_s),
                    "whole_model_roofline_error": _rel_error(charged_roof, whole_s),
                    "sum_of_ops_error": _rel_error(predicted, meas),
                    "sum_of_ops_roofline_error": _rel_error(roofline, meas)}
    res = {m: _mean([f[m] for f in per_fold]) for m in METRICS}
    res["n_test"] = int(sum(f["n"] for f in per_fold))
    res["folds"] = len(per_fold)
    if whole is not None:
        for key in ("whole_model_error", "whole_model_roofline_error", "sum_of_ops_error",
                    "sum_of_ops_roofline_error"):
            res[key] = _mean([v[key] for v in per_model.values()])
        res["models"] = per_model
    return res


@functools.lru_cache(maxsize=None)
def _kernel_counts(spec: str) -> dict[str, int]:
    """``{workload key: nodes}`` of model ``spec`` (``zoo:NAME``) that run in a kernel of its
    CPU build (:func:`autoplace.graph.fusion.fused_groups`): the others cost nothing."""
    from autoplace.graph import OpGraph
    from autoplace.graph.fusion import fused_groups
    from autoplace.zoo import from_spec

    mod = from_spec(spec).mod
    graph = OpGraph.from_relax(mod)
    out: dict[str, int] = {}
    for _, nodes in fused_groups(mod, gpu=False):
        for i in nodes:
            key = graph.nodes[i].workload_key
            out[key] = out.get(key, 0) + 1
    return out


def _rel_error(predicted: float, reference: float | None) -> float | None:
    return None if reference is None else abs(predicted - reference) / reference


def _metrics(held, pred, roof, near) -> dict:
    from scipy import stats

    y = np.array([r["latency_s"] for r in held])
    ape = np.abs(pred - y) / y
    rho, tau = [], []
    for op in sorted({r["op_type"] for r in held}):
        idx = [i for i, r in enumerate(held) if r["op_type"] == op]
        if len(idx) >= 3 and np.ptp(y[idx]) > 0 and np.ptp(pred[idx]) > 0:
            rho.append(stats.spearmanr(y[idx], pred[idx])[0])
            tau.append(stats.kendalltau(y[idx], pred[idx])[0])
    return {"n": len(held), "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
            "within_10": float((ape <= 0.10).mean()), "within_25": float((ape <= 0.25).mean()),
            "roofline_mape": float((np.abs(roof - y) / y).mean()),
            "nn_mape": float((np.abs(near - y) / y).mean()),
            "spearman": _mean(rho), "kendall": _mean(tau)}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else None


def to_json(result: dict) -> dict:
    """:func:`evaluate`'s result as ``autoplace evaluate --json`` prints it: the four splits
    under ``"splits"``, everything else (``noise_cv``, ``retest_within_10``...) beside them."""
    return {"splits": {s: result[s] for s in SPLITS},
            **{k: v for k, v in result.items() if k not in SPLITS}}


def format_table(result: dict) -> str:
    """A readable table of :func:`evaluate`'s result: one row per split, percentages."""
    pct = lambda v: "   -" if v is None else f"{100 * v:5.1f}%"  # noqa: E731
    num = lambda v: "   -" if v is None else f"{v:5.2f}"  # noqa: E731
    lines = [f"{'split':<16}{'n':>5}{'MAPE':>8}{'medAPE':>8}{'<=10%':>8}{'<=25%':>8}"
             f"{'roofline':>10}{'nearest':>9}{'rho':>7}{'tau':>7}"]
    for s in SPLITS:
        r = result[s]
        lines.append(f"{s:<16}{r['n_test']:>5}{pct(r['mape']):>8}{pct(r['median_ape']):>8}"
                     f"{pct(r['within_10']):>8}{pct(r['within_25']):>8}"
                     f"{pct(r['roofline_mape']):>10}{pct(r['nn_mape']):>9}"
                     f"{num(r['spearman']):>7}{num(r['kendall']):>7}")
    hm = result["heldout_model"]
    if hm["whole_model_error"] is None:
        lines.append("whole-model error (leave one model out): not measured (the models were not "
                     "compiled and timed on this device)")
    else:
        lines.append(f"whole-model error (leave one model out; against the model compiled and "
                     f"timed whole): {pct(hm['whole_model_error']).strip()} (roofline "
                     f"{pct(hm['whole_model_roofline_error']).strip()})")
    lines.append(f"sum-of-ops error (the same predictions against the sum of the model's "
                 f"measured ops): {pct(hm['sum_of_ops_error']).strip()} (roofline "
                 f"{pct(hm['sum_of_ops_roofline_error']).strip()})")
    ms = lambda v: "        -" if v is None else f"{1e3 * v:9.3f}"  # noqa: E731
    lines.append(f"  {'model':<24}{'compiled':>10}{'sum of ops':>11}{'predicted':>10}"
                 f"{'charged':>10}{'vs compiled':>12}{'vs ops':>8}{'roofline':>10}   (ms)")
    for name, m in hm["models"].items():
        lines.append(f"  {name:<24}{ms(m['compiled_s']):>10}{ms(m['ops_measured_s']):>11}"
                     f"{ms(m['predicted_s']):>10}{ms(m['charged_s']):>10}"
                     f"{pct(m['whole_model_error']):>12}"
                     f"{pct(m['sum_of_ops_error']):>8}{ms(m['roofline_s']):>10}")
    lines.append(f"noise: median cv of one measurement's repeats {pct(result['noise_cv']).strip()} "
                 f"({result['n_workloads']} measured workloads)")
    if result["retest_workloads"]:
        lines.append(f"noise between occasions: {pct(result['retest_within_10']).strip()} of the "
                     f"{result['retest_workloads']} workloads timed in 2+ passes came within 10% "
                     "of their fastest pass on their slowest")
    else:
        lines.append("noise between occasions: unknown (profile with --passes 2 to measure it; "
                     "it is larger than the repeats' cv)")
    return "\n".join(lines)
