"""The ``autoplace`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import numpy as np

EPILOG_DEMO = """examples:
  autoplace demo                       # resnet (or branchy_cnn without torch) over two CPU devices
  autoplace demo --model zoo:inception --objective latency
"""
EPILOG_OPTIMIZE = """examples:
  autoplace optimize --model zoo:resnet --device cpu:0 --device cpu:1
  autoplace optimize --model model.onnx --device cpu:0 --device cpu:1 --rule 'op:nn.conv2d#0=cpu0' --json
  autoplace optimize --model zoo:resnet --objective throughput --run 64 --json
"""


def _devices(specs):
    from autoplace import Device

    devs = [Device.from_spec(s) for s in specs]
    if len({d.name for d in devs}) != len(devs):
        raise ValueError(f"devices must differ, got {specs}")
    return devs


def _rules(specs):
    rules = []
    for s in specs:
        if "=" not in s:
            raise ValueError(f"rule {s!r}: expected PATTERN=DEVICE, e.g. 'op:nn.conv2d=cpu0'")
        pattern, dev = s.rsplit("=", 1)
        rules.append((pattern, dev))
    return rules


def _default_model() -> str:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "zoo:branchy_cnn"
    return "zoo:resnet"


def _cost_model(args):
    """Profiles given with --profile, roofline with --no-profile, else optimize's "auto"."""
    from autoplace.predict import MeasuredCostModel, RooflineCostModel
    from autoplace.profile import DeviceProfile

    if args.profile:
        return MeasuredCostModel([DeviceProfile.load(p) for p in args.profile])
    return RooflineCostModel() if args.no_profile else "auto"


def _pipeline_report(res, model, devices, n: int) -> dict:
    """Run ``n`` inputs through the plan's pipeline and, in the same run, each single-device build;
    "sequential" is the fastest of those."""
    from autoplace.run.pipeline import fastest_single_device, random_inputs_like

    xs = random_inputs_like(model.inputs, n, np.random.default_rng(0))
    with res.pipeline() as pipe:
        pipe.run(xs[:4])  # warm-up
        _, ref, seq_s = fastest_single_device(model.mod, res.graph, devices, xs)
        outs = pipe.run(xs)
        stats, stages = pipe.stats, pipe.staged.stages
    err = max(float(np.max(np.abs(a - b))) for o, r in zip(outs, ref) for a, b in zip(o, r))
    return {
        "predicted_inputs_per_s": 1 / res.solution.value,
        "measured_inputs_per_s": stats.inputs_per_s,
        "sequential_inputs_per_s": n / seq_s,
        "max_abs_err": err,
        "stages": len(stages),
        "stage_details": [{"stage": s.index, "device": s.device.name, "nodes": len(s.nodes),
                           "busy_s": b, "utilisation": u}
                          for s, b, u in zip(stages, stats.busy_s, stats.utilisation)],
    }


def _optimize_and_run(args) -> dict:
    import autoplace
    from autoplace import zoo

    if getattr(args, "run", 0) and args.objective != "throughput":
        raise ValueError("--run N measures a pipeline: use it with --objective throughput")
    t0 = time.perf_counter()
    model = zoo.from_spec(args.model or _default_model())
    devices = _devices(args.device)
    cost_model = _cost_model(args)
    res = autoplace.optimize(model.mod, devices, objective=args.objective, solver=args.solver,
                             time_limit=args.time_limit, pins=_rules(args.rule),
                             cost_model=cost_model, contiguous=args.contiguous)
    t_opt = time.perf_counter() - t0
    run = res.compile()
    outs = run(*model.inputs)
    reference = autoplace.compile(
        model.mod, autoplace.place(res.graph, devices, [("*", devices[0].name)]))(*model.inputs)
    err = max(float(np.max(np.abs(a - b))) for a, b in zip(outs, reference))
    out = {
        "model": model.name, "graph": res.graph.summary(), "result": res,
        "report": {
            "model": model.name,
            "objective": args.objective,
            "devices": [d.name for d in devices],
            "predicted_s": res.predicted_latency_s,
            "bound_s": res.solution.bound,
            "status": res.solution.status,
            "solver": res.solution.solver,
            "baselines_s": dict(res.baselines),
            "copies": res.copies,
            "cost_model": res.cost_model,
            "cost_sources": sorted(set(res.plan.cost_sources)),
            "max_abs_err_vs_single_device": err,
            "optimize_s": t_opt,
            "plan": json.loads(res.plan.to_json()),
        },
    }
    if getattr(args, "run", 0):
        out["report"].update(_pipeline_report(res, model, devices, args.run))
    return out


