"""Plans, devices and manual rules: text forms, validation and the errors a user sees."""

import dataclasses
import json
from pathlib import Path

import pytest
from tvm.script import ir as I
from tvm.script import relax as R

import autoplace
from autoplace import Device, Plan, PlanError

GOLDEN = Path(__file__).parent / "golden"


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), w: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            c0 = R.matmul(x, w)
            r0 = R.nn.relu(c0)
            c1 = R.matmul(r0, w)
            r1 = R.nn.relu(c1)
            s = R.nn.softmax(r1)
            R.output(s)
        return s


@pytest.fixture
def graph():
    return autoplace.OpGraph.from_relax(Chain)


def test_json_round_trip_and_golden_file(graph):
    # The golden file's devices build for generic x86-64 (a plan records each device's target).
    devs = [Device.cpu(0, name="a", target="llvm"), Device.cpu(1, name="b", target="llvm")]
    plan = Plan.from_assignment(graph, devs, ["a", "a", "b", "b", "a"], stages=(0, 0, 1, 1, 2),
                                objective="throughput", predicted_s=1.25e-3,
                                cost_sources=("roofline",) * 5, solver="dp")
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.to_json() == (GOLDEN / "plan_v1.json").read_text()
    assert str(plan) == (GOLDEN / "plan_v1.txt").read_text()


def test_a_replicated_plan_round_trips_as_format_2_and_says_so(graph, devs):
    plan = Plan.from_assignment(graph, devs, ["b"] * 5, stages=(0,) * 5, objective="throughput",
                                predicted_s=1e-3, replicas=("b", "a"), solver="replicas")
    text = plan.to_json()
    assert json.loads(text)["format_version"] == 2 and json.loads(text)["replicas"] == ["b", "a"]
    assert Plan.from_json(text) == plan
    assert "replicated: the whole model on each of b, a" in str(plan)
    assert [d.name for d in plan.used_devices()] == ["a", "b"]
    threads = Plan.from_assignment(graph, devs, ["a"] * 5, threads=2)
    assert Plan.from_json(threads.to_json()) == threads and "with 2 TVM threads" in str(threads)
    # A plan without either keeps format 1, which older readers take.
    assert json.loads(Plan.from_assignment(graph, devs, ["a"] * 5).to_json())["format_version"] == 1


