"""Whole-model latency predicted for model families the cost model never saw, against the build.

The question a user asks of a cost model is "how long will *my* model take": this benchmark asks
it of torchvision CNN families (resnet, mobilenet v2/v3, regnet, shufflenet, efficientnet,
convnext, squeezenet; 224x224) and BERT-style encoders of three sizes, leaving one family out at
a time. Steps (each resumable; run them together or one by one with ``--steps``):

- ``profile``: the shipped CPU profile's workloads (its zoo models and sweeps) measured again into
  ``--db``, then the ops of every model: labels of one occasion (a profiling campaign, one pass;
  the family left out of a score never sees its own).
- ``whole``: each model compiled whole for ``cpu:0`` with TVM's default kernels (what a profile
  measures) and timed: the reference. Kept in ``<db>.whole.json``; ``--again`` times them anew.
- ``score``: per family, an XGBoost model trained on every row of ``--db`` except the workloads of
  that family's models (and of the zoo model of that family: ``zoo:resnet``, ``zoo:mobilenet``,
  ``zoo:transformer``), then each of the family's models predicted on one device, as
  ``optimize`` predicts it (the per-op costs, nothing for ops that run no kernel, the
  device's measured call; the plain per-op sum beside it), and beside it the shipped model's
  prediction (trained on the zoo and sweeps, on the day the shipped profile was measured) and
  the measured ops charged the same way (what a perfect per-op model would predict). With
  ``--two-device``, ``optimize`` on ``cpu:0`` + ``cpu:1`` with the left-out model (as a user gets
  it: the guard on), its plan built and timed against its prediction.
- ``tuned`` (not by default): each model tuned for ``--tune-minutes`` into ``<db>.tuned.db``,
  then its tuned build predicted as ``optimize`` predicts it (each tuned kernel timed alone, the
  other ops at the left-out model's cost) and timed, beside its default-kernel build.

Targets of the issue (printed, not asserted): every model's predicted/measured within 10 %.

    .venv/bin/python -m benchmarks unseen_models --db out/unseen.db
    .venv/bin/python -m benchmarks unseen_models --db out/unseen.db --steps score \\
        --families mobilenet bert --two-device
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _models  # noqa: E402
from _timing import aligned, median_call_s  # noqa: E402

# The zoo model of each family, left out with it (the shipped model was trained on them).
ZOO_OF_FAMILY = {"resnet": "zoo:resnet", "mobilenet": "zoo:mobilenet", "bert": "zoo:transformer"}
SHIPPED = "amd-epyc-cpu-1thread"


def spec(name: str) -> str:
    """The name a model's workloads carry in the store."""
    return f"bench:{name}"


def shipped_workloads():
    """``(name, one-op module)`` of every workload of the shipped CPU profile: the zoo models
    whole, and each sweep workload under its sweep's name."""
    from autoplace import zoo
    from autoplace.profile import shipped_dir
    from autoplace.profile.profiles import load_profile_json
    from autoplace.profile.workload import module_from_key

    data = load_profile_json(shipped_dir() / f"{SHIPPED}.json")
    models = sorted({m for w in data["workloads"] for m in w["models"]})
    out = [(m, zoo.from_spec(m).mod) for m in models if m.startswith("zoo:")]
    out += [(next(iter(w["models"])), module_from_key(w["key"])) for w in data["workloads"]
            if not any(m.startswith("zoo:") for m in w["models"])]
    return out


def profile_step(db: Path, names: list[str], passes: int) -> None:
    """Measure, on this occasion, the shipped profile's workloads (the training set the shipped
    model had) and the benchmark models' ops: labels of one occasion (a profile's rows can be
    off by a factor on another host of the same fingerprint; the campaign prints the drift)."""
    from autoplace.profile import ProfileStore
    from autoplace.profile.campaign import run_campaign

    with ProfileStore(db) as store:
        batches = [("the shipped profile's workloads", shipped_workloads())]
        batches += [(name, [(spec(name), _models.relax_and_inputs(name)[0])]) for name in names]
        for what, models in batches:
            t = time.perf_counter()
            rep = run_campaign(models, ["cpu:0"], store, passes=passes, links=False,
                               progress=False)
            d = rep.devices[0]
            print(f"{what}: {rep.workloads} workloads, {d.measured} timings now "
                  f"({d.unsupported} unsupported) in {time.perf_counter() - t:.0f} s", flush=True)


