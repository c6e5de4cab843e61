"""Active refinement measures new workloads the learned model was least sure about."""

import numpy as np
import pytest

from autoplace import zoo
from autoplace.pricing.refine import refine
from autoplace.profile import ProfileStore, TimingPolicy, run_campaign

FAST = TimingPolicy(min_repeat_ms=1, min_repeats=2, max_repeats=3, round_size=2, budget_s=0.3)


def test_refine_measures_the_least_sure_new_workloads(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    run_campaign([(n, zoo.load(n).mod) for n in ("mlp", "branchy_cnn")], ["cpu:0"], store,
                 policy=FAST, progress=False, links=False)
    before = {m.workload for m in store.measurements()}
    rounds = refine(store, "cpu:0", rounds=2, size=2, candidates=3, policy=FAST, progress=False,
                    rng=np.random.default_rng(1))
    assert [r.round for r in rounds] == [1, 2]
    assert [r.trained_on for r in rounds] == [len(before), len(before) + 2]
    assert all(r.measured == 2 and r.mean_band >= 1 and r.mape >= 0 for r in rounds)
    new = {m.workload for m in store.measurements()} - before
    assert len(new) == 4
    used_by = store.workload_models()
    assert all(next(iter(used_by[k])).startswith("refine:") for k in new)


def test_refine_needs_measurements_first(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    store.add_device("fp", "cpu:0", {"kind": "cpu"})
    with pytest.raises(ValueError, match="nothing measured on cpu:0"):
        refine(store, "cpu:0", rounds=1)
