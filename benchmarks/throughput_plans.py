"""Throughput plans run as a user runs them, against what a user would run instead.

Run: .venv/bin/python -m benchmarks throughput_plans [--models zoo:resnet resnet18 ...]
     [--device cpu:0 --device cpu:1] [--inputs 64] [--rounds 3] [--db auto|none|PATH]
     [--no-guard] [--json [FILE]] [--profile FILE ...]

Per model, ``autoplace.optimize(objective="throughput")`` (default cost model or the measured
profiles of ``--profile``, tuning records,
replication allowed, the baseline guard on unless ``--no-guard``) plans over the devices; then,
``--rounds`` times, the measurement of ``autoplace optimize --run N``: the plan's pipeline (or
replicas, or the single device the guard returned) as ``res.pipeline()`` builds it (with its
trial of the plans the guard passed over within its margin, ``res.contenders``, where it has
any) over ``--inputs`` inputs and, on the same inputs, the baselines a user would run instead:

- sequential: the fastest single-device build called on each input in turn;
- all threads: one CPU device's build with the threads of all the plan's CPU devices;
- replicas: every device running the whole model on alternate inputs.

The table gives medians over the rounds: the plan's measured and predicted inputs/s, and the
plan's rate over each baseline's in the same round (> 1: the plan is faster). Target (issue 24): measured/predicted
within 0.85-1.15 and every plan >= 0.97x the best baseline.

Models: ``autoplace.zoo`` names (``zoo:NAME``) and those of ``benchmarks/_models.py``
(``resnet18``, ``mobilenet_v3_small``, ``bert``; the ``bench`` extra).
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import autoplace
from autoplace.cli.optimize import pipeline_report
from _timing import aligned
from latency_plans import _or_dash, bench_all, common_parser, cost_model, load, start

BASELINES = ("sequential", "all_threads", "replicas")


def bench(name: str, devices, args) -> dict:
    mod, inputs = load(name)
    res = autoplace.optimize(mod, devices, objective="throughput",
                             db=None if args.db == "none" else args.db,
                             baseline_guard=not args.no_guard, cost_model=cost_model(args))
    model = SimpleNamespace(mod=mod, inputs=inputs)
    rounds = [pipeline_report(res, model, devices, args.inputs) for _ in range(args.rounds)]
    rates = {"plan": statistics.median(r["measured_inputs_per_s"] for r in rounds)}
    for b in BASELINES:
        got = [r[f"{b}_inputs_per_s"] for r in rounds if r[f"{b}_inputs_per_s"] is not None]
        if got:
            rates[b] = statistics.median(got)
    # Each round's pipeline() ran its own trial where the plan has contenders: the plan that
    # ran, its prediction and measured/predicted are each round's.
    kinds = dict.fromkeys(_kind(r) for r in rounds)
    known = [r for r in rounds if r["predicted_inputs_per_s"] is not None]
    return {
        "model": name, "ops": len(res.graph.nodes), "plan": "/".join(kinds),
        "guard": None if res.guard is None or res.guard.kept else res.guard.baseline,
        "trials": [r["pipeline_trial"] for r in rounds if r["pipeline_trial"]],
        "predicted_inputs_per_s": (statistics.median(r["predicted_inputs_per_s"] for r in known)
                                   if known else None),
        "inputs_per_s": rates, "rounds": rounds, "cost_model": res.cost_model,
        "measured/predicted": (statistics.median(r["measured_inputs_per_s"]
                                                 / r["predicted_inputs_per_s"] for r in known)
                               if known else None),
        # Per round, then the median: the plan and its baselines ran one after another.
        "vs": {b: statistics.median(r["measured_inputs_per_s"] / r[f"{b}_inputs_per_s"]
                                    for r in rounds if r[f"{b}_inputs_per_s"] is not None)
               for b in BASELINES if b in rates},
        "max_abs_err": max(r["max_abs_err"] for r in rounds),
    }


def _kind(report: dict) -> str:
    """What a round's pipeline ran: replicas, N stages, all threads or one device."""
    if report["replicated"]:
        return "replicas"
    if report["stages"] > 1:
        return f"{report['stages']} stages"
    return "all threads" if report["pipeline_plan"].get("threads") else "one device"


def render(rows) -> str:
    head = ["model", "ops", "plan", "pred in/s", "in/s", "meas/pred", "sequential", "all threads",
            "replicas", "vs seq", "vs all thr", "vs repl", "vs best"]
    table = [head]
    for r in rows:
        if "error" in r:
            table.append([r["model"], "error: " + r["error"]] + [""] * (len(head) - 2))
            continue
        rate, vs = r["inputs_per_s"], r["vs"]
        table.append([r["model"], str(r["ops"]), r["plan"],
                      _or_dash(r["predicted_inputs_per_s"], ".1f"),
                      f"{rate['plan']:.1f}", _or_dash(r["measured/predicted"], ".2f"),
                      *(f"{rate[b]:.1f}" if b in rate else "-" for b in BASELINES),
                      *(f"{vs[b]:.2f}x" if b in vs else "-" for b in BASELINES),
                      f"{min(vs.values()):.2f}x"])
    return aligned(
        table, "inputs/s, medians over the rounds; plan: what res.pipeline() ran (the returned "
        "plan, or the contender its trial kept; a/b: rounds differed); 'vs': the plan's rate / "
        "the baseline's in the same round, median (> 1: the plan is faster); 'vs best': against "
        "the best baseline measured.")


def main(argv=None) -> int:
    ap = common_parser(__doc__)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--no-guard", action="store_true", help="keep the solver's plan")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="print the report as JSON instead of a table; with FILE, write it there "
                         "(after every model) and print the table")
    args = ap.parse_args(argv)
    devices, report = start(args)
    return bench_all(bench, render, devices, args, report)


if __name__ == "__main__":
    raise SystemExit(main())
