"""``autoplace demo`` and ``autoplace optimize``: plan a model's placement, build it and run it."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from autoplace.cli import options

EPILOG_DEMO = """examples:
  autoplace demo                       # resnet over this machine's CPU and runtimes (torch, ORT)
  autoplace demo --model zoo:inception --objective latency
"""
EPILOG_OPTIMIZE = """examples:
  autoplace optimize --model zoo:resnet --device cpu:0 --device cpu:1
  autoplace optimize --model model.onnx --device cpu:0 --device cpu:1 --rule 'op:nn.conv2d#0=cpu0' --json
  autoplace optimize --model zoo:resnet --objective throughput --run 64 --json
  autoplace optimize --model zoo:resnet --device cpu:0 --device cpu:1 --db prof.db   # tuned kernels
"""


def pipeline_report(res, model, devices, n: int) -> dict:
    """Run ``n`` inputs through the plan's pipeline and, in the same run, the baselines:
    "sequential" is the fastest single-device build called on each input in turn, "all threads"
    one CPU device with the threads of all the CPU devices, "replicas" every device running the
    whole model (None where there is no such baseline). Errors are against the sequential
    outputs. Each is timed once the process is idle (:func:`autoplace.backend.settle`): the
    TVM workers of the one before spin on for up to a second."""
    from autoplace.backend import settle
    from autoplace.run.baseline import (fastest_single_device, random_inputs_like,
                                        time_all_threads, time_replicas)

    xs = random_inputs_like(model.inputs, n, np.random.default_rng(0))
    rates, outputs = {}, {}
    with res.pipeline() as pipe:
        pipe.run(xs[:4])  # warm-up
        settle()
        _, ref, seq_s = fastest_single_device(model.mod, res.graph, devices, xs,
                                              records=res.records)
        rates["sequential"] = n / seq_s
        settle()
        timed = time_all_threads(model.mod, res.graph, devices, xs, records=res.records)
        if timed is not None:
            outputs["all_threads"], rates["all_threads"] = timed[0], n / timed[1]
        if "replicas" in res.baseline_plans:
            settle()
            timed = time_replicas(model.mod, res.baseline_plans["replicas"], xs,
                                  records=res.records)
            outputs["replicas"], rates["replicas"] = timed[0], n / timed[1]
        settle()
        outs = pipe.run(xs)
        stats, stages, workers = pipe.stats, pipe.staged.stages, pipe.workers

    def err(got) -> float:
        return max(float(np.max(np.abs(a - b))) for o, r in zip(got, ref) for a, b in zip(o, r))

    ran = pipe.plan  # the returned plan, or the contender pipeline()'s trial kept
    predicted = res.plan.predicted_s if pipe.trial is None else pipe.trial.kept.predicted_s
    return {
        # None where the trial kept a plan nothing predicted (all threads without its costs)
        "predicted_inputs_per_s": None if predicted is None else 1 / predicted,
        "measured_inputs_per_s": stats.inputs_per_s,
        # pipeline()'s trial of the plans predicted faster within the costs' uncertainty
        "pipeline_trial": None if pipe.trial is None else str(pipe.trial),
        "pipeline_plan": json.loads(ran.to_json()),
        "sequential_inputs_per_s": rates["sequential"],
        "all_threads_inputs_per_s": rates.get("all_threads"),
        "replicas_inputs_per_s": rates.get("replicas"),
        "max_abs_err": err(outs),
        "baselines_max_abs_err": {k: err(v) for k, v in outputs.items()},
        "replicated": list(ran.replicas),
        "stages": len(stages),
        "stage_details": [{"stage": s.index, "device": d.name, "nodes": len(s.nodes),
                           "busy_s": b, "utilisation": u}
                          for (s, d), b, u in zip(workers, stats.busy_s, stats.utilisation)],
    }


def _optimize_and_run(args) -> dict:
    import autoplace
    from autoplace import zoo

    if getattr(args, "run", 0) and args.objective != "throughput":
        raise ValueError("--run N measures a pipeline: use it with --objective throughput")
    t0 = time.perf_counter()
    devices = options.devices(args.device)
    model = zoo.from_spec(args.model or options.default_model())
    cost_model = options.cost_model(args)
    res = autoplace.optimize(model.mod, devices, objective=args.objective, solver=args.solver,
                             time_limit=args.time_limit, pins=options.rules(args.rule),
                             cost_model=cost_model, contiguous=args.contiguous,
                             db=getattr(args, "db", None) or (None if args.no_profile
                                                              else "auto"),
                             baseline_guard=not getattr(args, "no_guard", False),
                             calibrate=not args.no_calibrate)
    t_opt = time.perf_counter() - t0
    run = res.compile()
    try:
        outs = run(*model.inputs)
    finally:
        if hasattr(run, "close"):  # a runner with worker threads
            run.close()
    reference = autoplace.compile(  # the same kernels on one device: what placement changed
        model.mod, autoplace.place(res.graph, devices, [("*", devices[0].name)]),
        records=res.records)(*model.inputs)
    err = max(float(np.max(np.abs(a - b))) for a, b in zip(outs, reference))
    out = {
        "model": model.name, "graph": res.graph.summary(), "result": res, "run_plan": run.plan,
        "report": {
            "model": model.name,
            "objective": args.objective,
            "devices": [d.name for d in devices],
            "predicted_s": res.predicted_latency_s,
            "runs_as": None if res.delivery is None else res.delivery.runner,
            # compile()'s trial of the plans predicted faster within the costs' uncertainty
            "trial": None if run.trial is None else str(run.trial),
            "runs_plan": json.loads(run.plan.to_json()),
            "bound_s": res.solution.bound,
            "status": res.solution.status,
            "solver": res.solution.solver,
            "baselines_s": dict(res.baselines),
            "copies": res.copies,
            "cost_model": res.cost_model,
            "cost_sources": sorted(set(res.plan.cost_sources)),
            "profiles": list(res.profiles_note),
            "overheads": list(res.overheads_note),
            "outside_training": list(res.outside_note),
            "overhead_sources": dict(res.overhead_sources),
            "max_abs_err_vs_single_device": err,
            "kernels": dict(run.kernels),
            "optimize_s": t_opt,
            "plan": json.loads(res.plan.to_json()),
        },
    }
    if getattr(args, "run", 0):
        out["report"].update(pipeline_report(res, model, devices, args.run))
    advice = _unseen_machine_advice(args, res, model, run.kernels)
    if advice:
        out["report"]["advice"] = advice
    return out


def _unseen_machine_advice(args, res, model, kernels: dict) -> str | None:
    """One line when nothing measured on these devices was used: no profile matched (roofline
    costs) or no tuning record did (every kernel default), with the commands that fix it and
    how long they take."""
    from autoplace import Device
    from autoplace.tuning.tuner import SECONDS_PER_TRIAL

    profiled = args.no_profile or not res.cost_model.startswith("roofline")  # asked for roofline
    tuned = kernels.get("tuned", 0) > 0
    if profiled and (tuned or not kernels.get("default", 0)):  # (no TVM kernel to tune)
        return None
    spec = args.model or options.default_model()
    every = " ".join(f"--device {d}" for d in args.device)
    devs = " ".join(f"--device {d}" for d in args.device  # a runtime's kernels are not tuned
                    if Device.from_spec(d).runtime == "tvm")
    db = getattr(args, "db", None) or "prof.db"
    steps, seconds = [], 0.0
    if not profiled:
        workloads = len({n.workload_key for n in res.graph.nodes})
        steps.append(f"autoplace profile --model {spec} {every} --db {db}")
        seconds += workloads * len(args.device) * 2.0  # --budget's default per workload
    if not tuned:
        trials = 64
        steps.append(f"autoplace tune --model {spec} {devs} --db {db} --trials {trials}")
        seconds += kernels.get("default", 0) * trials * SECONDS_PER_TRIAL
    what = ("no profile of these devices (roofline costs)" if not profiled else "")
    what += (" and " if what and not tuned else "") + ("no tuning records (default kernels)"
                                                       if not tuned else "")
    quick = ("" if profiled else
             f"; or, in a few minutes, autoplace profile --quick --model {spec} --device "
             f"{args.device[0]} --db {db} (times 40 of its workloads and adapts the shipped "
             "learned model to this machine; autoplace profile --help says how to use it)")
    return (f"{what}: {' && '.join(steps)}  (about {max(seconds / 60, 1):.0f} min; then "
            f"optimize with --db {db}){quick}")


def _cmd_demo(args) -> int:
    spec = args.model or options.default_model()
    if args.objective == "latency" and spec.startswith("zoo:") and _torch_installed():
        from autoplace import zoo

        found = zoo.torch_model(spec[4:])
        if found is not None:  # as a PyTorch user runs it: against eager and ONNX Runtime
            return _demo_pytorch(args, spec, *found)
    out = _optimize_and_run(args)
    rep = out["report"]
    print(f"model {out['model']}: {out['graph']}")
    print(out["result"].summary())
    print(f"kernels: {rep['kernels']['tuned']} tuned, {rep['kernels']['default']} default")
    if "advice" in rep:
        print(rep["advice"])
    print(f"cross-device copies (one per tensor and destination device): {rep['copies']}")
    if rep["trial"]:
        print(f"compile(): {rep['trial']}")
    plan = out["run_plan"]
    used = ", ".join(d.name for d in plan.used_devices()) + (
        f" with {plan.threads} TVM threads" if plan.threads else "")
    print(f"compiled the plan ({used}) and ran: max |difference| from the single-device "
          f"build = {rep['max_abs_err_vs_single_device']:.3g}")
    return 0


def _torch_installed() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _demo_pytorch(args, spec: str, model, inputs) -> int:
    """``optimize_module`` of zoo model ``spec`` (a PyTorch model) over ``--device`` (this
    machine's CPU and runtimes by default): the plan, what it measured against eager, ONNX
    Runtime on the whole model and (``--torch-compile``) frozen ``torch.compile``, which runs,
    and its outputs against eager's."""
    import torch

    from autoplace.pytorch import optimize_module

    devices = options.devices(args.device)
    t0 = time.perf_counter()
    module = optimize_module(
        model, inputs, devices, solver=args.solver, time_limit=args.time_limit,
        pins=options.rules(args.rule), cost_model=options.cost_model(args),
        baseline_guard=not getattr(args, "no_guard", False), calibrate=not args.no_calibrate,
        db=None if args.no_profile else "auto", torch_compile=args.torch_compile)
    took = time.perf_counter() - t0
    with torch.inference_mode():
        got, want = module(*inputs), model(*inputs)
    err = float((got - want).abs().max())
    print(f"model {spec}: {module.result.graph.summary()}")
    print(module.summary())
    if module.times:
        print("per call, measured here in blocks in turn: " + ", ".join(
            f"{name} {s * 1e3:.3f} ms" for name, s in sorted(module.times.items(),
                                                               key=lambda kv: kv[1])))
    used = ", ".join(d.name for d in module.plan.used_devices())
    print(f"optimized and built in {took:.1f} s; the module runs {module.runs}"
          + (f" (the plan on {used})" if module.runs == "build" else "")
          + f": max |difference| from eager = {err:.3g}")
    return 0


def _cmd_optimize(args) -> int:
    out = _optimize_and_run(args)
    if args.json:
        print(json.dumps(out["report"], indent=1))
    else:
        print(out["result"].summary())
        print(f"kernels: {out['report']['kernels']['tuned']} tuned, "
              f"{out['report']['kernels']['default']} default")
        if "advice" in out["report"]:
            print(out["report"]["advice"])
        if out["report"]["trial"]:
            print(f"compile(): {out['report']['trial']}")
        print(f"max |difference| from the single-device build: "
              f"{out['report']['max_abs_err_vs_single_device']:.3g}")
        if args.run:
            r = out["report"]
            if r["pipeline_trial"]:
                print(f"pipeline(): {r['pipeline_trial']}")
            what = (f"replicas on {', '.join(r['replicated'])}" if r["replicated"] else
                    f"pipeline of {r['stages']} stages")
            pred = ("not predicted" if r["predicted_inputs_per_s"] is None
                    else f"{r['predicted_inputs_per_s']:.1f} predicted")
            print(f"{what} over {args.run} inputs: "
                  f"{r['measured_inputs_per_s']:.1f} inputs/s measured, "
                  f"{pred}; max |err| {r['max_abs_err']:.3g}")
            base = [f"{r['sequential_inputs_per_s']:.1f} sequential on one device"]
            if r["all_threads_inputs_per_s"] is not None:
                base.append(f"{r['all_threads_inputs_per_s']:.1f} on one device with all threads")
            if r["replicas_inputs_per_s"] is not None:
                base.append(f"{r['replicas_inputs_per_s']:.1f} replicas")
            print(f"baselines measured in the same run (inputs/s): {', '.join(base)}")
    return 0


def register_cli(sub) -> None:
    """Add the ``demo`` and ``optimize`` subcommands to an argparse subparsers object."""
    p = sub.add_parser("demo", help="place a zoo model over this machine's CPU and runtimes, run "
                                    "it against eager PyTorch and ONNX Runtime",
                       epilog=EPILOG_DEMO, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_run_options(p)
    p.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=None,
                   help="for a PyTorch model: compile it with torch.compile (Inductor, frozen) "
                        "among the contenders, or not (default: where ONNX Runtime is not "
                        "installed)")
    p.set_defaults(func=_cmd_demo, device=None)

    p = sub.add_parser("optimize", help="optimize a model's placement, build and run it",
                       epilog=EPILOG_OPTIMIZE, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_run_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("--db", help="profile store whose tuned kernels (autoplace tune) the costs "
                                "and the build use; kernels without a record keep TVM's default "
                                "schedule (default: the records shipped for this machine, if "
                                "any); a torch device's PyTorch calls profiled in it are charged "
                                "as measured")
    p.add_argument("--run", type=int, default=0, metavar="N",
                   help="with --objective throughput: run N inputs through the pipelined plan "
                        "and report measured vs predicted inputs/s")
    p.set_defaults(func=_cmd_optimize)
