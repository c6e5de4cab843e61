"""Pipelined throughput per zoo model: measured vs sequential vs predicted.

Run: .venv/bin/python -m benchmarks pipeline_throughput [--inputs 64] [--rounds 3] [--models a,b]
     [--micro-batch 1 8]   (a row per micro-batch size, same plan, same inputs)
     [--threads 1 0]   (a row per TVM thread count of each stage; 0: the executor's default)
     [--device cpu:0 --device cuda:0]   (default: two CPU devices, cpu:0 and cpu:1)
     [--no-contiguous] [--stage-overhead SECONDS] [--profile FILE ...] [--json FILE]

For each model: ``optimize(objective="throughput")`` with the default costs and the tuning records
it finds (every build here applies them), a :class:`Pipeline`
of the plan's stages (one thread per stage), and the whole model built for the best single device
(the fastest of each device alone, timed once on the same inputs). Both run
the same inputs in the same process, interleaved ``--rounds`` times; the best round of each is
kept. Each run is printed next to what the solver's cost model predicts for it (sequential: the
best single device as the solver charges it, its call included), and the measured speed-up next
to the predicted one.
Targets (printed, not asserted): >= 1.6x over sequential where the solver balances the stages,
measured within 15 % of predicted.

A second row per model ("halves") runs a hand-made plan beside it: two convex stages split where
the cumulative FLOPs cross one half (first device, then second), to tell the executor's
overhead apart from the plan's balance.

``--json FILE`` also writes every row (and where each device's stage overhead came from) to FILE.
"""

import argparse
import itertools
import json
import os
import time

import numpy as np

import autoplace
from autoplace import zoo
from autoplace.pricing import auto_cost_model
from autoplace.predict import MeasuredCostModel
from autoplace.profile import DeviceProfile
from autoplace.run.baseline import fastest_single_device, random_inputs_like, time_sequential
from autoplace.run.pipeline import Pipeline
from autoplace.solve.simulate import simulate_throughput


def _halves(graph, devs):
    flops = np.cumsum([n.flops for n in graph.nodes])
    k = max(1, min(len(flops) - 1, int(np.searchsorted(flops, flops[-1] / 2))))
    n = len(flops)
    a, b = devs[0].name, devs[1].name
    return autoplace.Plan.from_assignment(graph, devs, [a] * k + [b] * (n - k),
                                          stages=(0,) * k + (1,) * (n - k), objective="throughput")


def _device_indices(problem, plan) -> np.ndarray:
    """The problem's device index of each node of ``plan``."""
    index = {name: k for k, name in enumerate(problem.device_names)}
    return np.array([index[d] for d in plan.assignment])


def _predicted(problem, plan) -> float:
    """Inputs per second the solver's throughput model gives ``plan`` (its stage overheads too)."""
    return 1 / simulate_throughput(problem, _device_indices(problem, plan), plan.stages)


def _stage_costs(problem, plan) -> list[float]:
    """Predicted seconds per input of each stage's ops (its hand-off not included)."""
    a = _device_indices(problem, plan)
    return np.bincount(plan.stages, weights=problem.cost[np.arange(a.size), a]).tolist()


