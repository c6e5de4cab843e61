"""The all-threads baseline's costs: only a profile measured with that many threads gives them."""

import numpy as np

import autoplace
from autoplace import Device, zoo
from autoplace.predict import MeasuredCostModel
from autoplace.predict.at_threads import costs_at_threads
from autoplace.profile import DeviceProfile

INFO = {"kind": "cpu", "hardware": "Some CPU", "target": "llvm", "tvm": "0.27", "remote": None}


def _profile(threads, graph, scale=1.0, skip=(), **info):
    keys = {n.workload_key for n in graph.nodes} - set(skip)
    return DeviceProfile(f"cpu-{threads}t", f"fp{threads}", {**INFO, **info, "threads": threads},
                         {k: scale * 1e-4 for k in keys}, {k: 0.05 for k in keys}, {})


def test_a_profile_at_the_thread_count_predicts_the_whole_model():
    g = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)
    a, b = Device.cpu(0, name="a"), Device.cpu(1, name="b")
    one, two = _profile(1, g), _profile(2, g, scale=0.6)
    # Extra profiles go in a mapping under a key that names no device.
    model = MeasuredCostModel({"a": one, "b": one, "all threads": two})
    assert model.profile_for(a) is one and model.profile_at(a, 2) is two
    assert model.profile_at(a, 1) is one and model.profile_at(a, 4) is None
    tc = costs_at_threads(model, g, a, 2)
    np.testing.assert_allclose(tc.cost, 0.6e-4)
    np.testing.assert_allclose(tc.spread, 0.05)
    assert tc.note == "measured (cpu-2t, 2 threads)"
    # Measured on other hardware: not this device's.
    other = _profile(2, g, hardware="Other CPU")
    assert MeasuredCostModel({"a": one, "x": other}).profile_at(a, 2) is None
    # Two candidates: ambiguous, none chosen.
    assert MeasuredCostModel({"a": one, "x": two, "y": _profile(2, g)}).profile_at(a, 2) is None


def test_without_a_full_profile_at_that_count_it_is_not_predicted():
    g = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)
    a = Device.cpu(0, name="a")
    one = _profile(1, g)
    tc = costs_at_threads(MeasuredCostModel(one), g, a, 2)
    assert tc.cost is None and tc.note.startswith("not predicted: no profile of a measured with "
                                                  "2 TVM threads")
    gone = g.nodes[-1].workload_key
    partial = MeasuredCostModel({"a": one, "all": _profile(2, g, skip={gone})})
    tc = costs_at_threads(partial, g, a, 2)
    lacking = sum(n.workload_key == gone for n in g.nodes)
    assert tc.cost is None and f"lacks {lacking} of the {len(g.nodes)} ops" in tc.note
    # Roofline costs have no profile: not predicted either; an extra profile found elsewhere is.
    assert costs_at_threads(autoplace.RooflineCostModel(), g, a, 2).cost is None
    assert costs_at_threads(autoplace.RooflineCostModel(), g, a, 2, [_profile(2, g)]).cost.size
