"""Solver scale on a random layered DAG, 4 devices (autoplace's own simulator).

Run: .venv/bin/python -m benchmarks solve_scale [--nodes 100 1000 10000] [--time-limit 10]

Per DAG size, each solver's value, proven bound, gap and seconds, for latency and throughput:
HEFT and greedy, CP-SAT (up to 1000 nodes), and what ``solver="auto"`` picks (CP-SAT up to
``AUTO_CPSAT_MAX_NODES``, the coarsening solver above).
"""

import argparse
import time

import numpy as np

from autoplace.solve import AUTO_CPSAT_MAX_NODES, Problem, solve


def random_dag(n, d, rng):
    cost = rng.uniform(1e-4, 1e-3, (n, d))
    cost[:, 1:][rng.random((n, d - 1)) < 0.1] = np.inf
    src = np.arange(1, n)
    edges = np.stack([rng.integers(np.maximum(0, src - 20), src), src], axis=1)
    extra = rng.integers(0, n - 1, n // 4)
    edges = np.concatenate([edges, np.stack([extra, extra + 1 + rng.integers(0, 30, extra.size)],
                                            axis=1)])
    edges = np.unique(edges[edges[:, 1] < n], axis=0)
    return Problem.build(cost, edges, rng.uniform(1e3, 1e6, n), alpha=1e-5, beta=1e10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'nodes':>7}{'solver':>10}{'objective':>12}{'value':>12}{'bound':>12}{'gap':>8}"
          f"{'s':>8}")
    for n in args.nodes:
        p = random_dag(n, 4, rng)
        big = n > AUTO_CPSAT_MAX_NODES
        # "auto" is CP-SAT up to AUTO_CPSAT_MAX_NODES and "coarse" above: its rows are those.
        rows = [("heft", "latency"), ("greedy", "latency"), ("greedy", "throughput")]
        rows += [("cpsat", "latency")] if n <= 1000 else []
        rows += ([("auto", "latency"), ("auto", "throughput")] if big else
                 [("coarse", "latency"), ("coarse", "throughput")])
        for solver, objective in rows:
            t0 = time.perf_counter()
            s = solve(p, objective, solver, time_limit=args.time_limit)
            print(f"{n:>7}{solver:>10}{objective:>12}{s.value:>12.5f}{s.bound:>12.5f}"
                  f"{s.gap:>8.3f}{time.perf_counter() - t0:>8.1f}")


if __name__ == "__main__":
    main()
