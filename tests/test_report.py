"""The readable plan: explain() and the plots agree with the simulator; the report CLI's files."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.figure import Figure

import autoplace
from autoplace import Device, Link, zoo
from autoplace.predict import cost_spread
from autoplace.report import (explain, plot_accuracy, plot_gantt, plot_graph,
                              plot_stage_loads)
from autoplace.solve.simulate import (copies_needed, device_loads, link_loads, stage_counts,
                                       stage_overhead)

US = 1e-6


class TableCost:
    """Seconds per op type and device index; 1 µs for op types not in the table."""

    source = "measured"

    def __init__(self, table):
        self.table = table

    def predict(self, graph, device):
        return np.array([self.table.get(n.op_type, (US, US))[device.index] for n in graph.nodes])


# branchy_cnn: stem conv -> relu -> {branch_a conv -> relu, branch_b pool -> conv} -> concat
# -> mean (gap) -> matmul (head) -> softmax (gv); every tensor up to concat is 8192 bytes.
# Convs take 100 µs anywhere, a copy of 8192 B takes 1 µs + 1 µs: running one branch on each
# device beats one device (~307 µs) by ~100 µs. Softmax is 10x faster on a, b cannot run mean
# (so "only b" is no baseline), and a rule pins matmul to a.
COSTS = TableCost({"nn.conv2d": (100 * US, 100 * US), "nn.softmax": (1 * US, 10 * US)})
LINK = {"alpha": 1 * US, "beta": 8192 / US}


def _devices():
    return [Device.cpu(0, name="a"), Device.cpu(1, name="b", unsupported_ops={"mean"})]


def _optimize(objective="latency", **kwargs):
    if objective == "latency":
        kwargs.setdefault("segment_overhead_s", 0.0)  # the hand-computed schedules below
    kwargs.setdefault("db", None)  # COSTS, not the tuned kernels shipped for this machine
    devs = _devices()
    links = {(s.name, t.name): Link(s.name, t.name, **LINK) for s in devs for t in devs
             if s is not t}
    return autoplace.optimize(zoo.load("branchy_cnn").mod, devs, objective=objective,
                              cost_model=COSTS, links=links, pins=[("op:matmul", "a")],
                              solver="brute", time_limit=30, **kwargs)


@pytest.fixture(scope="module")
def res():
    return _optimize()


@pytest.fixture(scope="module")
def tp():
    # 45 µs per stage: a branch on each device pays (the convs take 100 µs).
    return _optimize("throughput", stage_overhead_s=45 * US)


def _bars(fig, prefix):
    return {p.get_gid()[len(prefix):]: p for p in fig.axes[0].patches
            if (p.get_gid() or "").startswith(prefix)}


# ----------------------------------------------------------------------------- explain

def test_the_branches_run_in_parallel(res):
    # stem + relu 101 µs; branch_b (pool + conv) beside them: 202, copy back 2 -> 204; branch_a
    # on the other device after a copy in: 101 + 2 + 100 + 1 = 204; concat, mean, matmul, softmax
    # 1 µs each on a: 208 µs. One device: 3 x 100 + 7 x 1 = 307 µs.
    a = dict(zip(res.plan.nodes, res.plan.assignment))
    assert a["branch_a"] != a["branch_b"]
    assert res.predicted_latency_s == pytest.approx(208 * US)
    assert res.baselines["only a"] == pytest.approx(307 * US)


def test_explain_mentions_every_node_with_its_device_and_costs(res):
    expl = res.explain()
    text = str(expl)
    rows = expl.records()
    assert [r["node"] for r in rows] == list(res.plan.nodes)
    for r, node, dev in zip(rows, res.graph.nodes, res.plan.assignment):
        assert f" {node.name} " in text
        assert r["device"] == dev and r["op"] == node.op_type
        np.testing.assert_allclose([r["cost_a_s"], r["cost_b_s"]], res.problem.cost[node.index])
        assert r["reason"]
    assert "cost_b_s" in rows[0] and math.isinf(rows[res.graph.index("gap")]["cost_b_s"])


def test_explain_gives_the_reason_that_applies(res):
    why = {n.name: n.reason for n in res.explain().nodes}
    assert why["head"] == "pinned to a by a rule"
    assert why["gap"] == "only device that can run it"
    assert why["gv"].startswith("cheapest device (1 µs here, 10 µs on b)")
    # Moving a branch's conv to the other device serialises the two 100 µs convs.
    dev_of = dict(zip(res.plan.nodes, res.plan.assignment))
    other = {"a": "b", "b": "a"}[dev_of["branch_b"]]
    assert f"{other} is busy then" in why["branch_b"]


def test_kept_with_neighbours_names_the_copy_it_avoids():
    # Two equal devices, a copy costs 1 ms: the whole graph stays on one device. stem_relu alone
    # on the other device needs its input copied in and its output copied back once (its two
    # consumers share one copy): 2 x 8192 B, 2 x 1 ms, on the critical path.
    devs = [Device.cpu(0, name="a"), Device.cpu(1, name="b")]
    links = {(s.name, t.name): Link(s.name, t.name, alpha=1e-3, beta=1e12) for s in devs
             for t in devs if s is not t}
    res = autoplace.optimize(zoo.load("branchy_cnn").mod, devs, cost_model=TableCost({}),
                             links=links, solver="brute", segment_overhead_s=0, db=None)
    assert res.plan.assignment == ("a",) * len(res.graph) and res.copies == 0
    stem_relu = res.explain().nodes[1]
    assert stem_relu.reason == ("as fast on b; kept with its neighbours to avoid copying 16.4 KB "
                                "(2 ms): the latency would grow by 2 ms on b")
    assert stem_relu.move_s["b"] == pytest.approx(2 * (1e-3 + 8192 / 1e12))


def test_copies_and_totals_agree_with_the_simulator(res):
    expl = res.explain()
    a = res.solution.assignment
    needed = copies_needed(res.problem, a)
    assert len(expl.copies) == res.copies == len(needed)
    assert expl.bytes_moved == sum(res.problem.out_bytes[u] for u, _ in needed)
    assert sum(len(n.copies_out) for n in expl.nodes) == len(needed)
    assert sum(len(n.copies_in) for n in expl.nodes) >= len(needed)  # one copy may feed two
    np.testing.assert_allclose(list(expl.device_s.values()), device_loads(res.problem, a))
    assert sum(expl.link_s.values()) == pytest.approx(link_loads(res.problem, a).sum())
    assert expl.value_s == res.predicted_latency_s


def test_gains_are_the_baselines_over_the_plan(res):
    expl = res.explain()
    d = json.loads(json.dumps(expl.to_dict()))  # JSON-ready
    assert d["gain_over_greedy"] == pytest.approx(res.baselines["greedy"] / res.predicted_latency_s)
    assert "only b" not in res.baselines and expl.best_single == ("only a", res.baselines["only a"])
    assert d["gain_over_best_single"] == pytest.approx(res.baselines["only a"]
                                                       / res.predicted_latency_s)
    assert d["copies"] == res.copies and d["cost_sources"] == {"measured": len(res.graph)}
    assert f"{d['gain_over_greedy']:.2f}x greedy" in expl.summary()


def test_throughput_explanation_speaks_of_time_per_input(tp):
    expl = explain(tp)
    assert expl.objective == "throughput"
    assert "time per input" in expl.summary() and "inputs/s" in expl.summary()
    assert [n.stage for n in expl.nodes] == list(tp.plan.stages)


def test_a_model_called_directly_says_a_pipeline_would_cost_more():
    # Two equal devices, 1 µs per op (10 µs in all), 150 µs per stage: every cut costs more in
    # hand-offs than it gains, so the plan is one stage on one device, called directly.
    devs = [Device.cpu(0, name="a"), Device.cpu(1, name="b")]
    res = autoplace.optimize(zoo.load("branchy_cnn").mod, devs, objective="throughput",
                             cost_model=TableCost({}), stage_overhead_s=150 * US, db=None)
    assert set(res.plan.stages) == {0} and res.predicted_latency_s == pytest.approx(
        res.problem.cost[:, 0].sum())
    why = [n.reason for n in res.explain().nodes]
    on = res.plan.assignment[0]
    assert all(f"called directly on {on}: moving it would start a pipeline" in w for w in why), why


def test_cost_spread_reads_the_profile_cv_and_the_learned_band():
    from autoplace.predict import MeasuredCostModel, RooflineCostModel
    from autoplace.profile.profiles import DeviceProfile

    graph = autoplace.OpGraph.from_relax(zoo.load("branchy_cnn").mod)
    stem = graph.nodes[0].workload_key

    class Learned:
        source = "learned"

        def quantiles(self, graph, device):  # P10, P50, P90: the band is ±25 % of the P50
            return np.tile([1.5e-6, 2e-6, 2.5e-6], (len(graph.nodes), 1))

    prof = DeviceProfile("cpu", "fp", {"kind": "cpu"}, {stem: 1e-4}, {stem: 0.03}, {})
    devs = [Device.cpu(0, name="a")]
    spread = cost_spread(graph, devs, MeasuredCostModel(prof, fallback=Learned()))
    assert spread[0, 0] == pytest.approx(0.03)
    np.testing.assert_allclose(spread[1:, 0], 0.25)
    np.testing.assert_array_equal(cost_spread(graph, devs, RooflineCostModel()),
                                  RooflineCostModel.spread)


# ----------------------------------------------------------------------------- plots

def test_gantt_bars_are_the_simulators_schedule(res):
    sched = res.schedule()
    assert sched.makespan == pytest.approx(res.predicted_latency_s)
    fig = plot_gantt(res)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (µs)"
    rows = [t.get_text() for t in ax.get_yticklabels()]
    nodes = _bars(fig, "node:")
    assert set(nodes) == set(res.plan.nodes)
    for i, name in enumerate(res.plan.nodes):
        bar = nodes[name]
        assert bar.get_x() == pytest.approx(sched.start[i] * 1e6)
        assert bar.get_x() + bar.get_width() == pytest.approx(sched.finish[i] * 1e6)
        assert rows[round(bar.get_y() + bar.get_height() / 2)] == res.plan.assignment[i]
    copies = _bars(fig, "copy:")
    assert len(copies) == len(sched.transfers) > 0
    names = res.problem.node_names
    for t in sched.transfers:
        src, dst = res.problem.device_names[t.src], res.problem.device_names[t.dst]
        bar = copies[f"{names[t.node]}:{src}->{dst}"]
        assert bar.get_x() == pytest.approx(t.start * 1e6)
        assert bar.get_width() == pytest.approx((t.finish - t.start) * 1e6)
        assert rows[round(bar.get_y() + bar.get_height() / 2)] == f"copy {src} → {dst}"
    assert ax.get_legend() is not None


def test_graph_colours_each_node_by_its_device(res):
    fig = plot_graph(res)
    ax = fig.axes[0]
    nodes = next(c for c in ax.collections if c.get_gid() == "nodes")
    colours = nodes.get_facecolors()
    legend = {t.get_text(): h.get_facecolor() for t, h in
              zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)
              if t.get_text() in res.plan.assignment}
    for i, dev in enumerate(res.plan.assignment):
        np.testing.assert_allclose(colours[i], legend[dev])
    g, dev = res.graph.to_networkx(), res.plan.assignment
    cross = sum(dev[u] != dev[v] for u, v in g.edges)
    assert cross > 0 and f"{cross} of {g.number_of_edges()} edges cross devices" in ax.get_title()


def test_stage_loads_stack_to_the_device_loads_and_mark_the_bottleneck(tp):
    fig = plot_stage_loads(tp)
    a, p = tp.solution.assignment, tp.problem
    overhead = stage_overhead(p, stage_counts(p, a, tp.solution.stages))
    assert overhead.sum() > 0  # each stage costs a hand-off
    loads = device_loads(p, a) + overhead
    bars = _bars(fig, "load:")
    for k, dev in enumerate(tp.problem.device_names):
        stacked = [b for key, b in bars.items() if key.startswith(f"{dev}:")]
        assert sum(b.get_height() for b in stacked) == pytest.approx(loads[k] * 1e6)
        assert bars[f"{dev}:overhead"].get_height() == pytest.approx(overhead[k] * 1e6)
    assert bars["host"].get_height() == pytest.approx(overhead.sum() * 1e6)
    for (s, t), x in np.ndenumerate(link_loads(tp.problem, a)):
        if x > 0:
            src, dst = tp.problem.device_names[s], tp.problem.device_names[t]
            assert bars[f"{src}->{dst}"].get_height() == pytest.approx(x * 1e6)
    outline = next(p for p in fig.axes[0].patches if p.get_gid() == "bottleneck")
    assert outline.get_height() == pytest.approx(tp.solution.value * 1e6)
    assert fig.axes[0].get_ylabel() == "µs per input"


def test_plots_draw_into_the_axes_given():
    res = _optimize()
    fig = Figure()
    axes = fig.subplots(1, 3)
    assert plot_gantt(res, ax=axes[0]) is fig
    assert plot_graph(res, ax=axes[1]) is fig
    assert plot_stage_loads(res, ax=axes[2]) is fig
    assert all(ax.has_data() or ax.collections for ax in axes)


def test_accuracy_plot_counts_points_inside_the_bands():
    measured = np.array([1e-5, 1e-4, 1e-3, 1e-2])
    predicted = measured * np.array([1.05, 0.8, 1.5, 1.0])  # 5 %, 20 %, 50 %, 0 % off
    ax = plot_accuracy(predicted, measured).axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "within 10 %: 50%" in ax.get_title() and "within 25 %: 75%" in ax.get_title()
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= {"±10 %", "±25 %"}
    assert ax.get_xlabel() == "measured (µs)"  # median 550 µs


@pytest.mark.parametrize("predicted, measured, message", [
    ([1.0, 2.0], [1.0], "of one length; got 2 and 1"),
    ([], [], "non-empty"),
    ([1.0, -1.0], [1.0, 1.0], "1 are not, first at index 1"),
    ([1.0, np.nan], [1.0, 1.0], "positive and finite"),
])
def test_accuracy_plot_rejects_bad_arrays(predicted, measured, message):
    with pytest.raises(ValueError, match=message):
        plot_accuracy(predicted, measured)


# ----------------------------------------------------------------------------- CLI

def _run(*args):
    return subprocess.run([sys.executable, "-m", "autoplace", "report", *args],
                          capture_output=True, text=True, timeout=600)


def test_report_cli_writes_the_files_it_prints(tmp_path):
    r = _run("--model", "zoo:branchy_cnn", "--device", "cpu:0", "--device", "cpu:1",
             "--no-profile", "--out", str(tmp_path / "rep"), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    names = sorted(p.rsplit("/", 1)[1] for p in rep["files"])
    assert names == ["explain.txt", "gantt.png", "graph.png", "plan.json"]
    for f in rep["files"]:
        data = open(f, "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" if f.endswith(".png") else data
    plan = autoplace.Plan.from_json(open(tmp_path / "rep" / "plan.json").read())
    assert rep["predicted_s"] == pytest.approx(plan.predicted_s)
    assert rep["model"] == "branchy_cnn" and rep["devices"] == ["cpu0", "cpu1"]
    assert "stem" in (tmp_path / "rep" / "explain.txt").read_text()

    r = _run("--model", "zoo:branchy_cnn", "--no-profile", "--objective", "throughput",
             "--out", str(tmp_path / "tp"))
    assert r.returncode == 0, r.stderr
    printed = r.stdout.split()
    assert [p.rsplit("/", 1)[1] for p in printed] == ["graph.png", "stages.png", "explain.txt",
                                                       "plan.json"]
    assert all((tmp_path / "tp" / p.rsplit("/", 1)[1]).is_file() for p in printed)


@pytest.mark.parametrize("args, message", [
    (["--model", "zoo:nope", "--out", "OUT"], "no zoo model 'nope'"),
    (["--model", "zoo:mlp", "--out", "FILE"], "exists and is not a folder"),
    (["--model", "zoo:mlp", "--device", "tpu:0", "--out", "OUT"], "expected 'cpu:N' or 'cuda:N'"),
    (["--model", "zoo:mlp"], "the following arguments are required: --out"),
    (["--model", "zoo:mlp", "--dpi", "0", "--out", "OUT"], "--dpi must be positive"),
])
def test_report_cli_errors_exit_2_with_a_message(tmp_path, args, message):
    (tmp_path / "FILE").write_text("")
    args = [str(tmp_path / a) if a in ("OUT", "FILE") else a for a in args]
    r = _run(*args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "OUT").exists()


# ----------------------------------------------------------------------------- delivery

def test_a_latency_plan_runs_concurrently_when_that_is_predicted_faster(res):
    # The hand-computed schedule above: 208 µs side by side, 307 µs and more one kernel at a time.
    assert res.delivery.runner == "concurrent"
    assert res.delivery.concurrent_s == pytest.approx(208 * US)
    assert res.delivery.serial_s > 307 * US
    assert any(line.startswith("runs as: ") and "segments on one worker per device" in line
               for line in res.summary().splitlines())
    model = zoo.load("branchy_cnn")
    with res.compile(trial=False) as run:  # the returned plan's runner, without a trial
        assert isinstance(run, autoplace.run.ConcurrentModel)
        outs = run(*model.inputs)
    ref = res.compile(concurrent=False)(*model.inputs)
    for o, r in zip(outs, ref):
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6)


def test_segment_overheads_that_eat_the_overlap_keep_one_vm():
    # Each segment costing 150 µs: splitting the branches no longer pays.
    slow = _optimize(segment_overhead_s=150 * US)
    assert slow.delivery.runner == "vm"
    assert slow.predicted_latency_s == pytest.approx(slow.delivery.serial_s)
    assert isinstance(slow.compile(trial=False), autoplace.run.CompiledModel)
    assert slow.predicted_latency_s <= slow.baselines["only a"] + 1e-12


def test_segment_overheads_must_be_seconds():
    with pytest.raises(ValueError, match="segment_overhead_s for b must be a finite number"):
        _optimize(segment_overhead_s={"b": -1.0})
    with pytest.raises(ValueError, match="unknown device"):
        _optimize(segment_overhead_s={"c": 1e-6})
    with pytest.raises(ValueError, match="objective='latency'"):
        _optimize("throughput", segment_overhead_s=1e-6)
