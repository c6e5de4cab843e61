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

:func:`throughput_row` and :func:`latency_row` compute one input's row as a dict (the keys of
``THROUGHPUT_COLUMNS`` / ``LATENCY_COLUMNS``); ``notebooks/dnn_partitioning.ipynb`` uses them too.
"""

import argparse
import os
import time
from pathlib import Path

import numpy as np

from autoplace import dnn_partitioning as dnn
from autoplace.solve import InfeasibleError
from autoplace.solve.baselines import greedy, heft
from autoplace.solve.coarsen import coarse_graph, coarsen
from autoplace.dnn_partitioning.maxload import ideals

#: The benchmark's inputs, with its licence and README, as the repository carries them.
ROOT = Path(__file__).resolve().parent / "data" / "dnn-partitioning"

#: (row key, printed header, format spec) of each table column, in order.
THROUGHPUT_COLUMNS = [
    ("input", "input", "<13"), ("n", "n", ">4"), ("coarse", "coarse", ">7"),
    ("ideals", "ideals", ">8"), ("maxLoad", "maxLoad", ">10.4f"), ("bound", "bound", ">10.4f"),
    ("gap %", "gap %", ">8.4f"), ("method", "method", ">8"), ("s", "s", ">6.1f"),
    ("any shape", "any", ">10.4f"), ("any bound", "bound", ">10.4f"),
    ("any gap %", "gap %", ">7.2f"), ("topo DP", "topo DP", ">10.4f"),
    ("one acc", "one acc", ">10.4f"), ("all cpu", "all cpu", ">10.2f"),
    ("greedy", "greedy", ">10.4f")]
LATENCY_COLUMNS = [
    ("input", "input", "<13"), ("n", "n", ">4"), ("latency", "latency", ">10.4f"),
    ("bound", "bound", ">10.4f"), ("gap %", "gap %", ">7.1f"), ("s", "s", ">6.1f"),
    ("topo DP", "topo DP", ">10.4f"), ("paper greedy", "paper gr.", ">10.4f"),
    ("greedy", "greedy", ">10.4f"), ("heft", "heft", ">10.4f"), ("one acc", "one acc", ">10.4f")]


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


def inputs(kind, only=None, root=ROOT):
    """(name, :class:`dnn.Benchmark`) of each ``root/kind/*.json`` (kind: ``"throughput"`` or
    ``"latency"``), by name; only those named in ``only`` when given. A missing folder raises."""
    if not Path(root, kind).is_dir():
        raise FileNotFoundError(f"no benchmark inputs at {Path(root, kind)}: they ship in the "
                                "repository under benchmarks/data/dnn-partitioning")
    for path in sorted(Path(root, kind).glob("*.json")):
        name = os.path.basename(path).removesuffix("_inference.json")
        if not only or name in only:
            yield name, dnn.load(path)


def throughput_row(name, b, time_limit):
    """One input's throughput row: our contiguous and any-shape splits with their bounds, and
    the baselines, all scored by :func:`dnn.max_load`."""
    rep = coarsen(b.problem)
    count = ideals(coarse_graph(b.problem, rep), dnn.IDEAL_CAP)
    t0 = time.perf_counter()
    s = dnn.solve_benchmark(b, "throughput", time_limit=time_limit)
    dt = time.perf_counter() - t0
    g = dnn.solve_benchmark(b, "throughput", contiguous=False, time_limit=time_limit)
    return {
        "input": name, "n": b.problem.num_nodes, "coarse": int(rep.max()) + 1,
        "ideals": len(count) if count else None,  # None: more than IDEAL_CAP
        "maxLoad": s.value, "bound": s.bound,
        "gap %": max(0.0, 100 * (s.value - s.bound) / s.value),
        "method": "ideals" if count is not None else "cpsat", "s": dt,
        "any shape": g.value, "any bound": g.bound,
        "any gap %": 100 * (g.value - g.bound) / g.value,
        "topo DP": dnn.max_load(b, dnn.interval_dp(b, "throughput")),
        "one acc": _single_acc(b, dnn.max_load),
        "all cpu": dnn.max_load(b, np.full(b.problem.num_nodes, b.cpu)),
        "greedy": _baseline(greedy, b, "throughput", dnn.max_load)}


def latency_row(name, b, time_limit):
    """One input's latency row: our split with its bound, and the baselines (the paper's greedy
    from the README), all scored by :func:`dnn.latency` (``nan``: not allowed by the model)."""
    t0 = time.perf_counter()
    s = dnn.solve_benchmark(b, "latency", time_limit=time_limit)
    dt = time.perf_counter() - t0
    return {
        "input": name, "n": b.problem.num_nodes, "latency": s.value, "bound": s.bound,
        "gap %": 100 * (s.value - s.bound) / s.value, "s": dt,
        "topo DP": dnn.latency(b, dnn.interval_dp(b, "latency")),
        "paper greedy": dnn.PAPER_GREEDY_LATENCY.get(name, float("nan")),
        "greedy": _baseline(greedy, b, "latency", dnn.latency),
        "heft": _baseline(heft, b, "latency", dnn.latency),
        "one acc": _single_acc(b, dnn.latency)}


def _line(columns, row=None):
    """The header (no row) or one row of a table as printed."""
    cells = []
    for key, header, spec in columns:
        if row is None:
            cells.append(f"{header:{spec.split('.')[0]}}")
        elif row[key] is None:  # ideals past the cap
            cells.append(f"{'>' + str(dnn.IDEAL_CAP // 1000) + 'k':{spec}}")
        else:
            cells.append(f"{row[key]:{spec}}")
    return "".join(cells)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per input")
    parser.add_argument("--only", nargs="*", help="input names, e.g. inceptionv3 gnmt")
    args = parser.parse_args()

    print("THROUGHPUT (max-load, benchmark model; contiguous, then any shape)")
    print(_line(THROUGHPUT_COLUMNS))
    for name, b in inputs("throughput", args.only):
        print(_line(THROUGHPUT_COLUMNS, throughput_row(name, b, args.time_limit)), flush=True)
    print()
    print("LATENCY (benchmark model)")
    print(_line(LATENCY_COLUMNS))
    for name, b in inputs("latency", args.only):
        print(_line(LATENCY_COLUMNS, latency_row(name, b, args.time_limit)), flush=True)


if __name__ == "__main__":
    main()
