"""Tables for the public dnn-partitioning inputs, scored by the benchmark's own models.

Run: .venv/bin/python -m benchmarks solve_dnn_partitioning [--time-limit S] [--only NAME ...]

Throughput columns: our contiguous split (``solve_benchmark``: DP over ideals, else CP-SAT), its
proven lower bound and gap, the method that closed it, seconds; our split of any shape (CP-SAT
from the contiguous one), its bound over all splits and gap; then the split of one topological
order of the coarse DAG, one accelerator (everything supported on accelerator 0), everything on
the CPU, autoplace's greedy. Latency columns: our split (DP over one topological order, then
CP-SAT), its bound (the larger of CP-SAT's and the longest path's) and gap, seconds, the DP's
split alone, the paper's greedy (README), autoplace's greedy and HEFT (``nan``: their plan puts
a non-convex set on an accelerator, which the model does not allow), one accelerator.

The rows are :mod:`autoplace.dnn_partitioning.tables`' (``notebooks/dnn_partitioning.ipynb``
draws the same); this script prints them with the columns of ``THROUGHPUT_COLUMNS`` /
``LATENCY_COLUMNS``.
"""

import argparse
from pathlib import Path

from autoplace import dnn_partitioning as dnn
from autoplace.dnn_partitioning.tables import inputs, latency_row, throughput_row

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
    for name, b in inputs("throughput", args.only, root=ROOT):
        print(_line(THROUGHPUT_COLUMNS, throughput_row(name, b, args.time_limit)), flush=True)
    print()
    print("LATENCY (benchmark model)")
    print(_line(LATENCY_COLUMNS))
    for name, b in inputs("latency", args.only, root=ROOT):
        print(_line(LATENCY_COLUMNS, latency_row(name, b, args.time_limit)), flush=True)


if __name__ == "__main__":
    main()
