"""Tables for the public dnn-partitioning inputs, scored by the benchmark's own models.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/solve_dnn_partitioning.py [--time-limit S]
[--only NAME ...]``

Throughput columns: our contiguous split (``solve_benchmark``: DP over ideals, else CP-SAT), its
proven lower bound and gap, the method that closed it, seconds; our split of any shape (CP-SAT
from the contiguous one), its bound over all splits and gap; then the split of one topological
order of the coarse DAG, one accelerator (everything supported on accelerator 0), everything on
the CPU, autoplace's greedy. Latency columns: our split (DP over one topological order, then
CP-SAT), its bound (the larger of CP-SAT's and the longest path's) and gap, seconds, the DP's
split alone, the paper's greedy (README), autoplace's greedy and HEFT (``nan``: their plan puts
a non-convex set on an accelerator, which the model does not allow), one accelerator.
"""

import argparse
import glob
import os
import time
from pathlib import Path

import numpy as np

from autoplace.solve import InfeasibleError, dnn_partitioning as dnn
from autoplace.solve.baselines import greedy, heft
from autoplace.solve.coarsen import coarse_graph, coarsen
from autoplace.solve.maxload import ideals

ROOT = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "dnn-partitioning"
PAPER_GREEDY = {"bert24": 100.2185, "gnmt": 268.5005, "inceptionv3": 2485.2396,
                "resnet50": 4197.0555, "op_bert_l-3": 416.2044, "op_bert_l-6": 494.1352,
                "op_bert_l-12": 867.8395, "op_resnet50": 839.5363}


def _single_acc(bench, score):
    a = np.where(np.isfinite(bench.problem.cost[:, 0]), 0, bench.cpu)
    if bench.problem.node_mem[a == 0].sum() > bench.problem.mem_cap[0]:
        return float("nan")
    return score(bench, a)


def _baseline(rule, bench, objective, score):
    try:
        return score(bench, rule(bench.problem, objective).assignment)
    except InfeasibleError:
        return float("nan")


def _inputs(kind, only):
    for path in sorted(glob.glob(f"{ROOT}/{kind}/*.json")):
        name = os.path.basename(path).removesuffix("_inference.json")
        if not only or name in only:
            yield name, dnn.load(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per input")
    parser.add_argument("--only", nargs="*", help="input names, e.g. inceptionv3 gnmt")
    args = parser.parse_args()

    print("THROUGHPUT (max-load, benchmark model; contiguous, then any shape)")
    print(f"{'input':<13}{'n':>4}{'coarse':>7}{'ideals':>8}{'maxLoad':>10}{'bound':>10}"
          f"{'gap %':>8}{'method':>8}{'s':>6}{'any':>10}{'bound':>10}{'gap %':>7}"
          f"{'topo DP':>10}{'one acc':>10}{'all cpu':>10}{'greedy':>10}")
    for name, b in _inputs("throughput", args.only):
        rep = coarsen(b.problem)
        count = ideals(coarse_graph(b.problem, rep), dnn.IDEAL_CAP)
        t0 = time.perf_counter()
        s = dnn.solve_benchmark(b, "throughput", time_limit=args.time_limit)
        dt = time.perf_counter() - t0
        method = "ideals" if count is not None else "cpsat"
        gap = max(0.0, 100 * (s.value - s.bound) / s.value)
        cpu = dnn.max_load(b, np.full(b.problem.num_nodes, b.cpu))
        g = dnn.solve_benchmark(b, "throughput", contiguous=False, time_limit=args.time_limit)
        print(f"{name:<13}{b.problem.num_nodes:>4}{rep.max() + 1:>7}"
              f"{len(count) if count else '>' + str(dnn.IDEAL_CAP // 1000) + 'k':>8}"
              f"{s.value:>10.4f}{s.bound:>10.4f}{gap:>8.4f}{method:>8}{dt:>6.1f}"
              f"{g.value:>10.4f}{g.bound:>10.4f}{100 * (g.value - g.bound) / g.value:>7.2f}"
              f"{dnn.max_load(b, dnn.interval_dp(b, 'throughput')):>10.4f}"
              f"{_single_acc(b, dnn.max_load):>10.4f}{cpu:>10.2f}"
              f"{_baseline(greedy, b, 'throughput', dnn.max_load):>10.4f}", flush=True)
    print()
    print("LATENCY (benchmark model)")
    print(f"{'input':<13}{'n':>4}{'latency':>10}{'bound':>10}{'gap %':>7}{'s':>6}"
          f"{'topo DP':>10}{'paper gr.':>10}{'greedy':>10}{'heft':>10}{'one acc':>10}")
    for name, b in _inputs("latency", args.only):
        t0 = time.perf_counter()
        s = dnn.solve_benchmark(b, "latency", time_limit=args.time_limit)
        dt = time.perf_counter() - t0
        print(f"{name:<13}{b.problem.num_nodes:>4}{s.value:>10.4f}{s.bound:>10.4f}"
              f"{100 * (s.value - s.bound) / s.value:>7.1f}{dt:>6.1f}"
              f"{dnn.latency(b, dnn.interval_dp(b, 'latency')):>10.4f}{PAPER_GREEDY[name]:>10.4f}"
              f"{_baseline(greedy, b, 'latency', dnn.latency):>10.4f}"
              f"{_baseline(heft, b, 'latency', dnn.latency):>10.4f}"
              f"{_single_acc(b, dnn.latency):>10.4f}", flush=True)


if __name__ == "__main__":
    main()
