"""The command line as a user runs it: a real subprocess, its output and exit codes."""

import json
import os
import re
import subprocess
import sys

import pytest


def _run(*args):
    return subprocess.run([sys.executable, "-m", "autoplace", *args], capture_output=True,
                          text=True, timeout=600)


def test_demo_builds_runs_and_reports_the_difference():
    r = _run("demo", "--model", "zoo:branchy_cnn", "--time-limit", "2")
    assert r.returncode == 0, r.stderr
    assert "predicted latency" in r.stdout
    # over this machine's CPU and runtimes by default (PyTorch's, ONNX Runtime's kernels)
    ran = re.search(r"compiled the plan \((cpu0|torch|ort)(, (cpu0|torch|ort))*"
                    r"( with \d+ TVM threads)?\) and ran: max \|difference\| from the "
                    r"single-device build = (\S+)", r.stdout)
    assert ran, r.stdout[-500:]
    assert float(ran.group(5)) < 1e-4


def test_demo_of_a_pytorch_model_runs_it_against_eager_onnxruntime_and_torch_compile():
    r = _run("demo", "--model", "zoo:resnet", "--time-limit", "2", "--torch-compile")
    assert r.returncode == 0, r.stderr
    for contender in ("pytorch eager", "onnxruntime", "torch.compile"):  # their times
        assert f"baseline {contender}" in r.stdout, r.stdout[-800:]
    said = re.search(r"the module runs (build|eager|onnxruntime|torch\.compile).*: max "
                     r"\|difference\| from eager = (\S+)", r.stdout)
    assert said, r.stdout[-800:]
    assert float(said.group(2)) < 1e-3


def test_optimize_json_report():
    r = _run("optimize", "--model", "zoo:mlp", "--device", "cpu:0", "--device", "cpu:1",
             "--rule", "op:nn.relu=cpu1", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["devices"] == ["cpu0", "cpu1"] and rep["max_abs_err_vs_single_device"] == 0
    relus = [a for n, a in zip(rep["plan"]["nodes"], rep["plan"]["assignment"]) if "relu" in n]
    assert relus and set(relus) == {"cpu1"}
    # What compile() built (after its trial, if any): the pin holds there too.
    ran = [a for n, a in zip(rep["runs_plan"]["nodes"], rep["runs_plan"]["assignment"])
           if "relu" in n]
    assert set(ran) == {"cpu1"} and (rep["trial"] is None or "; runs " in rep["trial"])


@pytest.mark.parametrize("args, message", [
    (["optimize", "--model", "zoo:nope"], "no zoo model 'nope'"),
    (["optimize", "--model", "model.pt"], "expected 'zoo:NAME'"),
    (["optimize", "--model", "zoo:mlp", "--device", "tpu:0"], "expected 'cpu:N' or 'cuda:N'"),
    (["optimize", "--model", "zoo:mlp", "--rule", "op:nn.relu"], "expected PATTERN=DEVICE"),
    (["optimize", "--model", "zoo:mlp", "--time-limit", "-5"],
     "time_limit must be positive seconds, got -5.0"),
    (["profile", "--model", "zoo:mlp", "--device", "tpu:0", "--db", "/nonexistent/p.db",
      "--dry-run"], "expected cpu:N, cuda:N, torch:cpu, torch:cuda:N or rpc:KEY@HOST:PORT"),
    (["profile", "--db", "/nonexistent/p.db"], "nothing to profile"),
    (["optimize", "--model", "zoo:mlp", "--profile", "/nonexistent/prof.json"],
     "cannot read profile"),
])
def test_errors_exit_2_with_a_message(args, message):
    r = _run(*args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("command, extra", [("optimize", []), ("report", ["--out", "OUT"])])
def test_devices_this_machine_lacks_are_one_line_before_any_work(command, extra, tmp_path):
    # cuda:99 is on no machine; cpu:<os.cpu_count()> is past the cores any process may use.
    # The model zoo:nope is never read (that would be another error): devices come first.
    extra = [str(tmp_path / "out") if a == "OUT" else a for a in extra]
    for absent in ("cuda:99", f"cpu:{os.cpu_count()}"):
        r = _run(command, "--model", "zoo:nope", "--device", "cpu:0", "--device", absent, *extra)
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"autoplace {command}: error: {absent}: no such device on this "
                               "machine") and "; use cpu:0" in line
    assert not (tmp_path / "out").exists()


def test_a_profile_of_an_unreadable_schema_is_refused_like_profile_import(tmp_path):
    from autoplace.profile.measurements import PROFILE_FORMAT

    path = tmp_path / "v99.json"
    path.write_text(json.dumps({
        "format": PROFILE_FORMAT, "schema_version": 99, "workloads": [], "measurements": [],
        "device": {"name": "cpu:0", "fingerprint": "0" * 16, "info": {"kind": "cpu"}}}))
    for args in (["optimize", "--model", "zoo:mlp", "--profile", str(path)],
                 ["profile-import", str(path), "--db", str(tmp_path / "p.db")]):
        r = _run(*args)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "is a profile of schema version 99; this autoplace reads" in r.stderr
    assert not (tmp_path / "p.db").exists()


def test_train_refuses_too_few_measurements_and_writes_nothing(tmp_path):
    from autoplace.profile import Measurement, ProfileStore

    class Node:  # a workload as the store records it
        def __init__(self, key):
            self.workload_key, self.op_type = key, "add"
            self.flops, self.bytes_read, self.bytes_written, self.param_bytes = 10.0, 8, 4, 0

    db, out = tmp_path / "p.db", tmp_path / "model.json"
    with ProfileStore(db) as store:
        store.add_device("fp0", "cpu:0", {"kind": "cpu", "hardware": "test"})
        store.add_workloads([Node("k1"), Node("k2")], model="m")
        for key in ("k1", "k2"):
            store.put(Measurement(key, "fp0", "ok", 1e-5, 9e-6, 1.1e-5, 0.01, 5, 100))
    before = db.read_bytes()
    r = _run("train", "--db", str(db), "--out", str(out))
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"autoplace train: error: only 2 measurements in {db}: profile more workloads (at least "
        "10) before training a cost model; nothing was written"]
    assert not out.exists() and db.read_bytes() == before


