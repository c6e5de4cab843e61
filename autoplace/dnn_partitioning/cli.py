"""``autoplace solve``: place an input of the public dnn-partitioning benchmark and print the plan."""

from __future__ import annotations

import argparse
import json
import logging
import time

from autoplace.dnn_partitioning.benchmark import load, plan_json
from autoplace.dnn_partitioning.solvers import solve_benchmark
from autoplace.solve.problem import check_time_limit

log = logging.getLogger(__name__)


def register_cli(subparsers) -> None:
    """Add ``solve FILE --format dnn-partitioning --objective ... [--contiguous]
    [--time-limit S] [--json]`` to an argparse subparsers object."""
    cmd = subparsers.add_parser(
        "solve", help="place a benchmark input and print the plan",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""examples:
  autoplace solve benchmarks/data/dnn-partitioning/throughput/gnmt_inference.json --contiguous --json
  autoplace -v solve FILE --objective latency --time-limit 60   # -v logs the bound and status

FILE is an input of the public dnn-partitioning benchmark: a clone of autoplace carries them
all under benchmarks/data/dnn-partitioning, with the benchmark's README (the format) and licence.
The plan is printed in the benchmark's own output form ({"maxLoad" or "latency", "cpus", "fpgas"}),
with "bound" (proven: no plan does better), "gap" ((value - bound) / value) and "status" (OPTIMAL
when the gap is closed, else FEASIBLE: the best plan found in the time limit).""")
    cmd.add_argument("file")
    cmd.add_argument("--format", choices=["dnn-partitioning"], default="dnn-partitioning")
    cmd.add_argument("--objective", choices=["throughput", "latency"], default="throughput")
    cmd.add_argument("--contiguous", action="store_true",
                     help="throughput: convex stages in a chain (a pipeline); latency plans are "
                          "convex already")
    cmd.add_argument("--time-limit", type=float, default=10.0,
                     help="seconds (default 10); the first plan is always made, then the best "
                          "found in the limit is printed with its gap")
    cmd.add_argument("--json", action="store_true", help="print only the plan JSON")
    cmd.set_defaults(handler=run_cli)


def run_cli(args) -> int:
    """Handler of the ``solve`` command: print the plan JSON, its bound, gap and status on
    stdout."""
    check_time_limit(args.time_limit)
    bench = load(args.file)
    t0 = time.perf_counter()
    split = solve_benchmark(bench, args.objective, contiguous=args.contiguous,
                            time_limit=args.time_limit)
    plan = plan_json(bench, split.assignment, args.objective)
    plan.update(bound=split.bound, gap=split.gap, status=split.status)
    if not args.json:
        key = "maxLoad" if args.objective == "throughput" else "latency"
        log.info("%s: %s %.6g (lower bound %.6g, gap %.1f%%, %s) in %.2f s", args.file, key,
                 plan[key], split.bound, 100 * split.gap, split.status, time.perf_counter() - t0)
    print(json.dumps(plan))
    return 0
