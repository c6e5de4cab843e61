"""The public dnn-partitioning benchmark (Tarnawski et al., NeurIPS 2020) as an adapter over
:mod:`autoplace.solve`: its file format, its own max-load and latency models, solvers for them, and
plan export. Nothing in autoplace's core imports it.

>>> from autoplace import dnn_partitioning as dnn
>>> path = "benchmarks/data/dnn-partitioning/latency/op_bert_l-12_inference.json"  # in a clone
>>> bench = dnn.load(path)                                          # doctest: +SKIP
>>> split = dnn.solve_benchmark(bench, "latency", time_limit=10)    # doctest: +SKIP
>>> dnn.latency(bench, split.assignment)                            # doctest: +SKIP
"""

from autoplace.dnn_partitioning.benchmark import (PAPER_GREEDY_LATENCY, Benchmark, check, latency,
                                                  load, max_load, plan_json, units)
from autoplace.dnn_partitioning.cli import register_cli, run_cli
from autoplace.dnn_partitioning.solvers import (IDEAL_CAP, cpsat_latency, interval_dp, load_bound,
                                                path_bound, solve_benchmark)

__all__ = ["IDEAL_CAP", "PAPER_GREEDY_LATENCY", "Benchmark", "check", "cpsat_latency",
           "interval_dp", "latency", "load", "load_bound", "max_load", "path_bound", "plan_json",
           "register_cli", "run_cli", "solve_benchmark", "units"]
