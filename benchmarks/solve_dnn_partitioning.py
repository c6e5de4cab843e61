"""Tables for the public dnn-partitioning inputs, scored by the benchmark's own models.

Run: ``.venv/bin/python benchmarks/solve_dnn_partitioning.py``
"""

import glob
import os
import time

import numpy as np

from autoplace.solve import InfeasibleError, dnn_partitioning as dnn
from autoplace.solve.baselines import greedy

ROOT = "/work/shared/benchmarks/dnn-partitioning"
PAPER_GREEDY = {"bert24": 100.2185, "gnmt": 268.5005, "inceptionv3": 2485.2396,
                "resnet50": 4197.0555, "op_bert_l-3": 416.2044, "op_bert_l-6": 494.1352,
                "op_bert_l-12": 867.8395, "op_resnet50": 839.5363}


def _single_acc(bench, score):
    a = np.where(np.isfinite(bench.problem.cost[:, 0]), 0, bench.cpu)
    if bench.problem.node_mem[a == 0].sum() > bench.problem.mem_cap[0]:
        return float("nan")
    return score(bench, a)


def _greedy(bench, objective, score):
    try:
        a = greedy(bench.problem, objective).assignment
        return score(bench, a)
    except InfeasibleError:
        return float("nan")


def main():
    print("THROUGHPUT (max-load, benchmark model)")
    print(f"{'input':<14}{'n':>5}{'dp maxLoad':>14}{'dp s':>7}{'one acc':>12}{'all cpu':>12}"
          f"{'greedy':>12}")
    for path in sorted(glob.glob(f"{ROOT}/throughput/*.json")):
        name = os.path.basename(path).removesuffix("_inference.json")
        b = dnn.load(path)
        t0 = time.perf_counter()
        a = dnn.interval_dp(b, "throughput")
        dt = time.perf_counter() - t0
        cpu = dnn.max_load(b, np.full(b.problem.num_nodes, b.cpu))
        print(f"{name:<14}{b.problem.num_nodes:>5}{dnn.max_load(b, a):>14.4f}{dt:>7.1f}"
              f"{_single_acc(b, dnn.max_load):>12.4f}{cpu:>12.4f}"
              f"{_greedy(b, 'throughput', dnn.max_load):>12.4f}")
    print()
    print("LATENCY (benchmark model)")
    print(f"{'input':<14}{'n':>5}{'dp latency':>14}{'dp s':>7}{'paper greedy':>14}"
          f"{'one acc':>12}")
    for path in sorted(glob.glob(f"{ROOT}/latency/*.json")):
        name = os.path.basename(path).removesuffix("_inference.json")
        b = dnn.load(path)
        t0 = time.perf_counter()
        a = dnn.interval_dp(b, "latency")
        dt = time.perf_counter() - t0
        print(f"{name:<14}{b.problem.num_nodes:>5}{dnn.latency(b, a):>14.4f}{dt:>7.1f}"
              f"{PAPER_GREEDY[name]:>14.4f}{_single_acc(b, dnn.latency):>12.4f}")


if __name__ == "__main__":
    main()
