"""Latency plans built, run and timed as a user runs them, against what a user would run instead.

Run: .venv/bin/python -m benchmarks latency_plans [--models zoo:inception resnet18 ...]
     [--device cpu:0 --device cpu:1] [--repeat 30] [--rounds 3] [--db auto|none|PATH]
     [--json [FILE]] [--profile FILE ...] [--overhead]

Per model, ``autoplace.optimize`` (latency; default cost model and tuning records, or the
measured profiles given by ``--profile``, with their overheads) plans over the devices; then, in
one process, one round after another:

- the plan as ``res.compile()`` builds it: the concurrent runner (segments, one worker per device)
  or the single VM, whichever ``res.delivery`` predicts faster, unless the plans the guard passed
  over within its margin (``res.contenders``) ran faster in ``compile``'s trial; both runners of
  the returned plan are timed too;
- the best single device alone, on the caller's thread with TVM's default threads (the solver's
  single-device baseline);
- the best single device with all the cores of this process as TVM threads, called on the
  caller's thread (what a user with these cores runs instead of a two-device plan).

Each round times every runner, starting one runner later than the round before, each once the
process is idle (the TVM workers of the runner timed before spin on for up to a second).

Latencies are medians of ``--repeat`` calls after a warm-up; the table gives the median over
``--rounds`` rounds and measured/predicted for the plan's chosen runner. ``--overhead`` first
measures what a segment costs (``autoplace.run.overhead.measure_segment_overhead``: chains of
one-add segments alternating over the devices; the fit's slope per segment, the adds on one VM
subtracted), the figure behind ``autoplace.solve.problem.SEGMENT_OVERHEAD_S``; ``autoplace
profile`` measures and stores it per device.

Models: ``autoplace.zoo`` names (``zoo:NAME``) and those of ``benchmarks/_models.py``
(``resnet18``, ``mobilenet_v3_small``, ``bert``; the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

import numpy as np

import autoplace
from autoplace import zoo
from autoplace.backend import process_cpus
from autoplace.run.overhead import measure_segment_overhead
from _timing import aligned, median_call_s, settle


def median_ms(fn, inputs, repeat: int) -> float:
    return median_call_s(fn, inputs, repeat) * 1e3


def all_cores(mod, graph, devices, device, records):
    """The whole model built for ``device`` alone, its plan given every core of this process as
    TVM threads: called on the caller's thread, as a user who sets ``TVM_NUM_THREADS`` runs it
    (and as an all-threads plan runs). Returns ``(run, threads)``."""
    threads = len(process_cpus())
    plan = dataclasses.replace(autoplace.place(graph, devices, [("*", device.name)]),
                               threads=threads)
    return autoplace.compile(mod, plan, records=records), threads


def same_build(plan, threads: int | None) -> str | None:
    """The baseline whose build ``plan``'s also is (the two timed are one build: their ratio is
    the noise): "all cores" (one device with ``threads``), "only <device>", or None."""
    used = plan.used_devices()
    if len(used) > 1:
        return None
    if plan.threads is None:
        return f"only {used[0].name}"
    return "all cores" if plan.threads == threads else None


def load(name: str):
    """``(relax module, inputs)`` of a zoo or benchmark model."""
    import _models

    return _models.relax_and_inputs(name)


def bench(name: str, devices, args) -> dict:
    mod, inputs = load(name)
    db = None if args.db == "none" else args.db
    res = autoplace.optimize(mod, devices, db=db, time_limit=args.time_limit,
                             cost_model=cost_model(args))
    graph, dlv = res.graph, res.delivery
    runs = {
        "concurrent": res.compile(concurrent=True),
        "vm": res.compile(concurrent=False),
        "plan": res.compile(),  # with its trial of the contenders, where it has any
    }
    trial = runs["plan"].trial
    singles = {d.name: autoplace.compile(mod, autoplace.place(graph, devices, [("*", d.name)]),
                                         records=res.records) for d in devices}
    ref = singles[devices[0].name](*inputs)
    errors = {}
    for key, run in runs.items():
        errors[key] = max(float(np.max(np.abs(a - b))) for a, b in zip(run(*inputs), ref))
    cpu = [d for d in devices if not d.is_gpu]
    every, threads = (all_cores(mod, graph, devices, cpu[0], res.records) if cpu
                      else (None, None))
    timed = [*runs.items(), *((f"only {d}", run) for d, run in singles.items()),
             *([("all cores", every)] if every is not None else [])]
    rounds: dict[str, list[float]] = {key: [] for key, _ in timed}
    for r in range(args.rounds):
        # Each round starts one runner later: none is always timed right after the same one
        # (a concurrent runner's worker threads, say).
        for key, run in timed[r % len(timed):] + timed[:r % len(timed)]:
            settle()  # the last runner's TVM workers spin on for a while
            rounds[key].append(median_ms(run, inputs, args.repeat))
    for run in runs.values():
        getattr(run, "close", lambda: None)()
    measured = {k: statistics.median(v) for k, v in rounds.items()}
    chosen = measured["plan"]
    if trial is None:
        runner, predicted = dlv.runner, dlv.predicted_s
    else:
        runner, predicted = trial.chosen, trial.kept.predicted_s
    best_single = min(v for k, v in measured.items() if k.startswith("only "))
    same = same_build(runs["plan"].plan, threads)
    baseline = min(best_single, measured.get("all cores", float("inf")))
    return {
        "model": name, "ops": len(graph.nodes), "segments": dlv.segments, "runner": runner,
        "trial": None if trial is None else str(trial), "same_build_as": same,
        "devices_used": len(res.plan.used_devices()),
        # Each runner's prediction with the call (res.baselines have theirs).
        "predicted_ms": {"concurrent": (dlv.concurrent_s + dlv.call_s) * 1e3,
                         "vm": (dlv.serial_s + dlv.call_s) * 1e3,
                         "plan": None if predicted is None else predicted * 1e3,
                         "solver": res.solution.value * 1e3,
                         **{k: v * 1e3 for k, v in res.baselines.items()}},
        "measured_ms": measured, "rounds_ms": rounds, "max_abs_err": errors,
        "all_cores_threads": threads,
        # None where the trial ran a plan nothing predicted (all threads without its costs)
        "measured/predicted": None if predicted is None else chosen / (predicted * 1e3),
        "concurrent measured/predicted": (measured["concurrent"]
                                          / ((dlv.concurrent_s + dlv.call_s) * 1e3)),
        "plan vs best single (x)": best_single / chosen,
        "plan vs best baseline (x)": baseline / chosen,
        "cost_model": res.cost_model,
        "overheads": list(res.overheads_note),
    }


def render(rows) -> str:
    head = ["model", "ops", "seg", "runs as", "pred conc", "pred vm", "conc", "vm", "pred",
            "plan", "best 1 dev", "all cores", "meas/pred", "conc m/p", "vs 1 dev", "vs best",
            "same build as", "each device alone m/p"]
    table = [head]
    for r in rows:
        if "error" in r:
            table.append([r["model"], "error: " + r["error"]] + [""] * (len(head) - 2))
            continue
        m, p = r["measured_ms"], r["predicted_ms"]
        single = min(v for k, v in m.items() if k.startswith("only "))
        table.append([r["model"], str(r["ops"]), str(r["segments"]), r["runner"],
                      f"{p['concurrent']:.3f}", f"{p['vm']:.3f}", f"{m['concurrent']:.3f}",
                      f"{m['vm']:.3f}", _or_dash(p["plan"], ".3f"), f"{m['plan']:.3f}",
                      f"{single:.3f}", f"{m['all cores']:.3f}" if "all cores" in m else "-",
                      _or_dash(r["measured/predicted"], ".2f"),
                      f"{r['concurrent measured/predicted']:.2f}",
                      f"{r['plan vs best single (x)']:.2f}x", f"{r['plan vs best baseline (x)']:.2f}x",
                      r["same_build_as"] or "-",
                      " ".join(f"{k[5:]} {v / p[k]:.2f}" for k, v in m.items()
                               if k.startswith("only ") and p.get(k))])
    return aligned(
        table, "ms, medians. 'runs as': what res.compile() builds (a runner of the returned "
        "plan, or the contender its trial kept); pred, plan, meas/pred: of that; conc m/p: the "
        "concurrent runner's; 'vs': baseline time / plan time (> 1: the plan is faster); all "
        "cores: the best single device with every core; same build as: the baseline the plan's "
        "build also is (their ratio is the noise); each device alone m/p: the whole model built "
        "for one device, measured / predicted.")


def _or_dash(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def common_parser(doc: str) -> argparse.ArgumentParser:
    """The options every plan benchmark takes: models, devices, rounds, tuning records, JSON."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", nargs="+",
                    default=[f"zoo:{n}" for n in zoo.names(include_torch=False)])
    ap.add_argument("--device", action="append", help="cpu:N or cuda:N (default cpu:0 cpu:1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--db", default="auto", help="tuning records: auto (shipped), none, or a store")
    ap.add_argument("--profile", action="append", default=[],
                    help="measured profile JSON for the devices of its kind (repeatable; "
                         "default: optimize's automatic choice)")
    return ap


