"""The ``autoplace`` command line: ``main`` parses the arguments and runs one command."""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap

from autoplace.cli import cluster, optimize, predict, profile, report, tune
from autoplace.dnn_partitioning import cli as dnn_partitioning_cli

__all__ = ["build_parser", "main"]


EPILOG = """examples:
  autoplace demo                        # place a zoo model over this machine's runtimes, run it
  autoplace optimize --model zoo:inception --device cpu:0 --device cpu:1
  autoplace optimize --model model.onnx --objective throughput --run 64   # run the pipeline
  autoplace report --model zoo:inception --out report/                   # plots of the plan
  autoplace profile --model zoo:resnet --device cpu:0 --db prof.db       # measure the costs
  autoplace solve benchmarks/data/dnn-partitioning/throughput/gnmt_inference.json --json
  autoplace cluster --address auto          # a Ray cluster's hosts: --device HOST/cpu:0

{models}
autoplace COMMAND --help shows a command's options and more examples."""


def build_parser() -> argparse.ArgumentParser:
    from autoplace import zoo

    parser = argparse.ArgumentParser(
        prog="autoplace", description="Automatic device placement for TVM Relax models.",
        epilog=EPILOG.format(models=textwrap.fill(
            f"MODEL is zoo:NAME ({', '.join(zoo.names())}) or a path to an .onnx file.", 79)),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)

    optimize.register_cli(sub)
    dnn_partitioning_cli.register_cli(sub)
    sub.choices["solve"].set_defaults(func=dnn_partitioning_cli.run_cli)
    profile.register_cli(sub)
    predict.register_cli(sub)
    report.register_cli(sub)
    tune.register_cli(sub)
    cluster.register_cli(sub)
    return parser


def default_specs(objective: str) -> list[str]:
    """The devices of ``demo`` and ``optimize`` when none is named: for a latency plan, this
    machine's CPU and GPU and the runtimes installed here (``torch:cpu``, ``ort:cpu``:
    :func:`autoplace.devices.local_devices`); a pipeline, over two shares of the CPU."""
    if objective != "latency":
        return ["cpu:0", "cpu:1"]
    from autoplace.devices import local_devices

    return [d.spec for d in local_devices()]


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command in ("demo", "optimize") and args.device is None:
        args.device = default_specs(args.objective)
    from autoplace import InfeasibleError, PlanError, UnsupportedModelError
    from autoplace.profile import DeviceUnavailable
    from autoplace.profile.measurements import ProfileStoreError

    try:
        return args.func(args)
    except (InfeasibleError, PlanError, UnsupportedModelError, ProfileStoreError, ValueError,
            KeyError, OSError, DeviceUnavailable) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e  # no repr quotes
        print(f"autoplace {args.command}: error: {msg}", file=sys.stderr)
        return 2
