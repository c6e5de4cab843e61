"""The hosts of a plan's devices in its explanation and its plots."""

import numpy as np
import pytest

import autoplace
from autoplace.devices import Device
from autoplace.report import explain, plot_gantt, plot_graph, plot_stage_loads
from cluster_models import chain  # noqa: E402

pytest.importorskip("matplotlib")


class _Costs:
    """relu 10 ms, exp 10 ms, tanh 30 ms, on every device."""

    def predict(self, graph, device):
        return np.array([10e-3, 10e-3, 30e-3])


@pytest.fixture(scope="module")
def res():
    # alpha's device is named after its host; beta's is not ("fast"). A pipeline: relu, exp on
    # one host (20 ms), tanh on the other (30 ms); no replicas, so that it has stages.
    devs = [Device.cpu(0, host="alpha"), Device.cpu(1, host="beta", name="fast")]
    return autoplace.optimize(chain(ops=("relu", "exp", "tanh")), devs, objective="throughput", cost_model=_Costs(),
                              check_devices=False, calibrate=False, db=None, replicate=False,
                              baseline_guard=False, stage_overhead_s=1e-3)


def test_explain_shows_each_devices_host(res):
    assert len(set(res.plan.assignment)) == 2
    ex = explain(res)
    assert ex.hosts == {"alpha-cpu0": "alpha", "fast": "beta"}
    assert "hosts: alpha (alpha-cpu0), beta (fast)" in ex.summary().splitlines()
    assert ex.to_dict()["hosts"] == {"alpha-cpu0": "alpha", "fast": "beta"}
    assert {r["device"]: r["host"] for r in ex.records()} == {
        d: {"alpha-cpu0": "alpha", "fast": "beta"}[d] for d in res.plan.assignment}
    # The table names a device's host where its name does not: fast@beta, alpha-cpu0.
    table = ex.table()
    assert "fast@beta/" in table and "alpha-cpu0/" in table and "@alpha" not in table


def test_a_plan_of_this_host_shows_no_hosts():
    res = autoplace.optimize(chain(ops=("relu", "exp", "tanh")), [Device.cpu(0)], cost_model=_Costs(),
                             check_devices=False, calibrate=False, db=None)
    ex = explain(res)
    assert ex.hosts == {} and not any(ln.startswith("hosts:") for ln in ex.summary().splitlines())
    assert {r["host"] for r in ex.records()} == {None}


def test_plots_label_devices_with_their_hosts(res):
    ax = plot_stage_loads(res).axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[:2] == ["alpha-cpu0", "fast@beta"] and "driver\n(hand-offs)" in ticks
    rows = [t.get_text() for t in plot_gantt(res).axes[0].get_yticklabels()]
    assert rows[:2] == ["alpha-cpu0", "fast@beta"]
    assert any(r.startswith("copy ") and "fast@beta" in r for r in rows)
    legend = [t.get_text() for t in plot_graph(res).axes[0].get_legend().get_texts()]
    assert legend[:2] == ["alpha-cpu0", "fast@beta"]