@pytest.mark.parametrize("fields, message", [
    ({"replicas": ("a",)}, "two or more distinct devices"),
    ({"replicas": ("a", "c")}, "unknown device\\(s\\) \\['c'\\]"),
    ({"replicas": ("b", "a")}, "place every node on its first replica 'b'"),
    ({"threads": 0}, "threads must be a positive int"),
    ({"threads": 2, "replicas": ("a", "b")}, "threads is for a plan of one device"),
])
def test_bad_replicas_and_threads_say_what_to_fix(graph, devs, fields, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_assignment(graph, devs, ["a"] * 5, **fields)


def test_every_replica_must_run_the_whole_model(graph):
    devs = [Device.cpu(0, name="a"), Device.cpu(1, name="npu", unsupported_ops={"nn.softmax"})]
    with pytest.raises(PlanError, match="'s' \\(nn.softmax\\) is placed on 'npu'"):
        Plan.from_assignment(graph, devs, ["a"] * 5, replicas=("a", "npu"))


def test_plan_is_immutable(graph, devs):
    plan = Plan.from_assignment(graph, devs, ["a"] * 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.solver = "x"
    assert dataclasses.replace(plan, solver="x").solver == "x" and plan.solver == "manual"


@pytest.mark.parametrize("assignment, message", [
    ({"c0": "a"}, "4 node\\(s\\) left unplaced"),
    ({"c0": "a", "r0": "a", "c1": "a", "r1": "a", "s": "a", "zz": "a"}, "not in the graph: \\['zz'\\]"),
    (["a", "a", "a", "a", "gpu"], "unknown device\\(s\\) \\['gpu'\\]"),
    (["a", "a"], "got 2 devices for 5 nodes"),
])
def test_bad_assignments_say_what_to_fix(graph, devs, assignment, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_assignment(graph, devs, assignment)


def test_op_on_a_device_that_cannot_run_it(graph):
    devs = [Device.cpu(0, name="a"), Device.cpu(1, name="npu", unsupported_ops={"nn.softmax"})]
    with pytest.raises(PlanError, match="'s' \\(nn.softmax\\) is placed on 'npu', which cannot run"):
        Plan.from_assignment(graph, devs, ["a", "a", "a", "a", "npu"])


def test_plan_for_another_graph(graph, devs):
    plan = Plan.from_assignment(graph, devs, ["a"] * 5)
    other = autoplace.OpGraph.from_relax(autoplace.zoo.load("mlp").mod)
    with pytest.raises(PlanError, match="made for another graph"):
        plan.validate(other)


@pytest.mark.parametrize("text, message", [
    ("{", "invalid JSON"),
    ('{"nodes": []}', "no 'format_version'"),
    ('{"format_version": 99}', "version 99 is not supported"),
    ('{"format_version": 1, "nodes": []}', "missing or malformed field"),
])
def test_malformed_plan_text(text, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_json(text)


def test_device_specs_and_errors():
    assert Device.from_spec("cpu:1") == Device.cpu(1)
    assert Device.from_spec("cuda:0").target == "nvidia/nvidia-h100"
    with pytest.raises(ValueError, match="expected 'cpu:N' or 'cuda:N'"):
        Device.from_spec("tpu:0")
    with pytest.raises(ValueError, match="unknown kind"):
        Device("x", kind="fpga")
    assert Device.from_dict(Device.cuda(1).to_dict()) == Device.cuda(1)


def test_unsupported_ops_take_either_spelling_and_refuse_unknown_names(graph):
    # The workload keys' spelling "relax.matmul" and the op type "matmul" are the same op.
    for spelling in ("relax.matmul", "matmul"):
        npu = Device.cpu(1, name="npu", unsupported_ops={spelling})
        assert npu.unsupported_ops == {"matmul"} and not npu.can_run("matmul")
        with pytest.raises(PlanError, match="'c0' \\(matmul\\) is placed on 'npu'"):
            Plan.from_assignment(graph, [Device.cpu(0, name="a"), npu], ["npu"] + ["a"] * 4)
    assert Device.from_dict(npu.to_dict()) == npu
    for typo, near in (("matmull", "'matmul'"), ("softmax", "'nn.softmax'")):
        with pytest.raises(ValueError, match=f"names '{typo}', which is no Relax op; did you "
                                             f"mean {near}"):
            Device.cpu(0, unsupported_ops={typo})
    with pytest.raises(ValueError, match="a set of op names, got the string 'matmul'"):
        Device.cpu(0, unsupported_ops="matmul")


@pytest.mark.parametrize("field", ["memory_bytes", "peak_flops", "mem_bandwidth"])
@pytest.mark.parametrize("value", [float("nan"), 0, -1.0, "8e9", None])
def test_device_numbers_must_be_positive(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a positive number"):
        Device.cpu(0, **{field: value})


def test_place_checks_device_memory(graph):
    # Each node holds its output: 2x4 float32 = 32 bytes (matmul's weight is an input, not a
    # parameter), so five nodes need 160 bytes; a fits four (128 bytes), not five.
    devs = [Device.cpu(0, name="a", memory_bytes=128), Device.cpu(1, name="b")]
    assert [n.mem_bytes for n in graph.nodes] == [32] * 5
    with pytest.raises(PlanError, match="'a' holds 160 bytes .* over its memory_bytes of 128"):
        autoplace.place(graph, devs, [("*", "a")])
    assert autoplace.place(graph, devs, [("op:nn.softmax", "b"), ("*", "a")]).assignment[-1] == "b"


def test_link_time_is_alpha_plus_bytes_over_beta():
    link = autoplace.Link("a", "b", alpha=1e-5, beta=1e9)
    assert link.time(2e6) == pytest.approx(1e-5 + 2e-3)


# ---------------------------------------------------------------------------- manual rules

def test_first_conv_on_a_rest_on_b(devs):
    g = autoplace.OpGraph.from_relax(autoplace.zoo.load("branchy_cnn").mod)
    plan = autoplace.place(g, devs, [("op:nn.conv2d#0", "a"), ("*", "b")])
    convs = [n.index for n in g.nodes if n.op_type == "nn.conv2d"]
    assert plan.assignment[convs[0]] == "a"
    assert [a for i, a in enumerate(plan.assignment) if i != convs[0]] == ["b"] * (len(g) - 1)


def test_rule_kinds_and_first_match_wins(graph, devs):
    plan = autoplace.place(graph, devs, [("name:r*", "b"), ("index:0-2", "a"), ("op:nn.*", "a")],
                           default="b")
    # c0: index 0-2 -> a; r0: name r* -> b (first rule); c1: index -> a; r1: b; s: op nn.* -> a.
    assert plan.assignment == ("a", "b", "a", "b", "a")
    plan = autoplace.place(graph, devs, [("op:matmul#1", "b")], default="a")
    assert plan.assignment == ("a", "a", "b", "a", "a")


@pytest.mark.parametrize("rules, message", [
    ([("op:conv2d", "a")], "matches no node"),
    ([("conv", "a")], "say what it matches"),
    ([("index:3-9", "a")], "only 5 nodes"),
    ([("*", "gpu")], "names device 'gpu'"),
    ([("op:matmul", "a")], "3 node\\(s\\) match no rule"),
])
def test_bad_rules(graph, devs, rules, message):
    with pytest.raises(PlanError, match=message):
        autoplace.place(graph, devs, rules)
