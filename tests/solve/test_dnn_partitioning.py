"""The benchmark importer, its two scoring models worked by hand, and the CLI handler."""

import argparse
import json

import numpy as np
import pytest

from autoplace.solve import InfeasibleError
from autoplace import dnn_partitioning as dnn



def _write(tmp_path, max_size=10.0, k=2):
    # Chain 1 -> 2 -> 3 plus 1 -> 3. fpga latencies 1, 2, 3; cpu 10, 20, 30; edge cost of
    # node 1 = 0.5, node 2 = 0.25. Node 3 is not supported on an accelerator. Sizes 4 each.
    raw = {"maxSizePerFPGA": max_size, "maxFPGAs": k, "maxCPUs": 1,
           "nodes": [{"id": i, "supportedOnFpga": int(i != 3), "cpuLatency": 10.0 * i,
                      "fpgaLatency": float(i), "isBackwardNode": 0, "size": 4.0}
                     for i in (3, 1, 2)],
           "edges": [{"sourceId": 1, "destId": 2, "cost": 0.5},
                     {"sourceId": 2, "destId": 3, "cost": 0.25},
                     {"sourceId": 1, "destId": 3, "cost": 0.5}]}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(raw))
    return path


def test_import_renumbers_topologically(tmp_path):
    b = dnn.load(_write(tmp_path))
    assert b.ids == (1, 2, 3)
    assert b.problem.cost.tolist() == [[1, 1, 10], [2, 2, 20], [np.inf, np.inf, 30]]
    assert b.comm.tolist() == [0.5, 0.25, 0.0]
    # a copy of node 1 costs its edge cost in the autoplace problem too
    assert b.problem.transfer_time(0, 0, 2) == 0.5


def test_max_load_by_hand(tmp_path):
    b = dnn.load(_write(tmp_path))
    # 1 on fpga0, 2 on fpga1, 3 on cpu. fpga0: 1 + send 0.5 = 1.5. fpga1: 2 + receive 0.5 +
    # send 0.25 = 2.75. cpu: 30 (no communication). Max 30.
    assert dnn.max_load(b, [0, 1, 2]) == pytest.approx(30.0)
    # Same but with cpu latency of node 3 irrelevant: compare the accelerators via a plan with
    # 1, 2 on fpga0: 3 + send of 1 (0.5) + send of 2 (0.25) = 3.75; cpu 30.
    assert dnn.max_load(b, [0, 0, 2]) == pytest.approx(30.0)


def test_latency_by_hand(tmp_path):
    b = dnn.load(_write(tmp_path))
    # {1, 2} on fpga0: no feeders, 1 + 2 compute, out-copies 0.5 + 0.25 -> all finish at 3.75;
    # node 3 on cpu starts at 3.75, takes 30 -> 33.75.
    assert dnn.latency(b, [0, 0, 2]) == pytest.approx(33.75)
    # 1 on fpga0 (1 + 0.5 = 1.5), 2 on fpga1 (1.5 + in 0.5 + 2 + out 0.25 = 4.25), 3 cpu: 34.25.
    assert dnn.latency(b, [0, 1, 2]) == pytest.approx(34.25)
    # {1, 3} on one accelerator is not convex (1 -> 2 -> 3 leaves and comes back).
    with pytest.raises(InfeasibleError, match="non-convex"):
        dnn.latency(b, [0, 2, 0])


def test_interval_dp_respects_memory(tmp_path):
    # Each accelerator holds 4 bytes = one node: 1 and 2 on separate accelerators, 3 on cpu.
    b = dnn.load(_write(tmp_path, max_size=4.0))
    a = dnn.interval_dp(b, "throughput")
    assert a.tolist() == [0, 1, 2] or a.tolist() == [1, 0, 2]
    # One accelerator: node 1 on it (1.5), {2, 3} the cpu stage (20 + 30 = 50) beats all-cpu 60.
    assert dnn.interval_dp(dnn.load(_write(tmp_path, max_size=4.0, k=1)),
                           "throughput").tolist() == [0, 1, 1]


def test_cli_prints_the_plan(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    dnn.register_cli(parser.add_subparsers())
    args = parser.parse_args(["solve", str(_write(tmp_path)), "--format", "dnn-partitioning",
                              "--objective", "throughput", "--contiguous", "--json"])
    assert args.handler(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["maxLoad"] == pytest.approx(30.0)  # node 3 runs on the cpu: 30 at best
    assert plan["cpus"][0]["nodes"] == [3]
    assert sorted(sum((f["nodes"] for f in plan["fpgas"]), [])) == [1, 2]


def test_cli_without_contiguous_searches_every_split(tmp_path, capsys):
    # Node 3 is CPU-only (30 there), so 30 is the optimum of any split, found without
    # --contiguous as well; the plan is valid JSON of the benchmark's form.
    parser = argparse.ArgumentParser()
    dnn.register_cli(parser.add_subparsers())
    for objective, key, value in [("throughput", "maxLoad", 30.0), ("latency", "latency", 33.75)]:
        args = parser.parse_args(["solve", str(_write(tmp_path)), "--objective", objective,
                                  "--time-limit", "5", "--json"])
        assert args.handler(args) == 0
        plan = json.loads(capsys.readouterr().out)
        assert plan[key] == pytest.approx(value)
        assert plan["cpus"][0]["nodes"] == [3]


def test_real_input_beats_the_papers_greedy_latency(bench):
    b = dnn.load(f"{bench}/latency/resnet50_inference.json")
    assert dnn.latency(b, dnn.interval_dp(b, "latency")) < 4197.0555  # README's greedy value


@pytest.mark.parametrize("text, says", [("x", "not JSON"), ("{}", "missing field 'nodes'"),
                                        ('{"nodes": [{"id": 1}], "edges": []}', "missing field")])
def test_malformed_input_is_a_clear_error(tmp_path, text, says):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=says):
        dnn.load(path)
