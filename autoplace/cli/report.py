"""``autoplace report``: optimize a model and write the plan's plots and explanation to a folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from autoplace.cli import options

EPILOG = """examples:
  autoplace report --model zoo:inception --device cpu:0 --device cpu:1 --out report/
  autoplace report --model zoo:resnet --objective throughput --out report/ --json

writes graph.png (the op graph coloured by device), gantt.png (latency: the simulated schedule)
or stages.png (throughput: load per device and link), explain.txt and plan.json, and prints
their paths (--json: {"files": [...], "model": ..., "predicted_s": ..., ...}).
"""


def register_cli(sub) -> None:
    """Add the ``report`` subcommand to an argparse subparsers object."""
    p = sub.add_parser("report", help="optimize a model and write plots of the plan (PNG)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_run_options(p)
    p.add_argument("--out", required=True, help="folder for the files (created if missing)")
    p.add_argument("--dpi", type=int, default=120, help="PNG resolution (default 120)")
    p.add_argument("--json", action="store_true", help="print the files and totals as JSON")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args) -> int:
    import autoplace
    from autoplace import zoo
    from autoplace.report import plot_gantt, plot_graph, plot_stage_loads

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    if args.dpi <= 0:
        raise ValueError(f"--dpi must be positive, got {args.dpi}")
    devices = options.devices(args.device or ["cpu:0", "cpu:1"])
    model = zoo.from_spec(args.model or options.default_model())
    res = autoplace.optimize(model.mod, devices, objective=args.objective, solver=args.solver,
                             time_limit=args.time_limit, pins=options.rules(args.rule),
                             cost_model=options.cost_model(args), contiguous=args.contiguous,
                             baseline_guard=not args.no_guard,
                             calibrate=not args.no_calibrate)
    expl = res.explain()
    out.mkdir(parents=True, exist_ok=True)
    figures = {"graph": plot_graph(res)}
    if args.objective == "latency":
        figures["gantt"] = plot_gantt(res)
    else:
        figures["stages"] = plot_stage_loads(res)
    files = []
    for name, fig in figures.items():
        ax = fig.axes[0]
        ax.set_title(f"{model.name}: {ax.get_title()}")
        files.append(out / f"{name}.png")
        fig.savefig(files[-1], dpi=args.dpi, bbox_inches="tight")
    files.append(out / "explain.txt")
    files[-1].write_text(str(expl) + "\n")
    files.append(out / "plan.json")
    files[-1].write_text(res.plan.to_json() + "\n")
    if args.json:
        print(json.dumps({"files": [str(f) for f in files], "model": model.name,
                          "devices": [d.name for d in devices], **expl.to_dict(),
                          "solver_s": res.solution.value,
                          "delivery": None if res.delivery is None
                          else dataclasses.asdict(res.delivery)}, indent=1))
    else:
        print("\n".join(map(str, files)))
    return 0
