"""Throughput plans over 4, 16 and 64 hosts of the public placement benchmark's devices, on paper.

Run: .venv/bin/python -m benchmarks cluster_scale [--hosts 4 16 64] [--only NAME ...]
     [--time-limit 20] [--net 4]

Each host has the benchmark's two devices: an accelerator (``fpgaLatency``, ``maxSizePerFPGA`` of
memory) and a CPU side (``cpuLatency``), linked as the benchmark links them (a copy costs the
edge's ``cost``). Hosts differ: host ``h`` runs every op ``(1, 1.5, 2)[h % 3]`` times slower (a
rack of three generations). A copy between hosts costs ``--net`` times the edge's cost (a
network slower than the host's bus). Costs are in the benchmark's units.

Per model and host count: the better of two solvers' throughput plans over all hosts, greedy
and ``"coarse"`` (coarsen, CP-SAT, refine: what ``"auto"`` runs above 500 nodes; CP-SAT on every
node, what it runs below, takes minutes over a hundred devices), its solver, its time per input as ``simulate_throughput`` scores it, the hosts and
stages it uses, the seconds the solve took; the same solvers over the fastest 1, 4, 16 and all
hosts (``autoplace.cluster.solve_over_hosts``, greedy and ``coarse`` with a quarter of the time
limit each), its time per input and seconds; the best one-host plan (the same solver on the
fastest host's two devices); the predicted gain of the plan over it; and, beside it, replicas:
every host running its own best one-host plan on the inputs it takes (time per input
``1 / sum(1 / t_h)``), the data-parallel alternative the cluster could run instead.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from autoplace.cluster.solve import solve_over_hosts
from autoplace.dnn_partitioning.benchmark import load
from autoplace.solve import Problem, simulate_throughput, solve

ROOT = Path(__file__).resolve().parent / "data" / "dnn-partitioning" / "throughput"
SLOWDOWN = (1.0, 1.5, 2.0)


def hosts_problem(p: Problem, hosts: int, net: float) -> Problem:
    """``p``'s two devices (accelerator 0 and the CPU side, the last) on each of ``hosts``."""
    acc, cpu = p.cost[:, 0], p.cost[:, -1]
    cost = np.concatenate([np.stack([acc, cpu], 1) * SLOWDOWN[h % 3] for h in range(hosts)], 1)
    d = 2 * hosts
    host_of = np.arange(d) // 2
    same = host_of[:, None] == host_of[None, :]
    beta = np.where(same, 1.0, 1.0 / net)
    mem_cap = np.tile([p.mem_cap[0], np.inf], hosts)
    return Problem.build(cost, p.edges, p.out_bytes, alpha=np.zeros((d, d)), beta=beta,
                         node_mem=p.node_mem, mem_cap=mem_cap, groups=p.groups,
                         device_names=[f"h{h}-{k}" for h in range(hosts) for k in ("acc", "cpu")])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--only", nargs="*", help="input names, e.g. gnmt op_bert_l-12")
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    ap.add_argument("--net", type=float, default=4.0,
                    help="a copy between hosts costs this times the edge's cost (default 4)")
    args = ap.parse_args()
    files = sorted(ROOT.glob("*_inference.json"))
    if args.only:
        files = [f for f in files if f.name.removesuffix("_inference.json") in args.only]
    print(f"{'input':<13}{'n':>5}{'hosts':>6}{'plan':>10}{'solver':>8}{'used':>6}{'stages':>7}"
          f"{'greedy s':>9}{'coarse s':>9}{'k hosts':>9}{'k':>4}{'k s':>6}"
          f"{'1 host':>10}{'gain':>7}{'replicas':>10}{'gain':>7}")
    for f in files:
        bench = load(f)
        one = hosts_problem(bench.problem, 1, args.net)
        single = solve(one, "throughput", "auto", time_limit=args.time_limit).value
        for h in args.hosts:
            p = hosts_problem(bench.problem, h, args.net)
            found, walls = [], []
            for name in ("greedy", "coarse"):
                t0 = time.perf_counter()
                sol = solve(p, "throughput", name, time_limit=args.time_limit)
                walls.append(time.perf_counter() - t0)
                found.append((simulate_throughput(p, sol.assignment, sol.stages), name, sol))
            value, name, sol = min(found, key=lambda f: f[0])
            t0, counts = time.perf_counter(), sorted({c for c in (1, 4, 16, h) if c <= h})
            host_of = np.arange(2 * h) // 2
            subsets = [solve_over_hosts(p, host_of, solver=s, time_limit=args.time_limit / 4,
                                        counts=counts) for s in ("greedy", "coarse")]
            k_wall = time.perf_counter() - t0
            k_sol, k_tried = min(subsets, key=lambda st: st[0].value)
            k_best = min(k_tried, key=k_tried.get)
            used = len({int(a) // 2 for a in sol.assignment})
            stages = len(set(sol.stages)) if sol.stages is not None else 1
            # Each host its own best one-host plan (host 0's, slowed by its generation).
            replicas = 1.0 / sum(1.0 / (single * SLOWDOWN[k % 3]) for k in range(h))
            print(f"{f.name.removesuffix('_inference.json'):<13}{p.num_nodes:>5}{h:>6}"
                  f"{value:>10.4g}{name:>8}{used:>6}{stages:>7}{walls[0]:>9.1f}{walls[1]:>9.1f}"
                  f"{k_sol.value:>9.4g}{k_best:>4}{k_wall:>6.1f}{single:>10.4g}"
                  f"{single / min(value, k_sol.value):>7.2f}{replicas:>10.4g}"
                  f"{single / replicas:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