def test_solve_prints_the_benchmark_plan_json(bench):
    r = _run("solve", str(bench / "throughput" / "bert24_inference.json"), "--objective",
             "throughput", "--contiguous", "--time-limit", "5", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["maxLoad"] > 0 and "cpus" in plan and "fpgas" in plan
    placed = [n for part in plan["cpus"] + plan["fpgas"] for n in part["nodes"]]
    assert len(placed) == len(set(placed)) == 32  # bert24 has 32 nodes, each placed once


def test_solve_missing_file_is_a_clear_error(tmp_path):
    r = _run("solve", str(tmp_path / "nope.json"), "--json")
    assert r.returncode == 2 and "nope.json" in r.stderr and "Traceback" not in r.stderr


def test_help_has_examples():
    r = _run("optimize", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout


def test_top_level_help_has_examples_and_every_option_names_every_zoo_model():
    from autoplace import zoo
    from autoplace.cli import build_parser

    r = _run("--help")
    assert r.returncode == 0 and "examples:\n  autoplace demo" in r.stdout
    names = zoo.names()
    assert all(name in r.stdout for name in names)
    commands = build_parser()._subparsers._group_actions[0].choices
    for command in ("demo", "optimize", "report", "profile", "tune"):
        [model] = [a for a in commands[command]._actions if "--model" in a.option_strings]
        assert all(name in model.help for name in names), (command, model.help)


def test_no_profile_names_the_costs_as_the_fallback_does():
    r = _run("optimize", "--model", "zoo:mlp", "--no-profile", "--time-limit", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cost_model"] == "roofline estimates"


def test_optimize_throughput_runs_the_pipeline_and_reports_rates():
    r = _run("optimize", "--model", "zoo:branchy_cnn", "--objective", "throughput", "--run", "8",
             "--time-limit", "2", "--contiguous", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert {"predicted_inputs_per_s", "measured_inputs_per_s", "sequential_inputs_per_s",
            "max_abs_err", "stages"} <= set(rep)
    assert rep["max_abs_err"] == 0.0 and rep["stages"] >= 1
    workers = len(rep["replicated"]) if rep["replicated"] else rep["stages"]  # a worker each
    assert len(rep["stage_details"]) == workers
    assert rep["measured_inputs_per_s"] > 0 and rep["sequential_inputs_per_s"] > 0
    assert workers == len({s["device"] for s in rep["stage_details"]})  # one per device
    r = _run("optimize", "--model", "zoo:mlp", "--run", "8")
    assert r.returncode == 2 and "--objective throughput" in r.stderr


def test_solve_help_example_runs_on_an_input_the_repository_carries():
    import re
    from pathlib import Path

    r = _run("solve", "--help")
    files = re.findall(r"autoplace solve (\S+\.json)", r.stdout)
    repo = Path(__file__).resolve().parents[1]
    assert files and all((repo / f).is_file() for f in files), files


def test_solve_out_of_time_prints_the_plan_its_bound_and_gap(bench):
    r = _run("solve", str(bench / "latency" / "op_bert_l-12_inference.json"), "--objective",
             "latency", "--time-limit", "1", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert 0 < plan["bound"] <= plan["latency"] and 0 <= plan["gap"] < 1
    assert plan["status"] in ("OPTIMAL", "FEASIBLE") and plan["fpgas"]


@pytest.mark.parametrize("limit", ["-5", "0", "nan"])
def test_solve_refuses_a_time_limit_that_is_not_positive(bench, limit):
    r = _run("solve", str(bench / "throughput" / "bert24_inference.json"), "--time-limit", limit)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"autoplace solve: error: time_limit must be positive seconds, "
                                f"got {float(limit)!r}")


def test_the_tune_advice_names_only_the_devices_whose_kernels_tvm_builds():
    from types import SimpleNamespace

    from autoplace.cli.optimize import _unseen_machine_advice

    args = SimpleNamespace(no_profile=True, model="zoo:resnet", db="p.db",
                           device=["cpu:0", "torch:cpu", "ort:cpu", "cpu:1:generic"])
    res = SimpleNamespace(cost_model="measured")
    advice = _unseen_machine_advice(args, res, None, {"default": 3, "tuned": 0})
    tune = re.search(r"autoplace tune [^&(]*", advice).group(0)
    assert tune.split() == ["autoplace", "tune", "--model", "zoo:resnet", "--device", "cpu:0",
                            "--device", "cpu:1:generic", "--db", "p.db", "--trials", "64"]
    assert _unseen_machine_advice(args, res, None, {"default": 3, "tuned": 2}) is None
