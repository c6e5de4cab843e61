"""The benchmark's inputs scored row by row: our splits with their bounds beside the baselines.

One row per input, as a dict, every value scored by the benchmark's own models
(:func:`~autoplace.dnn_partitioning.max_load`, :func:`~autoplace.dnn_partitioning.latency`);
``nan`` where a baseline's plan does not fit or the model does not allow it.
``notebooks/dnn_partitioning.ipynb`` draws them; ``python -m benchmarks solve_dnn_partitioning``
prints them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from autoplace.dnn_partitioning.benchmark import (PAPER_GREEDY_LATENCY, Benchmark, latency, load,
                                                  max_load)
from autoplace.dnn_partitioning.maxload import ideals
from autoplace.dnn_partitioning.solvers import IDEAL_CAP, interval_dp, solve_benchmark
from autoplace.solve import InfeasibleError
from autoplace.solve.baselines import greedy, heft
from autoplace.solve.coarsen import coarse_graph, coarsen


def inputs(kind: str, only: Sequence[str] | None = None, *,
           root: str | Path) -> Iterator[tuple[str, Benchmark]]:
    """(name, :class:`Benchmark`) of each ``root/kind/*.json`` (kind: ``"throughput"`` or
    ``"latency"``), by name; only those named in ``only`` when given. A missing folder raises
    ``FileNotFoundError``."""
    folder = Path(root, kind)
    if not folder.is_dir():
        raise FileNotFoundError(f"no benchmark inputs at {folder}: they ship in the repository "
                                "under benchmarks/data/dnn-partitioning")
    for path in sorted(folder.glob("*.json")):
        name = path.name.removesuffix("_inference.json")
        if not only or name in only:
            yield name, load(path)


def _single_acc(bench: Benchmark, score) -> float:
    """Everything accelerator 0 supports on it, the rest on the CPU; ``nan`` past its memory."""
    a = np.where(np.isfinite(bench.problem.cost[:, 0]), 0, bench.cpu)
    if bench.problem.node_mem[a == 0].sum() > bench.problem.mem_cap[0]:
        return float("nan")
    return score(bench, a)


def _baseline(rule, bench: Benchmark, objective: str, score) -> float:
    try:
        return score(bench, rule(bench.problem, objective).assignment)
    except InfeasibleError:
        return float("nan")


def throughput_row(name: str, b: Benchmark, time_limit: float) -> dict:
    """One input's throughput row: our contiguous split (its bound, gap, method, seconds) and our
    split of any shape (its bound over all splits), then the split of one topological order
    (``topo DP``), one accelerator, everything on the CPU and autoplace's greedy."""
    rep = coarsen(b.problem)
    count = ideals(coarse_graph(b.problem, rep), IDEAL_CAP)
    t0 = time.perf_counter()
    s = solve_benchmark(b, "throughput", time_limit=time_limit)
    dt = time.perf_counter() - t0
    g = solve_benchmark(b, "throughput", contiguous=False, time_limit=time_limit)
    return {
        "input": name, "n": b.problem.num_nodes, "coarse": int(rep.max()) + 1,
        "ideals": len(count) if count else None,  # None: more than IDEAL_CAP
        "maxLoad": s.value, "bound": s.bound,
        "gap %": max(0.0, 100 * (s.value - s.bound) / s.value),
        "method": "ideals" if count is not None else "cpsat", "s": dt,
        "any shape": g.value, "any bound": g.bound,
        "any gap %": 100 * (g.value - g.bound) / g.value,
        "topo DP": max_load(b, interval_dp(b, "throughput")),
        "one acc": _single_acc(b, max_load),
        "all cpu": max_load(b, np.full(b.problem.num_nodes, b.cpu)),
        "greedy": _baseline(greedy, b, "throughput", max_load)}


def latency_row(name: str, b: Benchmark, time_limit: float) -> dict:
    """One input's latency row: our split with its bound, gap and seconds, then the split of one
    topological order, the paper's greedy (from the benchmark's README), autoplace's greedy and
    HEFT (``nan``: a plan the model does not allow) and one accelerator."""
    t0 = time.perf_counter()
    s = solve_benchmark(b, "latency", time_limit=time_limit)
    dt = time.perf_counter() - t0
    return {
        "input": name, "n": b.problem.num_nodes, "latency": s.value, "bound": s.bound,
        "gap %": 100 * (s.value - s.bound) / s.value, "s": dt,
        "topo DP": latency(b, interval_dp(b, "latency")),
        "paper greedy": PAPER_GREEDY_LATENCY.get(name, float("nan")),
        "greedy": _baseline(greedy, b, "latency", latency),
        "heft": _baseline(heft, b, "latency", latency),
        "one acc": _single_acc(b, latency)}