def _cmd_demo(args) -> int:
    out = _optimize_and_run(args)
    rep = out["report"]
    print(f"model {out['model']}: {out['graph']}")
    print(out["result"].summary())
    print(f"cross-device copies (one per tensor and destination device): {rep['copies']}")
    print(f"compiled for {', '.join(rep['devices'])} and ran: max |difference| from the "
          f"single-device build = {rep['max_abs_err_vs_single_device']:.3g}")
    return 0


def _cmd_optimize(args) -> int:
    out = _optimize_and_run(args)
    if args.json:
        print(json.dumps(out["report"], indent=1))
    else:
        print(out["result"].summary())
        print(f"max |difference| from the single-device build: "
              f"{out['report']['max_abs_err_vs_single_device']:.3g}")
        if args.run:
            r = out["report"]
            print(f"pipeline of {r['stages']} stages over {args.run} inputs: "
                  f"{r['measured_inputs_per_s']:.1f} inputs/s measured, "
                  f"{r['predicted_inputs_per_s']:.1f} predicted, {r['sequential_inputs_per_s']:.1f} "
                  f"sequential on one device; max |err| {r['max_abs_err']:.3g}")
    return 0


def _add_run_options(p):
    p.add_argument("--model", help="zoo:NAME or a path to an .onnx file "
                                   "(zoo: mlp, branchy_cnn, resnet, mobilenet, inception, transformer)")
    p.add_argument("--device", action="append", help="cpu:N or cuda:N; repeat for each device")
    p.add_argument("--objective", choices=("latency", "throughput"), default="latency")
    p.add_argument("--contiguous", action=argparse.BooleanOptionalAction, default=True,
                   help="throughput: one stage per device, the devices a chain (the default; "
                        "--no-contiguous lets a device hold several stages)")
    p.add_argument("--solver", default="auto", help="solver name (default: auto)")
    p.add_argument("--time-limit", type=float, default=10.0, help="solver seconds (default 10)")
    p.add_argument("--rule", action="append", default=[],
                   help="pin ops: PATTERN=DEVICE, e.g. 'op:nn.softmax=cpu1' (repeatable)")
    p.add_argument("--profile", action="append", default=[],
                   help="measured profile JSON (autoplace profile-export); each applies to the "
                        "devices of its kind (repeatable). Default: the shipped profile under "
                        "profiles/ if it was measured on this machine's CPU")
    p.add_argument("--no-profile", action="store_true",
                   help="ignore profiles: roofline estimates from device peaks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoplace", description="Automatic device placement for TVM Relax models.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="optimize a zoo model over two CPU devices, build and run it",
                       epilog=EPILOG_DEMO, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_options(p)
    p.set_defaults(func=_cmd_demo, device=None)

    p = sub.add_parser("optimize", help="optimize a model's placement, build and run it",
                       epilog=EPILOG_OPTIMIZE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("--run", type=int, default=0, metavar="N",
                   help="with --objective throughput: run N inputs through the pipelined plan "
                        "and report measured vs predicted inputs/s")
    p.set_defaults(func=_cmd_optimize)

    from autoplace.solve.dnn_partitioning import register_cli, run_cli

    register_cli(sub)
    sub.choices["solve"].set_defaults(func=run_cli)
    from autoplace.profile.cli import register_cli as register_profile_cli

    register_profile_cli(sub)
    from autoplace.predict.cli import register_cli as register_predict_cli

    register_predict_cli(sub)
    from autoplace.report.cli import register_cli as register_report_cli

    register_report_cli(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command in ("demo", "optimize") and args.device is None:
        args.device = ["cpu:0", "cpu:1"]
    from autoplace import InfeasibleError, PlanError, UnsupportedModelError
    from autoplace.profile.store import ProfileStoreError

    try:
        return args.func(args)
    except (InfeasibleError, PlanError, UnsupportedModelError, ProfileStoreError, ValueError,
            KeyError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e  # no repr quotes
        print(f"autoplace {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