def cost_model(args):
    """``optimize``'s cost model: the measured profiles of ``--profile``, else "auto"."""
    if not args.profile:
        return "auto"
    from autoplace.predict import MeasuredCostModel
    from autoplace.profile import DeviceProfile

    return MeasuredCostModel([DeviceProfile.load(p) for p in args.profile])


def start(args):
    """The devices of ``args`` and the report's head; prints the load and the devices."""
    devices = [autoplace.Device.from_spec(s) for s in args.device or ["cpu:0", "cpu:1"]]
    print(f"uptime: {os.getloadavg()}; devices {[d.name for d in devices]}", flush=True)
    return devices, {"devices": [d.name for d in devices]}


def bench_all(bench, render, devices, args, report: dict) -> int:
    """``bench(name, devices, args)`` per model (a failure is a row), then the table or JSON
    (``--json FILE`` is written after every model, so that a run cut short keeps what it
    measured). Exit status 1 when a model failed."""
    rows = report["rows"] = []
    for name in args.models:
        try:
            rows.append(bench(name, devices, args))
        except Exception as e:  # noqa: BLE001 - one model's failure is a row
            rows.append({"model": name, "error": f"{type(e).__name__}: {e}"})
        print(f"{name} done", flush=True)
        if args.json not in (None, "-"):
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)
    print(json.dumps(report, indent=1, default=str) if args.json == "-" else render(rows))
    return 1 if any("error" in r for r in rows) else 0


def main(argv=None) -> int:
    ap = common_parser(__doc__)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--overhead", action="store_true", help="measure the segment overhead first")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="print the report as JSON instead of a table; with FILE, write it there "
                         "(after every model) and print the table")
    args = ap.parse_args(argv)
    devices, report = start(args)
    if args.overhead:
        fit = measure_segment_overhead(devices, repeat=args.repeat * 10, max_segments=8)
        report["segment_overhead"] = {"per_segment_us": fit.per_segment_s * 1e6,
                                      "fixed_us": fit.fixed_s * 1e6,
                                      "extra_us_by_segments": {k: e * 1e6 for k, e in
                                                               enumerate(fit.extra_s, 2)}}
        print("segment overhead:", fit, flush=True)
    return bench_all(bench, render, devices, args, report)


if __name__ == "__main__":
    raise SystemExit(main())