def whole_step(db: Path, names: list[str], repeat: int, again: bool) -> dict:
    from autoplace import Device
    from autoplace.profile.whole_model import time_model

    path = Path(f"{db}.whole.json")
    done = json.loads(path.read_text()) if path.exists() else {}
    for name in names:
        if name in done and not again:
            continue
        mod, inputs = _models.relax_and_inputs(name)
        t = time.perf_counter()
        timing = time_model(mod, Device.cpu(0), inputs, repeat=repeat, instrumented_runs=1,
                            min_repeat_ms=0)
        done[name] = {"median_s": timing.median, "cv": timing.cv,
                      "load": os.getloadavg()[0], "measured_at": time.strftime("%Y-%m-%d %H:%M")}
        path.write_text(json.dumps(done, indent=1))
        print(f"{name}: {timing.median * 1e3:.2f} ms (cv {timing.cv:.2f}) in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
    return done


def _predicted_s(cost: np.ndarray, mod, graph, device, call_s: float) -> tuple[float, float]:
    """One device's whole-model prediction from its nodes' ``cost`` as ``optimize`` makes it
    (ops that run no kernel cost nothing: :func:`autoplace.predict.per_kernel.fused_costs`), and
    the plain sum of ops."""
    from autoplace.predict.per_kernel import fused_costs

    charged = fused_costs(mod, graph, [device], np.asarray(cost, dtype=float)[:, None])
    return float(charged.sum()) + call_s, float(np.sum(cost)) + call_s


def _left_out_model(rows, family: str, analysis):
    """An XGBoost model trained on ``rows`` less the workloads of ``family``'s models and of its
    zoo model."""
    from autoplace.predict import XGBCostModel

    left_out = {spec(n) for n in _models.FAMILIES[family]} | {ZOO_OF_FAMILY.get(family)}
    train = [r for r in rows if not left_out & set(r["models"])]
    return XGBCostModel(analysis=analysis).fit(train), len(train)


def score_step(db: Path, families: list[str], whole: dict, two_device: bool,
               repeat: int) -> list[list[str]]:
    import autoplace
    from autoplace import Device, OpGraph
    from autoplace.predict import KernelAnalysis, MeasuredCostModel, profile_rows
    from autoplace.predict.saved import load_cost_model
    from autoplace.profile import DeviceProfile, ProfileStore, shipped_dir

    dev = Device.cpu(0)
    shipped_prof = DeviceProfile.load(shipped_dir() / f"{SHIPPED}.json")
    shipped = load_cost_model(shipped_dir() / f"{SHIPPED}.xgb.json")
    call = shipped_prof.overhead("call")
    call_s = call.seconds if call is not None else 0.0
    with ProfileStore(db, readonly=True) as store:
        rows = profile_rows(store)
        prof = DeviceProfile.from_store(store, store.devices()[0].fingerprint)
    measured = MeasuredCostModel(prof)  # the ops as measured (nan-free: all were profiled)
    shared = KernelAnalysis()
    table = [["family", "model", "ops", "measured ms", "pred ms", "pred/meas", "per-op sum",
              "shipped/meas", "meas ops/meas", "outside training", "2-dev plan", "2-dev pred",
              "2-dev meas", "2-dev p/m"]]
    ratios, shipped_ratios, two = [], [], []
    for family in families:
        members = [n for n in _models.FAMILIES[family] if n in whole]
        t = time.perf_counter()
        model, trained_on = _left_out_model(rows, family, shared)
        print(f"{family}: trained on {trained_on} of {len(rows)} rows in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
        for name in members:
            mod, inputs = _models.relax_and_inputs(name)
            graph = OpGraph.from_relax(mod)
            ref = whole[name]["median_s"]
            cost = np.asarray(model.predict(graph, dev))
            pred, plain = _predicted_s(cost, mod, graph, dev, call_s)
            ship, _ = _predicted_s(shipped.predict(graph, dev), mod, graph, dev, call_s)
            ops, _ = _predicted_s(measured.predict(graph, dev), mod, graph, dev, call_s)
            outside = model.extrapolated(graph, dev)
            share = float(cost[outside].sum() / cost.sum())
            ratios.append(pred / ref)
            shipped_ratios.append(ship / ref)
            row = [family, name, str(len(graph.nodes)), f"{ref * 1e3:.2f}", f"{pred * 1e3:.2f}",
                   f"{pred / ref:.2f}", f"{plain / ref:.2f}", f"{ship / ref:.2f}",
                   f"{ops / ref:.2f}",
                   f"{int(outside.sum())} ({share:.0%})"]
            if two_device:
                res = autoplace.optimize(mod, [Device.cpu(0), Device.cpu(1)], cost_model=model,
                                         db=None)
                run = res.compile()
                got = median_call_s(run, inputs, repeat)
                p = res.predicted_latency_s  # the returned plan, as its build runs it, with its call
                two.append(p / got)
                used = sorted(set(res.plan.assignment))
                row += ["+".join(used), f"{p * 1e3:.2f}", f"{got * 1e3:.2f}", f"{p / got:.2f}"]
            else:
                row += ["", "", "", ""]
            table.append(row)
            print("  ".join(row), flush=True)
    summary = [_summary("left-out model", ratios), _summary("shipped model", shipped_ratios)]
    if two:
        summary.append(_summary("two-device plans", two))
    print(aligned(table, "\n".join(summary)))
    return table


def tuned_step(db: Path, families: list[str], names: list[str], minutes: float,
               repeat: int) -> None:
    """Tune ``names`` (``minutes`` each) into the store ``<db>.tuned.db``, then predict each
    tuned build as ``optimize`` does (every tuned kernel's time, measured alone; the ops no tuned
    kernel covers at the left-out model's cost) and time it."""
    import autoplace
    from autoplace import Device
    from autoplace.predict import KernelAnalysis, profile_rows
    from autoplace.profile import ProfileStore

    dev = Device.cpu(0)
    tuned_db = Path(f"{db}.tuned.db")
    with ProfileStore(db, readonly=True) as store:
        rows = profile_rows(store)
    shared = KernelAnalysis()
    table = [["family", "model", "tuned/default kernels", "pred ms", "meas ms", "pred/meas",
              "default-kernel build ms"]]
    ratios = []
    for family in families:
        members = [n for n in _models.FAMILIES[family] if n in names]
        if not members:
            continue
        model, _ = _left_out_model(rows, family, shared)
        for name in members:
            mod, inputs = _models.relax_and_inputs(name)
            t = time.perf_counter()
            autoplace.tune(mod, [dev], db=tuned_db, trials=64, time_limit_s=minutes * 60,
                           progress=False)
            print(f"{name}: tuned for {time.perf_counter() - t:.0f} s", flush=True)
            res = autoplace.optimize(mod, [dev], cost_model=model, db=tuned_db)
            got = median_call_s(res.compile(), inputs, repeat)
            default = autoplace.optimize(mod, [dev], cost_model=model, db=None)
            slow = median_call_s(default.compile(), inputs, repeat)
            ratios.append(res.predicted_latency_s / got)
            table.append([family, name, f"{res.kernels['tuned']}/{res.kernels['default']}",
                          f"{res.predicted_latency_s * 1e3:.2f}", f"{got * 1e3:.2f}",
                          f"{res.predicted_latency_s / got:.2f}", f"{slow * 1e3:.2f}"])
            print("  ".join(table[-1]), flush=True)
    print(aligned(table, _summary("tuned builds", ratios)))


def _summary(what: str, ratios: list[float]) -> str:
    if not ratios:
        return f"{what}: no model"
    within = sum(abs(r - 1) <= 0.10 for r in ratios)
    return (f"{what}: predicted/measured median {statistics.median(ratios):.2f}, "
            f"{within} of {len(ratios)} within 10 % (target: all)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True, help="profile store (made if missing)")
    ap.add_argument("--families", nargs="+", default=list(_models.FAMILIES),
                    choices=list(_models.FAMILIES))
    ap.add_argument("--steps", nargs="+", default=["profile", "whole", "score"],
                    choices=["profile", "whole", "score", "tuned"])
    ap.add_argument("--models", nargs="+", help="only these models of the families")
    ap.add_argument("--tune-minutes", type=float, default=5.0,
                    help="tuned step: minutes of tuning per model (default 5)")
    ap.add_argument("--passes", type=int, default=1, help="profiling passes (default 1)")
    ap.add_argument("--repeat", type=int, default=5, help="timed calls of a whole model")
    ap.add_argument("--again", action="store_true", help="time the whole models anew")
    ap.add_argument("--two-device", action="store_true",
                    help="also optimize, build and time a plan on cpu:0 + cpu:1")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    names = [n for f in args.families for n in _models.FAMILIES[f]
             if not args.models or n in args.models]
    if "profile" in args.steps:
        profile_step(args.db, names, args.passes)
    whole = {}
    if "whole" in args.steps:
        whole = whole_step(args.db, names, args.repeat, args.again)
    elif Path(f"{args.db}.whole.json").exists():
        whole = json.loads(Path(f"{args.db}.whole.json").read_text())
    if "score" in args.steps:
        score_step(args.db, args.families, whole, args.two_device, args.repeat)
    if "tuned" in args.steps:
        tuned_step(args.db, args.families, names, args.tune_minutes, args.repeat)
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)


if __name__ == "__main__":
    main()