def _row(label, mod, plan, pred, single, seq_pred, xs, rounds, micro_batch, threads, problem,
         records):
    t0 = time.perf_counter()
    with Pipeline.from_plan(mod, plan, micro_batch=micro_batch, records=records,
                            num_threads=threads or None) as pipe:
        t_build = time.perf_counter() - t0
        pipe.run(xs[:4])  # warm-up
        single(*xs[0])
        seq_s, pipe_s, stats = [], [], None
        for _ in range(rounds):
            ref, sec = time_sequential(single, xs)
            seq_s.append(sec)
            outs = pipe.run(xs)
            pipe_s.append(pipe.stats.wall_s)
            if pipe.stats.wall_s <= min(pipe_s):
                stats = pipe.stats
        stages, workers = pipe.staged.stages, pipe.workers
    err = max(float(np.max(np.abs(a - b))) for o, r in zip(outs, ref) for a, b in zip(o, r))
    seq, piped = len(xs) / min(seq_s), len(xs) / min(pipe_s)
    busy = "/".join(f"{u * 100:.0f}" for u in stats.utilisation)
    per_input = "  ".join(f"{b / stats.inputs * 1e6:.0f}/{c * 1e6:.0f}"
                          for b, c in zip(stats.busy_s, _stage_costs(problem, plan)))
    desc = " ".join(f"{d.name}:{len(s.nodes)}" for s, d in workers)  # per replica, if replicated
    print(f"{label:<18}{seq:>9.0f}{seq_pred:>9.0f}{seq / seq_pred:>6.2f}{piped:>9.0f}{pred:>9.0f}"
          f"{piped / pred:>6.2f}{piped / seq:>7.2f}{pred / seq_pred:>7.2f}{err:>9.2g}"
          f"  {len(stages):>3} [{desc}]  busy % {busy}  us busy/pred {per_input}"
          f"  (build {t_build:.1f} s)", flush=True)
    return {"label": label.strip(), "sequential_in_s": seq, "sequential_pred_in_s": seq_pred,
            "pipelined_in_s": piped, "pipelined_pred_in_s": pred, "speedup": piped / seq,
            "speedup_pred": pred / seq_pred, "max_abs_err": err, "stages": len(stages),
            "workers": desc, "utilisation": list(stats.utilisation), "build_s": t_build}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--no-halves", action="store_true", help="skip the two-stage FLOP-split rows")
    ap.add_argument("--contiguous", action=argparse.BooleanOptionalAction, default=True,
                    help="one stage per device (optimize's default; --no-contiguous lets a "
                         "device hold several stages)")
    ap.add_argument("--device", action="append", help="cpu:N or cuda:N (default cpu:0 cpu:1)")
    ap.add_argument("--replicate", action=argparse.BooleanOptionalAction, default=True,
                    help="let the plan be replicas of the whole model where they are predicted "
                         "faster (optimize's default; --no-replicate asks for a pipeline)")
    ap.add_argument("--micro-batch", type=int, nargs="+", default=[1], metavar="N",
                    help="inputs handed between stages together; several values give a row "
                         "each (default 1)")
    ap.add_argument("--threads", type=int, nargs="+", default=[0], metavar="N",
                    help="TVM threads per stage, 0 for the executor's default (CPU devices share "
                         "TVM's default count); several values give a row each")
    ap.add_argument("--stage-overhead", type=float, metavar="SECONDS",
                    help="seconds per stage the solver assumes (default: the library's per "
                         "device kind; 0: plans as if hand-offs were free)")
    ap.add_argument("--profile", action="append", default=[],
                    help="measured profile JSON for the devices of its kind (repeatable; default: "
                         "optimize's automatic choice, printed first)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows to FILE")
    args = ap.parse_args()
    devs = [autoplace.Device.from_spec(s) for s in args.device or ["cpu:0", "cpu:1"]]
    rng = np.random.default_rng(0)
    if args.profile:
        cost_model = MeasuredCostModel([DeviceProfile.load(p) for p in args.profile])
        print(f"costs: measured ({', '.join(args.profile)})")
    else:
        cost_model = "auto"
        print(f"costs: {auto_cost_model(devs)[1]}")
    print(f"{'':<18}{'sequential (best device)':>24}{'pipelined':>24}{'speed-up':>14}")
    print(f"{'model':<18}{'in/s':>9}{'pred':>9}{'m/p':>6}{'in/s':>9}{'pred':>9}{'m/p':>6}"
          f"{'meas':>7}{'pred':>7}{'max err':>9}  stages [device:nodes], busy % per stage")
    report = {"devices": [d.name for d in devs], "profiles": args.profile, "models": []}
    for name in args.models.split(","):
        m = zoo.load(name)
        res = autoplace.optimize(m.mod, devs, objective="throughput", contiguous=args.contiguous,
                                 cost_model=cost_model, stage_overhead_s=args.stage_overhead,
                                 replicate=args.replicate)
        rows = []
        report["models"].append({"model": name, "plan": str(res.plan), "rows": rows,
                                 "cost_model": res.cost_model,
                                 "overheads": list(res.overheads_note),
                                 "overhead_sources": dict(res.overhead_sources)})
        # Running TVM kernels on a thread can pin it to core 0; the pipeline's workers unpin
        # themselves, so the sequential runs here start unpinned too.
        os.sched_setaffinity(0, range(os.cpu_count()))
        xs = random_inputs_like(m.inputs, args.inputs, rng)
        single = fastest_single_device(m.mod, res.graph, devs, xs, records=res.records)[0]
        # The best single device's predicted rate, as the solver charges it (its call too).
        seq_pred = 1 / min((v for k, v in res.baselines.items() if k.startswith("only ")),
                           default=res.problem.cost.sum(axis=0).min())
        plans = [(name, res.plan, 1 / res.solution.value)]
        if not args.no_halves:
            halves = _halves(res.graph, devs)
            plans.append(("  halves", halves, _predicted(res.problem, halves)))
        for label, plan, pred in plans:
            for mb, threads in itertools.product(args.micro_batch, args.threads):
                tag = label + (f" mb{mb}" if len(args.micro_batch) > 1 else "") \
                    + (f" t{threads}" if len(args.threads) > 1 else "")
                rows.append(_row(tag, m.mod, plan, pred, single, seq_pred, xs, args.rounds, mb,
                                 threads, res.problem, res.records))
        if args.json:  # after every model, so that a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    print("pred: the solver's cost model (sequential: the best single device's baseline); "
          "m/p: measured / predicted; us busy/pred: per stage, microseconds per input it worked "
          "(uploads, copies, its call) / its ops' predicted cost.\ntargets: speed-up >= 1.6 "
          "where the solver balances the stages; pipelined m/p within 0.85-1.15")


if __name__ == "__main__":
    main()
